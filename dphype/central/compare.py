"""Federated DP-Hype vs central private tuning on one task, one candidate list and one budget.

Inputs, computed once and shared (the cost is charged to every method that uses them):

* per-client scores: the data set's pool is split over ``clients`` clients with
  `dphype.ml.torch_task.make_task`; every client scores every candidate on its own data
  (``Task.score`` with the paper's single split, ``validation="split"``, so that the primary key is the local
  accuracy that propose-test takes as each part's utility; the paper's model and epochs);
* central models: every candidate trained on the 80 % fit split of the whole pool
  (`dphype.ml.training.train_candidates`), scored on the 20 % validation split (DP-BO's
  sensitive validation set) and on the test split (the test accuracy of any selection).

The methods compared:

* DP-Hype (federated, no trusted party): the protocol's request, and every client's request check,
  scores and top-k votes (`dphype.protocol`); the noise is a seeded replay, one share per client
  drawn from the method's generator and summed with the votes (the release mode's
  `dphype.release.ReleaseMode.replay`, the law of the clients' secure shares; no encoding and no SecAgg+ run here),
  then the server's
  release (the configured selection rule and the privacy report);
* DP-BO (Kusner et al. Alg. 1; central, trusted curator): GP-UCB on the central validation
  accuracies, the index released by the exponential mechanism with the whole budget; the
  neighbouring-set kernel gap is ``1 - k1(V, V') = 1/(2 m^2)``, so that the GP's difference between
  neighbours has the standard deviation ``1/m`` of an accuracy on ``m`` records changing by one;
* propose-test (Ding & Wu Alg. 1; central, trusted curator): the clients' partitions are the
  ``k`` disjoint parts of subsample-and-aggregate; ``eps0`` calibrated so that even the
  worst-case number of iterations stays within the budget (advanced composition); candidates
  are scanned in a fresh public random order per repetition;
* Opt (non-private): the candidate with the best test accuracy; RandGuess (no data): a uniformly
  random candidate, reported by its expected test accuracy (the mean over candidates).
"""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dphype.central.dpbo import candidate_features, dp_bo
from dphype.checks import check_k
from dphype.config import DPHypeConfig
from dphype.ml.data import dataset_spec, split_indices
from dphype.ml.torch_task import FixedScoresTask, default_epochs, load_cached, score_clients
from dphype.ml.validation import SINGLE_SPLIT
from dphype.plotting import pyplot, save_figure
from dphype.protocol import check_request, make_vote_request, score_candidates
from dphype.selection.candidates import CandidateList
from dphype.selection.voting import primary_scores

DPHYPE_ASSUMPTIONS: tuple[str, ...] = (
    "client-level DP, replace-one neighbouring clients (top-k votes: L2 sqrt(2k), L1 2k)",
    "secure aggregation reveals only the sum; at least (1 - dropout) n clients add their noise share",
    "no trusted curator: the server never sees a client's votes or data",
)


@dataclass
class SharedInputs:
    """Scores every method draws from, with the seconds it took to compute them.

    Attributes:
        client_scores: ``(clients, candidates[, keys])`` local scores of ``Task.score``.
        validation_accuracy: ``(candidates,)`` central models on the 20 % validation split.
        test_accuracy: ``(candidates,)`` central models on the test split.
        validation_size: The validation split's size.
        client_seconds: Seconds the clients' scores took.
        central_seconds: Seconds the central models took.
    """

    client_scores: np.ndarray  # (clients, candidates[, keys]) local scores of Task.score, e.g. [accuracy, -loss]
    validation_accuracy: np.ndarray  # (candidates,) central models on the 20 % validation split
    test_accuracy: np.ndarray  # (candidates,) central models on the test split
    validation_size: int
    client_seconds: float
    central_seconds: float


def central_accuracies(
    dataset: str, candidates: CandidateList, *, seed: int, epochs: int | None, data_dir: str | None
) -> tuple[np.ndarray, np.ndarray, int]:
    """Every candidate trained on the pool's fit split: ``(validation accuracy, test accuracy, validation size)``.

    Args:
        dataset: The data set's name.
        candidates: The candidates.
        seed: Seeds the split and the training.
        epochs: Training epochs; ``None``: the data set's default.
        data_dir: Where the data lives; ``None``: the default.

    Returns:
        Two ``(candidates,)`` arrays and an int.
    """
    # lazy import: torch
    from dphype.ml.training import VALIDATION_FRACTION, accuracy, train_candidates

    pool, test = load_cached(dataset, data_dir)
    fit_idx, val_idx = split_indices(len(pool), VALIDATION_FRACTION, seed)
    models = train_candidates(dataset_spec(dataset).model, pool.subset(fit_idx), candidates,
                              epochs=default_epochs(dataset) if epochs is None else epochs, seed=seed)
    return accuracy(models, pool.subset(val_idx)), accuracy(models, test), len(val_idx)


def dphype_select(
    client_scores: np.ndarray,
    candidates: CandidateList,
    config: DPHypeConfig,
    *,
    rng: np.random.Generator,
) -> tuple[int, dict[str, Any]]:
    """DP-Hype's selection through the protocol's own steps, its noise a seeded replay.

    `dphype.protocol.make_vote_request`, every client's `check_request`, `score_candidates` and votes, one noise share
    per client from ``rng`` (`dphype.release.ReleaseMode.replay` with ``per_client=True``; the client path draws from
    the secure generator), and the server's `dphype.release.ReleaseMode.release`.

    Args:
        client_scores: ``(clients, candidates[, keys])`` local scores.
        candidates: The candidates.
        config: DP-Hype's configuration.
        rng: The generator of the replayed noise shares.

    Returns:
        ``(index, privacy report)``: the selected index and the report as a dict.
    """
    request = make_vote_request(config, candidates)
    mode = request.mode
    ballot = mode.resolved_ballot(config, len(candidates))
    votes = np.zeros(len(candidates))
    for scores in client_scores:
        check_request(request, local_candidates=candidates)
        votes += ballot.cast(score_candidates(FixedScoresTask(scores), candidates), config.k, maximize=True)
    n = len(client_scores)
    (opened,) = mode.replay(request, votes, repetitions=1, rng=rng, survivors=n, per_client=True)
    result = mode.release(request, opened, n)
    return result.selected_index, result.report.to_dict()


def _row(method: str, *, epsilon: float | None, delta: float | None, accountant: str, assumptions: Sequence[str],
         trusted_curator: bool, index: int | None, candidates: CandidateList, test_accuracy: float,
         seconds: float, **extra: Any) -> dict[str, Any]:
    return {
        "method": method,
        "epsilon": epsilon,
        "delta": delta,
        "accountant": accountant,
        "assumptions": list(assumptions),
        "trusted_curator": trusted_curator,
        "selected_index": index,
        "selected": None if index is None else dict(candidates[index]),
        "test_accuracy": test_accuracy,
        "wall_seconds": seconds,
        **extra,
    }


def compare(
    *,
    dataset: str = "adult",
    candidates: CandidateList,
    config: DPHypeConfig,
    epochs: int | None = None,
    partition: str = "iid",
    beta: float | None = None,
    dpbo_iterations: int = 30,
    dpbo_noise_var: float = 1e-4,
    dpbo_lengthscale: float = 0.5,
    granularity: float = 0.05,
    lower_bound: float = 0.5,
    repetitions: int = 20,
    seed: int = 0,
    data_dir: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[dict[str, Any]], SharedInputs]:
    """Run every method on one task / candidate list / (epsilon, delta) of ``config``.

    ``config`` is DP-Hype's configuration; its budget is every method's, and its ``clients`` are DP-Hype's
    clients and propose-test's parts.

    The private selections are repeated ``repetitions`` times with independent randomness on the
    same shared inputs (as the DP-Hype paper averages runs): a row reports the modal selection,
    the mean and std of the selections' test accuracy, and a wall time of the shared inputs plus
    one selection. Each repetition alone spends the row's (epsilon, delta).

    Args:
        dataset: The data set's name.
        candidates: The candidates.
        config: DP-Hype's configuration (the budget of every method).
        epochs: Training epochs; ``None``: the data set's default.
        partition: How the clients' data is split (``"iid"`` or ``"dirichlet"``).
        beta: The Dirichlet concentration, for ``partition="dirichlet"``.
        dpbo_iterations: DP-BO's iterations, ``>= 1``.
        dpbo_noise_var: DP-BO's GP noise variance.
        dpbo_lengthscale: DP-BO's kernel lengthscale.
        granularity: Propose-test's ``g``.
        lower_bound: Propose-test's ``u0``.
        repetitions: Independent repetitions of every private selection, ``>= 1``.
        seed: Seeds the shared inputs and the repetitions.
        data_dir: Where the data lives; ``None``: the default.
        progress: Called with ``(done, total)`` as the clients score.

    Returns:
        ``(rows, shared)``: one table row per method and the shared inputs.

    Raises:
        ValueError: ``k`` exceeds the candidates, or ``dpbo_iterations`` or ``repetitions`` is below 1.
    """
    # lazy import: scipy
    from dphype.central.propose_test import calibrate_eps0, propose_test

    check_k(config.k, len(candidates))
    epsilon, delta, clients, k = config.epsilon, config.delta, config.clients, config.k
    if not 1 <= dpbo_iterations:
        raise ValueError(f"dpbo_iterations must be >= 1, got {dpbo_iterations}")
    if not 1 <= repetitions:
        raise ValueError(f"repetitions must be >= 1, got {repetitions}")
    rng = np.random.default_rng(seed)

    t0 = time.perf_counter()
    client_scores = score_clients(dataset, candidates, clients, seed=seed, epochs=epochs, partition=partition,
                                  beta=beta, data_dir=data_dir, progress=progress, validation=SINGLE_SPLIT)
    client_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    val_acc, test_acc, val_size = central_accuracies(dataset, candidates, seed=seed, epochs=epochs,
                                                     data_dir=data_dir)
    central_seconds = time.perf_counter() - t0
    shared = SharedInputs(client_scores, val_acc, test_acc, val_size, client_seconds, central_seconds)
    test_scores = np.nan_to_num(test_acc, nan=0.0)  # a diverged candidate has test accuracy 0
    rows: list[dict[str, Any]] = []

    gains = np.nan_to_num(val_acc, nan=0.0)
    features = candidate_features(list(candidates))
    eps0 = calibrate_eps0(epsilon, delta, granularity, lower_bound)
    # propose-test's per-part utilities are the local accuracies: the primary key of every client's scores
    part_utilities = np.nan_to_num(np.stack([primary_scores(row) for row in client_scores]), nan=0.0)

    def run_dphype(r: np.random.Generator) -> tuple[int, dict[str, Any]]:
        return dphype_select(client_scores, candidates, config, rng=r)

    def run_dpbo(r: np.random.Generator) -> tuple[int, dict[str, Any]]:
        bo = dp_bo(lambda i: float(gains[i]), features, iterations=min(dpbo_iterations, len(candidates)),
                   epsilon=epsilon, delta=delta, noise_var=dpbo_noise_var, kernel_gap=1.0 / (2.0 * val_size**2),
                   lengthscale=dpbo_lengthscale, release_gain=False, rng=r)
        return bo.index, {**bo.to_dict(), "max_selection_probability": float(bo.probabilities.max())}

    def run_propose_test(r: np.random.Generator) -> tuple[int, dict[str, Any]]:
        # Alg. 1 scans the candidates in list order and, when noise dominates, accepts one of the
        # first few: a fresh public random order keeps the list's arbitrary order out of the result.
        order = r.permutation(len(candidates))
        pt = propose_test(part_utilities[:, order], eps0=eps0, granularity=granularity,
                          lower_bound=lower_bound, delta_slack=delta, rng=r)
        # s* stays empty if no threshold was ever passed: fall back to a data-independent uniform pick
        chosen = int(order[pt.index]) if pt.index is not None else int(r.integers(len(candidates)))
        return chosen, {**pt.to_dict(), "fallback_uniform": pt.index is None}

    runs: dict[str, Any] = {}
    for name, method in (("DP-Hype", run_dphype), ("DP-BO", run_dpbo), ("propose-test", run_propose_test)):
        t0 = time.perf_counter()
        runs[name] = [method(r) for r in rng.spawn(repetitions)]
        runs[name + ":seconds"] = (time.perf_counter() - t0) / repetitions

    def summary(name: str) -> dict[str, Any]:
        picks = np.array([index for index, _ in runs[name]])
        accs = test_scores[picks]
        values, counts = np.unique(picks, return_counts=True)
        return {"index": int(values[np.argmax(counts)]), "test_accuracy": float(accs.mean()),
                "test_accuracy_std": float(accs.std()), "distinct_selections": int(len(values)),
                "repetitions": repetitions, "info": runs[name][0][1], "seconds": runs[name + ":seconds"]}

    rep = summary("DP-Hype")
    report = rep["info"]
    rows.append(_row("DP-Hype", epsilon=report["epsilon"], delta=report["delta"],
                     accountant=f"{report['accountant']} ({report['noise']} noise, sigma={report['sigma']:.4g})",
                     assumptions=DPHYPE_ASSUMPTIONS, trusted_curator=False, index=rep["index"], candidates=candidates,
                     test_accuracy=rep["test_accuracy"], seconds=client_seconds + rep["seconds"],
                     test_accuracy_std=rep["test_accuracy_std"], distinct_selections=rep["distinct_selections"],
                     repetitions=repetitions, clients=clients, k=k))
    rep = summary("DP-BO")
    info = rep["info"]
    rows.append(_row("DP-BO", epsilon=info["epsilon"], delta=info["delta"], accountant=info["accountant"],
                     assumptions=info["assumptions"], trusted_curator=True, index=rep["index"], candidates=candidates,
                     test_accuracy=rep["test_accuracy"], seconds=central_seconds + rep["seconds"],
                     test_accuracy_std=rep["test_accuracy_std"], distinct_selections=rep["distinct_selections"],
                     repetitions=repetitions, evaluations=info["evaluations"],
                     mean_sensitivity=info["mean_sensitivity"],
                     max_selection_probability=info["max_selection_probability"]))
    rep = summary("propose-test")
    info = rep["info"]
    iterations = [i["iterations"] for _, i in runs["propose-test"]]
    rows.append(_row("propose-test", epsilon=info["epsilon_tuning_worst_case"], delta=delta,
                     accountant=info["accountant"], assumptions=info["assumptions"], trusted_curator=True,
                     index=rep["index"], candidates=candidates, test_accuracy=rep["test_accuracy"],
                     seconds=client_seconds + rep["seconds"], test_accuracy_std=rep["test_accuracy_std"],
                     distinct_selections=rep["distinct_selections"], repetitions=repetitions,
                     iterations_mean=float(np.mean(iterations)), iterations_max=int(np.max(iterations)),
                     epsilon_realised_iterations_max=max(i["epsilon_tuning"] for _, i in runs["propose-test"]),
                     eps0=eps0, parts=len(client_scores),
                     fallback_uniform=sum(i["fallback_uniform"] for _, i in runs["propose-test"])))

    best = int(np.argmax(test_scores))
    rows.append(_row("Opt", epsilon=None, delta=None, accountant="none (non-private: no finite epsilon)",
                     assumptions=("uses test accuracy of every candidate: no privacy",), trusted_curator=True,
                     index=best, candidates=candidates, test_accuracy=float(test_scores[best]),
                     seconds=central_seconds))
    rows.append(_row("RandGuess", epsilon=0.0, delta=0.0, accountant="none (data-independent)",
                     assumptions=("uniformly random candidate; accuracy is the expectation over candidates",),
                     trusted_curator=False, index=None, candidates=candidates,
                     test_accuracy=float(test_scores.mean()), seconds=0.0))
    return rows, shared


def write_table(rows: Sequence[Mapping[str, Any]], out: str, title: str) -> list[str]:
    """Write ``compare.csv`` and ``compare.png`` (test accuracy per method, privacy in the labels).

    Args:
        rows: The table rows of `compare`.
        out: The output folder (created when missing).
        title: The figure's title.

    Returns:
        The two files' paths.
    """
    plt = pyplot()
    os.makedirs(out, exist_ok=True)
    csv_path = os.path.join(out, "compare.csv")
    fields = ["method", "epsilon", "delta", "accountant", "trusted_curator", "selected_index", "selected",
              "test_accuracy", "test_accuracy_std", "repetitions", "wall_seconds", "assumptions"]
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "assumptions": " | ".join(row["assumptions"])})
    png_path = os.path.join(out, "compare.png")
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [
        f"{r['method']}\neps=" + ("inf" if r["epsilon"] is None else f"{r['epsilon']:.3g}")
        + ("\n(curator)" if r["trusted_curator"] else "")
        for r in rows
    ]
    colors = ["C2" if not r["trusted_curator"] else "C0" for r in rows]
    ax.bar(range(len(rows)), [r["test_accuracy"] for r in rows], color=colors,
           yerr=[r.get("test_accuracy_std", 0.0) for r in rows], capsize=3)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("test accuracy of the selection (mean +- std)")
    low = min(r["test_accuracy"] for r in rows)
    ax.set_ylim(max(0.0, low - 0.1), 1.0)
    ax.set_title(title, fontsize=9)
    return [csv_path, save_figure(fig, png_path, dpi=120)]
