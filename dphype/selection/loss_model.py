"""The planner's loss model (Section IV-B) and its exact samplers of the clients' rankings.

Every client's local loss is ``N(0, s^2)`` for each of the ``|H_good|`` good candidates and ``N(1, s^2)`` for the
others, and it votes for its ``k`` smallest. One ranking per client serves every ``k`` (the top-k sets are nested
prefixes of the client's loss ranking), and only what the first ``depth`` ranks depend on is drawn:

* ``losses``: draw every loss and sort (what a client does; the reference);
* ``direct``: sort rank keys ``-log Phi((loss - 1) / sigma_loss)`` instead. The map is decreasing, so the
  ranking is the ranking of the losses, and for a bad candidate the key is ``-log U ~ Exp(1)``, which is
  cheaper to draw than a Gaussian;
* ``order`` (many bad candidates): given the good losses ``g``, the number of bad losses below each of them
  is multinomial over the intervals between the sorted ``Phi((g - 1) / sigma_loss)`` (bad losses are iid
  ``N(1, sigma_loss^2)``); which bad candidates occupy the bad ranks is, by exchangeability, a uniformly
  random ordered tuple of distinct bad indices.

The synthetic study (``simulations.synthetic``, Fig. 2) draws its rankings with the same samplers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dphype.checks import check_int, check_positive

#: use the order-statistics sampler once bad candidates outnumber the ranking depth this many times
_ORDER_SAMPLER_RATIO = 5


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
        """``(rows, |H|)`` float32 losses, one row per client."""
        out = rng.standard_normal((rows, self.num_candidates), dtype=np.float32)
        out *= np.float32(self.sigma_loss)
        out[:, self.num_good :] += np.float32(1.0)
        return out


def ranking_from_losses(losses: np.ndarray, depth: int) -> np.ndarray:
    """Indices ``(rows, depth)`` of each row's ``depth`` smallest losses (or rank keys), best first.

    ``prefix[:, :k]`` marks the same ``k`` candidates as `dphype.selection.voting.top_k_votes` with
    ``maximize=False`` (up to exact ties, of probability zero for continuous losses).
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
    """Best-first candidate indices ``(rows, depth)`` of ``rows`` independent clients (module docstring).

    Args:
        model: The clients' loss model.
        rows: The number of clients.
        depth: The prefix length, the largest ``k`` needed.
        rng: The random generator.
        sampler: ``"losses"``, ``"direct"``, ``"order"`` or ``"auto"`` (``order`` when bad candidates outnumber
            ``depth`` five times, else ``direct``).

    Returns:
        The prefixes, int32 ``(rows, depth)``.

    Raises:
        ValueError: For an unknown ``sampler``, or ``"order"`` with fewer bad candidates than ``depth``.
    """
    # lazy import: scipy
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

