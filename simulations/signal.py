"""The clients' local signal: where each validation scheme's votes land against Opt, without noise and released.

Every client scores every candidate under each scheme of ``--validations`` (:mod:`dphype.ml.validation`: the
paper's one 80/20 split, k-fold cross-validation, repeated splits, each ranking by accuracy or by loss first);
the federation's ground truth (each candidate's FedAvg test accuracy, Opt its best) is shared by all schemes. Per
federation and scheme, ``signal.csv`` holds:

* how well the clients' own rankings order the candidates by their FedAvg test accuracy (Spearman's correlation,
  the mean over clients);
* the **noiseless vote's gap** (accuracy points behind Opt of the noiseless top-k winner, the lowest index among
  tied counts, as ``dphype bench ksweep`` at epsilon ``inf``) at the best fixed ``k`` of ``--ks``, its mean over
  ``--ks``, and at the ``auto`` ballot's ``k`` (:meth:`dphype.selection.voting.Ballot.resolve` with all ``n``
  clients voting);
* per epsilon, the **release's gap**: ``--repetitions`` winner releases (:func:`simulations.tradeoff.winner_picks`)
  at every ``k``, with common random numbers across ``k`` and across schemes, at the ``auto`` ballot's ``k`` and at
  the best fixed ``k`` in hindsight, with the shares of releases within 2 points of Opt.

The arrays are cached in ``--cache`` as by the other studies (a scheme other than the single split is part of
the scores' key).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from dphype.checks import NEIGHBOURING
from dphype.ml.validation import DEFAULT_VALIDATION, SINGLE_SPLIT, Validation, check_validation
from dphype.privacy.winner import noise_std
from dphype.selection.voting import Ballot
from simulations import harness, tradeoff
from simulations.ksweep import within


def add_arguments(parser: argparse.ArgumentParser) -> None:
    harness.add_federation_arguments(parser, clients=(10, 20), partitions=("iid", "0.5"), validation=False)
    parser.add_argument("--validations", nargs="+", default=[SINGLE_SPLIT, DEFAULT_VALIDATION, "kfold:5"],
                        help="validation schemes to compare (dphype.ml.validation; default: the paper's split, the "
                             f"product's {DEFAULT_VALIDATION} and kfold:5)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1.0],
                        help="privacy budgets of the releases, finite (default 0.5 1)")
    parser.add_argument("--ks", type=int, nargs="+", default=list(range(1, 51)),
                        help="votes per client to sweep (default 1 to 50)")
    parser.add_argument("--repetitions", type=int, default=1000, help="winner releases per point (default 1000)")
    parser.add_argument("--neighbouring", choices=NEIGHBOURING, default="replace-one",
                        help="the releases' neighbouring relation (default replace-one)")


def settings(args: argparse.Namespace, num_candidates: int) -> dict[str, Any]:
    """Validated options (``ValueError`` naming the option, before any work)."""
    epsilons = harness.check_epsilons(args.epsilons)
    if any(np.isinf(e) for e in epsilons):
        raise ValueError("epsilons must be finite (the noiseless vote is reported in any case)")
    ks = sorted({harness.check_int("ks", k, 1) for k in args.ks if k < num_candidates})
    if not ks:
        raise ValueError(f"ks must contain at least one k in [1, {num_candidates - 1}], got {args.ks!r}")
    return {"validations": list(dict.fromkeys(check_validation(v) for v in args.validations)),
            "epsilons": epsilons, "ks": ks, "neighbouring": args.neighbouring,
            "repetitions": harness.check_int("repetitions", args.repetitions, 2)}


def noiseless_gaps(counts: dict[int, np.ndarray], accuracy: np.ndarray) -> dict[int, float]:
    """Accuracy points behind Opt of each ``k``'s noiseless winner (the lowest index among tied counts)."""
    opt = float(accuracy.max())
    return {k: 100.0 * (opt - float(accuracy[int(np.argmax(c))])) for k, c in counts.items()}


def local_rank_correlation(scores: np.ndarray, accuracy: np.ndarray) -> float:
    """Mean over clients of Spearman's correlation between the client's ranking (its lexicographic keys, a
    diverged candidate last) and the candidates' FedAvg test accuracy: how well each client's signal orders them."""
    from scipy.stats import spearmanr

    out = []
    for keys in np.asarray(scores, dtype=np.float64):
        keys = np.nan_to_num(keys.reshape(len(keys), -1), nan=-np.inf)
        order = np.lexsort(keys.T[::-1])  # ascending, the first column the primary key
        rank = np.empty(len(order))
        rank[order] = np.arange(len(order))
        out.append(float(spearmanr(rank, accuracy).statistic))
    return float(np.nanmean(out))


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    candidates = harness.candidates_from_args(args)
    p = len(candidates)
    opts = settings(args, p)
    base = harness.Scale.from_args(args)
    feds = harness.federations_from_args(args)
    cache = harness.cache_from_args(args)
    from dphype.ml.torch_task import load_cached

    test_labels = load_cached(args.dataset, args.data_dir)[1].y
    relation = opts["neighbouring"]
    rows: list[dict[str, Any]] = []
    bases = {dataclasses.replace(Validation.parse(v), loss_first=False).name for v in opts["validations"]}
    units = harness.work_units(feds, base, scores=False) + sum(f.clients for f in feds) * len(bases)
    with harness.progress_bar(units, "signal") as bar:
        for f_index, fed in enumerate(feds):
            accuracy = harness.fill_diverged(harness.cached_accuracies(fed, candidates, base, cache, bar), test_labels)
            opt = float(accuracy.max())
            for validation in opts["validations"]:
                scale = dataclasses.replace(base, validation=validation)  # ':loss' reuses its base's arrays
                scores = harness.cached_scores(fed, candidates, scale, cache, bar)
                counts = {k: harness.client_votes(scores, k, maximize=True).sum(axis=0) for k in opts["ks"]}
                calm = noiseless_gaps(counts, accuracy)
                calm_k = min(opts["ks"], key=lambda k: (calm[k], k))
                calm_mean = float(np.mean([calm[k] for k in opts["ks"]]))
                correlation = local_rank_correlation(scores, accuracy)
                for e_index, eps in enumerate(opts["epsilons"]):
                    auto_k = Ballot.parse("auto").resolve(p, noise_std(eps, relation), fed.clients).depth
                    if auto_k not in counts:
                        counts[auto_k] = harness.client_votes(scores, auto_k, maximize=True).sum(axis=0)
                        calm.update(noiseless_gaps({auto_k: counts[auto_k]}, accuracy))
                    picks = {}
                    for k in sorted({*opts["ks"], auto_k}):  # the same seed for every k and every scheme
                        rng = np.random.default_rng([args.seed, f_index, e_index])
                        picks[k], _ = tradeoff.winner_picks(counts[k], epsilon=eps, relation=relation,
                                                            repetitions=opts["repetitions"], rng=rng)
                    gaps = {k: float(np.mean(100.0 * (opt - accuracy[v]))) for k, v in picks.items()}
                    best_k = min(opts["ks"], key=lambda k: (gaps[k], k))
                    rows.append({"dataset": fed.dataset, "clients": fed.clients, "partition": fed.label,
                                 "validation": validation, "epsilon": eps, "neighbouring": relation,
                                 "local_rank_correlation": round(correlation, 4),
                                 "noiseless_best_k": calm_k, "noiseless_best_gap": round(calm[calm_k], 3),
                                 "noiseless_mean_gap": round(calm_mean, 3),
                                 "auto_k": auto_k, "noiseless_auto_gap": round(calm[auto_k], 3),
                                 "release_auto_gap": round(gaps[auto_k], 3),
                                 "release_auto_within_2pt": within(accuracy, opt, picks[auto_k], 2),
                                 "release_best_k": best_k, "release_best_gap": round(gaps[best_k], 3),
                                 "release_best_within_2pt": within(accuracy, opt, picks[best_k], 2)})
    study.write_csv("signal.csv", rows)
    return study.result(dataset=args.dataset, scale=vars(base), candidates=p, **opts,
                        summary=summary(rows, opts["validations"]))


def summary(rows: Sequence[dict[str, Any]], validations: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per scheme, the mean of every gap column over the grid's points."""
    columns = ("local_rank_correlation", "noiseless_best_gap", "noiseless_mean_gap", "noiseless_auto_gap",
               "release_auto_gap", "release_best_gap",
               "release_auto_within_2pt", "release_best_within_2pt")
    return {v: {c: round(float(np.mean([r[c] for r in rows if r["validation"] == v])), 3) for c in columns}
            for v in validations}
