"""Benchmark: what the client privacy guard adds to a vote, per call and per in-process round.

Per call (microseconds, median of ``--repeats``), for a client at ``--clients`` (default 50, Skellam noise,
epsilon 1, k 5, Table III's 100 candidates, dropout 0.1):

* ``policy_from_node_config_us``: :meth:`dphype.node.policy.NodePolicy.from_node_config`;
* ``check_vote_request_us``: :func:`dphype.node.policy.check_vote_request` (pre-flight and again at the vote);
* ``ledger_check_us`` / ``ledger_spend_us``: :meth:`dphype.node.ledger.Ledger.check` / ``spend`` on a ledger
  that already holds ``--entries`` votes (default 10; ``spend`` includes the fsync'd atomic write; each
  spend is followed by a restore of the ledger, not timed);
* ``secure_share_us`` vs ``pcg64_share_us``: one client's noise share of 100 entries from
  :func:`dphype.privacy.noise.client_noise_share` (fresh ChaCha20 keyed from the OS) vs numpy's default PCG64.

``guard_total_ms`` sums what one vote adds per client (two request checks, a ledger check and a spend, the
secure share minus the PCG64 one). The secure sum's own checks of every stage are part of its protocol
(:mod:`dphype.secure.secagg`) and are measured with it (``simulations/secagg_profile.py``).

Per round (``--rounds R``, default 5; 0 skips it): ``DPHype(...).start(grid)`` with ``--clients`` real
``register_dphype`` clients (fixed scores, the same settings, the argmax selection rule) on the in-process grid of
``dphype.flower.local.LocalGrid`` (no Ray, no SuperLink: the protocol's own cost), alternating rounds with the guard
(``guarded``) and with it switched off (``unguarded``: the node policy, the request checks and the ledger
replaced by no-ops, PCG64 instead of ChaCha20). Reported: the median wall and CPU seconds of each
(``round_*``), and in the guarded rounds the seconds spent inside the guard's checks (policy, request
checks, ledger; not the noise draw), summed over all clients (``inside_guard_seconds``;
the clients run one after another in process, so this is what the checks add to the round's wall time).
Ledgers live in a temporary directory; the disk's fsync latency dominates ``ledger_spend_us``.

Run: ``.venv/bin/python -m simulations.bench_guard [--clients N] [--entries E] [--rounds R] [--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dphype.config import DPHypeConfig
from dphype.node.ledger import Ledger, admitting_policy
from dphype.node.policy import NodePolicy, check_vote_request
from dphype.privacy.noise import client_noise_share, noise_share
from dphype.protocol import make_vote_request
from dphype.selection.candidates import table_iii_grid
from simulations import harness


def _median_us(fn: Callable[[], Any], repeats: int, after: Callable[[], Any] | None = None) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        if after is not None:
            after()
    return statistics.median(times) * 1e6


def run(clients: int, entries: int, repeats: int) -> dict[str, Any]:
    config = DPHypeConfig(epsilon=1.0, delta=1e-5, k=5, clients=clients, dropout=0.1, noise="skellam")
    candidates = table_iii_grid()
    request = make_vote_request(config, candidates)
    sigma = request.sigma
    out: dict[str, Any] = {"clients": clients, "entries": entries}
    with tempfile.TemporaryDirectory() as tmp:
        node_config = {**admitting_policy(request), "dphype-lifetime-epsilon": 1000.0,
                       "dphype-ledger": str(Path(tmp) / "ledger.json")}
        out["policy_from_node_config_us"] = _median_us(lambda: NodePolicy.from_node_config(node_config), repeats)
        policy = NodePolicy.from_node_config(node_config)
        out["check_vote_request_us"] = _median_us(lambda: check_vote_request(request, policy), repeats)
        guarantee = check_vote_request(request, policy)
        ledger = Ledger(policy.ledger)
        for _ in range(entries):
            ledger.spend(guarantee, policy, "bench")
        saved = policy.ledger.read_bytes()
        out["ledger_check_us"] = _median_us(lambda: ledger.check(guarantee, policy), repeats)
        out["ledger_spend_us"] = _median_us(lambda: ledger.spend(guarantee, policy, "bench"), repeats,
                                            after=lambda: policy.ledger.write_bytes(saved))

    share = {"size": len(candidates), "sigma": sigma, "clients": clients, "dropout": 0.1, "kind": "skellam"}
    out["secure_share_us"] = _median_us(lambda: client_noise_share(**share), repeats)
    out["pcg64_share_us"] = _median_us(lambda: noise_share(**share, rng=np.random.default_rng()), repeats)
    added = (2 * out["check_vote_request_us"] + out["ledger_check_us"] + out["ledger_spend_us"]
             + out["secure_share_us"] - out["pcg64_share_us"])
    out["guard_total_ms"] = added / 1e3
    return out


def round_cost(clients: int, rounds: int) -> dict[str, Any]:
    """Guarded against unguarded in-process DP-Hype rounds (module docstring)."""
    from flwr.clientapp import ClientApp

    import dphype.flower.client as client_side
    import dphype.flower.client.policy_client as client_policy
    import dphype.protocol as protocol
    from dphype.flower import DPHype, register_dphype
    from dphype.flower.local import LocalGrid
    from dphype.ml.torch_task import FixedScoresTask

    # the argmax rule: the server's selection time is not the guard's
    config = DPHypeConfig(epsilon=1.0, delta=1e-5, k=5, clients=clients, dropout=0.1, noise="skellam", rule="max-votes")
    candidates = table_iii_grid()
    scores = np.random.default_rng(0).random((clients, len(candidates)))
    selection = DPHype(candidates, config)
    policy = NodePolicy.from_node_config(admitting_policy(selection.request))
    guarantee = check_vote_request(selection.request, policy)

    class NoLedger:
        def __init__(self, path: Any) -> None:
            pass

        def check(self, *args: Any) -> float:
            return 0.0

        spend = check

    def pcg64_share(size: Any, **kwargs: Any) -> np.ndarray:
        return noise_share(size, rng=np.random.default_rng(), **kwargs)

    unguarded = [(client_policy, "node_policy", lambda context: policy),
                 (client_side, "check_vote_request", lambda request, limits: guarantee),
                 (client_policy, "check_vote_request", lambda request, limits: guarantee),
                 (client_side, "Ledger", NoLedger), (protocol, "client_noise_share", pcg64_share)]
    inside = [("node_policy", client_policy, "node_policy"), ("check_vote_request", client_side, "check_vote_request"),
              ("Ledger.check", Ledger, "check"), ("Ledger.spend", Ledger, "spend")]
    times: dict[str, list[tuple[float, float]]] = {"guarded": [], "unguarded": []}
    guard_seconds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(2 * rounds):
            variant = ("guarded", "unguarded")[index % 2]
            app = register_dphype(ClientApp(), lambda ctx: FixedScoresTask(
                scores[int(ctx.node_config["partition-id"])], True))
            # every round on fresh nodes (a fresh ledger each), whose policy admits its one vote
            grid = LocalGrid(app, clients, node_config=admitting_policy(selection.request))
            for i, context in enumerate(grid.contexts.values()):
                context.node_config["dphype-ledger"] = f"{tmp}/ledger-{index}-{i}.json"
            spent: dict[str, float] = defaultdict(float)
            with contextlib.ExitStack() as stack:
                for owner, name, value in (unguarded if variant == "unguarded" else []):
                    stack.enter_context(harness.swapped(owner, name, value))
                for label, owner, name in (inside if variant == "guarded" else []):
                    stack.enter_context(harness.timed(spent, label, owner, name))
                start, cpu = time.perf_counter(), time.process_time()
                selection.start(grid)
                times[variant].append((time.perf_counter() - start, time.process_time() - cpu))
            if variant == "guarded":
                guard_seconds.append(dict(spent))
    out: dict[str, Any] = {"round_clients": clients, "rounds": rounds}
    for variant, rows in times.items():
        out[f"round_{variant}_seconds"] = statistics.median(w for w, _ in rows)
        out[f"round_{variant}_cpu_seconds"] = statistics.median(c for _, c in rows)
    out["inside_guard_seconds"] = statistics.median(sum(row.values()) for row in guard_seconds)
    for key in sorted({k for row in guard_seconds for k in row}):
        out[f"inside_guard_seconds: {key}"] = statistics.median(row.get(key, 0.0) for row in guard_seconds)
    out["round_difference_seconds"] = out["round_guarded_seconds"] - out["round_unguarded_seconds"]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--entries", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5, help="in-process rounds per variant (0: none)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.clients, args.entries, args.repeats)
    if args.rounds > 0:
        result.update(round_cost(args.clients, args.rounds))
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()
