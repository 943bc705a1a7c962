"""Client votes and the server's selection rule (DP-Hype Algorithm 1, Section IV, Appendix F).

Each client turns its local scores into a vote vector with exactly ``k`` ones (Algorithm 1, lines 5-8);
the server takes the argmax of the noisy vote sum (line 12). Theorem IV.1 lower-bounds the probability
that this argmax is a good candidate.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from numpy.typing import ArrayLike


def _as_scores(scores: ArrayLike) -> np.ndarray:
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"scores must be a non-empty 1-D array, got shape {arr.shape}")
    return arr


def _as_score_keys(scores: ArrayLike) -> np.ndarray:
    """Scores as a ``(p, j)`` float64 array of lexicographic keys; a ``(p,)`` vector is one key column."""
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim not in (1, 2) or arr.shape[0] == 0 or arr.size == 0:
        raise ValueError(
            f"scores must be a non-empty array of shape (p,) or (p, j) (lexicographic keys), got shape {arr.shape}"
        )
    return arr.reshape(arr.shape[0], -1)


def primary_scores(scores: ArrayLike) -> np.ndarray:
    """The primary key of each candidate: ``scores`` itself for shape ``(p,)``, column 0 for ``(p, j)``."""
    return _as_score_keys(scores)[:, 0].copy()


def top_k_votes(scores: ArrayLike, k: int, *, maximize: bool = True) -> np.ndarray:
    """Vote vector with exactly ``k`` ones at the ``k`` best candidates (Algorithm 1, lines 5-8).

    Algorithm 1 has every client vote for the ``k`` candidates with the best local score (the ``k``
    smallest losses). ``scores`` is either one score per candidate, shape ``(p,)``, or lexicographic keys,
    shape ``(p, j)``: column 0 decides, and each later column only breaks ties among candidates equal in
    all earlier columns, e.g. ``[accuracy, -loss]`` ranks by validation accuracy and breaks its frequent
    ties (small validation sets have few distinct accuracies) by the validation loss of Algorithm 1.
    Every column is ranked in the same direction: ``maximize=True`` for accuracies, ``False`` for losses.
    Candidates still tied in every key go to the lower candidate index (the public order). A candidate
    with NaN or +-inf in ANY key ranks last, whatever the direction (after every candidate with all keys
    finite; ties among them by index), so a broken evaluation never attracts a vote while finite
    alternatives remain. Returns ``int64`` of length ``p``.
    """
    keys = _as_score_keys(scores)
    p = keys.shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= p:
        raise ValueError(f"k must be an integer in [1, {p}] (number of candidates), got {k!r}")
    bad = ~np.all(np.isfinite(keys), axis=1)
    ranked = np.where(bad[:, None], 0.0, -keys if maximize else keys)
    # np.lexsort's LAST key is primary: finite first, then column 0, 1, ..., then the candidate index.
    order = np.lexsort((np.arange(p), *ranked.T[::-1], bad))
    votes = np.zeros(p, dtype=np.int64)
    votes[order[: int(k)]] = 1
    return votes


def raw_score_votes(scores: ArrayLike, *, maximize: bool = True) -> np.ndarray:
    """Real-valued vote of Appendix F: the local scores themselves, bounded to ``[0, 1]``.

    With ``maximize=False`` the scores are losses in ``[0, 1]`` and the vote is ``1 - loss`` (Appendix F:
    subtract the loss from the maximal loss). Replace-one sensitivity is then ``L2 = sqrt(p)``,
    ``L1 = p`` (see :class:`dphype.accounting.VoteRelease` with ``raw_scores=True``). Out-of-range or
    non-finite scores raise ``ValueError``; they are never clipped silently. For lexicographic keys of
    shape ``(p, j)`` (see :func:`top_k_votes`) only the primary key, column 0, is released: the
    tie-breaking columns matter only for a ranking.
    """
    arr = primary_scores(scores)
    if not np.all(np.isfinite(arr)) or arr.min() < 0.0 or arr.max() > 1.0:
        raise ValueError(
            f"raw scores must be finite and in [0, 1], got min {arr.min()!r}, max {arr.max()!r}"
        )
    return arr.copy() if maximize else 1.0 - arr


def select(noisy_sum: ArrayLike) -> int:
    """Index of the candidate with the most noisy votes (Algorithm 1, line 12); ties -> lowest index."""
    arr = _as_scores(noisy_sum)
    if not np.all(np.isfinite(arr)):
        raise ValueError("noisy_sum must be finite")
    return int(np.argmax(arr))


def selection_gap(vote_sum: ArrayLike, good: Sequence[int]) -> float:
    """Gap ``gamma`` of Eq. (3): min votes over good candidates minus max votes over the others.

    ``vote_sum`` is the noiseless aggregated vote vector, ``good`` the indices of ``H_good``; every other
    index counts as bad. Requires at least one good and one bad candidate.
    """
    arr = _as_scores(vote_sum)
    mask = np.zeros(arr.size, dtype=bool)
    idx = np.asarray(good, dtype=np.int64)
    if idx.size == 0 or idx.min() < 0 or idx.max() >= arr.size:
        raise ValueError(f"good must be a non-empty list of indices in [0, {arr.size - 1}]")
    mask[idx] = True
    if mask.all():
        raise ValueError("good must leave at least one bad candidate")
    return float(arr[mask].min() - arr[~mask].max())


def good_selection_probability_bound(gap: float, sigma: float, num_good: int, num_bad: int) -> float:
    """Theorem IV.1: ``Pr[M(D) in H_good] >= 1 - |H_bad| sigma / (gamma sqrt(pi)) exp(-gamma^2 / (4 sigma^2))``.

    ``gap`` is ``gamma`` of Eq. (3), ``sigma`` the std of the total Gaussian noise on each coordinate of the
    vote sum. The proof bounds ``Pr[z_i - z_j >= gamma]`` for ``z_i - z_j ~ N(0, 2 sigma^2)`` by the
    Gaussian tail ``sigma / (gamma sqrt(pi)) exp(-gamma^2/(4 sigma^2))`` and takes a union bound over the
    ``num_bad`` bad candidates. The bound does not depend on ``num_good`` (only ``num_good >= 1`` is
    needed for ``gamma`` to exist); it is validated for consistency with the theorem's setting.
    The tail bound needs ``gamma > 0``; for ``gamma <= 0`` the theorem gives nothing and the trivial
    bound 0 is returned; a negative right-hand side is likewise reported as 0 (a probability is >= 0).
    """
    from dphype.accounting import check_sigma  # local import: accounting pulls in scipy

    check_sigma(sigma)
    if not math.isfinite(gap):
        raise ValueError(f"gap must be finite, got {gap!r}")
    for name, value in (("num_good", num_good), ("num_bad", num_bad)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if num_good < 1:
        raise ValueError(f"num_good must be >= 1, got {num_good}")
    if num_bad < 0:
        raise ValueError(f"num_bad must be >= 0, got {num_bad}")
    if num_bad == 0:
        return 1.0
    if gap <= 0:
        return 0.0
    failure = num_bad * sigma / (gap * math.sqrt(math.pi)) * math.exp(-(gap**2) / (4.0 * sigma**2))
    return max(0.0, 1.0 - failure)
