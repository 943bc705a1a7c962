"""The search space of a Pareto problem: its axes, the box they span, and the random baseline's sampling laws.

A `Domain` is DPareto's hyperparameter set ``Lambda`` (Avent et al. PoPETs 2020, Sec. 2.1): a box of named
`Hyperparameter` axes, each a real or integer interval on a linear or log scale, mapped to the unit cube for the
GPs. A `Distribution` is one axis' law of the random-sampling baseline (Appendix C), and `sample_configs` draws
configurations from those laws by rejection into the box.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: A configuration: hyperparameter name -> value.
Config = dict[str, Any]


# ------------------------------------------------------------------------------------ the search domain
@dataclass(frozen=True)
class Hyperparameter:
    """One axis of a domain: a real or integer interval, searched on a linear or log scale.

    Attributes:
        name: The hyperparameter's name.
        low: The interval's lower end (``> 0`` on a log scale).
        high: Its upper end, ``> low``.
        log: Search on a log scale.
        integer: Integer values only.

    Raises:
        ValueError: ``low``/``high`` are not finite with ``low < high``, or a log scale has ``low <= 0``.
    """

    name: str
    low: float
    high: float
    log: bool = False
    integer: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or not self.low < self.high:
            raise ValueError(
                f"hyperparameter {self.name!r}: need finite low < high, got [{self.low}, {self.high}]"
            )
        if self.log and self.low <= 0:
            raise ValueError(f"hyperparameter {self.name!r}: a log-scale range needs low > 0, got {self.low}")

    def _scale(self, value: np.ndarray) -> np.ndarray:
        return np.log(value) if self.log else value

    def from_unit(self, u: np.ndarray) -> np.ndarray:
        """Map ``u`` in ``[0, 1]`` (any shape) to ``[low, high]`` (log-linear if ``log``; rounded if ``integer``)."""
        lo, hi = self._scale(np.array([self.low, self.high], dtype=np.float64))
        value = lo + np.clip(u, 0.0, 1.0) * (hi - lo)
        value = np.exp(value) if self.log else value
        return np.clip(np.round(value), self.low, self.high) if self.integer else np.clip(value, self.low, self.high)

    def to_unit(self, value: np.ndarray) -> np.ndarray:
        """Inverse of `from_unit` (up to integer rounding)."""
        lo, hi = self._scale(np.array([self.low, self.high], dtype=np.float64))
        return (self._scale(np.asarray(value, dtype=np.float64)) - lo) / (hi - lo)

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies in the interval (and is an integer on an integer axis)."""
        ok = self.low <= value <= self.high
        return bool(ok and (not self.integer or float(value).is_integer()))


@dataclass(frozen=True)
class Domain:
    """The hyperparameter set ``Lambda``: a box of named axes, mapped to the unit cube for the GPs.

    Attributes:
        params: The axes, with unique names.

    Raises:
        ValueError: No axes, or repeated names.
    """

    params: tuple[Hyperparameter, ...]

    def __post_init__(self) -> None:
        if len(self.params) == 0:
            raise ValueError("domain must have at least one hyperparameter, got none")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"domain hyperparameter names must be unique, got {names}")

    @property
    def names(self) -> tuple[str, ...]:
        """The axes' names, in order."""
        return tuple(p.name for p in self.params)

    @property
    def dim(self) -> int:
        """The number of axes ``d``."""
        return len(self.params)

    def from_unit(self, unit: np.ndarray) -> list[Config]:
        """Configurations for the rows of ``unit`` ``(n, dim)`` in ``[0, 1]``; another column count is refused."""
        unit = np.atleast_2d(np.asarray(unit, dtype=np.float64))
        if unit.shape[1] != self.dim:
            raise ValueError(f"unit points must have {self.dim} columns, got shape {unit.shape}")
        cols = [p.from_unit(unit[:, j]) for j, p in enumerate(self.params)]
        return [
            {p.name: (int(c[i]) if p.integer else float(c[i])) for p, c in zip(self.params, cols)}
            for i in range(len(unit))
        ]

    def to_unit(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """``(n, dim)`` unit-cube coordinates of ``configs``."""
        self.check(configs)
        return np.stack(
            [p.to_unit(np.array([c[p.name] for c in configs], dtype=np.float64)) for p in self.params],
            axis=1,
        ).reshape(len(configs), self.dim)

    def check(self, configs: Sequence[Mapping[str, Any]]) -> None:
        """Refuse configurations with a hyperparameter missing or out of range (the first one is named)."""
        for c in configs:
            for p in self.params:
                if p.name not in c:
                    raise ValueError(f"configuration {dict(c)} lacks hyperparameter {p.name!r}")
                if not p.contains(float(c[p.name])):
                    kind = "an integer" if p.integer else "a number"
                    raise ValueError(
                        f"{p.name} must be {kind} in [{p.low}, {p.high}], got {c[p.name]!r}"
                    )

    def grid(self, points_per_axis: int) -> list[Config]:
        """Full grid of ``points_per_axis >= 1`` values per axis, end points included (DPareto Sec. 4.3)."""
        if points_per_axis < 1:
            raise ValueError(f"points_per_axis must be >= 1, got {points_per_axis}")
        ticks = np.linspace(0.0, 1.0, points_per_axis) if points_per_axis > 1 else np.array([0.5])
        mesh = np.meshgrid(*[ticks] * self.dim, indexing="ij")
        return self.from_unit(np.stack([m.ravel() for m in mesh], axis=1))


# ----------------------------------------------------------------- random-sampling distributions (App. C)
@dataclass(frozen=True)
class Distribution:
    """A 1-D sampling law of DPareto's random baseline (Appendix C, Tables 3-4; Sec. 3.3).

    Draws outside the axis' accept range are rejected and redrawn; integer axes are rounded before the check.

    Attributes:
        kind: ``"uniform"`` (a, b), ``"loguniform"`` (a, b), ``"normal"`` (mean, std) or
            ``"shifted-exponential"`` (rate, shift): ``shift + Exp(rate)``.
        a: The law's first parameter.
        b: Its second parameter.
    """

    kind: str
    a: float
    b: float

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``(size,)`` draws from the law (an unknown ``kind`` is refused)."""
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b, size)
        if self.kind == "loguniform":
            return np.exp(rng.uniform(math.log(self.a), math.log(self.b), size))
        if self.kind == "normal":
            return rng.normal(self.a, self.b, size)
        if self.kind == "shifted-exponential":
            return self.b + rng.exponential(1.0 / self.a, size)
        raise ValueError(
            f"distribution kind must be uniform, loguniform, normal or shifted-exponential, got {self.kind!r}")


def sample_configs(
    domain: Domain,
    distributions: Mapping[str, Distribution],
    n: int,
    rng: np.random.Generator,
    *,
    max_tries: int = 10_000,
) -> list[Config]:
    """``n`` configurations drawn axis-wise from ``distributions`` by rejection into ``domain``.

    Args:
        domain: The domain.
        distributions: Axis name -> its law (an axis without one: uniform on its range, log-uniform on a log
            axis).
        n: The number of configurations.
        rng: The generator.
        max_tries: Rounds of redraws before giving up.

    Returns:
        ``n`` configurations.

    Raises:
        ValueError: A law rarely falls in its axis' range.
    """
    if n == 0:
        return []
    columns: dict[str, np.ndarray] = {}
    for p in domain.params:
        law = distributions.get(p.name, Distribution("loguniform" if p.log else "uniform", p.low, p.high))
        kept = np.zeros(0)
        for _ in range(max_tries):
            draws = law.draw(rng, max(n, 16))
            draws = np.round(draws) if p.integer else draws
            kept = np.concatenate([kept, draws[(draws >= p.low) & (draws <= p.high)]])
            if len(kept) >= n:
                break
        else:
            raise ValueError(f"distribution for {p.name!r} rarely falls in [{p.low}, {p.high}]")
        columns[p.name] = kept[:n]
    return [
        {p.name: (int(columns[p.name][i]) if p.integer else float(columns[p.name][i])) for p in domain.params}
        for i in range(n)
    ]
