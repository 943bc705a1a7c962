"""Client votes (DP-Hype Algorithm 1, lines 5-8, and Appendix F).

Each client turns its local scores into a vote vector with exactly ``k`` ones. The server's selection rule
on the noisy vote sum (line 12) and Theorem IV.1 live in `dphype.selection.rules`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def _as_score_keys(scores: ArrayLike) -> np.ndarray:
    """Scores as a ``(p, j)`` float64 array of lexicographic keys; a ``(p,)`` vector is one key column."""
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim not in (1, 2) or arr.shape[0] == 0 or arr.size == 0:
        raise ValueError(
            f"scores must be a non-empty array of shape (p,) or (p, j) (lexicographic keys), got shape {arr.shape}"
        )
    return arr.reshape(arr.shape[0], -1)


def primary_scores(scores: ArrayLike) -> np.ndarray:
    """The primary key of each candidate.

    Args:
        scores: ``(p,)`` scores, or ``(p, j)`` lexicographic keys (see `top_k_votes`).

    Returns:
        A ``(p,)`` float64 copy: ``scores`` itself for shape ``(p,)``, column 0 for ``(p, j)``.

    Raises:
        ValueError: ``scores`` is empty or not of shape ``(p,)`` or ``(p, j)``.
    """  # noqa: DOC502
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
    alternatives remain.

    Args:
        scores: ``(p,)`` scores, one per candidate, or ``(p, j)`` lexicographic keys.
        k: The number of votes, an integer in ``[1, p]``.
        maximize: Rank every key column from high to low (``True``: accuracies) or low to high (losses).

    Returns:
        The ``(p,)`` int64 vote vector: ``1`` at the ``k`` best candidates, ``0`` elsewhere.

    Raises:
        ValueError: ``scores`` is empty or of another shape, or ``k`` is not an integer in ``[1, p]``.
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
    ``L1 = p`` (see `dphype.privacy.accounting.VoteRelease` with ``raw_scores=True``). Out-of-range or
    non-finite scores raise ``ValueError``; they are never clipped silently. For lexicographic keys of
    shape ``(p, j)`` (see `top_k_votes`) only the primary key, column 0, is released: the
    tie-breaking columns matter only for a ranking.

    Args:
        scores: ``(p,)`` scores in ``[0, 1]``, or ``(p, j)`` lexicographic keys whose column 0 is in ``[0, 1]``.
        maximize: The scores are utilities (the vote is the score) or losses (the vote is ``1 - loss``).

    Returns:
        The ``(p,)`` float64 vote vector in ``[0, 1]``.

    Raises:
        ValueError: The scores' shape is wrong, or a primary score is non-finite or outside ``[0, 1]``.
    """
    arr = primary_scores(scores)
    if not np.all(np.isfinite(arr)) or arr.min() < 0.0 or arr.max() > 1.0:
        raise ValueError(
            f"raw scores must be finite and in [0, 1], got min {arr.min()!r}, max {arr.max()!r}"
        )
    return arr.copy() if maximize else 1.0 - arr

