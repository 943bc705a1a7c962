"""DP-Hype's own side of the Pareto interface: its vote release as a privacy oracle, a task as a utility oracle.

`vote_privacy_oracle` is DP-Hype's privacy (a `dphype.privacy.accounting.VoteEvent` per configuration),
`candidate_utility_oracle` scores configurations with a `dphype.task.Task`-like scorer, and `dphype_vote_problem`
makes DP-Hype's own ``(sigma, k)`` trade-off a DPareto problem over fixed local scores. The vote problem takes the
clients' scores, so it is built with its data, not by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dphype.checks import DEFAULT_NOISE, check_delta
from dphype.ml.oracles.problem import ParetoProblem, PrivacyOracle, UtilityOracle, UtilityResult
from dphype.ml.oracles.space import Config, Distribution, Domain, Hyperparameter
from dphype.privacy.accounting import VoteEvent, epsilon
from dphype.privacy.noise import replay_noisy_sums
from dphype.selection.candidates import CandidateList
from dphype.selection.voting import primary_scores, top_k_votes


def vote_privacy_oracle(
    *,
    delta: float,
    num_candidates: int | None = None,
    accountant: str | None = None,
    noise: str = DEFAULT_NOISE,
) -> PrivacyOracle:
    """DP-Hype's privacy as an oracle: ``{"sigma": s, "k": k} -> epsilon`` of the noisy vote sum (`VoteEvent`).

    Args:
        delta: The fixed delta.
        num_candidates: The number of candidates, or ``None``.
        accountant: The accountant; ``None``: the noise kind's default.
        noise: The noise kind.

    Returns:
        The oracle.
    """
    check_delta(delta)

    def privacy(config: Config) -> float:
        release = VoteEvent(int(config["k"]), num_candidates, float(config["sigma"]), noise)
        return epsilon(release, delta, accountant)

    return privacy


def candidate_utility_oracle(
    score: Callable[[Sequence[Mapping[str, Any]]], np.ndarray],
    *,
    maximize: bool = True,
) -> UtilityOracle:
    """A utility oracle from a candidate scorer, e.g. ``dphype.task.Task.score``.

    ``score`` receives a one-candidate list and returns ``(1,)`` scores in ``[0, 1]`` or ``(1, j)`` lexicographic keys;
    the utility is the primary key (`dphype.selection.voting.primary_scores`), ``1 - score`` for ``maximize=False``.
    Deterministic scorers have one run.

    Args:
        score: The candidate scorer.
        maximize: Whether higher scores are better.

    Returns:
        The oracle.
    """

    def utility(config: Config, rng: np.random.Generator) -> UtilityResult:
        value = float(primary_scores(score(CandidateList([config])))[0])
        return UtilityResult.from_runs([value if maximize else 1.0 - value])

    return utility


def dphype_vote_problem(
    client_scores: np.ndarray,
    test_accuracy: np.ndarray,
    *,
    delta: float,
    noise: str = DEFAULT_NOISE,
    accountant: str | None = None,
    runs: int = 50,
    sigma_range: tuple[float, float] = (1.0, 100.0),
    max_k: int = 10,
) -> ParetoProblem:
    """DP-Hype itself as a DPareto problem over ``(sigma, k)`` for fixed local scores.

    Privacy: `vote_privacy_oracle`. Utility: the test accuracy of the argmax of the summed top-k votes plus noise
    shares, replayed by `dphype.privacy.noise.replay_noisy_sums` and averaged over ``runs`` draws.

    Args:
        client_scores: ``(clients, candidates)`` or ``(clients, candidates, j)`` scores, at least 2 clients.
        test_accuracy: ``(candidates,)`` accuracies a model trained with each candidate reaches.
        delta: The fixed delta.
        noise: The noise kind.
        accountant: The accountant; ``None``: the noise kind's default.
        runs: Noise draws per evaluation.
        sigma_range: The ``sigma`` axis.
        max_k: The largest ``k``.

    Returns:
        The problem.

    Raises:
        ValueError: ``client_scores`` has the wrong shape or fewer than 2 clients.
    """
    scores = np.asarray(client_scores, dtype=np.float64)
    acc = np.asarray(test_accuracy, dtype=np.float64)
    if scores.ndim not in (2, 3) or scores.shape[0] < 2 or scores.shape[1] != acc.shape[0]:
        raise ValueError(
            f"client_scores must be (clients >= 2, candidates[, keys]) matching test_accuracy, got {scores.shape} "
            f"and {acc.shape}"
        )
    n, p = scores.shape[:2]
    max_k = min(max_k, p)

    def utility(config: Config, rng: np.random.Generator) -> UtilityResult:
        k, sigma = int(config["k"]), float(config["sigma"])
        votes = np.sum([top_k_votes(row, k) for row in scores], axis=0)
        noisy = replay_noisy_sums(votes, sigma=sigma, clients=n, repetitions=runs, rng=rng, noise=noise)
        picks = np.argmax(noisy, axis=1)  # the server's argmax (dphype.selection.rules.select) on every release
        return UtilityResult.from_runs(np.nan_to_num(acc[picks], nan=0.0))

    return ParetoProblem(
        name="dphype-votes",
        domain=Domain((Hyperparameter("sigma", sigma_range[0], sigma_range[1], log=True),
                       Hyperparameter("k", 1, max_k, integer=True))),
        privacy=vote_privacy_oracle(delta=delta, num_candidates=p, accountant=accountant, noise=noise),
        utility=utility,
        delta=delta,
        distributions={"sigma": Distribution("loguniform", *sigma_range), "k": Distribution("uniform", 1, max_k)},
        description=f"DP-Hype top-k voting with {n} clients over {p} candidates ({noise} noise)",
    )
