"""Public, ordered hyperparameter candidate lists.

DP-Hype (Section II-C) assumes that the candidate set ``H = {H_1, ..., H_p}`` *and its order* are public:
the order fixes the vote-vector coordinates and breaks ties. Every client therefore checks a fingerprint
of the list before voting; a mismatch fails loudly (:class:`CandidateMismatchError`) instead of
silently summing votes for different candidates.

The paper's evaluation grid is Table III (10 learning rates x 5 decays x 2 momenta = 100 candidates).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

Candidate = dict[str, Any]

#: Table III of the DP-Hype paper, in the paper's order.
TABLE_III_LR: tuple[float, ...] = (0.5, 0.1, 0.05, 1e-3, 5e-3, 1e-5, 1e-6, 5e-6, 5e-7, 1e-7)
TABLE_III_DECAY: tuple[float, ...] = (0.0, 0.1, 0.25, 0.99, 1.0)
TABLE_III_MOMENTUM: tuple[float, ...] = (0.0, 0.9)


class CandidateMismatchError(ValueError):
    """A client's candidate list differs from the one the server announced."""


def _normalize_value(key: str, value: Any) -> float | int | str | bool:
    """Return a JSON-safe plain Python value, rejecting anything that cannot be fingerprinted stably."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            raise ValueError(f"candidate value for {key!r} must be finite, got {value!r}")
        return float(value)
    if isinstance(value, str):
        return value
    raise ValueError(
        f"candidate value for {key!r} must be a float, int, bool or str, got {type(value).__name__}"
    )


def _normalize_candidate(item: Mapping[str, Any], index: int) -> Candidate:
    if not isinstance(item, Mapping):
        raise ValueError(f"candidate {index} must be a mapping of hyperparameter names to values")
    if len(item) == 0:
        raise ValueError(f"candidate {index} is empty; it must name at least one hyperparameter")
    out: Candidate = {}
    for key, value in item.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"candidate {index}: hyperparameter names must be non-empty strings, got {key!r}")
        out[key] = _normalize_value(key, value)
    return out


def _canonical_json(items: Sequence[Candidate]) -> str:
    """Canonical JSON: sorted keys, no whitespace; floats via ``repr`` (shortest round-trip, stable)."""
    return json.dumps(list(items), sort_keys=True, separators=(",", ":"), allow_nan=False)


class CandidateList:
    """An ordered, immutable, non-empty list of distinct candidates (DP-Hype's public set ``H``).

    Two candidates are duplicates when they compare equal as dictionaries (so ``{"lr": 1}`` and
    ``{"lr": 1.0}`` are duplicates). Items are returned as fresh ``dict`` copies.
    """

    __slots__ = ("_items", "_json")

    def __init__(self, items: Sequence[Mapping[str, Any]]) -> None:
        if isinstance(items, (str, bytes, Mapping)):
            raise ValueError("candidates must be a sequence of mappings, not a single string or mapping")
        normalized = tuple(_normalize_candidate(item, i) for i, item in enumerate(items))
        if not normalized:
            raise ValueError("candidates must contain at least 1 candidate, got 0")
        seen: dict[frozenset, int] = {}
        for i, cand in enumerate(normalized):
            key = frozenset(cand.items())
            if key in seen:
                raise ValueError(f"duplicate candidate at positions {seen[key]} and {i}: {cand}")
            seen[key] = i
        self._items: tuple[Candidate, ...] = normalized
        self._json: str = _canonical_json(normalized)

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> Candidate:
        return dict(self._items[i])

    def __iter__(self) -> Iterator[Candidate]:
        return (dict(c) for c in self._items)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CandidateList):
            return NotImplemented
        return self._json == other._json

    def __hash__(self) -> int:
        return hash(self._json)

    def __repr__(self) -> str:
        return f"CandidateList({len(self)} candidates, fingerprint={self.fingerprint()[:12]})"

    def fingerprint(self) -> str:
        """SHA-256 hex digest of the canonical JSON (order-sensitive: the order is part of the protocol)."""
        return hashlib.sha256(self._json.encode("utf-8")).hexdigest()

    def to_json(self) -> str:
        """Canonical JSON list; ``from_json(to_json())`` reproduces the list and its fingerprint."""
        return self._json

    @classmethod
    def from_json(cls, s: str) -> "CandidateList":
        """Parse a JSON list of objects (raises ``ValueError`` on malformed input)."""
        try:
            data = json.loads(s)
        except json.JSONDecodeError as err:
            raise ValueError(f"candidates JSON is malformed: {err}") from err
        if not isinstance(data, list):
            raise ValueError(f"candidates JSON must be a list of objects, got {type(data).__name__}")
        return cls(data)

    def check_fingerprint(self, expected: str) -> None:
        """Raise :class:`CandidateMismatchError` unless this list's fingerprint equals ``expected``."""
        actual = self.fingerprint()
        if actual != expected:
            raise CandidateMismatchError(
                f"candidate list fingerprint mismatch: local {actual} != expected {expected}; "
                "all clients must vote over the same public, ordered candidate list"
            )


def grid(**axes: Sequence[Any]) -> CandidateList:
    """Cartesian product of the axes in the given key order (first key slowest, last key fastest)."""
    if not axes:
        raise ValueError("grid needs at least one hyperparameter axis")
    for name, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise ValueError(f"grid axis {name!r} must be a sequence of values, got {type(values).__name__}")
        if len(values) == 0:
            raise ValueError(f"grid axis {name!r} must have at least 1 value, got 0")
    names = list(axes)
    return CandidateList([dict(zip(names, combo)) for combo in itertools.product(*axes.values())])


def table_iii_grid() -> CandidateList:
    """DP-Hype Table III: lr (10) x decay (5) x momentum (2) = 100 candidates, lr-major, momentum fastest."""
    return grid(lr=TABLE_III_LR, decay=TABLE_III_DECAY, momentum=TABLE_III_MOMENTUM)


def random_subset(cands: CandidateList, size: int, seed: int) -> CandidateList:
    """A seeded uniform random subset of ``size`` candidates, keeping their original relative order."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 1 <= size <= len(cands):
        raise ValueError(f"size must be an integer in [1, {len(cands)}], got {size!r}")
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(len(cands), size=int(size), replace=False))
    return CandidateList([cands[int(i)] for i in chosen])


def load_candidates(spec: str) -> CandidateList:
    """Resolve a candidate spec: ``"table3"``, an integer ``"N"`` (``"table3:random:N:0"``),
    ``"table3:random:SIZE:SEED"`` or a path to a JSON list."""
    if spec == "table3":
        return table_iii_grid()
    if spec.isdigit():
        return random_subset(table_iii_grid(), int(spec), 0)
    if spec.startswith("table3:"):
        parts = spec.split(":")
        if len(parts) != 4 or parts[1] != "random":
            raise ValueError(f"candidates spec must be 'table3' or 'table3:random:SIZE:SEED', got {spec!r}")
        try:
            size, seed = int(parts[2]), int(parts[3])
        except ValueError as err:
            raise ValueError(f"candidates spec {spec!r}: SIZE and SEED must be integers") from err
        return random_subset(table_iii_grid(), size, seed)
    if spec.endswith(".json") or os.path.sep in spec:
        with open(spec, encoding="utf-8") as fh:  # FileNotFoundError propagates with the path
            return CandidateList.from_json(fh.read())
    raise ValueError(
        f"candidates spec must be 'table3', an integer N, 'table3:random:SIZE:SEED' or a .json path, got {spec!r}")
