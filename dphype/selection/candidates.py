"""Public, ordered hyperparameter candidate lists.

DP-Hype (Section II-C) assumes that the candidate set ``H = {H_1, ..., H_p}`` *and its order* are public:
the order fixes the vote-vector coordinates and breaks ties. Every client therefore checks a fingerprint
of the list before voting; a mismatch fails loudly (`CandidateMismatchError`) instead of
silently summing votes for different candidates.

The paper's evaluation grid is Table III (10 learning rates x 5 decays x 2 momenta = 100 candidates).

The candidates are also points of a public hyperparameter space (`CandidateList.feature_space`):
every hyperparameter is an axis on a log scale (positive values spanning at least a factor
`LOG_SCALE_RATIO`, such as learning rates), a linear scale (other numbers) or categorical (strings,
bools, mixed types: only equality counts). Structure-aware selection (`dphype.selection.rules`) estimates
the vote surface over this space; it is derived from the public list alone.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np

Candidate = dict[str, Any]

#: Table III of the DP-Hype paper, in the paper's order.
TABLE_III_LR: tuple[float, ...] = (0.5, 0.1, 0.05, 1e-3, 5e-3, 1e-5, 1e-6, 5e-6, 5e-7, 1e-7)
TABLE_III_DECAY: tuple[float, ...] = (0.0, 0.1, 0.25, 0.99, 1.0)
TABLE_III_MOMENTUM: tuple[float, ...] = (0.0, 0.9)


class CandidateMismatchError(ValueError):
    """A client's candidate list differs from the one the server announced (``refusal_code`` is what it tells)."""

    refusal_code = "candidate_mismatch"  # what a client tells the server (dphype.refusal.as_refusal)


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


class CandidateList(Sequence[Candidate]):
    """An ordered, immutable, non-empty list of distinct candidates (DP-Hype's public set ``H``).

    Two candidates are duplicates when they compare equal as dictionaries (so ``{"lr": 1}`` and
    ``{"lr": 1.0}`` are duplicates). Items are returned as fresh ``dict`` copies.

    Args:
        items: The candidates, each a mapping of hyperparameter names to finite numbers, strings or booleans.

    Raises:
        ValueError: If ``items`` is a single string or mapping, is empty, holds duplicates, or holds a candidate
            that is not a non-empty mapping of such values.
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

    @overload
    def __getitem__(self, i: int) -> Candidate: ...

    @overload
    def __getitem__(self, i: slice) -> list[Candidate]: ...

    def __getitem__(self, i: int | slice) -> Candidate | list[Candidate]:
        if isinstance(i, slice):
            return [dict(c) for c in self._items[i]]
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
    def from_json(cls, s: str) -> CandidateList:
        """Parse a JSON list of objects (the last few lists parsed are cached by text); malformed input is refused."""
        return _parse_candidates(s)

    def feature_space(self, scales: Mapping[str, str] | None = None) -> FeatureSpace:
        """The public hyperparameter space of these candidates (see `FeatureSpace`).

        Args:
            scales: Overrides the automatic scale of named axes (``"log"``, ``"linear"`` or ``"categorical"``).

        Returns:
            The feature space.

        Raises:
            ValueError: For an impossible request: an unknown name or scale, ``"log"`` for a non-positive or
                non-numeric axis, ``"linear"`` for a non-numeric one.
        """  # noqa: DOC502
        return FeatureSpace.of(self._items, scales)

    def check_fingerprint(self, expected: str) -> None:
        """Raise `CandidateMismatchError` unless this list's fingerprint equals ``expected``."""
        actual = self.fingerprint()
        if actual != expected:
            raise CandidateMismatchError(
                f"candidate list fingerprint mismatch: local {actual} != expected {expected}; use the same list\n"
                "all clients must vote over the same public, ordered candidate list"
            )


#: An axis of positive numbers whose largest value is at least this many times its smallest is on a log scale.
LOG_SCALE_RATIO = 10.0
#: Axis scales of a `FeatureSpace`.
SCALES: tuple[str, ...] = ("log", "linear", "categorical")


@dataclass(frozen=True)
class Axis:
    """One hyperparameter of the public space: its name, scale and distinct values (sorted if numeric).

    Attributes:
        name: The hyperparameter's name.
        scale: One of `SCALES`.
        levels: Its distinct values (sorted floats if numeric, in order of appearance if categorical).
    """

    name: str
    scale: str
    levels: tuple[Any, ...]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _axis(name: str, values: Sequence[Any], scale: str | None) -> Axis:
    """The axis of one hyperparameter; ``scale=None`` picks it from the values (module docstring)."""
    numeric = all(_is_number(v) for v in values)
    positive = numeric and min(values) > 0
    if scale is None:
        if not numeric:
            scale = "categorical"
        elif positive and max(values) >= LOG_SCALE_RATIO * min(values):
            scale = "log"
        else:
            scale = "linear"
    elif scale not in SCALES:
        raise ValueError(f"scales[{name!r}] must be one of {', '.join(SCALES)}, got {scale!r}")
    elif scale == "log" and not positive:
        raise ValueError(f"scales[{name!r}] = 'log' needs numbers > 0, got values {sorted(set(map(repr, values)))}")
    elif scale == "linear" and not numeric:
        raise ValueError(f"scales[{name!r}] = 'linear' needs numbers, got values {sorted(set(map(repr, values)))}")
    if scale == "categorical":
        return Axis(name, scale, tuple(dict.fromkeys(values)))  # equal values (1, 1.0, True) are one level
    return Axis(name, scale, tuple(sorted(set(float(v) for v in values))))


class FeatureSpace:
    """The candidates as points of the public hyperparameter space (read by `dphype.selection.rules`).

    ``numeric`` is ``(p, d)`` float64: each log or linear axis mapped to ``[0, 1]`` (log axes after
    ``log``), ``categorical`` is ``(p, c)`` int64: each categorical axis as level codes (equality is all
    that counts). Axes with a single value carry nothing and are left out. ``no_structure`` is ``None`` or
    the reason why the space cannot inform selection (then only the max-votes rule makes sense): fewer than
    3 candidates, a hyperparameter missing from some candidates (conditional spaces), or a single
    categorical axis (every candidate is its own category, nothing is shared between candidates).
    Derived from the public candidate list only; built by `of`.

    Args:
        axes: The axes with more than one value.
        numeric: The log and linear axes, ``(p, d)`` float64 in ``[0, 1]``.
        categorical: The categorical axes' level codes, ``(p, c)`` int64.
        no_structure: Why the space cannot inform selection, or ``None``.
        num_candidates: The number ``p`` of candidates.
    """

    __slots__ = ("axes", "numeric", "categorical", "no_structure", "num_candidates")

    def __init__(self, axes: Sequence[Axis], numeric: np.ndarray, categorical: np.ndarray,
                 no_structure: str | None, num_candidates: int) -> None:
        self.axes = tuple(axes)
        self.numeric = numeric
        self.categorical = categorical
        self.no_structure = no_structure
        self.num_candidates = num_candidates

    def __repr__(self) -> str:
        axes = ", ".join(f"{a.name}:{a.scale}({len(a.levels)})" for a in self.axes)
        why = "" if self.no_structure is None else f", no structure: {self.no_structure}"
        return f"FeatureSpace({self.num_candidates} candidates; {axes}{why})"

    @classmethod
    def of(cls, items: Sequence[Mapping[str, Any]], scales: Mapping[str, str] | None = None) -> FeatureSpace:
        """The space of ``items`` (normalized candidates); see `CandidateList.feature_space`.

        Args:
            items: The normalized candidates.
            scales: Overrides the automatic scale of named axes.

        Returns:
            The feature space.

        Raises:
            ValueError: If ``scales`` names an unknown hyperparameter or asks for an impossible scale.
        """
        names = list(dict.fromkeys(key for item in items for key in item))
        scales = dict(scales or {})
        unknown = sorted(set(scales) - set(names))
        if unknown:
            raise ValueError(f"scales names unknown hyperparameters {unknown}; the candidates have {names}")
        p = len(items)
        missing = next(((name, i) for name in names for i, item in enumerate(items) if name not in item), None)
        if missing is not None:
            why = f"hyperparameter {missing[0]!r} is missing from candidate {missing[1]} (conditional space)"
            return cls((), np.zeros((p, 0)), np.zeros((p, 0), dtype=np.int64), why, p)
        axes = [_axis(name, [item[name] for item in items], scales.get(name)) for name in names]
        axes = [a for a in axes if len(a.levels) > 1]
        numeric_cols, categorical_cols = [], []
        for axis in axes:
            if axis.scale == "categorical":
                code = {v: j for j, v in enumerate(axis.levels)}
                categorical_cols.append([code[item[axis.name]] for item in items])
                continue
            transform = np.log if axis.scale == "log" else np.asarray
            col = transform(np.array([float(item[axis.name]) for item in items]))
            lo, hi = transform(np.array([axis.levels[0], axis.levels[-1]]))
            numeric_cols.append((col - lo) / (hi - lo))
        numeric = np.array(numeric_cols, dtype=np.float64).T.reshape(p, len(numeric_cols))
        categorical = np.array(categorical_cols, dtype=np.int64).T.reshape(p, len(categorical_cols))
        reason: str | None = None
        if p < 3:
            reason = f"fewer than 3 candidates ({p})"
        elif not numeric_cols and len(categorical_cols) == 1:
            reason = f"a single categorical axis ({axes[0].name!r}): every candidate is its own category"
        return cls(axes, numeric, categorical, reason, p)


def candidate_grid(**axes: Sequence[Any]) -> CandidateList:
    """The candidates of every combination of the axes' values, first key slowest, last key fastest.

    Args:
        **axes: Hyperparameter name -> its values (a non-empty sequence, not a string).

    Returns:
        The candidate list.

    Raises:
        ValueError: If there is no axis, an axis is not a sequence or is empty, or two combinations are equal.
    """
    if not axes:
        raise ValueError("candidate_grid needs at least one hyperparameter axis")
    for name, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise ValueError(f"grid axis {name!r} must be a sequence of values, got {type(values).__name__}")
        if len(values) == 0:
            raise ValueError(f"grid axis {name!r} must have at least 1 value, got 0")
    names = list(axes)
    return CandidateList([dict(zip(names, combo)) for combo in itertools.product(*axes.values())])


def table_iii_grid() -> CandidateList:
    """DP-Hype Table III: lr (10) x decay (5) x momentum (2) = 100 candidates, lr-major, momentum fastest."""
    return candidate_grid(lr=TABLE_III_LR, decay=TABLE_III_DECAY, momentum=TABLE_III_MOMENTUM)


def random_subset(cands: CandidateList, size: int, seed: int) -> CandidateList:
    """A seeded uniform random subset of ``size`` in ``[1, len(cands)]`` candidates, in their original order."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 1 <= size <= len(cands):
        raise ValueError(f"size must be an integer in [1, {len(cands)}], got {size!r}")
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(len(cands), size=int(size), replace=False))
    return CandidateList([cands[int(i)] for i in chosen])


def load_candidates(spec: str) -> CandidateList:
    """Resolve a candidate spec.

    Args:
        spec: ``"table3"``, an integer ``"N"`` (``"table3:random:N:0"``), ``"table3:random:SIZE:SEED"`` or a path
            to a JSON list.

    Returns:
        The candidate list.

    Raises:
        ValueError: For a malformed spec or list.
        FileNotFoundError: If the JSON file does not exist (naming the option, the path and the fix).
    """
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
        path = Path(spec).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"candidates (--candidates, or the run config's candidates): no file {spec!r}; name one, or 'table3'\n"
                f"(looked for {path.absolute()}); name an existing JSON list of candidates")
        return CandidateList.from_json(path.read_text(encoding="utf-8"))
    raise ValueError(
        f"candidates spec must be 'table3', an integer N, 'table3:random:SIZE:SEED' or a .json path, got {spec!r}")


@functools.lru_cache(maxsize=8)
def _parse_candidates(s: str) -> CandidateList:
    """`CandidateList.from_json`'s parser (cached there; failures are not cached)."""
    try:
        data = json.loads(s)
    except json.JSONDecodeError as err:
        raise ValueError(f"candidates JSON is malformed: {err}") from err
    if not isinstance(data, list):
        raise ValueError(f"candidates JSON must be a list of objects, got {type(data).__name__}")
    return CandidateList(data)
