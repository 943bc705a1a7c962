"""Client votes (DP-Hype Algorithm 1, lines 5-8, Appendix F, and graded ballots).

Each client turns its local scores into a ballot, one integer per candidate. DP-Hype's is `top_k_votes`: exactly
``k`` ones. The graded ballots give each candidate an integer in ``[0, G]``, ``G = 2**bits - 1``:

* `rank_votes` (``"rank:D"``): truncated Borda, ``G`` for the client's best candidate falling linearly to about
  ``G / D`` at its ``D``-th, 0 below;
* `score_votes` (``"score:M"``): a clipped linear utility of the shortfall from the client's own best,
  ``round(G * clip(1 - (best - s) / M, 0, 1))``. Summed over ``n`` clients, near the top the noisy maximum
  approaches the argmax of the clients' mean score, with noise std about ``2 sqrt(2) M / (n epsilon)`` in score
  units under replace-one, whatever ``G`` (``G`` only sets the rounding);
* `auto_depth` (``"auto"``): top-k with ``k = round(c p (s / m)^a)`` from public facts only: ``p``, the std ``s``
  of the argmax release's noise for a top-k ballot and the fewest voters ``m`` (``c = AUTO_SCALE``,
  ``a = AUTO_EXPONENT``), at least ``AUTO_FLOOR p`` and `AUTO_MIN_DEPTH`. The noise-to-signal ratio ``s / m``
  decides how deep a vote must reach before the good candidates' counts rise above the noise; the argmax
  release's default;
* `share_depth` (``"share"``): top-k with ``k = round(c p s^a)``, a share of the candidates that grows with the
  release's noise std ``s`` but not with ``n`` (``c = SHARE_SCALE``, ``a = SHARE_EXPONENT``), with the same bounds.

Both rules' constants are fitted by ``dphype bench ksweep-loto``, which fits each family of rules on all measured
tasks but one and measures it on the task left out (docs/ballots.md).

`Ballot` names a ballot (``"top-k"``, ``"share[:C[:A]]"``, ``"auto[:C]"``, ``"rank:D[:BITS]"``,
``"score:M[:BITS]"``), casts it and gives its `dphype.selection.ballots.BallotForm`, the bounds every ballot must
meet and the tallies check.

The trade-off. In the argmax release the noise depends on ``G`` only (`dphype.privacy.winner`): a graded ballot
costs no more epsilon than top-k, but its noise and counts both grow by ``G``, so per unit of ``G`` a linear rank
ballot over ``D`` ranks is the average of the top-``j`` ballots, ``j <= D``: a hedge over ``k``, never better than
the best ``k``. In the sum release the noise must hide a whole ballot: a linear rank ballot's l2 sensitivity is
about ``G sqrt(2 D / 3)`` against top-k's ``sqrt(2 k)``; the sum release keeps top-k
(`dphype.release.ReleaseMode.check_ballot`). The server's selection rule lives in `dphype.selection.rules`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike

from dphype.selection.ballots import BallotForm


def _as_score_keys(scores: ArrayLike) -> np.ndarray:
    """Scores as a ``(p, j)`` float64 array of lexicographic keys; a ``(p,)`` vector is one key column."""
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim not in (1, 2) or arr.shape[0] == 0 or arr.size == 0:
        raise ValueError(
            f"scores must be a non-empty array of shape (p,) or (p, j) (lexicographic keys), got shape {arr.shape}"
        )
    return arr.reshape(arr.shape[0], -1)


def primary_scores(scores: ArrayLike) -> np.ndarray:
    """The ``(p,)`` primary key of each candidate: ``scores`` for ``(p,)``, column 0 for ``(p, j)``."""
    return _as_score_keys(scores)[:, 0].copy()


def ranking(scores: ArrayLike, *, maximize: bool = True) -> np.ndarray:
    """The ``(p,)`` candidate indices best first, as `top_k_votes` ranks them; a bad shape is refused."""
    keys = _as_score_keys(scores)
    p = keys.shape[0]
    bad = ~np.all(np.isfinite(keys), axis=1)
    ranked = np.where(bad[:, None], 0.0, -keys if maximize else keys)
    # np.lexsort's LAST key is primary: finite first, then column 0, 1, ..., then the candidate index.
    return np.lexsort((np.arange(p), *ranked.T[::-1], bad)).astype(np.int64)


def top_k_votes(scores: ArrayLike, k: int, *, maximize: bool = True) -> np.ndarray:
    """Vote vector with exactly ``k`` ones at the ``k`` best candidates (Algorithm 1, lines 5-8).

    ``scores`` is one score per candidate, ``(p,)``, or lexicographic keys, ``(p, j)``: column 0 decides and each
    later column only breaks ties among candidates equal in all earlier ones (e.g. ``[accuracy, -loss]``); every column
    is ranked in the same direction. Candidates still tied go to the lower index (the public order). A candidate with
    NaN or +-inf in ANY key ranks last whatever the direction, so a broken evaluation never attracts a vote while
    finite alternatives remain.

    Args:
        scores: ``(p,)`` scores, or ``(p, j)`` lexicographic keys.
        k: The number of votes, an integer in ``[1, p]``.
        maximize: Rank every key column from high to low (accuracies) or low to high (losses).

    Returns:
        The ``(p,)`` int64 vote vector.

    Raises:
        ValueError: ``scores`` is empty or of another shape, or ``k`` is not an integer in ``[1, p]``.
    """
    keys = _as_score_keys(scores)
    p = keys.shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= p:
        raise ValueError(f"k must be an integer in [1, {p}] (number of candidates), got {k!r}")
    order = ranking(keys, maximize=maximize)
    votes = np.zeros(p, dtype=np.int64)
    votes[order[: int(k)]] = 1
    return votes


def raw_score_votes(scores: ArrayLike, *, maximize: bool = True) -> np.ndarray:
    """Real-valued vote of Appendix F: the primary scores themselves in ``[0, 1]``, or ``1 - loss``.

    Replace-one sensitivity ``L2 = sqrt(p)``, ``L1 = p`` (`dphype.privacy.accounting.VoteEvent` with
    ``raw_scores=True``). Out-of-range or non-finite scores are refused, never clipped; of ``(p, j)`` keys only
    column 0 is released.

    Args:
        scores: ``(p,)`` scores, or ``(p, j)`` keys, with the primary score in ``[0, 1]``.
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



#: Bits of a graded ballot's entries unless its name says otherwise: entries in ``[0, 15]``.
DEFAULT_BITS = 4
#: The most bits an entry may have (the committee checks ``bits`` binary digits per entry).
MAX_BITS = 8
#: ``c`` of the auto ballot's rule ``k = round(c p (s / m)**AUTO_EXPONENT)`` (`auto_depth`), fitted by ``dphype bench
#: ksweep-loto`` as its ``ratio`` family (the largest excess over the cells' goals or floors, with a margin). On the
#: enlarged grid no rule of public facts meets the goals; without the one task whose label-skewed split no rule
#: serves, the fit gives 0.38 on the grid's first 88 federations and 0.42 on its 96 (docs/ballots.md), and the
#: ballot grid's measured ``auto`` points, which the planner quotes, are this constant's.
AUTO_SCALE = 0.36
#: The exponent of the noise per voter ``s / m`` in the auto rule: 1, ``k`` in proportion to ``s / m`` (the study's
#: ``ratio`` family; its ``auto`` family, which fits the exponent too, misses a cell more out of sample).
AUTO_EXPONENT = 1.0
#: The auto ballot's smallest ``k`` as a fraction of ``p``, whatever the number of voters. A vote of one or two
#: candidates is fragile: on the ballot grid a floor of 2 at ``p = 100`` gains at n >= 50 under replace-one and
#: falls off a cliff under add-remove on label-skewed digits (the ``floor`` family in the docs).
AUTO_FLOOR = 0.03
#: The auto ballot's smallest ``k`` whatever ``p`` (below ``p // 2``): with one vote each, label-skewed clients vote
#: for what suits their own labels (measured with few candidates, where ``AUTO_FLOOR p`` rounds to 1: results/ballots.md
#: "Fashion-MNIST on the ballot grid").
AUTO_MIN_DEPTH = 2
#: ``c`` of the share ballot's rule ``k = round(c p s**a)`` (`share_depth`), fitted as a fixed share of ``p`` on every
#: measured task by ``dphype bench ksweep-loto``.
SHARE_SCALE = 0.08
#: ``a``, the power of the noise std ``s`` in the share ballot's rule (0: a fixed share of ``p``).
SHARE_EXPONENT = 0.0


def rule_depth(num_candidates: ArrayLike, noise_std: ArrayLike, voters: ArrayLike, scale: float,
               noise_exponent: float, voters_exponent: float, floor: ArrayLike = AUTO_FLOOR) -> np.ndarray:
    """``k = round(scale p s**noise_exponent / m**voters_exponent)``, at least `AUTO_MIN_DEPTH` and ``floor p``.

    At most ``max(1, p // 2)``; element-wise over arrays of public facts (what the bench fits over its grid).

    Args:
        num_candidates: ``p``.
        noise_std: ``s``, the std of one discrete Laplace of the release's epsilon for a top-k ballot
            (`dphype.privacy.winner.noise_std`).
        voters: ``m``, the fewest voters whose ballots are summed, ``>= 1``.
        scale: ``c > 0``.
        noise_exponent: The power of ``s``.
        voters_exponent: The power of ``1 / m``.
        floor: The smallest ``k`` as a share of ``p`` (rounded), whatever ``m``.

    Returns:
        ``k``, int64, of the broadcast shape.
    """
    p = np.asarray(num_candidates, dtype=np.int64)
    raw = scale * p * np.asarray(noise_std, dtype=np.float64) ** noise_exponent \
        / np.asarray(voters, dtype=np.float64) ** voters_exponent
    k = np.maximum(np.maximum(AUTO_MIN_DEPTH, np.rint(np.asarray(floor, dtype=np.float64) * p)),
                   np.rint(raw)).astype(np.int64)
    return np.minimum(k, np.maximum(1, p // 2))


def share_depth(num_candidates: int, noise_std: float, scale: float = SHARE_SCALE,
                exponent: float = SHARE_EXPONENT) -> int:
    """The share ballot's ``k``: `rule_depth` without ``n``, ``round(scale p noise_std**exponent)``."""
    return int(rule_depth(int(num_candidates), float(noise_std), 1, scale, exponent, 0.0))


def auto_depth(num_candidates: int, noise_std: float, voters: int, scale: float = AUTO_SCALE) -> int:
    """The auto ballot's ``k``: `rule_depth` with both exponents `AUTO_EXPONENT`.

    Args:
        num_candidates: ``p``.
        noise_std: The std of the release's discrete Laplace noise on one count for a top-k ballot
            (`dphype.privacy.winner.noise_std`), the ``s`` the constants were fitted with.
        voters: The fewest voters whose ballots are summed, ``>= 1``.
        scale: ``c > 0``.

    Returns:
        ``k``.
    """
    return int(rule_depth(int(num_candidates), float(noise_std), int(voters), scale, AUTO_EXPONENT, AUTO_EXPONENT))


def rank_weights(depth: int, max_entry: int) -> np.ndarray:
    """Truncated Borda weights ``ceil(G (D - r) / D)`` for ranks ``r = 0 .. D - 1``, int64 in ``[1, G]``."""
    r = np.arange(int(depth))
    return np.ceil(int(max_entry) * (depth - r) / depth - 1e-9).astype(np.int64)


def rank_votes(scores: ArrayLike, depth: int, *, max_entry: int = 2**DEFAULT_BITS - 1,
               maximize: bool = True) -> np.ndarray:
    """Rank-weighted ballot: `rank_weights` on the client's ``depth`` best candidates (`ranking`), 0 elsewhere.

    ``depth`` above ``p`` is cut to ``p``; with ``max_entry = 1`` it is `top_k_votes` with ``k = depth``.

    Args:
        scores: ``(p,)`` scores, or ``(p, j)`` lexicographic keys.
        depth: ``D``, the ranks that get a weight, ``>= 1``.
        max_entry: ``G``, the best candidate's entry.
        maximize: Whether a higher score is better.

    Returns:
        The ``(p,)`` int64 ballot.

    Raises:
        ValueError: ``scores`` has a wrong shape.
    """  # noqa: DOC502
    order = ranking(scores, maximize=maximize)
    weights = rank_weights(min(int(depth), order.size), max_entry)
    votes = np.zeros(order.size, dtype=np.int64)
    votes[order[: weights.size]] = weights
    return votes


def score_votes(scores: ArrayLike, margin: float, *, max_entry: int = 2**DEFAULT_BITS - 1,
                maximize: bool = True) -> np.ndarray:
    """Score-graded ballot: ``round(G * clip(1 - shortfall / margin, 0, 1))`` per candidate.

    ``shortfall`` is how far the primary score falls behind the client's best finite one; a non-finite score gets 0.
    A client without any finite score gives ``G`` to candidate 0, so every ballot totals at least ``G``.

    Args:
        scores: ``(p,)`` scores, or ``(p, j)`` lexicographic keys (only column 0 is graded).
        margin: ``M > 0``, in the score's units (accuracy 0.05 = 5 points).
        max_entry: ``G``, the best candidate's entry.
        maximize: Whether a higher score is better.

    Returns:
        The ``(p,)`` int64 ballot.

    Raises:
        ValueError: ``scores`` has a wrong shape.
    """  # noqa: DOC502
    primary = _as_score_keys(scores)[:, 0]
    finite = np.isfinite(primary)
    votes = np.zeros(primary.size, dtype=np.int64)
    if not finite.any():
        votes[0] = max_entry
        return votes
    best = primary[finite].max() if maximize else primary[finite].min()
    shortfall = np.where(finite, (best - primary) if maximize else (primary - best), np.inf)
    utility = np.clip(1.0 - shortfall / float(margin), 0.0, 1.0)
    votes[:] = np.rint(int(max_entry) * utility).astype(np.int64)
    return votes


#: The default ``C`` of each ballot whose ``k`` follows from public facts.
_SCALES = {"share": SHARE_SCALE, "auto": AUTO_SCALE}


@dataclass(frozen=True)
class Ballot:
    """A named ballot: how a client turns its scores into one integer per candidate, and the form of the result.

    Names (`parse` reads them, `name` writes the canonical one): ``"top-k"`` (`top_k_votes` with the configuration's
    ``k``); ``"share[:C[:A]]"`` (`top_k_votes` with `share_depth`'s ``k``) and ``"auto[:C]"`` (with `auto_depth`'s
    ``k``; `resolve` either before `form` and `cast`); ``"rank:D[:BITS]"`` (`rank_votes`); ``"score:M[:BITS]"``
    (`score_votes`).

    Attributes:
        kind: ``"top-k"``, ``"share"``, ``"auto"``, ``"rank"`` or ``"score"``.
        depth: ``D`` of a rank ballot (0 otherwise).
        margin: ``M`` of a score ballot (0 otherwise).
        bits: Bits per entry: 1 for top-k and auto, in ``[1, MAX_BITS]`` for the graded ones.
        scale: ``C`` of a share or auto ballot (0 otherwise).
        exponent: ``A`` of a share ballot (0 otherwise).
        ALLOWED: The allowed names, in words.
    """

    kind: str
    depth: int = 0
    margin: float = 0.0
    bits: int = 1
    scale: float = 0.0
    exponent: float = 0.0

    #: What `parse`'s error lists.
    ALLOWED: ClassVar[str] = (f'"top-k", "share[:C[:A]]" (top-k with k = round(C p s^A), C > 0, default '
               f'{SHARE_SCALE:g}, A default {SHARE_EXPONENT:g}), '
               f'"auto[:C]" (top-k with k = round(C p (s / m)^{AUTO_EXPONENT:g}), C > 0, '
               f'default {AUTO_SCALE:g}), "rank:D[:BITS]" (D >= 1 ranks get a weight) or "score:M[:BITS]" '
               f"(margin M > 0 in the score's units), BITS in [1, {MAX_BITS}] (default {DEFAULT_BITS})")

    @property
    def max_entry(self) -> int:
        """``G = 2**bits - 1``, the largest entry: the argmax release's l-infinity sensitivity."""
        return 2**self.bits - 1

    @property
    def from_public_facts(self) -> bool:
        """Whether ``k`` follows from the release's public facts (share, auto): `resolve` it before `form`, `cast`."""
        return self.kind in _SCALES

    @property
    def graded(self) -> bool:
        """Whether this is another ballot than DP-Hype's top-k with the configuration's ``k``."""
        return self.kind != "top-k"

    @property
    def name(self) -> str:
        """The canonical name (`parse` reads it back)."""
        if self.kind == "top-k":
            return "top-k"
        if self.from_public_facts:
            if self.kind == "share" and self.exponent != SHARE_EXPONENT:
                return f"share:{self.scale:g}:{self.exponent:g}"
            return self.kind if self.scale == _SCALES[self.kind] else f"{self.kind}:{self.scale:g}"
        param = str(self.depth) if self.kind == "rank" else f"{self.margin:g}"
        return f"{self.kind}:{param}" + ("" if self.bits == DEFAULT_BITS else f":{self.bits}")

    @classmethod
    def parse(cls, value: Any) -> Ballot:
        """The ballot a name stands for.

        Args:
            value: One of `ALLOWED`.

        Returns:
            The ballot.

        Raises:
            ValueError: Naming ``ballot``, the allowed values and the fix, for anything else.
        """  # noqa: DOC503
        def refuse(why: str) -> ValueError:
            return ValueError(f"ballot must be {cls.ALLOWED}; got {value!r} ({why}): set ballot (the "
                              "configuration's ballot, --ballot, or the run config's ballot) to one of them")

        if not isinstance(value, str):
            raise refuse("not a string")
        parts = value.strip().split(":")
        kind = parts[0]
        if kind == "top-k":
            if len(parts) != 1:
                raise refuse("top-k takes no parameter: it reads the configuration's k")
            return cls("top-k")
        if kind in _SCALES and (len(parts) in (1, 2) or (kind == "share" and len(parts) == 3)):
            try:
                scale = float(parts[1]) if len(parts) >= 2 else _SCALES[kind]
                exponent = float(parts[2]) if len(parts) == 3 else SHARE_EXPONENT
            except ValueError as err:
                raise refuse("C or A is not a number") from err
            if not (math.isfinite(scale) and scale > 0):
                raise refuse("C must be a finite number > 0")
            if not math.isfinite(exponent):
                raise refuse("A must be a finite number")
            return cls(kind, scale=scale, exponent=exponent if kind == "share" else 0.0)
        if kind not in ("rank", "score") or len(parts) not in (2, 3):
            raise refuse("unknown kind or wrong number of parts")
        try:
            bits = int(parts[2]) if len(parts) == 3 else DEFAULT_BITS
        except ValueError as err:
            raise refuse("BITS is not an integer") from err
        if not 1 <= bits <= MAX_BITS:
            raise refuse(f"BITS out of [1, {MAX_BITS}]")
        try:
            number = int(parts[1]) if kind == "rank" else float(parts[1])
        except ValueError as err:
            raise refuse("its parameter is not a number" if kind == "score" else "D is not an integer") from err
        if kind == "rank":
            if number < 1:
                raise refuse("D must be >= 1")
            return cls("rank", depth=int(number), bits=bits)
        margin = float(number)
        if not (math.isfinite(margin) and margin > 0):
            raise refuse("M must be a finite number > 0")
        return cls("score", margin=margin, bits=bits)

    def resolve(self, num_candidates: int, noise_std: float, voters: int) -> Ballot:
        """A share or auto ballot as the fixed-depth ballot it stands for (top-``K``); any other unchanged."""
        if self.kind == "share":
            return Ballot("rank", depth=share_depth(num_candidates, noise_std, self.scale, self.exponent), bits=1)
        if self.kind != "auto":
            return self
        return Ballot("rank", depth=auto_depth(num_candidates, noise_std, voters, self.scale), bits=1)

    def _resolved(self) -> None:
        if self.from_public_facts:
            raise ValueError(f"a {self.kind} ballot's k follows from the release's public facts: resolve it first\n"
                             "(dphype.release.ReleaseMode.resolved_ballot)")

    def form(self, k: int, num_candidates: int | None = None) -> BallotForm:
        """The form every ballot of this kind has (what the tallies check).

        Args:
            k: The configuration's ``k`` (read by top-k only).
            num_candidates: ``p`` when known (a rank ballot's depth is cut to it, a score ballot's largest total is
                ``p G``); ``None``: the bounds that hold for every ``p``.

        Returns:
            The form: top-k ``(1, k, k)``; rank ``(G, w, w)``, ``w`` the sum of `rank_weights`; score ``(G, G, p G)``.

        Raises:
            ValueError: For a share or auto ballot not `resolve`d.
        """  # noqa: DOC502
        self._resolved()
        if self.kind == "top-k":
            return BallotForm.top_k(k)
        if self.kind == "rank":
            depth = self.depth if num_candidates is None else min(self.depth, int(num_candidates))
            total = int(rank_weights(depth, self.max_entry).sum())
            return BallotForm(self.max_entry, total, total)
        most = (2**31 - 1) if num_candidates is None else int(num_candidates) * self.max_entry
        return BallotForm(self.max_entry, self.max_entry, most)

    def cast(self, scores: ArrayLike, k: int, *, maximize: bool = True) -> np.ndarray:
        """This ballot on a client's scores: ``(p,)`` int64 of `form` ``(k, p)`` (share, auto: `resolve` it first)."""
        self._resolved()
        if self.kind == "top-k":
            return top_k_votes(scores, k, maximize=maximize)
        if self.kind == "rank":
            return rank_votes(scores, self.depth, max_entry=self.max_entry, maximize=maximize)
        return score_votes(scores, self.margin, max_entry=self.max_entry, maximize=maximize)


def check_ballot(value: Any) -> str:
    """A ballot name, checked (`Ballot.parse`) and canonical."""
    return Ballot.parse(value).name
