"""A Pareto problem: DPareto's ``(Lambda, P_delta, U_z)`` (Avent et al. PoPETs 2020, Sec. 2.1), and how one registers.

A *privacy oracle* ``P_delta: Lambda -> [0, inf)`` maps a configuration to the epsilon at which the configured
algorithm is (epsilon, delta)-DP for a fixed delta (Remark 1). A *utility oracle* ``U_z: Lambda -> [0, 1]`` maps it
to a score measured empirically: the algorithm is run ``R`` times and the mean is the utility, the best and worst
runs give DPareto's variability band (Remark 2, Sec. 4.3). A `ParetoProblem` bundles ``(Lambda, P_delta, U_z)``
with the random-sampling distributions of the baseline (Appendix C); `ParetoProblem.evaluate` calls both oracles
and checks their outputs.

A problem that `dphype.ml.oracles.make_problem` builds by name is a `NamedProblem` subclass, listed once in
`dphype.ml.oracles.PROBLEMS`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dphype.ml.data import Dataset
from dphype.ml.oracles.space import Config, Distribution, Domain


@dataclass(frozen=True)
class UtilityResult:
    """Utility over ``R`` runs: the mean (the oracle's value) and the best and worst run.

    Attributes:
        mean: The mean over the runs.
        best: The best run.
        worst: The worst run.
        runs: Every run's utility.
    """

    mean: float
    best: float
    worst: float
    runs: tuple[float, ...]

    @classmethod
    def from_runs(cls, runs: Sequence[float] | np.ndarray) -> UtilityResult:
        """Summarise at least one run's utility."""
        values = tuple(float(v) for v in runs)
        if len(values) == 0:
            raise ValueError("a utility needs at least one run")
        return cls(float(np.mean(values)), max(values), min(values), values)


#: ``P_delta``: configuration -> epsilon (the delta is fixed by the problem).
PrivacyOracle = Callable[[Config], float]
#: ``U_z``: (configuration, randomness) -> utility over R runs.
UtilityOracle = Callable[[Config, np.random.Generator], UtilityResult]


@dataclass(frozen=True)
class Evaluation:
    """One evaluated configuration: epsilon and utility (mean, best, worst).

    Attributes:
        config: The configuration.
        epsilon: Its privacy cost.
        utility: Its utility over the runs.
    """

    config: Config
    epsilon: float
    utility: UtilityResult

    @property
    def error(self) -> float:
        """``1 - U(lambda)``, DPareto's second (minimised) objective."""
        return 1.0 - self.utility.mean


@dataclass(frozen=True)
class ParetoProblem:
    """DPareto's ``(Lambda, P_delta, U_z)`` plus the random baseline's sampling laws.

    Attributes:
        name: The problem's name.
        domain: ``Lambda``.
        privacy: ``P_delta``: configuration -> epsilon.
        utility: ``U_z``: (configuration, randomness) -> utility over R runs.
        delta: The fixed delta.
        distributions: The random baseline's sampling laws, by axis name.
        description: What the problem is.
    """

    name: str
    domain: Domain
    privacy: PrivacyOracle
    utility: UtilityOracle
    delta: float
    distributions: Mapping[str, Distribution] = field(default_factory=dict)
    description: str = ""

    def evaluate(self, config: Mapping[str, Any], rng: np.random.Generator) -> Evaluation:
        """Call both oracles on ``config``; an output out of range is refused, naming the oracle."""
        cfg = dict(config)
        self.domain.check([cfg])
        eps = float(self.privacy(cfg))
        if not math.isfinite(eps) or eps < 0:
            raise ValueError(
                f"privacy oracle of {self.name!r} must return a finite epsilon >= 0, got {eps} for {cfg}"
            )
        util = self.utility(cfg, rng)
        for label, value in (("mean", util.mean), ("best", util.best), ("worst", util.worst)):
            if not (0.0 <= value <= 1.0):  # also rejects NaN
                raise ValueError(
                    f"utility oracle of {self.name!r} must return values in [0, 1], got {label} {value} for {cfg}"
                )
        return Evaluation(cfg, eps, util)


@dataclass(frozen=True)
class ProblemOptions:
    """What `dphype.ml.oracles.make_problem` hands every problem; each uses the options that apply to it.

    Attributes:
        runs: Overrides the problem's default number of utility runs R; ``None``: keep it.
        seed: Seeds the problem's fixed randomness (the SVT problem's true queries).
        accountant: Opacus' accountant (DP-SGD problems).
        train_size: Subsamples the training pool; ``None``: all.
        data_dir: The folder holding a non-bundled data set.
    """

    runs: int | None = None
    seed: int = 0
    accountant: str = "rdp"
    train_size: int | None = None
    data_dir: str | None = None

    def runs_override(self) -> dict[str, int]:
        """``{"runs": runs}`` for a problem's builder, or nothing when ``runs`` is ``None``."""
        return {} if self.runs is None else {"runs": self.runs}


class NamedProblem(ABC):
    """A problem `dphype.ml.oracles.make_problem` builds by one of its ``names`` (unique across the registry)."""

    #: The names it builds, unique across the registry.
    names: ClassVar[tuple[str, ...]]

    @classmethod
    @abstractmethod
    def build(cls, name: str, options: ProblemOptions) -> ParetoProblem:
        """The problem ``name``, one of `names`, built with the caller's options."""


def subsample_pool(data: Dataset, size: int | None, seed: int = 0) -> Dataset:
    """The first ``size >= 2`` rows of a seeded permutation of ``data`` (all for ``None`` or too large a size)."""
    if size is None or size >= len(data):
        return data
    if size < 2:
        raise ValueError(f"train_size must be >= 2, got {size}")
    return data.subset(np.random.default_rng(seed).permutation(len(data))[:size])
