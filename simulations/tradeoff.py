"""Privacy-utility trade-off of Section V-C (Figs. 4, 5, 12, 13): DP-Hype vs Opt vs RandGuess.

For every federation (data set, ``n`` clients, iid or Dirichlet ``beta``):

* the FedAvg test accuracy of every candidate (5 rounds x 5 local epochs, all candidates batched by
  :func:`dphype.ml.training.fedavg`) is computed once; **Opt** is the best of them, **RandGuess** their mean
  (the expected accuracy of a random pick, Section V-B);
* every client scores every candidate on its local data (:meth:`dphype.ml.torch_task.TorchTask.score`: validation
  accuracy, ties broken by validation loss, then by candidate order) and votes for its top ``k = 5``
  (:func:`dphype.selection.voting.top_k_votes`), once;
* for every ``epsilon`` the noisy vote sum is drawn ``--repetitions`` times
  (:func:`dphype.privacy.noise.replay_noisy_sums`: per-client shares, summed), and every selection rule of
  ``--rules`` (:mod:`dphype.selection.rules`: the max-votes rule and the structure-aware ``gp`` rule) picks a
  candidate from the SAME releases; **DP-Hype**'s accuracy is the FedAvg accuracy of the pick. Per point:
  mean with 95% CI, the share of runs within 1 point of Opt, the worst 5% accuracy (5th percentile) and
  the share of picks no client voted for.
  The JSON ``summary`` rows describe the product's default rule (:data:`dphype.selection.rules.DEFAULT_RULE`),
  with the argmax's numbers beside them.
* with ``--release argmax`` (or ``sum argmax``) the winner-only release of :mod:`dphype.privacy.winner` is
  replayed too (:func:`dphype.privacy.winner.replay_winners`: the committee's discrete Laplace shares summed, the noisy
  maximum with lowest-index ties, as the tallies compute it), for each relation of ``--neighbourings``, at
  :func:`winner_k`'s ``k`` (``--k`` when given, else the planner's recommendation for that point); its rows
  have ``release = argmax``, rule ``noisy-max/<relation>`` and their ``k``, and ``winner_summary`` in the JSON
  gives their gap to Opt.

Repetitions replay the release's noise; local training and the partition are fixed by ``--seed`` (the
paper's 20 runs also retrain, so its CIs include training variance; ours are noise-only).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dphype.checks import NEIGHBOURING
from dphype.privacy.noise import replay_noisy_sums
from dphype.privacy.noise_kinds import resolve_accountant
from dphype.privacy.winner import noise_std, replay_winners
from dphype.release import RELEASE_MODES, ArgmaxRelease
from dphype.selection.planner import plan, read_consensus
from dphype.selection.rules import DEFAULT_RULE, rule_names, select_batch
from simulations import harness

EPSILONS: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 3.0, float("inf"))
#: Votes per client when ``--k`` is not given (Section V-B), except for the argmax release (:func:`winner_k`).
DEFAULT_K = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # every default n with every default partition: Adult's Dirichlet 0.5 split cannot give 250 clients 10 rows each
    # (the paper's n = 250 runs use beta = 2: --clients 250 --betas iid 30 5 2)
    harness.add_federation_arguments(parser, clients=(20, 50, 100), partitions=("iid", "30", "5", "0.5"))
    add_release_arguments(parser, repetitions=20)
    parser.add_argument("--flower", action="store_true",
                        help="also run the first configuration once through Flower + SecAgg+ and record its pick")


def add_release_arguments(parser: argparse.ArgumentParser, *, repetitions: int) -> None:
    """Privacy options of one DP-Hype release (shared with the ablations)."""
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS),
                        help="privacy budgets, 'inf' = no noise (default 0.1 0.25 0.5 1 3 inf)")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--k", type=int, default=None,
                        help=f"votes per client (default {DEFAULT_K}, Section V-B; the argmax release: the "
                             "planner's recommended k for each clients, epsilon and relation)")
    parser.add_argument("--repetitions", type=int, default=repetitions,
                        help=f"noisy releases per setting (default {repetitions})")
    harness.add_noise_arguments(parser)
    parser.add_argument("--rules", nargs="+", choices=rule_names(), default=list(rule_names()),
                        help=f"selection rules applied to the same releases (default all; default rule {DEFAULT_RULE})")
    parser.add_argument("--total-noise", action="store_true",
                        help="draw the summed noise at once instead of one share per client (same distribution)")
    parser.add_argument("--release", nargs="+", choices=RELEASE_MODES.names(), default=["sum"],
                        help="release modes replayed on the same votes: sum (the noisy vote sum, default) and/or "
                             "argmax (only the winner, pure epsilon; dphype.privacy.winner)")
    parser.add_argument("--neighbourings", nargs="+", choices=NEIGHBOURING, default=["replace-one"],
                        help="argmax release: neighbouring relations to calibrate for (default replace-one)")
    parser.add_argument("--consensus", default="moderate",
                        help="argmax release without --k: the planner's consensus scenario for its k (strong, "
                             "moderate (default, as dphype plan), weak, or a number > 0)")


def release_settings(args: argparse.Namespace, num_candidates: int) -> dict[str, Any]:
    """Validated privacy settings (``ValueError`` before any work)."""
    resolve_accountant(args.accountant, args.noise)  # Skellam needs the RDP accountant
    k = harness.check_int("k", DEFAULT_K if args.k is None else args.k, 1)
    if k > num_candidates:
        raise ValueError(f"k must be in [1, {num_candidates}] (number of candidates), got {k}")
    return {
        "epsilons": harness.check_epsilons(args.epsilons),
        "delta": harness.check_delta(args.delta),
        "k": k,
        "planner_k": args.k is None,
        "consensus": read_consensus(args.consensus),
        "repetitions": harness.check_int("repetitions", args.repetitions, 1),
        "accountant": args.accountant,
        "noise": harness.check_noise(args.noise),
        "per_client": not args.total_noise,
        "rules": list(dict.fromkeys(args.rules)),
        "releases": list(dict.fromkeys(args.release)),
        "neighbourings": list(dict.fromkeys(args.neighbourings)),
    }


def winner_plan(clients: int, epsilon: float, relation: str, *, delta: float, space: Any, num_candidates: int,
                consensus: Any = "moderate", ks: Sequence[int] | None = None) -> Any:
    """The planner's prediction for the winner release at one point, as ``dphype plan --release argmax
    --neighbouring R`` gives it (``recommended_k_winner``, ``by_k``'s ``success_winner``), without the searches.
    The sum release's success is asked for the max-votes rule: the winner's ``k`` does not depend on it, and
    the GP rule's simulation would cost most of the call."""
    return plan(clients, epsilon, delta, space, num_candidates, neighbouring=relation, release=ArgmaxRelease(),
                consensus=consensus, ks=ks, rule="max-votes", search=False)


def winner_k(release: dict[str, Any], *, clients: int, epsilon: float, relation: str, space: Any,
             num_candidates: int) -> int:
    """The k of the argmax release at one point: ``--k`` when given, else the planner's recommendation
    (:func:`winner_plan`; epsilon = inf: ``--k``'s default)."""
    if not release["planner_k"] or np.isinf(epsilon):
        return int(release["k"])
    return int(winner_plan(clients, epsilon, relation, delta=release["delta"], space=space,
                           num_candidates=num_candidates, consensus=release["consensus"]).recommended_k_winner)


def winner_picks(vote_sum: np.ndarray, *, epsilon: float, relation: str, repetitions: int,
                 rng: np.random.Generator, sensitivity: int = 1) -> tuple[np.ndarray, float]:
    """Argmax-mode picks of ``repetitions`` winner releases (:func:`dphype.privacy.winner.replay_winners`) under the
    neighbouring ``relation`` for ballots of largest entry ``sensitivity``, and the std of the committee's noise
    (one discrete Laplace per count, sampled in the MPC); ``epsilon = inf``: the noiseless argmax (lowest index
    among ties) and std 0."""
    if np.isinf(epsilon):
        return np.full(repetitions, int(np.argmax(vote_sum))), 0.0
    picks = replay_winners(vote_sum, epsilon=epsilon, neighbouring=relation, repetitions=repetitions, rng=rng,
                           sensitivity=sensitivity)
    return picks, noise_std(epsilon, relation, sensitivity)


@dataclass(frozen=True)
class WinnerEvent:
    """The argmax release replayed at one point for one neighbouring relation."""

    rule: str  #: ``noisy-max/<relation>``
    k: int  #: votes per client (:func:`winner_k`)
    counts: np.ndarray  #: the noiseless vote counts at ``k``
    picks: np.ndarray  #: the released winners
    std: float  #: the total noise std per count


def winner_releases(scores: np.ndarray, votes: np.ndarray, *, epsilon: float, clients: int,
                    release: dict[str, Any], space: Any, rng: np.random.Generator) -> list[WinnerEvent]:
    """The argmax release for each relation of ``release['neighbourings']``, at :func:`winner_k`'s ``k``:
    ``votes`` (the vote counts at ``release['k']``) are reused when that is the ``k``, otherwise the clients'
    ``scores`` are voted again at it."""
    out = []
    for relation in release["neighbourings"]:
        k = winner_k(release, clients=clients, epsilon=epsilon, relation=relation, space=space,
                     num_candidates=len(votes))
        counts = votes if k == release["k"] else harness.client_votes(scores, k, maximize=True).sum(axis=0)
        picks, std = winner_picks(counts, epsilon=epsilon, relation=relation, repetitions=release["repetitions"],
                                  rng=rng)
        out.append(WinnerEvent(f"noisy-max/{relation}", k, counts, picks, std))
    return out


def selection_picks(
    vote_sum: np.ndarray,
    *,
    sigma: float,
    clients: int,
    release: dict[str, Any],
    space: Any,
    rng: np.random.Generator,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The picks of every rule in ``release['rules']`` on the same ``release['repetitions']`` noisy releases,
    and the seconds each rule took for all of them."""
    noisy = replay_noisy_sums(vote_sum, sigma=sigma, clients=clients, repetitions=release["repetitions"], rng=rng,
                            noise=release["noise"], per_client=release["per_client"])
    picks, seconds = {}, {}
    for rule in release["rules"]:
        start = time.perf_counter()
        picks[rule] = select_batch(noisy, space, sigma, rule=rule, clients=clients, k=release["k"]).picks
        seconds[rule] = time.perf_counter() - start
    return picks, seconds


def point_stats(picked: np.ndarray, opt: float, picked_votes: np.ndarray | None = None) -> dict[str, float]:
    """Mean accuracy with the 95% CI half-width, shares of runs within 1 and 2 points of Opt, worst 5% accuracy
    (the 5th percentile: 5% of the runs are at or below it) and, given the noiseless votes of the picks, the
    share of picks that no client voted for."""
    mean, half = harness.mean_ci(picked)
    out = {"mean_accuracy": mean, "ci95": half, "within_1pt": float(np.mean(opt - picked <= 0.01 + 1e-12)),
           "within_2pt": float(np.mean(opt - picked <= 0.02 + 1e-12)),
           "worst5_accuracy": float(np.quantile(picked, 0.05, method="inverted_cdf"))}
    if picked_votes is not None:
        out["zero_vote_share"] = float(np.mean(picked_votes == 0))
    return out


def baseline_rows(common: dict[str, Any], accuracy: np.ndarray,
                  votes: np.ndarray | None = None) -> list[dict[str, Any]]:
    """The Opt row (the best candidate, always picked) and the RandGuess row (a uniformly random candidate:
    its exact distribution over ``accuracy``) in :func:`point_stats`' columns, with no CI (nothing is sampled)."""
    best = int(np.argmax(accuracy))
    opt = float(accuracy[best])
    return [
        {**common, "method": method, "release": "", "rule": "", "epsilon": "", "sigma": "",
         **point_stats(picked, opt, None if votes is None else votes[chosen]), "ci95": 0.0, "runs": 1}
        for method, picked, chosen in (("Opt", accuracy[[best]], [best]),
                                       ("RandGuess", accuracy, slice(None)))
    ]


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    candidates = harness.candidates_from_args(args)
    release = release_settings(args, len(candidates))
    scale = harness.Scale.from_args(args)
    feds = harness.federations_from_args(args)
    cache = harness.cache_from_args(args)
    from dphype.ml.torch_task import load_cached

    test_labels = load_cached(args.dataset, args.data_dir)[1].y
    rows: list[dict[str, Any]] = []
    per_candidate: list[dict[str, Any]] = []
    space = candidates.feature_space()
    timing: dict[str, float] = {}
    with harness.progress_bar(harness.work_units(feds, scale), "tradeoff") as bar:
        for f_index, fed in enumerate(feds):
            accuracy = harness.fill_diverged(harness.cached_accuracies(fed, candidates, scale, cache, bar), test_labels)
            scores = harness.cached_scores(fed, candidates, scale, cache, bar)
            votes = harness.client_votes(scores, release["k"], maximize=True).sum(axis=0)
            local_accuracy = harness.local_accuracies(scores, scale.validation)
            common = {"dataset": fed.dataset, "clients": fed.clients, "partition": fed.label,
                      "candidates": len(candidates), "k": release["k"]}
            opt = float(accuracy.max())
            rows.extend(baseline_rows(common, accuracy, votes))
            for e_index, eps in enumerate(release["epsilons"]):
                sigma = harness.sigma_for(eps, release["delta"], release["k"], num_candidates=len(candidates),
                                          accountant=release["accountant"], noise=release["noise"])
                rng = np.random.default_rng([args.seed, f_index, e_index])
                if "sum" in release["releases"]:
                    picks, seconds = selection_picks(votes, sigma=sigma, clients=fed.clients, release=release,
                                                     space=space, rng=rng)
                    for rule, chosen in picks.items():
                        timing[rule] = timing.get(rule, 0.0) + seconds[rule]
                        rows.append({**common, "method": "DP-Hype", "release": "sum", "rule": rule, "epsilon": eps,
                                     "sigma": sigma, **point_stats(accuracy[chosen], opt, votes[chosen]),
                                     "runs": release["repetitions"]})
                winners = (winner_releases(scores, votes, epsilon=eps, clients=fed.clients, release=release,
                                           space=space, rng=rng) if "argmax" in release["releases"] else [])
                for won in winners:
                    rows.append({**common, "k": won.k, "method": "DP-Hype", "release": "argmax", "rule": won.rule,
                                 "epsilon": eps, "sigma": won.std,
                                 **point_stats(accuracy[won.picks], opt, won.counts[won.picks]),
                                 "runs": release["repetitions"]})
            for j, cand in enumerate(candidates):
                per_candidate.append({**common, "candidate": j, **cand, "fedavg_accuracy": float(accuracy[j]),
                                      "votes": int(votes[j]),
                                      "mean_local_score": float(np.nanmean(local_accuracy[:, j]))})
    study.write_csv("tradeoff.csv", rows)
    study.write_csv("tradeoff_candidates.csv", per_candidate)
    plot(rows, release["epsilons"], study, f"tradeoff_{args.dataset}.png")
    extra: dict[str, Any] = {}
    if args.flower:  # one configuration once through Flower + SecAgg+ (first federation, first epsilon)
        from simulations.flower import flower_check

        fed = feds[0]
        accuracy = harness.fill_diverged(harness.cached_accuracies(fed, candidates, scale, cache), test_labels)
        extra["flower"] = flower_check(fed, candidates, harness.cached_scores(fed, candidates, scale, cache), accuracy,
                                       k=release["k"], epsilon=release["epsilons"][0], delta=release["delta"])
    return study.result(dataset=args.dataset, scale=vars(scale), candidates=len(candidates),
                        **{k: v for k, v in release.items()}, default_rule=DEFAULT_RULE,
                        select_seconds={rule: round(t, 3) for rule, t in timing.items()},
                        summary=summarize(rows) if "sum" in release["releases"] else [],
                        winner_summary=winner_summary(rows), **extra)


def winner_summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per federation, epsilon and relation, the argmax release's gap to Opt (points), share within 1 point of
    Opt and worst 5% gap; beside it the sum release's default rule at the same point when it ran."""
    out = []
    for row in rows:
        if row["method"] != "DP-Hype" or row["release"] != "argmax":
            continue
        same = [r for r in rows if r["clients"] == row["clients"] and r["partition"] == row["partition"]]
        opt = next(r["mean_accuracy"] for r in same if r["method"] == "Opt")
        entry = {"clients": row["clients"], "partition": row["partition"], "epsilon": row["epsilon"], "k": row["k"],
                 "neighbouring": row["rule"].split("/", 1)[1],
                 "gap_to_opt_points": round(100 * (opt - row["mean_accuracy"]), 2) + 0.0,
                 "within_1pt": round(row["within_1pt"], 3), "within_2pt": round(row["within_2pt"], 3),
                 "worst5_gap_points": round(100 * (opt - row["worst5_accuracy"]), 2) + 0.0}
        summed = next((r for r in same if r["method"] == "DP-Hype" and r["release"] == "sum"
                       and r["rule"] == DEFAULT_RULE and r["epsilon"] == row["epsilon"]), None)
        if summed is not None:
            entry["sum_gap_to_opt_points"] = round(100 * (opt - summed["mean_accuracy"]), 2) + 0.0
            entry["sum_k"] = summed["k"]
        out.append(entry)
    return out


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per federation and epsilon, the product's default rule (or, if it did not run, the first rule): its
    gap to Opt and margin over RandGuess (accuracy points), share of runs within 1 point of Opt and worst 5%
    gap, with the max-votes rule's gap, share and worst 5% gap beside them."""
    ran = list(dict.fromkeys(r["rule"] for r in rows if r["method"] == "DP-Hype"))
    main_rule = DEFAULT_RULE if DEFAULT_RULE in ran else ran[0]
    out = []
    for row in rows:
        if row["method"] != "DP-Hype" or row["rule"] != main_rule:
            continue
        same = [r for r in rows if r["clients"] == row["clients"] and r["partition"] == row["partition"]]
        opt = next(r["mean_accuracy"] for r in same if r["method"] == "Opt")
        rand = next(r["mean_accuracy"] for r in same if r["method"] == "RandGuess")
        entry = {"clients": row["clients"], "partition": row["partition"], "epsilon": row["epsilon"],
                 "rule": main_rule, "dphype": round(row["mean_accuracy"], 4),
                 "gap_to_opt_points": round(100 * (opt - row["mean_accuracy"]), 2) + 0.0,
                 "over_randguess_points": round(100 * (row["mean_accuracy"] - rand), 2),
                 "within_1pt": round(row["within_1pt"], 3), "within_2pt": round(row["within_2pt"], 3),
                 "worst5_gap_points": round(100 * (opt - row["worst5_accuracy"]), 2),
                 "zero_vote_share": round(row["zero_vote_share"], 4)}
        argmax = next((r for r in same if r["method"] == "DP-Hype" and r["rule"] == "max-votes"
                       and r["epsilon"] == row["epsilon"]), None)
        if argmax is not None and main_rule != "max-votes":
            entry.update({"max_votes_gap_to_opt_points": round(100 * (opt - argmax["mean_accuracy"]), 2),
                          "max_votes_within_1pt": round(argmax["within_1pt"], 3),
                          "max_votes_within_2pt": round(argmax["within_2pt"], 3),
                          "max_votes_worst5_gap_points": round(100 * (opt - argmax["worst5_accuracy"]), 2),
                          "max_votes_zero_vote_share": round(argmax["zero_vote_share"], 4)})
        out.append(entry)
    return out


def plot(rows: Sequence[dict[str, Any]], epsilons: Sequence[float], study: harness.StudyRun, filename: str) -> None:
    """Figs. 4/5/12/13 layout: one panel per (n, partition); x = epsilon; DP-Hype (one line per rule) with 95% CI,
    Opt, RandGuess."""
    plt = harness.pyplot()
    clients = sorted({r["clients"] for r in rows})
    parts = list(dict.fromkeys(r["partition"] for r in rows))
    fig, axes = plt.subplots(len(clients), len(parts), figsize=(3.2 * len(parts), 2.6 * len(clients)),
                             squeeze=False, sharey=True)
    xs = np.arange(len(epsilons))
    labels = ["∞" if np.isinf(e) else f"{e:g}" for e in epsilons]
    for i, n in enumerate(clients):
        for j, part in enumerate(parts):
            ax = axes[i][j]
            sel = [r for r in rows if r["clients"] == n and r["partition"] == part]
            for offset, rule in enumerate(dict.fromkeys(r["rule"] for r in sel if r["method"] == "DP-Hype")):
                dp = [next(r for r in sel if r["method"] == "DP-Hype" and r["rule"] == rule and r["epsilon"] == e)
                      for e in epsilons]
                ax.errorbar(xs + 0.08 * offset, [r["mean_accuracy"] for r in dp], yerr=[r["ci95"] for r in dp],
                            fmt="o-", ms=3, capsize=2, label=f"DP-Hype ({rule})")
            for method, style in (("Opt", "-"), ("RandGuess", "--")):
                value = next(r["mean_accuracy"] for r in sel if r["method"] == method)
                ax.axhline(value, ls=style, color="grey" if method == "RandGuess" else "black", lw=1, label=method)
            ax.set_xticks(xs, labels)
            ax.set_title(f"n={n}, {part}", fontsize=9)
            ax.grid(alpha=0.3)
            ax.set_ylim(0, 1)
            if i == len(clients) - 1:
                ax.set_xlabel("ε")
        axes[i][0].set_ylabel("test accuracy")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    winner_ks = sorted({r["k"] for r in rows if r["release"] == "argmax"})
    winner = f"; argmax release k = {'/'.join(map(str, winner_ks))}" if winner_ks else ""
    fig.suptitle(f"{rows[0]['dataset']}: DP-Hype vs Opt vs RandGuess (k={rows[0]['k']}{winner}, "
                 f"{rows[0]['candidates']} candidates)", fontsize=9, y=1.03)
    study.save_figure(fig, filename)
