"""``dphype compare``: federated DP-Hype vs DP-BO, propose-test, Opt and RandGuess on one task.

Defaults: the bundled Adult data, the Table III grid, epsilon 1, delta 1e-5, 50 iid clients, k = 5,
Skellam noise. Prints the table (method, privacy spent with accountant and assumptions, whether a
trusted curator is needed, selected candidate, test accuracy, wall time) and writes
``compare.csv`` and ``compare.png`` to ``--out`` (default ``results/compare``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="adult", help="data set (default adult, bundled)")
    parser.add_argument("--data-dir", default=None, help="folder of non-bundled data sets")
    parser.add_argument("--candidates", default="table3",
                        help="candidate list: table3 | table3:random:SIZE:SEED | path to a JSON list")
    parser.add_argument("--epsilon", type=float, default=1.0, help="privacy budget epsilon (default 1)")
    parser.add_argument("--delta", type=float, default=1e-5, help="privacy budget delta (default 1e-5)")
    parser.add_argument("--clients", type=int, default=50, help="clients = propose-test parts (default 50)")
    parser.add_argument("--k", type=int, default=5, help="DP-Hype votes per client (default 5)")
    parser.add_argument("--noise", choices=("skellam", "gaussian"), default="skellam", help="DP-Hype noise")
    parser.add_argument("--accountant", choices=("rdp", "analytic"), default=None,
                        help="DP-Hype accountant (default: rdp for skellam, analytic for gaussian)")
    parser.add_argument("--epochs", type=int, default=None, help="training epochs (default: the paper's)")
    parser.add_argument("--partition", choices=("iid", "dirichlet"), default="iid")
    parser.add_argument("--beta", type=float, default=None, help="Dirichlet concentration (dirichlet only)")
    parser.add_argument("--dpbo-iterations", type=int, default=30, help="DP-BO GP-UCB steps T (default 30)")
    parser.add_argument("--granularity", type=float, default=0.05, help="propose-test utility step g")
    parser.add_argument("--lower-bound", type=float, default=0.5, help="propose-test utility lower bound u0")
    parser.add_argument("--repetitions", type=int, default=20,
                        help="independent repetitions of each private selection (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/compare", help="output folder (default results/compare)")


def _progress(done: int, total: int) -> None:
    print(f"compare: scored client {done}/{total}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dphype.candidates import load_candidates
    from dphype.central.compare import compare, write_table

    started = time.perf_counter()
    candidates = load_candidates(args.candidates)
    rows, shared = compare(
        dataset=args.dataset, candidates=candidates, epsilon=args.epsilon, delta=args.delta, clients=args.clients,
        k=args.k, noise=args.noise, accountant=args.accountant, epochs=args.epochs, partition=args.partition,
        beta=args.beta, dpbo_iterations=args.dpbo_iterations, granularity=args.granularity,
        lower_bound=args.lower_bound, repetitions=args.repetitions, seed=args.seed, data_dir=args.data_dir,
        progress=None if args.json else _progress,
    )
    title = (f"{args.dataset}, {len(candidates)} candidates, eps={args.epsilon:g}, delta={args.delta:g}, "
             f"{args.clients} clients")
    outputs = write_table(rows, args.out, title)
    if not args.json:
        for r in rows:
            eps = "inf" if r["epsilon"] is None else f"{r['epsilon']:.4g}"
            delta = "-" if r["delta"] is None else f"{r['delta']:.2g}"
            print(f"{r['method']:>12}  eps={eps:<8} delta={delta:<8} "
                  f"curator={'yes' if r['trusted_curator'] else 'no ':3}  acc={r['test_accuracy']:.4f}"
                  f"{'' if 'test_accuracy_std' not in r else '+-%.4f' % r['test_accuracy_std']}  "
                  f"{r['wall_seconds']:7.1f}s  {r['selected']}  [{r['accountant']}]")
    return {
        "rows": rows,
        "seconds": time.perf_counter() - started,
        "client_scoring_seconds": shared.client_seconds,
        "central_training_seconds": shared.central_seconds,
        "outputs": outputs,
    }
