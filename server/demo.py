"""``dphype demo``: DP-Hype on Adult through Flower + SecAgg+, then FedAvg with the winner.

Runs the project's ServerApp and ClientApp in Flower's simulation runtime
(``flwr.simulation.run_simulation``, Ray backend, one CPU per client actor):
every simulated client scores the candidates on its Adult shard, votes top-k
with its Skellam noise share, SecAgg+ releases only the noisy vote sum, the
server selects the argmax and trains the final model by FedAvg.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

#: Candidate list of the demo: DP-Hype Table III (100 candidates).
DEFAULT_CANDIDATES = "table3"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dphype demo``."""
    parser.add_argument("--clients", type=int, default=50, help="simulated clients (default 50)")
    parser.add_argument("--epsilon", type=float, default=1.0, help="privacy budget epsilon (default 1)")
    parser.add_argument("--delta", type=float, default=1e-5, help="privacy budget delta (default 1e-5)")
    parser.add_argument("--k", type=int, default=5, help="votes per client (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="data partition / model seed (default 0)")
    parser.add_argument("--dropout", type=float, default=0.0, help="tolerated dropout fraction xi")
    parser.add_argument("--noise", choices=("skellam", "gaussian"), default="skellam")
    parser.add_argument(
        "--candidates",
        default=DEFAULT_CANDIDATES,
        help="'table3', 'table3:random:SIZE:SEED' or a JSON file (default: Table III, 100 candidates)",
    )
    parser.add_argument("--fedavg-rounds", type=int, default=5, help="FedAvg rounds (default 5)")
    parser.add_argument("--local-epochs", type=int, default=5, help="local epochs (default 5)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the demo; returns the selection, test accuracy, wall time and privacy report."""
    from dphype.candidates import load_candidates
    from server.config import AppConfig

    cfg = AppConfig(
        dataset="adult",
        epsilon=args.epsilon,
        delta=args.delta,
        k=args.k,
        dropout=args.dropout,
        noise=args.noise,
        accountant="auto",
        candidates=args.candidates,
        seed=args.seed,
        fedavg_rounds=args.fedavg_rounds,
        local_epochs=args.local_epochs,
        clients=args.clients,
    )
    # Refuse bad input before starting Flower (the same checks run inside the ServerApp).
    from dphype.strategy import make_vote_request

    make_vote_request(load_candidates(cfg.candidates), **cfg.vote_parameters())
    return simulate(cfg)


def simulate(cfg: Any) -> dict[str, Any]:
    """Run the ServerApp + ClientApp for ``cfg`` (an AppConfig) in Flower's simulation runtime."""
    from flwr.simulation import run_simulation

    from clients.app import build_client_app
    from server.app import build_server_app

    results: list[dict[str, Any]] = []
    start = time.perf_counter()
    run_simulation(
        server_app=build_server_app(cfg, on_result=results.append),
        client_app=build_client_app(cfg),
        num_supernodes=cfg.clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    if not results:
        raise RuntimeError("the Flower simulation ended without a DP-Hype result")
    summary = results[0]
    privacy = summary.pop("privacy")
    return {**summary, "seconds": time.perf_counter() - start, "privacy": privacy}
