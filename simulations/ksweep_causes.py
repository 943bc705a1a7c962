"""Why the default ballot trails the best fixed ``k`` where it does, on the ballot grid's points.

At every point where the auto ballot (`dphype.selection.voting.auto_depth`, the shipped constants) trails the best
fixed ``k`` in hindsight by more than the worst goal (`simulations.ksweep_loto.GOAL_WORST`), this study names the
cause from the federation's own arrays (`simulations.ksweep_aware.load_federation`):

* ``collapse``: at least half of the default's releases (exactly, `dphype.privacy.winner.winner_probabilities`) go
  to candidates whose FedAvg test accuracy on this partition is within `CHANCE_BAND` points of the federation's
  lowest: candidates that score well on the clients' own rows and train to chance when federated. No score a client
  computes on its own data sees that;
* ``deeper`` / ``shallower``: the best fixed ``k`` lies above / below the default's.

Beside each, what the clients' validation accuracy itself knows: the argmax release (same epsilon and relation) of
the summed validation accuracies on the ``1 / G`` grid, ``G = 2**ACCURACY_BITS - 1``, each entry in ``[0, G]``, so
the release's noise grows with ``G`` (`dphype.privacy.winner`). Where that release also lands far from Opt, no
ballot of local scores can do better than the grid's tasks allow. Pure analysis; it releases nothing.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from dphype.ml.validation import DEFAULT_VALIDATION, check_validation
from dphype.privacy.winner import noise_std, winner_probabilities
from dphype.selection.voting import auto_depth
from simulations import harness
from simulations.ksweep_aware import Federation, depth_release, load_federation, outcome
from simulations.ksweep_loto import GOAL_WORST, Grid
from simulations.ksweep_report import read_runs, run_folders

#: Points above a federation's lowest FedAvg accuracy that count as chance.
CHANCE_BAND = 2.0
#: Bits per entry of the accuracy release, and its largest entry ``G``.
ACCURACY_BITS = 6
ACCURACY_MAX_ENTRY = 2**ACCURACY_BITS - 1


def chance_share(probabilities: np.ndarray, accuracy: np.ndarray, band: float = CHANCE_BAND) -> float:
    """The share of releases whose candidate's accuracy ``(p,)`` is within ``band`` points of the lowest."""
    return float(probabilities[100.0 * (accuracy - accuracy.min()) <= band + 1e-9].sum())


def accuracy_counts(local_accuracy: np.ndarray) -> np.ndarray:
    """``(p,)``: the clients' ``(n, p)`` validation accuracies on the grid ``1 / G`` summed (non-finite as 0)."""
    acc = np.where(np.isfinite(local_accuracy), np.clip(local_accuracy, 0.0, 1.0), 0.0)
    return np.rint(acc * ACCURACY_MAX_ENTRY).astype(np.int64).sum(axis=0)


def cause_of(fed: Federation, epsilon: float, relation: str, best_k: int) -> dict[str, Any]:
    """The default's ``k``, its expected gap, its share at chance, the accuracy release's gap and the cause."""
    n, p = fed.scores.shape[:2]
    k = auto_depth(p, noise_std(epsilon, relation), n)
    probs = depth_release(fed.scores, k, epsilon, relation)
    at_chance = chance_share(probs, fed.accuracy)
    row: dict[str, Any] = {"default_k": k, "default_gap": round(outcome(probs, fed.accuracy)[0], 3),
                           "default_at_chance": round(at_chance, 3),
                           "candidates_at_chance": int(chance_share(np.ones(p), fed.accuracy))}
    if fed.local is not None:
        row["accuracy_gap"] = round(outcome(winner_probabilities(accuracy_counts(fed.local[..., 0]), epsilon,
                                                                 relation, ACCURACY_MAX_ENTRY), fed.accuracy)[0], 3)
    row["cause"] = "collapse" if at_chance >= 0.5 else ("deeper" if best_k > k else "shallower")
    return row


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", nargs="+", required=True, metavar="DIR",
                        help="ksweep output folders (each with ksweep.csv), or folders holding them")
    parser.add_argument("--cache", required=True, help="the ksweep runs' --cache folder (each federation's arrays)")
    parser.add_argument("--candidate-list", default="table3", metavar="SPEC", help="the runs' candidate list")
    parser.add_argument("--validation", default=DEFAULT_VALIDATION, help="the runs' --validation")
    parser.add_argument("--relation", default="replace-one", choices=["replace-one", "add-remove"],
                        help="the points' neighbouring relation (default replace-one)")


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    from dphype.selection.candidates import load_candidates

    validation = check_validation(args.validation)
    runs = run_folders(args.runs)
    candidates = load_candidates(str(args.candidate_list))
    sweeps = {pt: m for pt, m in read_runs(runs)[0].items() if pt[4] == args.relation}
    if not sweeps:
        raise ValueError(f"--runs: no ksweep point with --relation {args.relation}; pass the runs of that relation")
    grid = Grid.of(sweeps, len(candidates))
    cache = harness.ArrayCache(args.cache)
    rows: list[dict[str, Any]] = []
    for i, (dataset, clients, partition, eps, relation) in enumerate(grid.points):
        best = int(grid.ks[grid.gap[i].argmin()])
        k = auto_depth(len(candidates), noise_std(eps, relation), clients)
        behind = float(grid.gap[i][grid.column(np.array([k]))[0]] - grid.gap[i].min())
        if behind <= GOAL_WORST:
            continue
        fed = load_federation(dataset, clients, partition, cache=cache, candidates=candidates,
                              validation=validation, seed=args.seed)
        rows.append({"dataset": dataset, "clients": clients, "partition": partition, "epsilon": eps,
                     "neighbouring": relation, "behind": round(behind, 3), "best_k": best,
                     "best_gap": round(float(grid.gap[i].min()), 3), **cause_of(fed, eps, relation, best)})
    study.write_csv("ksweep_causes.csv", rows)
    study.outputs.append(str(_markdown(study, rows, len(grid.points))))
    _figure(study, rows)
    counts = {c: sum(r["cause"] == c for r in rows) for c in ("collapse", "deeper", "shallower")}
    return study.result(points=len(grid.points), trailing=len(rows), causes=counts)


def _markdown(study: harness.StudyRun, rows: list[dict[str, Any]], points: int) -> Any:
    head = ("| task | n | partition | eps | behind | default k | best k | default at chance | candidates at chance | "
            "accuracy release's gap | best k's gap | cause |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(f"| {r['dataset']} | {r['clients']} | {r['partition']} | {r['epsilon']:g} | {r['behind']:.2f} | "
                   f"{r['default_k']} | {r['best_k']} | {100 * r['default_at_chance']:.0f}% | "
                   f"{r['candidates_at_chance']} | "
                   f"{r.get('accuracy_gap', float('nan')):.2f} | {r['best_gap']:.2f} | {r['cause']} |\n"
                   for r in rows)
    path = study.path("ksweep_causes.md")
    path.write_text(f"Of {points} points, {len(rows)} where the default ballot trails the best fixed k by more than "
                    f"{GOAL_WORST:g} points. \"Default at chance\": the share of its releases on candidates whose "
                    f"FedAvg accuracy is within {CHANCE_BAND:g} points of the federation's lowest. \"Accuracy "
                    "release's gap\": the expected gap to Opt (points) of the argmax release of the summed validation "
                    "accuracies at the same epsilon.\n\n" + head + body)
    return path


def _figure(study: harness.StudyRun, rows: list[dict[str, Any]]) -> None:
    from dphype.plotting import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for cause, marker in (("collapse", "x"), ("deeper", "o"), ("shallower", "s")):
        mine = [r for r in rows if r["cause"] == cause]
        ax.scatter([r["default_gap"] for r in mine], [r.get("accuracy_gap", np.nan) for r in mine], marker=marker,
                   label=f"{cause} ({len(mine)})")
    top = max([1.0] + [max(r["default_gap"], r.get("accuracy_gap", 0.0)) for r in rows])
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8)
    ax.set_xlabel("default ballot: gap to Opt (points)")
    ax.set_ylabel("accuracy release: gap to Opt (points)")
    ax.set_title("Where the default trails the best fixed k by > 3 points")
    ax.legend(fontsize=8)
    study.save_figure(fig, "ksweep_causes.png")
