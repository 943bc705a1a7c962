"""The argmax release's ``k``: the measured sweep against the planner's advice.

For every federation (the tradeoff study's cached arrays: each client's local scores and the FedAvg test
accuracy of every candidate), every epsilon and every neighbouring relation of ``--neighbourings``:

* the winner release (:func:`dphype.privacy.winner.replay_winners`) is replayed ``--repetitions`` times at every
  ``k`` of ``--ks`` (default the planner's list, :data:`dphype.selection.planner.KS`), with **common random
  numbers**: each ``k`` gets the same noise draws, so the difference between two ``k`` is the votes' alone
  and its paired confidence interval is tight. Per ``k``: the gap to Opt in accuracy points with its 95% CI;
* the planner (:func:`simulations.tradeoff.winner_plan`, as ``dphype plan --release argmax --neighbouring R``
  gives it) is asked for its ``k`` under each scenario of ``--consensus``; its simulated success for every
  ``k`` goes beside the measured gap;
* **agreement**: the planner's ``k`` agrees with the sweep when the gap at its ``k`` is at most
  :data:`TOLERANCE` points above the sweep's smallest gap, or the 95% CI of the paired difference (the same
  releases at both ``k``) contains 0. The regret (gap at the planner's ``k`` minus the smallest gap) is
  reported either way.

The planner sees no data: it answers from ``n``, epsilon, the relation and its scenario alone, so one call
serves every federation with the same ``n``.

**Ballots**: every ballot of ``--ballots`` (names of :class:`dphype.selection.voting.Ballot`, e.g.
``rank:20:2`` or ``score:0.05``) is cast by every client on the same scores and replayed on the same seeds
(noise scaled by its largest entry, :func:`dphype.privacy.winner.noise_parameter`; an ``auto`` ballot resolved at each
point with all ``n`` clients voting, :meth:`dphype.selection.voting.Ballot.resolve`). ``ksweep_ballots.csv`` has,
per point and ballot, the gap to Opt, the shares of releases within 1 and 2 points of Opt, and how far it trails
the best fixed ``k`` in hindsight (paired over the same releases); the result's ``ballot_summary`` summarises each
ballot over the grid (largest and mean regret against the best ``k``, the smallest share within 2 points).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

from dphype.checks import NEIGHBOURING
from dphype.privacy.winner import discrete_laplace, noise_std, report_noisy_max
from dphype.selection.planner import KS, read_consensus
from dphype.selection.voting import Ballot, check_ballot
from simulations import harness, tradeoff

#: Accuracy points by which the planner's ``k`` may trail the sweep's best and still agree with it.
TOLERANCE = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    harness.add_federation_arguments(parser, clients=(10, 20, 50), partitions=("iid", "0.5"))
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.1, 0.25, 0.5, 1.0, 3.0],
                        help="privacy budgets, finite (default 0.1 0.25 0.5 1 3)")
    parser.add_argument("--delta", type=float, default=1e-5, help="the planner's delta (the release is pure DP)")
    parser.add_argument("--ks", type=int, nargs="+", default=None,
                        help=f"votes per client to sweep (default the planner's: {' '.join(map(str, KS))}, "
                             "below the number of candidates)")
    parser.add_argument("--repetitions", type=int, default=500, help="winner releases per point (default 500)")
    parser.add_argument("--neighbourings", nargs="+", choices=NEIGHBOURING, default=list(NEIGHBOURING),
                        help="neighbouring relations (default both)")
    parser.add_argument("--consensus", nargs="+", default=["moderate"],
                        help="the planner's consensus scenarios to compare (default moderate, as dphype plan)")
    parser.add_argument("--ballots", nargs="+", default=[],
                        help="graded ballots to measure beside top-k at every k (e.g. rank:20:2 score:0.05; "
                             "default none)")


def settings(args: argparse.Namespace, num_candidates: int) -> dict[str, Any]:
    """Validated options (``ValueError`` naming the option, before any work)."""
    epsilons = harness.check_epsilons(args.epsilons)
    if any(np.isinf(e) for e in epsilons):
        raise ValueError("epsilons must be finite for the k sweep (without noise the planner has no k to advise)")
    ks = [harness.check_int("ks", k, 1) for k in (KS if args.ks is None else args.ks)]
    ks = sorted({k for k in ks if k < num_candidates})
    if not ks:
        raise ValueError(f"ks must contain at least one k in [1, {num_candidates - 1}], got {args.ks!r}")
    return {"epsilons": epsilons, "delta": harness.check_delta(args.delta), "ks": ks,
            "repetitions": harness.check_int("repetitions", args.repetitions, 2),
            "neighbourings": list(dict.fromkeys(args.neighbourings)),
            "consensus": list(dict.fromkeys(read_consensus(c) for c in args.consensus)),
            "ballots": list(dict.fromkeys(check_ballot(b) for b in args.ballots))}


def paired_gap(accuracy: np.ndarray, picks: np.ndarray, best_picks: np.ndarray) -> tuple[float, float]:
    """The regret of ``picks`` against ``best_picks`` over the same releases: mean and 95% CI half-width (points)
    of ``accuracy[best_picks] - accuracy[picks]`` (the mean is the difference of the two gaps to Opt)."""
    return harness.mean_ci(100.0 * (accuracy[best_picks] - accuracy[picks]))


def within(accuracy: np.ndarray, opt: float, picks: np.ndarray, points: float) -> float:
    """The share of releases whose pick is within ``points`` accuracy points of Opt."""
    return float(np.mean(100.0 * (opt - accuracy[picks]) <= points + 1e-9))


def agrees(regret: float, half_width: float) -> bool:
    """Whether a ``k`` with this regret (points, :func:`paired_gap`) agrees with the best: within
    :data:`TOLERANCE`, or not significantly worse."""
    return regret <= TOLERANCE + 1e-9 or regret - half_width <= 0.0


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    candidates = harness.candidates_from_args(args)
    p = len(candidates)
    opts = settings(args, p)
    scale = harness.Scale.from_args(args)
    feds = harness.federations_from_args(args)
    cache = harness.cache_from_args(args)
    from dphype.ml.torch_task import load_cached

    test_labels = load_cached(args.dataset, args.data_dir)[1].y
    space = candidates.feature_space()
    advice_cache: dict[tuple[Any, ...], Any] = {}

    def planner(clients: int, eps: float, relation: str, consensus: Any) -> Any:
        key = (clients, eps, relation, consensus)
        if key not in advice_cache:
            advice_cache[key] = tradeoff.winner_plan(clients, eps, relation, delta=opts["delta"], space=space,
                                                     num_candidates=p, consensus=consensus, ks=opts["ks"])
        return advice_cache[key]

    rows: list[dict[str, Any]] = []
    advice: list[dict[str, Any]] = []
    ballot_rows: list[dict[str, Any]] = []
    ballots = {name: Ballot.parse(name) for name in opts["ballots"]}
    with harness.progress_bar(harness.work_units(feds, scale), "ksweep") as bar:
        for f_index, fed in enumerate(feds):
            accuracy = harness.fill_diverged(harness.cached_accuracies(fed, candidates, scale, cache, bar), test_labels)
            scores = harness.cached_scores(fed, candidates, scale, cache, bar)
            opt = float(accuracy.max())
            counts = {k: harness.client_votes(scores, k, maximize=True).sum(axis=0) for k in opts["ks"]}
            graded: dict[Ballot, np.ndarray] = {}  # the counts of each resolved ballot (auto's k depends on epsilon)
            for e_index, eps in enumerate(opts["epsilons"]):
                for r_index, relation in enumerate(opts["neighbourings"]):
                    # the same draws for every k (common random numbers): drawn once, as each k's replay would
                    noise = discrete_laplace((opts["repetitions"], p), epsilon=eps, neighbouring=relation,
                                             rng=np.random.default_rng([args.seed, f_index, e_index, r_index]))
                    picks = {k: report_noisy_max(counts[k] + noise).astype(np.int64) for k in opts["ks"]}
                    gaps = {k: harness.mean_ci(100.0 * (opt - accuracy[picks[k]])) for k in opts["ks"]}
                    best_k = min(opts["ks"], key=lambda k: (gaps[k][0], k))
                    plans = {c: planner(fed.clients, eps, relation, c) for c in opts["consensus"]}
                    common = {"dataset": fed.dataset, "clients": fed.clients, "partition": fed.label,
                              "epsilon": eps, "neighbouring": relation}
                    for name, b in ballots.items():  # the same seeds again
                        b = b.resolve(p, noise_std(eps, relation), fed.clients)
                        if b not in graded:
                            graded[b] = np.stack([b.cast(row, 1) for row in scores]).sum(axis=0)
                        if b.max_entry == 1:
                            mine = report_noisy_max(graded[b] + noise).astype(np.int64)
                        else:
                            rng = np.random.default_rng([args.seed, f_index, e_index, r_index])
                            mine, _ = tradeoff.winner_picks(graded[b], epsilon=eps, relation=relation,
                                                            repetitions=opts["repetitions"], rng=rng,
                                                            sensitivity=b.max_entry)
                        gap = harness.mean_ci(100.0 * (opt - accuracy[mine]))
                        regret, half = paired_gap(accuracy, mine, picks[best_k])
                        ballot_rows.append({**common, "ballot": name, "depth": b.depth, "gap_points": round(gap[0], 3),
                                            "ci95": round(gap[1], 3), "within_1pt": within(accuracy, opt, mine, 1),
                                            "within_2pt": within(accuracy, opt, mine, 2), "best_k": best_k,
                                            "best_k_gap_points": round(gaps[best_k][0], 3),
                                            "behind_best_k_points": round(regret, 3), "paired_ci95": round(half, 3)})
                    for k in opts["ks"]:
                        row = {**common, "k": k, "gap_points": round(gaps[k][0], 3), "ci95": round(gaps[k][1], 3),
                               "within_1pt": within(accuracy, opt, picks[k], 1),
                               "within_2pt": within(accuracy, opt, picks[k], 2)}
                        for c, pl in plans.items():
                            row[f"success_{c}"] = next(r["success_winner"] for r in pl.by_k if r["k"] == k)
                        rows.append(row)
                    for c, pl in plans.items():
                        k = int(pl.recommended_k_winner)
                        regret, half = paired_gap(accuracy, picks[k], picks[best_k])
                        advice.append({**common, "consensus": c, "planner_k": k,
                                       "planner_gap_points": round(gaps[k][0], 3), "best_k": best_k,
                                       "best_gap_points": round(gaps[best_k][0], 3), "regret_points": round(regret, 3),
                                       "paired_ci95": round(half, 3), "agrees": agrees(regret, half)})
    study.write_csv("ksweep.csv", rows)
    study.write_csv("ksweep_advice.csv", advice)
    if ballot_rows:
        study.write_csv("ksweep_ballots.csv", ballot_rows)
    plot(rows, advice, study, f"ksweep_{args.dataset}.png")
    return study.result(dataset=args.dataset, scale=vars(scale), candidates=p, **opts, tolerance_points=TOLERANCE,
                        agreement=agreement(advice), advice=advice, ballot_summary=ballot_summary(ballot_rows))


def ballot_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per ballot over the grid: the points, the largest and mean gap behind the best ``k`` in hindsight (points),
    and the smallest share of releases within 2 points of Opt."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(r["ballot"] for r in rows):
        mine = [r for r in rows if r["ballot"] == name]
        behind = [r["behind_best_k_points"] for r in mine]
        out[name] = {"points": len(mine), "max_behind_best_k_points": round(float(np.max(behind)), 3),
                     "mean_behind_best_k_points": round(float(np.mean(behind)), 3),
                     "min_within_2pt": round(min(r["within_2pt"] for r in mine), 4)}
    return out


def agreement(advice: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per consensus scenario: points where the planner's ``k`` agrees, of all, and the mean and largest regret."""
    out: dict[str, Any] = {}
    for c in dict.fromkeys(a["consensus"] for a in advice):
        mine = [a for a in advice if a["consensus"] == c]
        regrets = [a["regret_points"] for a in mine]
        out[str(c)] = {"agrees": sum(a["agrees"] for a in mine), "points": len(mine),
                       "mean_regret_points": round(float(np.mean(regrets)), 3),
                       "max_regret_points": round(float(np.max(regrets)), 3)}
    return out


def plot(rows: Sequence[dict[str, Any]], advice: Sequence[dict[str, Any]], study: harness.StudyRun,
         filename: str) -> None:
    """One row of panels per federation, one column per relation: gap to Opt against ``k`` (log axis), one line
    per epsilon; the planner's ``k`` (first scenario) marked with a circle."""
    plt = harness.pyplot()
    feds = list(dict.fromkeys((r["clients"], r["partition"]) for r in rows))
    relations = list(dict.fromkeys(r["neighbouring"] for r in rows))
    fig, axes = plt.subplots(len(feds), len(relations), figsize=(3.4 * len(relations), 2.6 * len(feds)),
                             squeeze=False, sharey=True)
    first = advice[0]["consensus"]
    for i, (n, part) in enumerate(feds):
        for j, rel in enumerate(relations):
            ax = axes[i][j]
            mine = [r for r in rows if (r["clients"], r["partition"], r["neighbouring"]) == (n, part, rel)]
            for eps in dict.fromkeys(r["epsilon"] for r in mine):
                line = [r for r in mine if r["epsilon"] == eps]
                (drawn,) = ax.plot([r["k"] for r in line], [r["gap_points"] for r in line], marker=".",
                                   label=f"ε={eps:g}")
                chosen = next(a for a in advice if (a["clients"], a["partition"], a["neighbouring"], a["epsilon"],
                                                    a["consensus"]) == (n, part, rel, eps, first))
                ax.plot([chosen["planner_k"]], [chosen["planner_gap_points"]], "o", mfc="none", ms=9,
                        color=drawn.get_color())
            ax.set_xscale("log")
            ax.set_title(f"n={n} {part}, {rel}", fontsize=8)
            ax.set_xlabel("k")
        axes[i][0].set_ylabel("gap to Opt (points)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    study.save_figure(fig, filename)
