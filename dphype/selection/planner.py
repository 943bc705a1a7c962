"""Plan a DP-Hype run before any data is touched: the chance of selecting a good candidate, and what reaches it.

Theorem IV.1 bounds the chance that the argmax of the noisy vote sum is good, given the gap between good
and bad vote counts; the gap depends on how much the clients agree. The planner therefore predicts under
stated **consensus scenarios**, Section IV-B's loss model (`LossModel`): every client's local loss is
``N(0, s^2)`` for each of the ``|H_good|`` good candidates and ``N(1, s^2)`` for the others, and it votes
for its ``k`` smallest; ``s`` is the clients' disagreement (`CONSENSUS`: strong 0.25, moderate 0.5,
weak 1). The good candidates form a neighbourhood of the public feature space (the ``|H_good|`` nearest to
a random candidate), as good hyperparameters do on real tasks, so the structure-aware rule meets the
structure it exploits; the argmax does not depend on where they are. Success = the pick is good.

For a range of ``k`` it reports the simulated success of the selection rule that will run and of the argmax,
with Theorem IV.1's bound (averaged over the simulated vote vectors: for each, the best bound over the sets
"the ``j`` most-voted good candidates"), recommends the ``k`` with the highest success (the winner release's
ties: `_winner_tie_break`), and finds the smallest epsilon and the smallest number of clients that reach
a target success (bisection with common random numbers).
The noise is the run's (Skellam or Gaussian shares, replayed by `dphype.privacy.noise.replay_noisy_sums`); with a
dropout fraction ``xi`` the worst accepted case is simulated: only ``ceil((1 - xi) n)`` clients vote and their
shares add up to std ``sigma``.

Both kinds of release (`Forecast`) are predicted on the SAME simulated votes: the noisy vote sum picked by
the selection rule, and the winner's index alone (`dphype.privacy.winner`: discrete Laplace noise whose scale
depends on epsilon and the neighbouring relation only, replayed by `dphype.privacy.winner.replay_winners`).
The planner names no release mode: its caller passes the run's mode and the modes to compare
(`PlannedRelease`, which `dphype.modes.ReleaseMode` implements: a name and the forecast that predicts
it). The plan recommends ``k`` for each forecast and, among the modes passed, the one with the higher predicted
success at its recommended ``k`` (ties: the first passed, the sum release in `dphype.modes.RELEASE_MODES`).

Speed: the clients' rankings come from exact samplers of the loss model (module ``simulations.synthetic``
uses them for Fig. 2): one ranking per client serves every ``k`` (the top-k sets are nested prefixes of the
client's loss ranking), and only what the first ``depth`` ranks depend on is drawn:

* ``losses``: draw every loss and sort (what a client does; the reference);
* ``direct``: sort rank keys ``-log Phi((loss - 1) / sigma_loss)`` instead. The map is decreasing, so the
  ranking is the ranking of the losses, and for a bad candidate the key is ``-log U ~ Exp(1)``, which is
  cheaper to draw than a Gaussian;
* ``order`` (many bad candidates): given the good losses ``g``, the number of bad losses below each of them
  is multinomial over the intervals between the sorted ``Phi((g - 1) / sigma_loss)`` (bad losses are iid
  ``N(1, sigma_loss^2)``); which bad candidates occupy the bad ranks is, by exchangeability, a uniformly
  random ordered tuple of distinct bad indices.
"""

from __future__ import annotations

import enum
import math
import warnings as _warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dphype.checks import (
    MAX_CLIENTS,
    check_clients,
    check_delta,
    check_dropout,
    check_epsilon,
    check_int,
    check_k,
    check_neighbouring,
    check_positive,
    check_probability,
)
from dphype.privacy.accounting import calibrate
from dphype.privacy.noise import replay_noisy_sums
from dphype.privacy.noise_kinds import resolve_accountant
from dphype.privacy.winner import noise_std, replay_winners

if TYPE_CHECKING:
    from dphype.selection.candidates import FeatureSpace

#: client disagreement ``sigma_loss`` of the named consensus scenarios (loss gap between good and bad: 1)
CONSENSUS: dict[str, float] = {"strong": 0.25, "moderate": 0.5, "weak": 1.0}
#: success the planner's ``min_epsilon`` and ``min_clients`` aim for unless told otherwise
DEFAULT_TARGET = 0.9
#: below this predicted success the server and the demo warn
WARN_BELOW = 0.5
#: values of ``k`` the planner compares (those below the number of candidates)
KS: tuple[int, ...] = (1, 2, 3, 5, 8, 10, 15, 20, 25, 30, 40, 50)
#: use the order-statistics sampler once bad candidates outnumber the ranking depth this many times
_ORDER_SAMPLER_RATIO = 5
#: The ballot whose measured shares `measured_within` reports (`dphype.modes.ArgmaxRelease`'s default).
MEASURED_BALLOT = "auto"
#: What ``dphype bench ksweep --ballots auto`` measured for the argmax release with `MEASURED_BALLOT` (5,000
#: releases per point, the release's noise one discrete Laplace per count; the ranges from ``dphype bench
#: ksweep-report``'s ``ksweep_report_within.csv``, README "Ballots" and results/README.md "Fashion-MNIST on the ballot
#: grid"): per ``(candidates p, relation, n, epsilon)``, the smallest and largest share of releases within 1 and
#: within 2 accuracy points of Opt over the measured federations and how many there were. The federations of each
#: ``p`` are named in `MEASURED_TASKS`.
MEASURED_WITHIN: dict[tuple[int, str, int, float], dict[str, Any]] = {
    (100, "replace-one", 10, 0.5): {"within_1pt": (0.12, 0.73), "within_2pt": (0.15, 0.74), "tasks": 10},
    (100, "replace-one", 10, 1.0): {"within_1pt": (0.18, 0.82), "within_2pt": (0.33, 0.90), "tasks": 10},
    (100, "replace-one", 20, 0.5): {"within_1pt": (0.15, 0.97), "within_2pt": (0.15, 0.97), "tasks": 9},
    (100, "replace-one", 20, 1.0): {"within_1pt": (0.33, 1.00), "within_2pt": (0.33, 1.00), "tasks": 9},
    (100, "replace-one", 50, 0.5): {"within_1pt": (0.22, 1.00), "within_2pt": (0.22, 1.00), "tasks": 7},
    (100, "replace-one", 50, 1.0): {"within_1pt": (0.05, 1.00), "within_2pt": (0.05, 1.00), "tasks": 7},
    (100, "add-remove", 10, 0.5): {"within_1pt": (0.20, 0.82), "within_2pt": (0.34, 0.91), "tasks": 10},
    (100, "add-remove", 10, 1.0): {"within_1pt": (0.14, 0.95), "within_2pt": (0.22, 0.99), "tasks": 10},
    (100, "add-remove", 20, 0.5): {"within_1pt": (0.30, 1.00), "within_2pt": (0.30, 1.00), "tasks": 9},
    (100, "add-remove", 20, 1.0): {"within_1pt": (0.12, 1.00), "within_2pt": (0.12, 1.00), "tasks": 9},
    (100, "add-remove", 50, 0.5): {"within_1pt": (0.05, 1.00), "within_2pt": (0.05, 1.00), "tasks": 7},
    (100, "add-remove", 50, 1.0): {"within_1pt": (0.34, 1.00), "within_2pt": (0.34, 1.00), "tasks": 7},
    (10, "replace-one", 10, 0.5): {"within_1pt": (0.56, 0.56), "within_2pt": (0.56, 0.56), "tasks": 2},
    (10, "replace-one", 10, 1.0): {"within_1pt": (0.71, 0.82), "within_2pt": (0.71, 0.82), "tasks": 2},
    (10, "replace-one", 20, 0.5): {"within_1pt": (0.32, 0.55), "within_2pt": (0.55, 0.77), "tasks": 2},
    (10, "replace-one", 20, 1.0): {"within_1pt": (0.29, 0.49), "within_2pt": (0.49, 0.91), "tasks": 2},
    (10, "replace-one", 50, 0.5): {"within_1pt": (0.89, 1.00), "within_2pt": (0.89, 1.00), "tasks": 2},
    (10, "replace-one", 50, 1.0): {"within_1pt": (0.97, 1.00), "within_2pt": (0.97, 1.00), "tasks": 2},
    (10, "add-remove", 10, 0.5): {"within_1pt": (0.70, 0.83), "within_2pt": (0.70, 0.83), "tasks": 2},
    (10, "add-remove", 10, 1.0): {"within_1pt": (0.85, 0.96), "within_2pt": (0.85, 0.96), "tasks": 2},
    (10, "add-remove", 20, 0.5): {"within_1pt": (0.28, 0.51), "within_2pt": (0.51, 0.91), "tasks": 2},
    (10, "add-remove", 20, 1.0): {"within_1pt": (0.17, 0.37), "within_2pt": (0.37, 0.98), "tasks": 2},
    (10, "add-remove", 50, 0.5): {"within_1pt": (0.97, 1.00), "within_2pt": (0.97, 1.00), "tasks": 2},
    (10, "add-remove", 50, 1.0): {"within_1pt": (1.00, 1.00), "within_2pt": (1.00, 1.00), "tasks": 2},
}
#: The measured federations of each number of candidates in `MEASURED_WITHIN`.
MEASURED_TASKS: dict[int, str] = {
    100: "Adult, digits, breast-cancer, fair and randhie; iid and Dirichlet 0.5",
    10: "Fashion-MNIST at a reduced scale (1 local epoch); iid and Dirichlet 0.5",
}


class Forecast(enum.Enum):
    """What the planner simulates of a release; its value is the ``by_k`` column with the simulated success.

    ``NOISY_SUM``: the noisy vote sum (noise std ``sigma`` calibrated for ``(epsilon, delta, k)``), picked by the
    run's selection rule. ``WINNER``: the winner's index alone, report-noisy-max with discrete Laplace noise of the
    std that epsilon and the neighbouring relation imply (`dphype.privacy.winner.noise_std`).

    Attributes:
        NOISY_SUM: The noisy vote sum, picked by the run's selection rule (column ``success``).
        WINNER: The winner's index alone, report-noisy-max (column ``success_winner``).
    """

    NOISY_SUM = "success"
    WINNER = "success_winner"


class PlannedRelease(Protocol):
    """What the planner needs of a release mode: its configuration name and the forecast that predicts it.

    `dphype.modes.ReleaseMode` has both.
    """

    @property
    def name(self) -> str:
        """The mode's configuration name (for the plan's report)."""
        ...

    @property
    def forecast(self) -> Forecast:
        """The forecast that predicts the mode's release."""
        ...

    @property
    def noise_inflation(self) -> float:
        """The released noise's std over the calibrated ``sigma`` of a noisy-sum forecast (1: exactly ``sigma``)."""
        ...


@dataclass(frozen=True)
class LossModel:
    """Clients' local losses: ``num_good`` from ``N(0, s^2)``, the rest of ``num_candidates`` from ``N(1, s^2)``.

    Good candidates are indices ``0 .. num_good - 1`` (the order is irrelevant: noise is iid and the
    selection of a good candidate is all that is measured).

    Attributes:
        num_good: The number of good candidates, in ``[1, num_candidates - 1]``.
        num_candidates: The number ``|H|`` of candidates, at least 2.
        sigma_loss: The clients' disagreement ``s`` > 0.

    Raises:
        ValueError: If a field is out of range.
    """

    num_good: int
    num_candidates: int
    sigma_loss: float

    def __post_init__(self) -> None:
        check_int("num_good", self.num_good, 1)
        check_int("num_candidates", self.num_candidates, 2)
        if self.num_good >= self.num_candidates:
            raise ValueError(
                f"num_good must be in [1, {self.num_candidates - 1}] (num_candidates - 1), got {self.num_good}"
            )
        check_positive("sigma_loss", self.sigma_loss)

    @property
    def num_bad(self) -> int:
        """The number of bad candidates."""
        return self.num_candidates - self.num_good

    def losses(self, rows: int, rng: np.random.Generator) -> np.ndarray:
        """``(rows, |H|)`` float32 losses, one row per client.

        Args:
            rows: The number of clients.
            rng: The random generator.

        Returns:
            The losses.
        """
        out = rng.standard_normal((rows, self.num_candidates), dtype=np.float32)
        out *= np.float32(self.sigma_loss)
        out[:, self.num_good :] += np.float32(1.0)
        return out


def ranking_from_losses(losses: np.ndarray, depth: int) -> np.ndarray:
    """Indices of each row's ``depth`` smallest losses (or rank keys), best first: nested top-k sets.

    ``prefix[:, :k]`` marks the same ``k`` candidates as `dphype.selection.voting.top_k_votes` with
    ``maximize=False`` (up to exact ties, which have probability zero for continuous losses).

    Args:
        losses: The losses (or rank keys), ``(rows, p)``.
        depth: How many of each row's best to keep.

    Returns:
        The indices, int32 ``(rows, depth)``.
    """
    return np.argsort(losses, axis=1)[:, :depth].astype(np.int32)


def _distinct_uniform(rng: np.random.Generator, rows: int, length: int, population: int) -> np.ndarray:
    """``rows`` uniformly random ordered tuples of ``length`` distinct integers in ``[0, population)``.

    Draw with replacement, then redraw every later repeat of a value until none is left. Each step only
    compares labels, so the procedure commutes with any relabelling; the result is therefore uniform over
    ordered tuples of distinct values (they form one orbit). Cheap when ``population >> length``.
    """
    shift = max(1, int(length - 1).bit_length())
    if population << shift >= 2**31:
        raise ValueError(f"population * length too large for the int32 sampler: {population} x {length}")
    labels = rng.integers(0, population, size=(rows, length), dtype=np.int32)
    positions = np.arange(length, dtype=np.int32)
    mask = np.int32((1 << shift) - 1)
    todo = np.arange(rows)
    while todo.size:
        keyed = np.sort((labels[todo] << shift) | positions, axis=1)  # by value, then position
        r, c = np.nonzero((keyed[:, 1:] >> shift) == (keyed[:, :-1] >> shift))  # later repeats
        if r.size == 0:
            break
        labels[todo[r], keyed[r, c + 1] & mask] = rng.integers(0, population, size=r.size, dtype=np.int32)
        todo = todo[np.unique(r)]
    return labels


def _good_losses(model: LossModel, rows: int, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((rows, model.num_good)) * model.sigma_loss


def ranking_prefix(model: LossModel, rows: int, depth: int, rng: np.random.Generator,
                   sampler: str = "auto") -> np.ndarray:
    """Best-first candidate indices ``(rows, depth)`` of ``rows`` independent clients (see module docstring).

    ``sampler``: ``"losses"`` (draw every loss, the reference), ``"direct"`` (rank keys for every
    candidate), ``"order"`` (order statistics) or ``"auto"`` (``order`` when bad candidates outnumber
    ``depth`` five times, else ``direct``).

    Args:
        model: The clients' loss model.
        rows: The number of clients.
        depth: The prefix length, the largest ``k`` needed.
        rng: The random generator.
        sampler: ``"losses"``, ``"direct"``, ``"order"`` or ``"auto"`` (above).

    Returns:
        The prefixes, int32 ``(rows, depth)``.

    Raises:
        ValueError: For an unknown ``sampler``, or ``"order"`` with fewer bad candidates than ``depth``.
    """
    from scipy.special import log_ndtr, ndtr

    if sampler == "auto":
        sampler = "order" if model.num_bad > _ORDER_SAMPLER_RATIO * depth else "direct"
    if sampler == "losses":
        return ranking_from_losses(model.losses(rows, rng), depth)
    g, s = model.num_good, model.sigma_loss
    if sampler == "direct":
        # key = -log Phi((loss - 1) / s), decreasing in the loss; bad candidates: -log U ~ Exp(1)
        keys = rng.standard_exponential((rows, model.num_candidates), dtype=np.float32)
        keys[:, :g] = -log_ndtr((_good_losses(model, rows, rng) - 1.0) / s)
        np.negative(keys, out=keys)
        return ranking_from_losses(keys, depth)
    if sampler != "order" or model.num_bad < depth:
        raise ValueError(
            f"sampler must be 'auto', 'losses', 'direct' or 'order' (needs num_bad >= depth), got {sampler!r}"
        )
    good = _good_losses(model, rows, rng)
    good_order = np.argsort(good, axis=1)  # good labels, best first
    u = ndtr((np.take_along_axis(good, good_order, axis=1) - 1.0) / s)  # P(bad loss < good loss), ascending
    cells = np.clip(np.diff(u, axis=1, prepend=0.0, append=1.0), 0.0, None)
    bad_below = np.cumsum(rng.multinomial(model.num_bad, cells), axis=1)[:, :g]
    good_rank = np.arange(g) + bad_below  # rank of the j-th best good candidate among all candidates
    in_prefix = good_rank < depth
    is_good = np.zeros((rows, depth), dtype=bool)
    r, j = np.nonzero(in_prefix)
    is_good[r, good_rank[r, j]] = True
    prefix = np.empty((rows, depth), dtype=np.int32)
    prefix[is_good] = good_order[in_prefix]  # row-major order keeps each row's good labels best first
    bad_count = depth - in_prefix.sum(axis=1)
    bad_labels = _distinct_uniform(rng, rows, depth, model.num_bad) + g
    prefix[~is_good] = bad_labels[np.arange(depth) < bad_count[:, None]]
    return prefix


def vote_counts(prefix: np.ndarray, ks: Sequence[int], reps: int, clients: int,
                num_candidates: int) -> dict[int, np.ndarray]:
    """Noiseless vote sums ``(reps, p)`` for every ``k`` from the clients' ranking prefixes.

    Rows of ``prefix`` are ordered repetition-major (``rep * clients + client``). ``k = p`` is the
    all-ones vote (every candidate gets ``n`` votes).

    Args:
        prefix: The clients' ranking prefixes, ``(reps * clients, depth)`` with ``depth >= max(ks)`` (unless
            ``k = p``).
        ks: The values of ``k``.
        reps: The number of repetitions ``R``.
        clients: The number of clients per repetition.
        num_candidates: The number ``p`` of candidates.

    Returns:
        ``k`` -> the vote sums, int64 ``(reps, p)``.
    """
    offsets = (np.repeat(np.arange(reps, dtype=np.int64), clients) * num_candidates)[:, None]
    counts = np.zeros(reps * num_candidates, dtype=np.int64)
    out: dict[int, np.ndarray] = {}
    done = 0
    for k in sorted(ks):
        if k == num_candidates:
            out[k] = np.full((reps, num_candidates), clients, dtype=np.int64)
            continue
        counts += np.bincount((prefix[:, done:k] + offsets).ravel(), minlength=reps * num_candidates)
        done = k
        out[k] = counts.reshape(reps, num_candidates).copy()
    return out


# ------------------------------------------------------------------------------------------ scenarios
@dataclass(frozen=True)
class Scenario:
    """A stated consensus scenario: ``num_good`` good candidates, client disagreement ``sigma_loss``.

    Attributes:
        name: The scenario's name (a `CONSENSUS` name, or ``sigma_loss=...``).
        num_good: The number of good candidates.
        sigma_loss: The clients' disagreement.
    """

    name: str
    num_good: int
    sigma_loss: float

    def loss_model(self, num_candidates: int) -> LossModel:
        """The loss model of this scenario over ``num_candidates`` candidates.

        Args:
            num_candidates: The number of candidates.

        Returns:
            The loss model.
        """
        return LossModel(self.num_good, num_candidates, self.sigma_loss)


def scenario(num_candidates: int, consensus: str | float = "moderate", num_good: int | None = None) -> Scenario:
    """The scenario ``consensus`` with ``num_good`` good candidates.

    Args:
        num_candidates: The number ``p`` of candidates, at least 2.
        consensus: A name of `CONSENSUS` or a ``sigma_loss > 0``.
        num_good: The number of good candidates, in ``[1, p - 1]`` (default: 5 % of them, at least 1, as in
            Section IV-B's 5 of 100).

    Returns:
        The scenario.

    Raises:
        ValueError: For an unknown name, a non-positive ``sigma_loss`` or ``num_candidates``, or ``num_good`` out
            of range.
    """
    p = check_int("num_candidates", num_candidates, 2)
    if isinstance(consensus, str):
        if consensus not in CONSENSUS:
            raise ValueError(f"consensus must be one of {', '.join(CONSENSUS)} or a number > 0, got {consensus!r}")
        name, sigma_loss = consensus, CONSENSUS[consensus]
    else:
        sigma_loss = check_positive("consensus", consensus)
        name = f"sigma_loss={sigma_loss:g}"
    good = max(1, round(0.05 * p)) if num_good is None else num_good
    if isinstance(good, bool) or not isinstance(good, (int, np.integer)) or not 1 <= good < p:
        raise ValueError(f"num_good must be an integer in [1, {p - 1}] (fewer than the candidates), got {good!r}")
    return Scenario(name, int(good), sigma_loss)


def read_consensus(value: str) -> str | float:
    """A ``--consensus`` option as `scenario` takes it, checked there before any simulation.

    Args:
        value: The option's text.

    Returns:
        A number (``sigma_loss``) when it parses as one, else a scenario name.

    Raises:
        ValueError: Naming ``consensus``, if it is neither a scenario name nor a number > 0.
    """  # noqa: DOC502
    try:
        parsed: str | float = float(value)
    except ValueError:
        parsed = value
    scenario(2, parsed, 1)
    return parsed


def _neighbourhoods(space: FeatureSpace | None, num_good: int, centres: np.ndarray) -> np.ndarray:
    """``(R, num_good)``: the ``num_good`` candidates nearest to each centre.

    Euclidean over the numeric features plus the number of differing categories; ties by index. Without
    structure: ``0 .. num_good-1``.
    """
    if space is None or space.no_structure is not None:
        return np.broadcast_to(np.arange(num_good), (len(centres), num_good))
    diff = space.numeric[centres][:, None, :] - space.numeric[None, :, :]
    dist = (diff**2).sum(axis=2) + (space.categorical[centres][:, None, :] != space.categorical[None, :, :]).sum(axis=2)
    return np.argsort(dist, axis=1, kind="stable")[:, :num_good]


def simulate_votes(sc: Scenario, clients: int, ks: Sequence[int], num_candidates: int,
                   space: FeatureSpace | None, repetitions: int,
                   rng: np.random.Generator) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """Noiseless vote sums ``{k: (R, p)}`` of ``clients`` clients under ``sc`` and the good masks ``(R, p)``.

    The loss model's labels (good ``0 .. g-1``) are placed on the candidates per repetition: the good ones on a
    neighbourhood of a random candidate, the bad ones on the others in random order (they are exchangeable).

    Args:
        sc: The scenario.
        clients: The number of voting clients.
        ks: The values of ``k``.
        num_candidates: The number ``p`` of candidates.
        space: The candidates' feature space (``None``: no structure).
        repetitions: The number ``R`` of repetitions.
        rng: The random generator.

    Returns:
        ``k`` -> the vote sums ``(R, p)``, and the good masks, bool ``(R, p)``.
    """
    model = sc.loss_model(num_candidates)
    depth = max([k for k in ks if k < num_candidates], default=1)
    prefix = ranking_prefix(model, repetitions * clients, depth, rng)
    counts = vote_counts(prefix, ks, repetitions, clients, num_candidates)
    good = _neighbourhoods(space, sc.num_good, rng.integers(0, num_candidates, repetitions))
    is_good = np.zeros((repetitions, num_candidates), dtype=bool)
    np.put_along_axis(is_good, good, True, axis=1)
    rest = np.argsort(np.where(is_good, -1.0, rng.random((repetitions, num_candidates))), axis=1)[:, sc.num_good:]
    place = np.concatenate([good, rest], axis=1)  # label j -> candidate place[r, j]
    out = {}
    for k, label_counts in counts.items():
        votes = np.zeros_like(label_counts)
        np.put_along_axis(votes, place, label_counts, axis=1)
        out[k] = votes
    return out, is_good


def theorem_iv1_success(votes: np.ndarray, good: np.ndarray, sigma: float) -> float:
    """Theorem IV.1's lower bound on the chance that the argmax is good, averaged over vote vectors ``(R, p)``.

    For each vector the theorem holds for any set ``H'`` of good candidates (``Pr[pick in H_good] >=
    Pr[pick in H']``); the best of the sets "the ``j`` most-voted good candidates" is used, whose gap is the
    ``j``-th good count minus the largest count outside the set
    (`dphype.selection.rules.good_selection_probability_bound`).

    Args:
        votes: The noiseless vote sums, ``(R, p)``.
        good: The good masks, bool ``(R, p)``.
        sigma: The noise std of the sum.

    Returns:
        The mean bound.
    """
    from dphype.selection.rules import good_selection_probability_bound

    p = votes.shape[1]
    total = 0.0
    for row, mask in zip(votes.astype(np.float64), good):
        ranked = np.sort(row[mask])[::-1]
        outside_bad = row[~mask].max()
        best = 0.0
        for j in range(1, ranked.size + 1):
            rival = max(outside_bad, ranked[j]) if j < ranked.size else outside_bad
            best = max(best, good_selection_probability_bound(float(ranked[j - 1] - rival), sigma, j, p - j))
        total += best
    return total / len(votes)


def simulated_success(votes: np.ndarray, good: np.ndarray, sigma: float, *, rule: str,
                      space: FeatureSpace | None, clients: int, voters: int, dropout: float, noise: str, k: int,
                      rng: np.random.Generator) -> float:
    """Share of releases whose pick under ``rule`` is good.

    A release is ``votes`` of ``voters`` of the ``clients`` clients plus their noise shares
    (`dphype.privacy.noise.replay_noisy_sums`).

    Args:
        votes: The noiseless vote sums, ``(R, p)``.
        good: The good masks, bool ``(R, p)``.
        sigma: The total noise std calibrated for ``clients``.
        rule: The selection rule (`dphype.selection.rules.RULES`).
        space: The candidates' feature space (``None``: no structure).
        clients: The number ``n`` of clients the noise is calibrated for.
        voters: The number of clients that contribute.
        dropout: The tolerated dropout fraction.
        noise: The noise kind.
        k: Votes per client.
        rng: The random generator.

    Returns:
        The share of good picks.
    """
    from dphype.selection.rules import select_batch

    noisy = replay_noisy_sums(votes, sigma=sigma, clients=clients, repetitions=len(votes), rng=rng, dropout=dropout,
                            noise=noise, survivors=voters)
    picks = select_batch(noisy, space, sigma, rule=rule, clients=voters, k=k).picks
    return float(good[np.arange(len(picks)), picks].mean())


def unanimous_success(clients: int, k: int, num_candidates: int, sigma: float) -> float:
    """Chance that the argmax picks one of ``k`` candidates that ALL ``clients`` voted for (the best case).

    With ``u = (x - n) / sigma``: ``int k phi(u) Phi(u)^(k-1) Phi(u + n / sigma)^(p-k) du`` (the largest of the
    ``k`` counts ``n + sigma Z`` beats the ``p - k`` counts ``sigma W``).

    Args:
        clients: The number ``n`` of clients.
        k: Votes per client.
        num_candidates: The number ``p`` of candidates.
        sigma: The noise std of the sum.

    Returns:
        The chance (1 when ``k >= p``).
    """
    from scipy.integrate import quad
    from scipy.stats import norm

    p = num_candidates
    if k >= p:
        return 1.0
    lead = clients / sigma

    def density(u: float) -> float:
        return k * norm.pdf(u) * norm.cdf(u) ** (k - 1) * norm.cdf(u + lead) ** (p - k)

    return float(min(1.0, quad(density, -12.0, 12.0, limit=200)[0]))


# ---------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Plan:
    """What the planner predicts for one configuration (all keys of `to_dict` are JSON-ready).

    Attributes:
        clients: The number ``n`` of clients.
        epsilon: The run's epsilon.
        delta: The run's delta.
        dropout: The tolerated dropout fraction ``xi``.
        voters: The clients simulated as voting, the ``ceil((1 - xi) n)`` survivors.
        num_candidates: The number ``p`` of candidates.
        noise: The noise kind.
        accountant: The accountant, resolved.
        neighbouring: The neighbouring relation.
        rule: The selection rule that runs (the argmax where ``gp`` has no structure to use).
        scenario: The consensus scenario (`Scenario`, as a dict).
        target: The success that ``min_epsilon`` and ``min_clients`` aim at.
        k: The chosen ``k``, else the recommended one.
        sigma: The noise std of ``release`` at ``k``.
        success: Simulated chance that the run picks a good candidate at ``k``: ``rule`` on the noisy sum, or the
            winner release, as the mode's `Forecast` says.
        success_argmax: The argmax rule on the noisy sum at ``k``.
        bound: Theorem IV.1's bound for the argmax rule on the noisy sum at ``k``.
        recommended_k: The best ``k`` of the noisy sum.
        by_k: One row per compared ``k`` (both forecasts).
        release: The name of the mode the run uses (``None``: none was passed; the noisy-sum forecast applies).
        success_winner: The winner release at ``k``.
        recommended_k_winner: The best ``k`` of the winner release.
        recommended_release: The name of the mode passed with the higher success at its best ``k`` (``None``: no
            mode was passed).
        min_epsilon: Smallest epsilon whose success (of ``release``) at ``k`` reaches ``target`` (``None``: not
            within ``[1e-3, 1e3]``).
        min_clients: Smallest number of clients whose success (of ``release``) at ``k`` reaches ``target``
            (``None``: not within ``[2, MAX_CLIENTS]``).
        unanimous_success: The chance of a good pick if all voters voted for the same ``k`` candidates
            (`unanimous_success`).
        within_opt: For the winner release with the default ballot: the shares of releases within 1 and 2 points
            of Opt measured on the bench tasks nearest this ``(n, epsilon)`` (`measured_within`), or ``None``.
        warnings: The plan's warnings (`warnings`).
    """

    clients: int
    epsilon: float
    delta: float
    dropout: float
    voters: int
    num_candidates: int
    noise: str
    accountant: str
    neighbouring: str
    rule: str
    scenario: dict[str, Any]
    target: float
    k: int
    sigma: float
    success: float
    success_argmax: float
    bound: float
    recommended_k: int
    by_k: list[dict[str, Any]]
    release: str | None
    success_winner: float
    recommended_k_winner: int
    recommended_release: str | None
    min_epsilon: float | None
    min_clients: int | None
    unanimous_success: float
    within_opt: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The plan as a JSON-ready dict.

        Returns:
            Field name -> value.
        """
        return asdict(self)


@dataclass(frozen=True)
class _Setting:
    """Everything fixed while the planner varies ``k``, epsilon or ``n`` (the fields of `plan`'s arguments).

    Attributes:
        delta: The run's delta.
        dropout: The tolerated dropout fraction.
        num_candidates: The number ``p`` of candidates.
        space: The candidates' feature space.
        scenario: The consensus scenario.
        rule: The selection rule.
        noise: The noise kind.
        accountant: The accountant, resolved.
        neighbouring: The neighbouring relation.
        repetitions: Simulated runs per point.
        seed: The simulation's seed.
        inflation: The released noisy sum's std over the calibrated ``sigma`` (`PlannedRelease.noise_inflation`).
    """

    delta: float
    dropout: float
    num_candidates: int
    space: FeatureSpace | None
    scenario: Scenario
    rule: str
    noise: str
    accountant: str
    neighbouring: str
    repetitions: int
    seed: int
    inflation: float = 1.0

    def sigma(self, epsilon: float, k: int) -> float:
        return calibrate(epsilon, self.delta, k, num_candidates=self.num_candidates, accountant=self.accountant,
                         noise=self.noise, neighbouring=self.neighbouring).sigma

    def votes(self, clients: int, ks: Sequence[int]) -> tuple[int, dict[int, np.ndarray], np.ndarray]:
        """Voters (the ``ceil((1 - xi) n)`` survivors), their vote sums per ``k`` and the good masks.

        Args:
            clients: The number ``n`` of clients.
            ks: The values of ``k``.

        Returns:
            The number of voters, ``k`` -> vote sums ``(R, p)``, and the good masks ``(R, p)``.
        """
        from dphype.privacy.noise import min_survivors

        voters = min_survivors(clients, self.dropout)
        rng = np.random.default_rng([self.seed, voters])
        counts, good = simulate_votes(self.scenario, voters, ks, self.num_candidates, self.space, self.repetitions,
                                      rng)
        return voters, counts, good

    def winner_success(self, votes: np.ndarray, good: np.ndarray, epsilon: float) -> float:
        """Share of winner releases (`Forecast.WINNER`) that pick a good candidate, on the same votes.

        Args:
            votes: The noiseless vote sums, ``(R, p)``.
            good: The good masks, ``(R, p)``.
            epsilon: The run's epsilon.

        Returns:
            The share of good picks.
        """
        rng = np.random.default_rng([self.seed, 2])  # common random numbers across k, epsilon and n
        picks = replay_winners(votes, epsilon=epsilon, neighbouring=self.neighbouring, repetitions=len(votes),
                               rng=rng)  # the committee's noise: neither the clients nor the dropout change it
        return float(good[np.arange(len(picks)), picks].mean())

    def success(self, votes: np.ndarray, good: np.ndarray, sigma: float, clients: int, voters: int, k: int,
                rule: str) -> float:
        rng = np.random.default_rng([self.seed, 1])  # common random numbers across k, epsilon and n
        return simulated_success(votes, good, sigma, rule=rule, space=self.space, clients=clients, voters=voters,
                                 dropout=self.dropout, noise=self.noise, k=k, rng=rng)

    def forecast_sigma(self, forecast: Forecast, epsilon: float, k: int) -> float:
        """The noise std of ``forecast``'s release at ``(epsilon, k)``.

        Args:
            forecast: The release forecast.
            epsilon: The epsilon.
            k: Votes per client.

        Returns:
            The noise std.
        """
        if forecast is Forecast.WINNER:
            return noise_std(epsilon, self.neighbouring)
        return self.sigma(epsilon, k)

    def forecast_success(self, forecast: Forecast, votes: np.ndarray, good: np.ndarray, epsilon: float,
                         clients: int, voters: int, k: int) -> float:
        """Simulated success of ``forecast``'s release at ``(epsilon, k)`` on ``votes`` (the run's rule on the sum).

        Args:
            forecast: The release forecast.
            votes: The noiseless vote sums, ``(R, p)``.
            good: The good masks, ``(R, p)``.
            epsilon: The epsilon.
            clients: The number ``n`` of clients.
            voters: The number of voters.
            k: Votes per client.

        Returns:
            The share of good picks.
        """
        if forecast is Forecast.WINNER:
            return self.winner_success(votes, good, epsilon)
        return self.success(votes, good, self.inflation * self.sigma(epsilon, k), clients, voters, k, self.rule)


def _bisect(ok: Any, lo: float, hi: float, ratio: float) -> float | None:
    """Smallest ``x`` in ``[lo, hi]`` with ``ok(x)``, to within a factor ``ratio``.

    ``ok`` is monotone in ``x``; ``None`` if ``not ok(hi)``.
    """
    if not ok(hi):
        return None
    if ok(lo):
        return lo
    while hi / lo > ratio:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def _smallest_clients(ok: Any, start: int) -> int | None:
    """Smallest ``n`` in ``[2, MAX_CLIENTS]`` with ``ok(n)`` for ``ok`` monotone in ``n``.

    ``None`` if not ``ok(MAX_CLIENTS)``. Brackets the answer by halving down or doubling up from ``start`` (the
    run's own n, near which the answer usually lies), then bisects exactly: the simulations stay near the answer
    instead of starting with ``MAX_CLIENTS`` simulated clients.
    """
    lo = hi = min(max(start, 2), MAX_CLIENTS)
    if ok(hi):
        while hi > 2:
            lo = max(2, hi // 2)
            if not ok(lo):
                break
            hi = lo
        else:
            return 2
    else:
        while True:
            if lo >= MAX_CLIENTS:
                return None
            hi = min(2 * lo, MAX_CLIENTS)
            if ok(hi):
                break
            lo = hi
    while hi - lo > 1:  # not ok(lo), ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def plan(
    clients: int,
    epsilon: float,
    delta: float,
    space: FeatureSpace | None,
    num_candidates: int,
    *,
    k: int | None = None,
    dropout: float = 0.0,
    consensus: str | float = "moderate",
    num_good: int | None = None,
    target: float = DEFAULT_TARGET,
    rule: str | None = None,
    noise: str = "skellam",
    accountant: str | None = None,
    neighbouring: str = "replace-one",
    ks: Sequence[int] | None = None,
    repetitions: int = 200,
    seed: int = 0,
    search: bool = True,
    release: PlannedRelease | None = None,
    releases: Sequence[PlannedRelease] = (),
    ballot: str | None = None,
) -> Plan:
    """Predict a DP-Hype run of ``clients`` clients at ``(epsilon, delta)`` over ``num_candidates`` public candidates.

    Both forecasts (`Forecast`) are predicted whatever ``release`` is.

    Args:
        clients: The number ``n`` of clients.
        epsilon: The run's epsilon.
        delta: The run's delta.
        space: The candidates' feature space (``None`` or structureless: the rule falls back to the argmax).
        num_candidates: The number ``p`` of candidates.
        k: Votes per client; ``None`` recommends ``k`` among ``ks`` and reports at it.
        dropout: The tolerated dropout fraction.
        consensus: The consensus scenario (`scenario`).
        num_good: The scenario's number of good candidates (`scenario`).
        target: The success that ``min_epsilon`` and ``min_clients`` aim at.
        rule: The selection rule (default `dphype.selection.rules.DEFAULT_RULE`).
        noise: The noise kind.
        accountant: The accountant (``None``: the noise kind's default).
        neighbouring: The neighbouring relation.
        ks: The values of ``k`` to compare (default `KS` below ``num_candidates``).
        repetitions: Simulated runs per point, at least 10.
        seed: The simulation's seed.
        search: ``False`` skips the searches for ``min_epsilon`` and ``min_clients`` (reported as ``None``).
        release: The run's mode (e.g. ``DPHypeConfig.mode``; ``None``: report the noisy-sum forecast, unnamed).
        releases: The modes to recommend among (default: ``release`` alone; `dphype.modes.release_modes` for
            all).
        ballot: The run's ballot name: with the winner release and `MEASURED_BALLOT` the plan carries the measured
            shares within 1 and 2 points of Opt (`measured_within`), which the scenario cannot predict.

    Returns:
        The plan, with its warnings.

    Raises:
        ValueError: If a parameter is out of range, ``space`` has another number of candidates, or ``ks`` holds
            no ``k`` below ``num_candidates``.
    """
    from dphype.selection.rules import DEFAULT_RULE, check_rule

    clients = check_clients(clients)
    epsilon = check_epsilon(epsilon)
    p = check_int("num_candidates", num_candidates, 2)
    if space is not None and space.num_candidates != p:
        raise ValueError(f"space has {space.num_candidates} candidates, num_candidates is {p}")
    chosen_k = None if k is None else check_k(k, p)
    setting = _Setting(
        delta=check_delta(delta), dropout=check_dropout(dropout), num_candidates=p, space=space,
        scenario=scenario(p, consensus, num_good), rule=check_rule(DEFAULT_RULE if rule is None else rule),
        noise=noise, accountant=resolve_accountant(accountant, noise), neighbouring=check_neighbouring(neighbouring),
        repetitions=check_int("repetitions", repetitions, 10), seed=check_int("seed", seed, 0),
        inflation=1.0 if release is None else float(release.noise_inflation))
    target = check_probability("target", target)
    forecast = Forecast.NOISY_SUM if release is None else release.forecast
    chosen = set() if chosen_k is None else {chosen_k}
    compare = sorted({check_k(x, p) for x in (KS if ks is None else ks) if x < p} | chosen)
    if not compare:
        raise ValueError(f"ks must contain at least one k in [1, {p - 1}], got {ks!r}")
    voters, counts, good = setting.votes(clients, compare)
    by_k: list[dict[str, Any]] = []
    for kk in compare:
        sigma = setting.sigma(epsilon, kk)
        released = setting.inflation * sigma  # the noise the sum is released with
        by_k.append({"k": kk, "sigma": sigma,
                     "success": setting.success(counts[kk], good, released, clients, voters, kk, setting.rule),
                     "success_argmax": setting.success(counts[kk], good, released, clients, voters, kk, "argmax"),
                     "bound": theorem_iv1_success(counts[kk], good, sigma),
                     "success_winner": setting.winner_success(counts[kk], good, epsilon)})
    best = max(by_k, key=lambda row: (row["success"], -row["k"]))
    best_of = {Forecast.NOISY_SUM: best, Forecast.WINNER: _winner_tie_break(setting, by_k, epsilon, clients)}
    row = best_of[forecast] if chosen_k is None else next(r for r in by_k if r["k"] == chosen_k)
    kk = int(row["k"])
    sigma = setting.forecast_sigma(forecast, epsilon, kk)
    compared = list(releases) or ([] if release is None else [release])
    recommended = max(compared, key=lambda r: best_of[r.forecast][r.forecast.value], default=None)  # ties: first

    def reaches_epsilon(eps: float) -> bool:
        return setting.forecast_success(forecast, counts[kk], good, eps, clients, voters, kk) >= target

    def reaches_clients(n: int) -> bool:
        m, c, g = setting.votes(n, [kk])
        return setting.forecast_success(forecast, c[kk], g, epsilon, n, m, kk) >= target

    min_eps = _bisect(reaches_epsilon, 1e-3, 1e3, 1.02) if search else None
    min_n = _smallest_clients(reaches_clients, clients) if search else None
    result = Plan(
        clients=clients, epsilon=epsilon, delta=setting.delta, dropout=setting.dropout, voters=voters,
        num_candidates=p, noise=setting.noise, accountant=setting.accountant, neighbouring=setting.neighbouring,
        rule=_rule_that_runs(setting), scenario=asdict(setting.scenario), target=target, k=kk,
        sigma=sigma, success=row[forecast.value], success_argmax=row["success_argmax"], bound=row["bound"],
        recommended_k=int(best["k"]), by_k=by_k, release=None if release is None else release.name,
        success_winner=row["success_winner"], recommended_k_winner=int(best_of[Forecast.WINNER]["k"]),
        recommended_release=None if recommended is None else recommended.name,
        min_epsilon=None if min_eps is None else float(f"{min_eps:.3g}"),
        min_clients=None if min_n is None else int(min_n),
        unanimous_success=unanimous_success(voters, kk, p, sigma),
        within_opt=measured_within(clients, epsilon, setting.neighbouring, p)
        if forecast is Forecast.WINNER and ballot == MEASURED_BALLOT else None)
    return Plan(**{**asdict(result), "warnings": warnings(result)})


def measured_within(clients: int, epsilon: float, neighbouring: str = "replace-one",
                    num_candidates: int = 100) -> dict[str, Any]:
    """The measured shares of releases within 1 and 2 points of Opt nearest the run (`MEASURED_WITHIN`).

    The planner sees no data: how close a release lands to Opt depends on how well the clients' local scores
    predict the federated accuracy, which no scenario knows. This is what the bench measured, as a range over its
    tasks, for `MEASURED_BALLOT`: at the measured number of candidates nearest ``p`` (in ``log p``), then at its
    grid point nearest ``(clients, epsilon)`` (in ``log n`` and ``log epsilon``).

    Args:
        clients: The number ``n`` of clients.
        epsilon: The run's epsilon.
        neighbouring: The run's neighbouring relation (each was measured).
        num_candidates: The number ``p`` of candidates.

    Returns:
        ``{"ballot", "neighbouring", "candidates", "clients", "epsilon", "on_grid", "tasks", "measured_on",
        "within_1pt", "within_2pt"}``: the grid point, whether the run is on it, the ``[min, max]`` shares over the
        tasks and which they were.
    """
    relation = check_neighbouring(neighbouring)
    p = min(MEASURED_TASKS, key=lambda q: (abs(math.log(q / num_candidates)), q))
    point = min((key for key in MEASURED_WITHIN if key[:2] == (p, relation)),
                key=lambda key: (abs(math.log(key[2] / clients)) + abs(math.log(key[3] / epsilon)), key))
    entry = MEASURED_WITHIN[point]
    return {"ballot": MEASURED_BALLOT, "neighbouring": relation, "candidates": p, "clients": point[2],
            "epsilon": point[3], "on_grid": point[2:] == (clients, epsilon) and p == num_candidates,
            "tasks": entry["tasks"], "measured_on": MEASURED_TASKS[p],
            "within_1pt": list(entry["within_1pt"]), "within_2pt": list(entry["within_2pt"])}


#: The winner release's remaining ties are broken under this many times the stated scenario's disagreement.
TIE_BREAK_DISAGREEMENT = 2.0


def tie_break_scenario(sc: Scenario) -> Scenario:
    """The scenario that breaks the winner release's remaining ties.

    Args:
        sc: The stated scenario.

    Returns:
        ``sc`` with `TIE_BREAK_DISAGREEMENT` times its disagreement ``sigma_loss`` (moderate's 0.5 -> weak's 1.0).
    """
    return Scenario(f"{sc.name}, tie-break", sc.num_good, TIE_BREAK_DISAGREEMENT * sc.sigma_loss)


def _winner_tie_break(setting: _Setting, by_k: list[dict[str, Any]], epsilon: float, clients: int) -> dict[str, Any]:
    """The row of the winner release's recommended ``k``: the highest ``success_winner``.

    When several ``k`` reach it (at a large epsilon every ``k`` from some on simulates success 1.0), the scenario
    cannot tell them apart, and the tie goes to

    1. the scenario's number of good candidates ``|H_good|`` (a vote for exactly the good ones) if it is tied;
    2. else the tied ``k`` with the highest success under `tie_break_scenario` (clients that agree half
       as well), simulated for the tied ``k`` exactly as `plan` with that scenario and ``ks`` = the tied
       ``k`` would (each tied row gets ``success_winner_tie_break``); then the smallest ``k``.

    Why (``dphype bench ksweep`` on 9 Adult federations, results/README.md): the smallest saturated ``k``
    (1-3) lands 2-4 points from Opt under label skew, where ``k`` = 5 lands within 0.4; ``k`` of 20 and more
    lands 5-9 points from it at n = 250 (many candidates reach the ceiling of n votes and the lowest index wins
    among them); ties below saturation (epsilon <= 0.25 at 10-20 clients) measure best at the larger ``k`` that
    the weaker scenario prefers.
    """
    top = max(row["success_winner"] for row in by_k)
    tied = [row for row in by_k if row["success_winner"] == top]
    if len(tied) == 1:
        return tied[0]
    good = next((row for row in tied if row["k"] == setting.scenario.num_good), None)
    if good is not None:
        return good
    weaker = replace(setting, scenario=tie_break_scenario(setting.scenario))
    voters, counts, is_good = weaker.votes(clients, [row["k"] for row in tied])
    for row in tied:
        row["success_winner_tie_break"] = weaker.winner_success(counts[row["k"]], is_good, epsilon)
    return max(tied, key=lambda row: (row["success_winner_tie_break"], -row["k"]))


def _rule_that_runs(setting: _Setting) -> str:
    from dphype.selection.rules import selection_rule

    return selection_rule(setting.rule).runs_as(setting.space)[0].name


def warnings(result: Plan, min_success: float | None = None) -> list[str]:
    """The plan's warnings; a refusal when ``min_success`` is given and not reached.

    Args:
        result: The plan.
        min_success: The smallest predicted success to accept, in ``[0, 1]``; ``None``: never refuse.

    Returns:
        The warnings: a release that is noise, or a predicted success below `WARN_BELOW`.

    Raises:
        ValueError: If the predicted success is below ``min_success``, or ``min_success`` is not in ``[0, 1]``.
    """
    out = []
    if result.unanimous_success < WARN_BELOW:
        out.append(f"epsilon {result.epsilon:g} is so small that the release is noise: even if all {result.voters} "
                   f"clients voted for the same {result.k} candidates, the argmax would pick one of them with "
                   f"probability {result.unanimous_success:.2f} (noise std sigma = {result.sigma:.1f} votes)")
    if result.success < WARN_BELOW:
        hint = (f"; reaching {result.target:g} needs epsilon >= {result.min_epsilon} or clients >= "
                f"{result.min_clients}" if result.min_epsilon is not None or result.min_clients is not None else "")
        out.append(f"predicted chance of selecting a good candidate is {result.success:.2f} (< {WARN_BELOW}) under "
                   f"the {result.scenario['name']} consensus scenario at k = {result.k}; `dphype plan` recommends "
                   f"k and the smallest epsilon and number of clients{hint}")
    if result.within_opt is not None and result.within_opt["within_2pt"][0] < DEFAULT_TARGET:
        w = result.within_opt
        out.append(f"the planner sees no data: on the bench tasks at n = {w['clients']}, epsilon = {w['epsilon']:g} "
                   f"with {w['candidates']} candidates ({w['tasks']} federations: {w['measured_on']}) "
                   f"the {w['ballot']} ballot (k = {result.k} here) put {w['within_2pt'][0]:.0%} to "
                   f"{w['within_2pt'][1]:.0%} of releases within 2 points of Opt ({w['within_1pt'][0]:.0%} to "
                   f"{w['within_1pt'][1]:.0%} within 1); yours depends on how well local scores predict the "
                   f"federated accuracy. The auto ballot is the measured robust default: the scenario's k "
                   f"(recommended_k_winner = {result.recommended_k_winner}) is a guess about data the planner cannot "
                   "see, and no fixed k did as well on every measured task")
    if min_success is not None:
        floor = check_probability("min_success", min_success)
        if result.success < floor:
            raise ValueError(f"predicted success {result.success:.2f} is below min_success = {floor:g}: refusing "
                             f"to run ({'; '.join(out) or 'raise epsilon, clients or choose the recommended k'})")
    return out


def check_plan(
    clients: int,
    epsilon: float,
    delta: float,
    space: FeatureSpace | None,
    num_candidates: int,
    k: int,
    *,
    dropout: float = 0.0,
    min_success: float | None = None,
    **options: Any,
) -> Plan:
    """The check a server or the demo runs before any data is touched (about a second).

    The predicted success of the configured run, refused below ``min_success``: the plan at the configured ``k``
    without the searches; its ``warnings`` say when the predicted success is below `WARN_BELOW` or the release is
    noise.

    Args:
        clients: The number ``n`` of clients.
        epsilon: The run's epsilon.
        delta: The run's delta.
        space: The candidates' feature space.
        num_candidates: The number ``p`` of candidates.
        k: Votes per client.
        dropout: The tolerated dropout fraction.
        min_success: In ``[0, 1]``: refuse when the predicted success is below it; ``None``: never refuse.
        **options: Go to `plan` (``rule``, ``noise``, ``accountant``, ``neighbouring``, ``consensus``,
            ``num_good``, ``repetitions``, ``seed``, ``release``, ``releases``).

    Returns:
        The plan.

    Raises:
        ValueError: If a parameter is out of range, or the predicted success is below ``min_success``.
    """  # noqa: DOC502
    if min_success is not None:
        check_probability("min_success", min_success)
    result = plan(clients, epsilon, delta, space, num_candidates, k=k, dropout=dropout, ks=[k], search=False,
                  **options)
    warnings(result, min_success)
    return result


def preflight(*args: Any, **kwargs: Any) -> Plan:
    """Deprecated alias of `check_plan` (the name collided with the clients' pre-flight round).

    Args:
        *args: As for `check_plan`.
        **kwargs: As for `check_plan`.

    Returns:
        `check_plan`'s plan, after a ``DeprecationWarning``.
    """
    _warnings.warn("dphype.selection.planner.preflight is deprecated; use check_plan", DeprecationWarning,
                   stacklevel=2)
    return check_plan(*args, **kwargs)
