"""``dphype pareto``: one DPareto (or baseline) search of a privacy-utility Pareto front.

Writes to ``--out`` (default ``results/pareto-<oracle>``): ``evaluations.csv`` (every configuration
with epsilon and its mean/best/worst utility), ``front.png`` (evaluated points, the Pareto front
and the band between the best-run and worst-run fronts) and ``hypervolume.png`` (hypervolume vs
evaluations). ``overhead_seconds`` is all wall time not spent inside oracle calls or building the
oracles (GP fits, acquisition, bookkeeping, writing the outputs).
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from typing import Any

from dphype.ml.oracles import make_problem, problem_names
from dphype.ml.oracles.dpsgd import OPACUS_ACCOUNTANTS

METHODS = ("hvpoi", "qnehvi", "random", "grid")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``pareto`` options.

    Args:
        parser: The sub-command's parser.
    """
    parser.add_argument("--oracle", required=True, choices=problem_names(), metavar="NAME",
                        help="problem: " + ", ".join(problem_names()))
    parser.add_argument("--seeds", type=int, default=16, help="random seed configurations k0 (default 16)")
    parser.add_argument("--iterations", type=int, default=256, help="BO iterations k (default 256)")
    parser.add_argument("--method", choices=METHODS, default="hvpoi",
                        help="hvpoi (DPareto), qnehvi (BoTorch qLogNEHVI), random or grid (default hvpoi)")
    parser.add_argument("--baseline", choices=("none", "random"), default="none",
                        help="also run random sampling with the same budget for the hypervolume plot")
    parser.add_argument("--seed", type=int, default=0, help="randomness of the search and the oracles")
    parser.add_argument("--runs", type=int, default=None, help="utility runs R per configuration (oracle default)")
    parser.add_argument("--accountant", choices=OPACUS_ACCOUNTANTS, default="rdp",
                        help="Opacus accountant of the DP-SGD/DP-Adam oracles (default rdp)")
    parser.add_argument("--train-size", type=int, default=None,
                        help="subsample the training pool of data-driven oracles to this many rows")
    parser.add_argument("--data-dir", default=None, help="folder of non-bundled data sets")
    parser.add_argument("--reference", type=float, nargs=2, default=(10.0, 1.0), metavar=("EPS", "ERR"),
                        help="anti-ideal point (default 10 1)")
    parser.add_argument("--out", default=None, help="output folder (default results/pareto-<oracle>)")


def _write_csv(path: str, result: Any, on_front: list[bool], seeds: int) -> None:
    names = list(result.evaluations[0].config) if result.evaluations else []
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["index", "phase", *names, "epsilon", "utility_mean", "utility_best", "utility_worst",
                         "error", "on_front"])
        for i, (ev, front) in enumerate(zip(result.evaluations, on_front)):
            phase = "seed" if i < seeds and result.method in ("hvpoi", "qnehvi", "random") else "search"
            writer.writerow([i, phase, *[ev.config[n] for n in names], ev.epsilon, ev.utility.mean,
                             ev.utility.best, ev.utility.worst, ev.error, int(front)])


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the search (and the random baseline when asked), write the CSV and the plots, and report.

    Args:
        args: The parsed options.

    Returns:
        The settings, the hypervolumes (mean, best and worst runs; the baseline's), the GP fits, the times, the
        Pareto ``front`` sorted by epsilon and the ``outputs`` written.

    Raises:
        ValueError: For bad input (exit status 2 via `dphype.cli.main`).
    """  # noqa: DOC502
    # lazy import: start-up: scipy and BoTorch only when the search runs
    from dphype.central.dpareto import run_search, single_thread
    from dphype.central.pareto import hypervolume, hypervolume_trace, non_dominated, plot_front, plot_hypervolume_curves

    started = time.perf_counter()
    problem = make_problem(args.oracle, runs=args.runs, seed=args.seed, accountant=args.accountant,
                           train_size=args.train_size, data_dir=args.data_dir)
    setup_seconds = time.perf_counter() - started
    reference = tuple(args.reference)
    result = run_search(problem, args.method, seeds=args.seeds, iterations=args.iterations, seed=args.seed,
                        reference=reference)
    oracle_seconds = result.oracle_seconds
    curves = {f"{args.method} (mean of runs)": result.trace}
    baseline = None
    if args.baseline == "random" and args.method != "random":
        baseline = run_search(problem, "random", seeds=args.seeds, iterations=args.iterations, seed=args.seed,
                              reference=reference)
        oracle_seconds += baseline.oracle_seconds
        curves["random (mean of runs)"] = baseline.trace

    with single_thread():  # small tensor work only; see dphype.central.dpareto.single_thread
        out = args.out or os.path.join("results", f"pareto-{args.oracle}")
        os.makedirs(out, exist_ok=True)
        mean_pts, best_pts, worst_pts = (result.points(w) for w in ("mean", "best", "worst"))
        curves[f"{args.method} (best runs)"] = hypervolume_trace(best_pts, reference)
        curves[f"{args.method} (worst runs)"] = hypervolume_trace(worst_pts, reference)
        on_front = non_dominated(mean_pts).tolist()
        csv_path = os.path.join(out, "evaluations.csv")
        _write_csv(csv_path, result, on_front, args.seeds)
        front_png = plot_front(os.path.join(out, "front.png"), mean_pts, best=best_pts, worst=worst_pts,
                               reference=reference, title=f"{args.oracle}: {args.method}")
        hv_png = plot_hypervolume_curves(os.path.join(out, "hypervolume.png"), curves,
                                         title=f"{args.oracle}: hypervolume vs evaluations")
    wall = time.perf_counter() - started
    front: list[dict[str, Any]] = [
        {"epsilon": ev.epsilon, "error": ev.error, "config": ev.config}
        for ev, keep in zip(result.evaluations, on_front) if keep
    ]
    front.sort(key=lambda f: f["epsilon"])
    summary: dict[str, Any] = {
        "oracle": args.oracle,
        "method": args.method,
        "seeds": args.seeds,
        "iterations": args.iterations,
        "evaluations": len(result.evaluations),
        "reference": list(reference),
        "delta": problem.delta,
        "hypervolume": result.hypervolume,
        "hypervolume_best_runs": hypervolume(best_pts, reference),
        "hypervolume_worst_runs": hypervolume(worst_pts, reference),
        "gp_fits": result.fits,
        "overhead_seconds": wall - setup_seconds - oracle_seconds,
        "search_overhead_seconds": result.overhead_seconds,
        "oracle_seconds": oracle_seconds,
        "setup_seconds": setup_seconds,
        "wall_seconds": wall,
        "front": front,
        "outputs": [csv_path, front_png, hv_png],
    }
    if baseline is not None:
        summary["baseline_random_hypervolume"] = baseline.hypervolume
    return summary
