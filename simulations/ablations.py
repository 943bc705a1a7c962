"""Ablations of Appendices F, G and H against DP-Hype, on the same local evaluations and ground truth.

All methods reuse the tradeoff study's arrays (each client's local score of every candidate and the
FedAvg test accuracy of every candidate, cached per configuration), so only the release differs:

* **DP-Hype**: top-k votes (:func:`dphype.selection.voting.top_k_votes`), L2 sensitivity ``sqrt(2k)``; every selection
  rule of ``--rules`` (the max-votes rule and the structure-aware ``gp`` rule of :mod:`dphype.selection.rules`) picks
  from the same releases, one row each (column ``rule``). With ``--release argmax`` the winner release is
  replayed too (:func:`simulations.tradeoff.winner_releases`: per relation of ``--neighbourings``, at the
  planner's recommended ``k`` unless ``--k`` is given; column ``k``).
* **Raw scores** (App. F): every client releases its local accuracies themselves
  (:func:`dphype.selection.voting.raw_score_votes`), L2 sensitivity ``sqrt(p)`` (``calibrate(raw_scores=True)``).
  A diverged candidate (NaN local score) is reported as accuracy 0. Real-valued reports take Gaussian
  noise whatever ``--noise`` says (which sets the integer releases' noise), calibrated with the same
  accountant.
* **Subsets** (App. H): each run assigns the clients uniformly at random to ``p`` groups of (nearly)
  equal size, one candidate per group; each client reports only its score of its group's candidate; the
  server divides each noisy group sum by the (public) group size and picks the best noisy mean. Replacing
  one client changes at most two entries by at most 1, so L2 = ``sqrt(2)``: the calibration of top-1
  votes. With ``n < p`` only ``n`` randomly chosen candidates (one client each) are evaluated per run.
* **Feathers, corrected** (App. G): a Feathers-style search keeps a distribution over the candidates and
  updates it by exponentiated gradient towards the candidates with the smallest losses. With the paper's
  corrections: every client's loss is clipped to ``[0, 1]`` (here ``1 - local accuracy``), each report
  gets local Gaussian noise (sensitivity 1; Feathers noises per client, i.e. local DP), and exactly 100
  releases are accounted for in advance by RDP composition with ``dp_accounting``
  (:func:`feathers_sigma`). Simplification: the candidates' losses are the clients' fixed local scores
  (no interleaved training phases and no architecture search).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from dphype.privacy.noise import replay_noisy_sums
from dphype.privacy.noise_kinds import resolve_accountant
from dphype.selection.rules import DEFAULT_RULE
from simulations import harness, tradeoff

METHODS: tuple[str, ...] = ("DP-Hype", "Raw scores", "Subsets", "Feathers (corrected)")
#: number of DP loss releases of the corrected Feathers (Appendix G)
FEATHERS_RELEASES = 100


def feathers_sigma(epsilon: float, delta: float, releases: int = FEATHERS_RELEASES) -> float:
    """Per-report Gaussian std so that ``releases`` sensitivity-1 releases are ``(epsilon, delta)``-DP.

    Accounted with ``dp_accounting``'s RDP accountant on ``SelfComposedDpEvent(GaussianDpEvent, releases)``
    and calibrated by ``dp_accounting.calibrate_dp_mechanism`` (Appendix G: fixed number of releases,
    a-priori RDP accounting). ``epsilon = inf`` gives 0.
    """
    if math.isinf(epsilon):
        return 0.0
    import dp_accounting
    from dp_accounting import rdp

    def event(noise_multiplier: float) -> Any:
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise_multiplier), releases)

    return float(dp_accounting.calibrate_dp_mechanism(
        rdp.RdpAccountant, event, epsilon, delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(1e-3, 1e5)))


def subsets_sums(scores: np.ndarray, repetitions: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per run: each group's sum of its clients' scores for its candidate, and the group sizes ``(reps, p)``."""
    n, p = scores.shape
    sums = np.zeros((repetitions, p))
    sizes = np.zeros((repetitions, p))
    base = np.arange(n) % p  # balanced group sizes (n < p: n groups of one client)
    for r in range(repetitions):
        group = rng.permutation(p)[base][rng.permutation(n)]  # random candidates, random clients
        np.add.at(sums[r], group, scores[np.arange(n), group])
        np.add.at(sizes[r], group, 1.0)
    return sums, sizes


def feathers_picks(scores: np.ndarray, sigma: float, repetitions: int, rng: np.random.Generator,
                   releases: int = FEATHERS_RELEASES) -> np.ndarray:
    """Candidate picked by the corrected Feathers-style search in each of ``repetitions`` runs.

    Each release: every client samples a candidate from the current distribution ``softmax(theta)``,
    reports its clipped loss ``1 - accuracy`` plus ``N(0, sigma^2)``; the server forms the
    importance-weighted loss estimate with the mean report as baseline and takes an exponentiated-gradient
    step of size ``sqrt(2 log p / releases)``. The pick is the candidate of highest probability at the end.
    """
    n, p = scores.shape
    loss = 1.0 - scores  # in [0, 1]: the clipping of Appendix G is a no-op for accuracies
    theta = np.zeros((repetitions, p))
    step = math.sqrt(2.0 * math.log(p) / releases)
    rows = np.arange(repetitions)[:, None]
    for _ in range(releases):
        prob = np.exp(theta - theta.max(axis=1, keepdims=True))
        prob /= prob.sum(axis=1, keepdims=True)
        u = rng.random((repetitions, n, 1))
        picks = (u > np.cumsum(prob, axis=1)[:, None, :]).sum(axis=2)  # inverse-CDF sampling per client
        picks = np.minimum(picks, p - 1)
        reports = loss[np.arange(n)[None, :], picks] + (sigma * rng.standard_normal((repetitions, n)) if sigma else 0.0)
        centred = (reports - reports.mean(axis=1, keepdims=True)) / n
        grad = np.zeros((repetitions, p))
        np.add.at(grad, (np.broadcast_to(rows, picks.shape), picks), centred / prob[rows, picks])
        theta -= step * grad
    return np.argmax(theta, axis=1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    harness.add_federation_arguments(parser, clients=(100,), partitions=("5", "0.5"))
    tradeoff.add_release_arguments(parser, repetitions=20)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), metavar="METHOD",
                        help=f"subset of: {'; '.join(METHODS)} (default all)")
    parser.add_argument("--flower", action="store_true",
                        help="also run DP-Hype's release for the first setting once through Flower + SecAgg+")


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    candidates = harness.candidates_from_args(args)
    release = tradeoff.release_settings(args, len(candidates))
    scale = harness.Scale.from_args(args)
    feds = harness.federations_from_args(args)
    cache = harness.cache_from_args(args)
    from dphype.ml.torch_task import load_cached

    test_labels = load_cached(args.dataset, args.data_dir)[1].y
    p, k, reps = len(candidates), release["k"], release["repetitions"]
    space = candidates.feature_space()
    rows: list[dict[str, Any]] = []
    with harness.progress_bar(harness.work_units(feds, scale), "ablations") as bar:
        for f_index, fed in enumerate(feds):
            accuracy = harness.fill_diverged(harness.cached_accuracies(fed, candidates, scale, cache, bar), test_labels)
            scores = harness.cached_scores(fed, candidates, scale, cache, bar)
            accuracies = harness.local_accuracies(scores, scale.validation)  # raw scores, Subsets, Feathers
            finite_scores = np.where(np.isfinite(accuracies), accuracies, 0.0)
            common = {"dataset": fed.dataset, "clients": fed.clients, "partition": fed.label, "candidates": p, "k": k}
            opt = float(accuracy.max())
            rows.extend(tradeoff.baseline_rows(common, accuracy))
            top_k = harness.client_votes(scores, k, maximize=True).sum(axis=0)
            raw = harness.client_raw_votes(finite_scores, maximize=True).sum(axis=0)
            for e_index, eps in enumerate(release["epsilons"]):
                rng = np.random.default_rng([args.seed, f_index, e_index])
                for method in args.methods:
                    by_rule: dict[tuple[str, str], tuple[np.ndarray, float, int]] = {}
                    if method == "DP-Hype":
                        if "sum" in release["releases"]:
                            sigma = harness.sigma_for(eps, release["delta"], k, num_candidates=p,
                                                      accountant=release["accountant"], noise=release["noise"])
                            summed, _ = tradeoff.selection_picks(top_k, sigma=sigma, clients=fed.clients,
                                                                 release=release, space=space, rng=rng)
                            by_rule |= {("sum", rule): (picks, sigma, k) for rule, picks in summed.items()}
                        if "argmax" in release["releases"]:
                            winners = tradeoff.winner_releases(scores, top_k, epsilon=eps, clients=fed.clients,
                                                               release=release, space=space, rng=rng)
                            by_rule |= {("argmax", won.rule): (won.picks, won.std, won.k) for won in winners}
                    else:
                        by_rule[("", "")] = (*_picks(method, eps, release, fed, raw, finite_scores, rng), k)
                    for (mode, rule), (picks, sigma, votes_k) in by_rule.items():
                        rows.append({**common, "k": votes_k, "method": method, "release": mode, "rule": rule,
                                     "epsilon": eps, "sigma": sigma, **tradeoff.point_stats(accuracy[picks], opt),
                                     "runs": reps})
    study.write_csv("ablations.csv", rows)
    plot(rows, release["epsilons"], study, f"ablations_{args.dataset}.png")
    extra: dict[str, Any] = {}
    if args.flower:
        from simulations.flower import flower_check

        fed = feds[0]
        accuracy = harness.fill_diverged(harness.cached_accuracies(fed, candidates, scale, cache), test_labels)
        extra["flower"] = flower_check(fed, candidates, harness.cached_scores(fed, candidates, scale, cache), accuracy,
                                       k=k, epsilon=release["epsilons"][0], delta=release["delta"])
    return study.result(**extra, dataset=args.dataset, scale=vars(scale), candidates=p, methods=list(args.methods),
                        **release, default_rule=DEFAULT_RULE, summary=summarize(rows))


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method (DP-Hype: per rule), federation and epsilon: its k, mean accuracy and gap to Opt
    (points)."""
    out = []
    for r in rows:
        opt = next(o["mean_accuracy"] for o in rows if o["method"] == "Opt" and o["clients"] == r["clients"]
                   and o["partition"] == r["partition"])
        out.append({key: r[key] for key in ("clients", "partition", "method", "rule", "k", "epsilon")}
                   | {"mean_accuracy": round(r["mean_accuracy"], 4),
                      "gap_to_opt_points": round(100 * (opt - r["mean_accuracy"]), 2) + 0.0})
    return out


def _label(row: dict[str, Any]) -> str:
    return f"{row['method']} ({row['rule']})" if row["rule"] else row["method"]


def _picks(method: str, eps: float, release: dict[str, Any], fed: harness.Federation, raw: np.ndarray,
           scores: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """The candidates the ablation ``method`` (not DP-Hype) selects in ``release['repetitions']`` runs, and the
    noise std it used."""
    p, reps = scores.shape[1], release["repetitions"]
    noise = {"clients": fed.clients, "repetitions": reps, "rng": rng, "noise": release["noise"],
             "per_client": release["per_client"]}
    calib = {"num_candidates": p, "accountant": release["accountant"], "noise": release["noise"]}
    if method == "Raw scores":
        # real-valued reports need Gaussian noise, accounted like the integer releases (same accountant)
        real = {**calib, "noise": "gaussian", "accountant": resolve_accountant(release["accountant"], release["noise"])}
        sigma = harness.sigma_for(eps, release["delta"], 1, raw_scores=True, **real)
        return np.argmax(replay_noisy_sums(raw, sigma=sigma, **{**noise, "noise": "gaussian"}), axis=1), sigma
    if method == "Subsets":
        sigma = harness.sigma_for(eps, release["delta"], 1, **calib)  # L2 = sqrt(2) = top-1 votes
        sums, sizes = subsets_sums(scores, reps, rng)
        noisy = replay_noisy_sums(sums, sigma=sigma, **noise)
        means = np.where(sizes > 0, noisy / np.maximum(sizes, 1.0), -np.inf)
        return np.argmax(means, axis=1), sigma
    sigma = feathers_sigma(eps, release["delta"])
    return feathers_picks(scores, sigma, reps, rng), sigma


def plot(rows: Sequence[dict[str, Any]], epsilons: Sequence[float], study: harness.StudyRun, filename: str) -> None:
    """Figs. 9-11 layout: one panel per federation, x = epsilon, one line per method (DP-Hype: per rule) plus
    Opt/RandGuess."""
    plt = harness.pyplot()
    feds = list(dict.fromkeys((r["clients"], r["partition"]) for r in rows))
    lines = list(dict.fromkeys(_label(r) for r in rows if r["method"] not in ("Opt", "RandGuess")))
    fig, axes = plt.subplots(1, len(feds), figsize=(3.6 * len(feds), 2.9), squeeze=False, sharey=True)
    xs = np.arange(len(epsilons))
    for ax, (n, part) in zip(axes[0], feds):
        sel = [r for r in rows if r["clients"] == n and r["partition"] == part]
        for m_index, line in enumerate(lines):
            pts = [next(r for r in sel if _label(r) == line and r["epsilon"] == e) for e in epsilons]
            ax.errorbar(xs + 0.06 * (m_index - 1.5), [r["mean_accuracy"] for r in pts], yerr=[r["ci95"] for r in pts],
                        fmt="o-", ms=3, capsize=2, label=line)
        for method, style in (("Opt", "-"), ("RandGuess", "--")):
            value = next(r["mean_accuracy"] for r in sel if r["method"] == method)
            ax.axhline(value, ls=style, color="black" if method == "Opt" else "grey", lw=1, label=method)
        ax.set_xticks(xs, ["∞" if np.isinf(e) else f"{e:g}" for e in epsilons])
        ax.set_xlabel("ε")
        ax.set_title(f"n={n}, {part}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("test accuracy")
    axes[0][-1].legend(fontsize=6, loc="lower right")
    fig.suptitle(f"{rows[0]['dataset']}: ablations (App. F raw scores, App. G Feathers, App. H Subsets)", fontsize=9,
                 y=1.03)
    study.save_figure(fig, filename)
