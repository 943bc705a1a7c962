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

from dphype.central.compare import compare, write_table
from dphype.cli import add_candidates_argument, add_privacy_arguments, privacy_config
from dphype.selection.candidates import load_candidates


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``compare`` options (the privacy options and ``--candidates`` as in every command).

    Args:
        parser: The sub-command's parser.
    """
    parser.add_argument("--dataset", default="adult", help="data set (default adult, bundled)")
    parser.add_argument("--data-dir", default=None, help="folder of non-bundled data sets")
    add_candidates_argument(parser)
    add_privacy_arguments(parser)  # the clients are also propose-test's parts
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
    """Compare the methods, write ``compare.csv`` and ``compare.png``, and report.

    Without ``--json`` it also prints one line per method, and the clients' scoring progress on standard error.

    Args:
        args: The parsed options.

    Returns:
        The ``rows`` (one per method), the wall ``seconds``, the shared client-scoring and central-training
        times, and the ``outputs`` written.

    Raises:
        ValueError: For bad input (exit status 2 via `dphype.cli.main`).
    """  # noqa: DOC502
    started = time.perf_counter()
    candidates = load_candidates(args.candidates)
    rows, shared = compare(
        dataset=args.dataset, candidates=candidates, config=privacy_config(args, len(candidates)),
        epochs=args.epochs, partition=args.partition,
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
            spread = f"+-{r['test_accuracy_std']:.4f}" if "test_accuracy_std" in r else ""
            print(f"{r['method']:>12}  eps={eps:<8} delta={delta:<8} "
                  f"curator={'yes' if r['trusted_curator'] else 'no ':3}  acc={r['test_accuracy']:.4f}{spread}  "
                  f"{r['wall_seconds']:7.1f}s  {r['selected']}  [{r['accountant']}]")
    return {
        "rows": rows,
        "seconds": time.perf_counter() - started,
        "client_scoring_seconds": shared.client_seconds,
        "central_training_seconds": shared.central_seconds,
        "outputs": outputs,
    }
