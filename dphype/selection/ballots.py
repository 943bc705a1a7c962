"""What a valid ballot is: the form every client's ballot must have, checked by the tally committee.

A ballot is what one client contributes to the vote sum: a ``(p,)`` vector of integers, one per candidate.
A `BallotForm` bounds it twice:

* every entry lies in ``[0, max_entry]``, with ``max_entry = 2**bits - 1`` (so a committee can check the range
  from the entry's ``bits`` binary digits, each of which must be 0 or 1);
* the entries sum to a total in ``[min_total, max_total]``.

The first bound is the release's l-infinity sensitivity: replacing one client's data moves every count by at
most ``max_entry`` (``dphype.privacy.winner`` scales its noise by it). The second bounds a client's influence on
the whole vector (the sum release's l2 sensitivity is at most ``sqrt(max_entry * max_total)`` under add/remove).
DP-Hype's top-k ballot (Algorithm 1, lines 5-8) is ``BallotForm.top_k(k)``: entries 0 or 1, exactly ``k`` ones.

The form is part of the approved request, so every node and tally derives the same form from what its node
approved; nothing else the server says changes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike


class InvalidBallot(ValueError):
    """A ballot that does not have its form; the message names the rule it breaks (never the ballot's content)."""


@dataclass(frozen=True)
class BallotForm:
    """The form of a valid ballot: integer entries in ``[0, max_entry]`` summing to ``[min_total, max_total]``.

    Attributes:
        max_entry: The largest entry, ``2**bits - 1`` for an integer ``bits >= 1``.
        min_total: The smallest total, ``>= 0``.
        max_total: The largest total, ``>= min_total``.
    """

    max_entry: int
    min_total: int
    max_total: int

    def __post_init__(self) -> None:
        for name in ("max_entry", "min_total", "max_total"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"ballot form's {name} must be an integer, got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.max_entry < 1 or (self.max_entry + 1) & self.max_entry:
            raise ValueError(f"ballot form's max_entry must be 2**bits - 1 for bits >= 1 (1, 3, 7, 15, ...), "
                             f"got {self.max_entry}")
        if not 0 <= self.min_total <= self.max_total:
            raise ValueError(f"ballot form's totals must satisfy 0 <= min_total <= max_total, got "
                             f"[{self.min_total}, {self.max_total}]")

    @classmethod
    def top_k(cls, k: int) -> BallotForm:
        """DP-Hype's top-k ballot ``BallotForm(1, k, k)``: entries 0 or 1, exactly ``k >= 1`` ones."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        return cls(1, int(k), int(k))

    @property
    def bits(self) -> int:
        """The binary digits of one entry: ``max_entry = 2**bits - 1``."""
        return self.max_entry.bit_length()

    def check(self, ballot: ArrayLike, num_candidates: int | None = None) -> np.ndarray:
        """Check one ballot against the form.

        Args:
            ballot: The ballot, a ``(p,)`` integer vector.
            num_candidates: ``p``, when known; the ballot's length must then equal it.

        Returns:
            The ballot as an int64 ``(p,)`` array.

        Raises:
            InvalidBallot: If the ballot's shape, an entry or its total breaks the form; the message names the rule.
        """
        arr = np.asarray(ballot)
        if arr.ndim != 1 or arr.size == 0:
            raise InvalidBallot(f"a ballot must be a non-empty (p,) vector, got shape {arr.shape}")
        if num_candidates is not None and arr.size != int(num_candidates):
            raise InvalidBallot(f"a ballot must have one entry per candidate ({num_candidates}), got {arr.size}")
        if arr.dtype.kind not in "iub":
            if arr.dtype.kind != "f" or not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
                raise InvalidBallot("a ballot's entries must be integers")
        values = arr.astype(np.int64)
        if values.min() < 0 or values.max() > self.max_entry:
            raise InvalidBallot(f"a ballot's entries must lie in [0, {self.max_entry}]")
        total = int(values.sum())
        if not self.min_total <= total <= self.max_total:
            raise InvalidBallot(f"a ballot's total must lie in [{self.min_total}, {self.max_total}]")
        return values

    def to_dict(self) -> dict[str, int]:
        """The form as plain JSON values: ``max_entry``, ``min_total``, ``max_total``."""
        return {"max_entry": self.max_entry, "min_total": self.min_total, "max_total": self.max_total}
