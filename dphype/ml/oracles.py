"""Privacy and utility oracles (DPareto, Avent et al. PoPETs 2020, Sec. 2.1).

A *privacy oracle* ``P_delta: Lambda -> [0, inf)`` maps a configuration to the epsilon at which the
configured algorithm is (epsilon, delta)-DP for a fixed delta (Remark 1). A *utility oracle*
``U_z: Lambda -> [0, 1]`` maps it to a score measured empirically: the algorithm is run ``R`` times
and the mean is the utility, the best and worst runs give DPareto's variability band (Remark 2,
Sec. 4.3). A `ParetoProblem` bundles ``(Lambda, P_delta, U_z)`` with the random-sampling
distributions of the baseline (Appendix C).

Concrete problems (`make_problem`, names in `problem_names`):

* ``svt`` - DPareto's sparse vector technique (Alg. 1) with its closed-form privacy oracle
  (Appendix B) and the F1 utility over random query orders (Sec. 2.2).
* ``logreg-output-perturbation`` - L2-regularised logistic regression on Adult trained with
  projected SGD and released with Gaussian output perturbation (Wu et al. 2017, Alg. 2); epsilon
  from the analytic Gaussian mechanism (Balle & Wang 2018) through `dphype.privacy.accounting`.
* ``{dpsgd,dpadam}-{logreg,svm,mlp,mlp1}-{adult,mnist}`` - DP-SGD / DP-Adam (DPareto Alg. 3/4)
  run through Opacus (per-sample gradients, clipping, noise) with Poisson-sampled lots, over the
  Table 1 domains; epsilon from Opacus' RDP or PRV accountant. ``mnist`` is the bundled 5,000-digit
  subset (``dphype.ml.data.load_dataset("mnist5k")``).

The federated path plugs into the same interface: `vote_privacy_oracle` is DP-Hype's
privacy (a `dphype.privacy.accounting.VoteRelease` per configuration),
`candidate_utility_oracle` scores configurations taken from a candidate list with a
`dphype.ml.task.Task`-like scorer, and `dphype_vote_problem` makes DP-Hype's own
``(sigma, k)`` trade-off a DPareto problem over fixed local scores.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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
        """Map ``u`` in ``[0, 1]`` to the range (log-linear if ``log``; rounded if ``integer``).

        Args:
            u: Unit coordinates, any shape.

        Returns:
            Values in ``[low, high]``, of the shape of ``u``.
        """
        lo, hi = self._scale(np.array([self.low, self.high], dtype=np.float64))
        value = lo + np.clip(u, 0.0, 1.0) * (hi - lo)
        value = np.exp(value) if self.log else value
        return np.clip(np.round(value), self.low, self.high) if self.integer else np.clip(value, self.low, self.high)

    def to_unit(self, value: np.ndarray) -> np.ndarray:
        """Inverse of `from_unit` (up to integer rounding).

        Args:
            value: Values in ``[low, high]``, any shape.

        Returns:
            Unit coordinates, of the shape of ``value``.
        """
        lo, hi = self._scale(np.array([self.low, self.high], dtype=np.float64))
        return (self._scale(np.asarray(value, dtype=np.float64)) - lo) / (hi - lo)

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies in the interval (and is an integer on an integer axis).

        Args:
            value: A value.

        Returns:
            Whether it is admissible.
        """
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
        """The axes' names, in order.

        Returns:
            The names.
        """
        return tuple(p.name for p in self.params)

    @property
    def dim(self) -> int:
        """The number of axes ``d``.

        Returns:
            ``d``.
        """
        return len(self.params)

    def from_unit(self, unit: np.ndarray) -> list[Config]:
        """Configurations for the rows of ``unit``.

        Args:
            unit: ``(n, dim)`` values in ``[0, 1]``.

        Returns:
            ``n`` configurations.

        Raises:
            ValueError: ``unit`` does not have ``dim`` columns.
        """
        unit = np.atleast_2d(np.asarray(unit, dtype=np.float64))
        if unit.shape[1] != self.dim:
            raise ValueError(f"unit points must have {self.dim} columns, got shape {unit.shape}")
        cols = [p.from_unit(unit[:, j]) for j, p in enumerate(self.params)]
        return [
            {p.name: (int(c[i]) if p.integer else float(c[i])) for p, c in zip(self.params, cols)}
            for i in range(len(unit))
        ]

    def to_unit(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """Unit-cube coordinates of ``configs``.

        Args:
            configs: ``n`` configurations.

        Returns:
            ``(n, dim)`` coordinates.
        """
        self.check(configs)
        return np.stack(
            [p.to_unit(np.array([c[p.name] for c in configs], dtype=np.float64)) for p in self.params],
            axis=1,
        ).reshape(len(configs), self.dim)

    def check(self, configs: Sequence[Mapping[str, Any]]) -> None:
        """Check configurations against the domain.

        Args:
            configs: The configurations.

        Raises:
            ValueError: A hyperparameter is missing or out of range (the first one is named).
        """
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
        """Full grid with ``points_per_axis`` values per axis, end points included (DPareto Sec. 4.3).

        Args:
            points_per_axis: Values per axis, ``>= 1``.

        Returns:
            ``points_per_axis ** dim`` configurations.

        Raises:
            ValueError: ``points_per_axis`` is below 1.
        """
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
        """Draw from the law.

        Args:
            rng: The generator.
            size: The number of draws.

        Returns:
            ``(size,)`` draws.

        Raises:
            ValueError: ``kind`` is unknown.
        """
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


# ------------------------------------------------------------------------------------------- oracles
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
        """Summarise the runs.

        Args:
            runs: Every run's utility, at least one.

        Returns:
            The summary.

        Raises:
            ValueError: No runs.
        """
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
        """``1 - U(lambda)``, DPareto's second (minimised) objective.

        Returns:
            One minus the mean utility.
        """
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
        """Call both oracles on ``config``.

        Args:
            config: The configuration.
            rng: The utility oracle's randomness.

        Returns:
            The evaluation.

        Raises:
            ValueError: An oracle's output is out of range (the message names the oracle).
        """
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


# ------------------------------------------------------------------------- sparse vector technique (SVT)
def svt_epsilon(b: float, bound: int) -> float:
    """DPareto Appendix B: Alg. 1 with noise ``b`` and answer bound ``C`` is (eps, 0)-DP.

    ``eps = (1 + (2C)^(1/3)) (1 + (2C)^(2/3)) / b``.

    Args:
        b: The noise scale, ``> 0``.
        bound: ``C``, an integer ``>= 1``.

    Returns:
        The epsilon.

    Raises:
        ValueError: ``b`` or ``C`` is out of its range.
    """
    from dphype.checks import check_positive

    check_positive("b", b)
    if bound < 1:
        raise ValueError(f"C must be an integer >= 1, got {bound}")
    two_c = 2.0 * bound
    return (1.0 + two_c ** (1.0 / 3.0)) * (1.0 + two_c ** (2.0 / 3.0)) / b


def svt_answers(answers: np.ndarray, b: float, bound: int, rng: np.random.Generator) -> np.ndarray:
    """Run DPareto Alg. 1 on each row of the 0/1 matrix ``answers`` (one run per row).

    ``b1 = b / (1 + (2C)^(1/3))``, ``b2 = b - b1``; threshold noise ``rho ~ Lap(b1)`` per run,
    query noise ``nu_i ~ Lap(b2)``; query ``i`` is answered 1 if ``q_i + nu_i >= 1/2 + rho``, and the
    run stops after the ``C``-th positive answer.

    Args:
        answers: ``(R, m)`` true 0/1 answers, one run per row.
        b: The noise scale.
        bound: ``C``.
        rng: The generator of the Laplace noise.

    Returns:
        The ``(R, m)`` released 0/1 vectors ``w``.
    """
    q = np.atleast_2d(answers).astype(np.float64)
    b1 = b / (1.0 + (2.0 * bound) ** (1.0 / 3.0))
    b2 = b - b1
    rho = rng.laplace(0.0, b1, size=(q.shape[0], 1))
    nu = rng.laplace(0.0, b2, size=q.shape)
    above = q + nu >= 0.5 + rho
    return above & (np.cumsum(above, axis=1) <= bound)


def f1_scores(truth: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Row-wise F1 score ``2TP / (2TP + FP + FN)`` of 0/1 matrices (1 when both are empty).

    Args:
        truth: ``(R, m)`` true 0/1 answers.
        predicted: ``(R, m)`` released 0/1 answers.

    Returns:
        ``(R,)`` F1 scores.
    """
    t = np.atleast_2d(truth).astype(bool)
    p = np.atleast_2d(predicted).astype(bool)
    tp = (t & p).sum(axis=1)
    denom = 2 * tp + (p & ~t).sum(axis=1) + (t & ~p).sum(axis=1)
    return np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 1.0)


def svt_problem(*, queries: int = 100, positives: int = 10, runs: int = 50, seed: int = 0) -> ParetoProblem:
    """DPareto's SVT example (Sec. 2.2/3.3).

    ``m = 100`` queries, 10 of them true; the utility is the F1 score averaged over ``R = 50`` runs with random
    query orders; ``C`` in [1, 30] (uniform), ``b`` in [1e-2, 1e2] (log-uniform).

    Args:
        queries: ``m``.
        positives: True queries, in ``[1, m]``.
        runs: ``R``, ``>= 1``.
        seed: Seeds which queries are true.

    Returns:
        The problem.

    Raises:
        ValueError: ``positives`` or ``runs`` is out of its range.
    """
    if not 1 <= positives <= queries:
        raise ValueError(f"positives must be in [1, queries={queries}], got {positives}")
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    truth = np.zeros(queries, dtype=bool)
    truth[np.random.default_rng(seed).choice(queries, positives, replace=False)] = True

    def utility(config: Config, rng: np.random.Generator) -> UtilityResult:
        order = np.argsort(rng.random((runs, queries)), axis=1)
        answers = truth[order]
        released = svt_answers(answers, float(config["b"]), int(config["C"]), rng)
        return UtilityResult.from_runs(f1_scores(answers, released))

    domain = Domain((Hyperparameter("C", 1, 30, integer=True), Hyperparameter("b", 1e-2, 1e2, log=True)))
    return ParetoProblem(
        name="svt",
        domain=domain,
        privacy=lambda c: svt_epsilon(float(c["b"]), int(c["C"])),
        utility=utility,
        delta=0.0,
        distributions={"C": Distribution("uniform", 1, 30), "b": Distribution("loguniform", 1e-2, 1e2)},
        description="sparse vector technique, closed-form privacy (DPareto Alg. 1, App. B), F1 utility",
    )


# ------------------------------------------------------- output-perturbed logistic regression (Wu et al.)
@dataclass(frozen=True)
class OutputPerturbationSetup:
    """Constants of Wu et al. (2017) Alg. 2 for logistic loss on unit-norm features.

    Logistic loss is ``L = 1``-Lipschitz and ``beta = 1/4``-smooth when ``||x|| <= 1``; with the
    regulariser ``gamma/2 ||w||^2`` and projection onto the ball of radius ``1/gamma`` (which holds
    the minimiser), the objective is ``gamma``-strongly convex, ``(beta + gamma)``-smooth and
    ``(1 + gamma * 1/gamma) = 2``-Lipschitz on the ball.

    Attributes:
        lipschitz: ``L`` of the objective on the ball.
        smoothness: ``beta`` of the logistic loss.
    """

    lipschitz: float = 2.0
    smoothness: float = 0.25

    def sensitivity(self, gamma: float, n: int) -> float:
        """L2 sensitivity ``2 L / (gamma n)`` of strongly convex permutation PSGD (Wu et al., Alg. 2).

        Args:
            gamma: The regularisation.
            n: The number of training rows.

        Returns:
            The sensitivity.
        """
        return 2.0 * self.lipschitz / (gamma * n)


def train_psgd_logreg(
    x: np.ndarray,
    y: np.ndarray,
    gamma: float,
    *,
    epochs: int,
    batch_size: int,
    rng: np.random.Generator,
    setup: OutputPerturbationSetup = OutputPerturbationSetup(),
) -> np.ndarray:
    """Projected permutation SGD on ``logistic + gamma/2 ||w||^2`` (Wu et al. 2017, Alg. 2).

    The data are reshuffled every epoch; step ``eta_t = min(1/(beta+gamma), 1/(gamma t))``;
    after each step ``w`` is projected onto ``||w|| <= 1/gamma``. Starts from ``w = 0``.

    Args:
        x: ``(n, d)`` features with unit-norm rows.
        y: ``(n,)`` labels in {-1, +1}.
        gamma: The regularisation.
        epochs: Passes over the data.
        batch_size: The minibatch size.
        rng: Shuffles the data.
        setup: The loss's constants.

    Returns:
        The non-private ``(d,)`` weights ``w``.
    """
    n, d = x.shape
    w = np.zeros(d)
    radius = 1.0 / gamma
    t = 0
    for _ in range(epochs):
        order = rng.permutation(n)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            xb, yb = x[idx], y[idx]
            coef = -yb / (1.0 + np.exp(yb * (xb @ w)))  # derivative of log(1 + e^{-y w.x}) w.r.t. w.x
            grad = coef @ xb / len(idx) + gamma * w
            t += 1
            w -= min(1.0 / (setup.smoothness + gamma), 1.0 / (gamma * t)) * grad
            norm = float(np.linalg.norm(w))
            if norm > radius:
                w *= radius / norm
    return w


def output_perturbation_problem(
    *,
    runs: int = 50,
    epochs: int = 10,
    batch_size: int = 32,
    delta: float = 1e-6,
    train_size: int | None = None,
) -> ParetoProblem:
    """DPareto's private logistic regression example (Sec. 2.2) on Adult.

    Hyperparameters: regularisation ``gamma`` in [1e-4, 1] and output-noise std ``sigma`` in
    [0.1, 10] (log-uniform, Sec. 3.3). Privacy: analytic Gaussian mechanism with the sensitivity
    of `OutputPerturbationSetup` at ``delta = 1e-6``. Utility: test accuracy of
    ``w + N(0, sigma^2 I)`` averaged over ``runs`` noise draws. For speed, the non-private ``w`` is
    trained once per oracle call (one random data order) and the runs differ in the output noise,
    which dominates the variability: after 10 passes the strongly convex PSGD iterate barely depends
    on the order (test accuracies agree to 1e-3 across orders and batch sizes 1..128). DPareto uses
    mini-batch size 1; the default here is 32 (the sensitivity bound of the strongly convex case
    does not depend on the batch size). Rows are scaled to unit L2 norm.

    Args:
        runs: Output-noise draws per evaluation.
        epochs: PSGD passes.
        batch_size: PSGD's minibatch size.
        delta: The fixed delta.
        train_size: Subsample the training rows to this many; ``None``: all.

    Returns:
        The problem.

    Raises:
        ValueError: ``train_size`` is below 2.
    """  # noqa: DOC502
    from dphype.checks import check_delta
    from dphype.ml.data import load_dataset
    from dphype.privacy.accounting import analytic_gaussian_epsilon

    check_delta(delta)
    pool, test = load_dataset("adult")
    pool = _maybe_subsample(pool, train_size)
    x = pool.x.astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = 2.0 * pool.y - 1.0
    xt = test.x.astype(np.float64)
    xt /= np.linalg.norm(xt, axis=1, keepdims=True)
    yt = 2.0 * test.y - 1.0
    setup = OutputPerturbationSetup()
    n = len(y)

    def privacy(config: Config) -> float:
        return analytic_gaussian_epsilon(setup.sensitivity(float(config["gamma"]), n), float(config["sigma"]), delta)

    def utility(config: Config, rng: np.random.Generator) -> UtilityResult:
        w = train_psgd_logreg(x, y, float(config["gamma"]), epochs=epochs, batch_size=batch_size, rng=rng)
        w = w[None, :] + rng.normal(0.0, float(config["sigma"]), size=(runs, len(w)))
        return UtilityResult.from_runs(((xt @ w.T) * yt[:, None] > 0).mean(axis=0))

    return ParetoProblem(
        name="logreg-output-perturbation",
        domain=Domain((Hyperparameter("gamma", 1e-4, 1.0, log=True), Hyperparameter("sigma", 0.1, 10.0, log=True))),
        privacy=privacy,
        utility=utility,
        delta=delta,
        distributions={"gamma": Distribution("loguniform", 1e-4, 1.0), "sigma": Distribution("loguniform", 0.1, 10.0)},
        description="output-perturbed L2 logistic regression on Adult (Wu et al. Alg. 2, analytic Gaussian)",
    )


def _maybe_subsample(data: Any, size: int | None, seed: int = 0) -> Any:
    """The first ``size`` rows of a seeded permutation of ``data`` (all rows if ``size`` is None)."""
    if size is None or size >= len(data):
        return data
    if size < 2:
        raise ValueError(f"train_size must be >= 2, got {size}")
    return data.subset(np.random.default_rng(seed).permutation(len(data))[:size])


# ---------------------------------------------------------------------------- DP-SGD / DP-Adam (Opacus)
#: DPareto Table 1 domains per data set (epochs, lot size, learning rate, noise variance, clip norm).
DPSGD_DOMAINS: dict[str, dict[str, tuple[float, float]]] = {
    "adult": {"epochs": (1, 64), "lot_size": (8, 512), "lr": (5e-4, 5e-2), "noise_variance": (0.1, 16),
              "clip_norm": (0.1, 4)},
    "mnist": {"epochs": (1, 400), "lot_size": (16, 4000), "lr": (1e-3, 5e-1), "noise_variance": (0.1, 16),
              "clip_norm": (0.1, 12)},
}

#: DPareto Appendix C, Tables 3 (MNIST) and 4 (ADULT): the random baseline's sampling laws.
DPSGD_DISTRIBUTIONS: dict[str, dict[str, Distribution]] = {
    "adult": {
        "epochs": Distribution("uniform", 1, 64),
        "lot_size": Distribution("normal", 128, 64),
        "lr": Distribution("shifted-exponential", 10, 1e-3),
        "noise_variance": Distribution("shifted-exponential", 1e-1, 1e-1),
        "clip_norm": Distribution("shifted-exponential", 1e-1, 1e-1),
    },
    "mnist": {
        "epochs": Distribution("uniform", 1, 400),
        "lot_size": Distribution("normal", 800, 800),
        "lr": Distribution("shifted-exponential", 10, 1e-3),
        "noise_variance": Distribution("shifted-exponential", 5e-1, 1e-1),
        "clip_norm": Distribution("shifted-exponential", 5e-1, 1e-1),
    },
}

DPSGD_MODELS: tuple[str, ...] = ("logreg", "svm", "mlp", "mlp1")
DPSGD_OPTIMIZERS: tuple[str, ...] = ("dpsgd", "dpadam")
OPACUS_ACCOUNTANTS: tuple[str, ...] = ("rdp", "prv")
_DATASETS = {"adult": "adult", "mnist": "mnist5k"}
#: Renyi orders for the RDP accountant: Opacus' defaults extended to 1024, so that very noisy,
#: short runs (tiny epsilon, optimal order beyond 63) are not over-estimated.
RDP_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
                                      + list(range(64, 1025, 16)))


def dpsgd_steps(epochs: int, lot_size: int, num_samples: int) -> tuple[float, int]:
    """Poisson sampling rate ``q = m / n`` and number of steps ``T * n / m`` (at least 1).

    Args:
        epochs: ``T``, ``>= 1``.
        lot_size: ``m``, in ``[1, n]``.
        num_samples: ``n``.

    Returns:
        ``(q, steps)``.

    Raises:
        ValueError: ``epochs`` or ``lot_size`` is out of its range.
    """
    if not 1 <= lot_size <= num_samples:
        raise ValueError(f"lot_size must be in [1, {num_samples}] (the training set size), got {lot_size}")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    return lot_size / num_samples, max(1, int(round(epochs * num_samples / lot_size)))


def dpsgd_epsilon(config: Mapping[str, Any], num_samples: int, delta: float, accountant: str = "rdp") -> float:
    """Epsilon of DP-SGD/DP-Adam with ``config`` on ``num_samples`` records (Opacus accountants).

    The mechanism is the Poisson-subsampled Gaussian mechanism (Abadi et al. 2016) with noise
    multiplier ``sqrt(noise_variance)`` (noise std ``sqrt(noise_variance) * clip_norm`` on the sum
    of clipped per-example gradients, add/remove neighbours), sample rate ``lot_size / n``, for
    ``epochs * n / lot_size`` steps; the clipping norm does not affect epsilon. The RDP accountant
    minimises over `RDP_ORDERS`.

    Args:
        config: ``noise_variance``, ``lot_size``, ``epochs`` (and the rest of the configuration).
        num_samples: ``n``.
        delta: The delta.
        accountant: One of `OPACUS_ACCOUNTANTS`.

    Returns:
        The epsilon.

    Raises:
        ValueError: ``accountant`` is unknown, or ``epochs`` or ``lot_size`` is out of its range.
    """
    from opacus.accountants import create_accountant

    if accountant not in OPACUS_ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {OPACUS_ACCOUNTANTS}, got {accountant!r}")
    q, steps = dpsgd_steps(int(config["epochs"]), int(config["lot_size"]), num_samples)
    acc = create_accountant(accountant)
    acc.history.append((math.sqrt(float(config["noise_variance"])), q, steps))
    if accountant == "rdp":
        return float(acc.get_epsilon(delta, alphas=list(RDP_ORDERS)))
    return float(acc.get_epsilon(delta))


def build_dpsgd_model(name: str, in_features: int, num_classes: int) -> Any:
    """DPareto Sec. 4.1 models.

    ``logreg``/``svm`` (linear, zero-initialised as in Alg. 3), ``mlp`` (MLP2: 128-64 ReLU) and ``mlp1`` (one
    hidden layer of 1000 ReLU units).

    Args:
        name: One of `DPSGD_MODELS`.
        in_features: The number of input features.
        num_classes: The number of classes.

    Returns:
        A fresh torch module.

    Raises:
        ValueError: ``name`` is unknown.
    """
    from torch import nn

    if name in ("logreg", "svm"):
        layer = nn.Linear(in_features, num_classes)
        nn.init.zeros_(layer.weight)
        nn.init.zeros_(layer.bias)
        return layer
    if name == "mlp":
        return nn.Sequential(nn.Linear(in_features, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                             nn.Linear(64, num_classes))
    if name == "mlp1":
        return nn.Sequential(nn.Linear(in_features, 1000), nn.ReLU(), nn.Linear(1000, num_classes))
    raise ValueError(f"model must be one of {DPSGD_MODELS}, got {name!r}")


def train_dpsgd(
    model_name: str,
    optimizer: str,
    x: Any,
    y: Any,
    num_classes: int,
    config: Mapping[str, Any],
    seed: int,
) -> Any:
    """Train with DP-SGD (DPareto Alg. 3) or DP-Adam (Alg. 4) through Opacus.

    Lots are Poisson samples with rate ``lot_size / n`` (so Opacus' accountants apply); Opacus'
    ``GradSampleModule`` computes per-example gradients and its ``DPOptimizer`` clips them to
    ``clip_norm``, adds ``N(0, noise_variance * clip_norm^2)`` to their sum and divides by the
    expected lot size. An empty lot still takes a (pure-noise) step. ``logreg`` uses the logistic
    (cross-entropy) loss, ``svm`` the multi-class hinge loss, MLPs cross-entropy.

    Args:
        model_name: One of `DPSGD_MODELS`.
        optimizer: One of `DPSGD_OPTIMIZERS`.
        x: ``(n, d)`` training features.
        y: ``(n,)`` labels.
        num_classes: The number of classes.
        config: The configuration (learning rate, clipping norm, noise variance, lot size, epochs).
        seed: Seeds the training.

    Returns:
        The trained model.

    Raises:
        ValueError: ``optimizer`` or ``model_name`` is unknown.
    """  # noqa: DOC502
    import torch
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    if optimizer not in DPSGD_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {DPSGD_OPTIMIZERS}, got {optimizer!r}")
    n = x.shape[0]
    q, steps = dpsgd_steps(int(config["epochs"]), int(config["lot_size"]), n)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = GradSampleModule(build_dpsgd_model(model_name, x.shape[1], num_classes), loss_reduction="sum")
    base = (torch.optim.SGD if optimizer == "dpsgd" else torch.optim.Adam)(model.parameters(), lr=float(config["lr"]))
    opt = DPOptimizer(
        base,
        noise_multiplier=math.sqrt(float(config["noise_variance"])),
        max_grad_norm=float(config["clip_norm"]),
        expected_batch_size=int(config["lot_size"]),
        loss_reduction="mean",
        generator=generator,
    )
    loss_fn = torch.nn.functional.multi_margin_loss if model_name == "svm" else torch.nn.functional.cross_entropy
    with warnings.catch_warnings():
        # Opacus' hooks on the first layer fire without input gradients: expected, harmless.
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        for _ in range(steps):
            idx = (torch.rand(n, generator=generator) < q).nonzero().squeeze(1)
            opt.zero_grad(set_to_none=True)
            if len(idx):
                loss_fn(model(x[idx]), y[idx], reduction="sum").backward()
            else:
                for p in model.parameters():
                    p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype)
            opt.step()
    return model._module


def dpsgd_problem(
    optimizer: str,
    model_name: str,
    dataset: str,
    *,
    runs: int = 3,
    delta: float = 1e-5,
    accountant: str = "rdp",
    train_size: int | None = None,
    data_dir: str | None = None,
) -> ParetoProblem:
    """DP-SGD / DP-Adam over DPareto's Table 1 domain for ``dataset`` in {adult, mnist}.

    Utility: test accuracy averaged over ``runs`` independent trainings (best/worst kept).
    Privacy: `dpsgd_epsilon` at ``delta`` with Opacus' ``accountant``.

    Args:
        optimizer: One of `DPSGD_OPTIMIZERS`.
        model_name: One of `DPSGD_MODELS`.
        dataset: ``"adult"`` or ``"mnist"``.
        runs: Independent trainings per evaluation, ``>= 1``.
        delta: The fixed delta.
        accountant: ``"rdp"`` or ``"prv"``.
        train_size: Subsamples the training pool (the privacy oracle uses the same ``n``); ``None``: all.
        data_dir: The folder holding a non-bundled data set.

    Returns:
        The problem.

    Raises:
        ValueError: An argument is unknown or out of its range.
    """
    import torch

    from dphype.checks import check_delta
    from dphype.ml.data import load_dataset

    if optimizer not in DPSGD_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {DPSGD_OPTIMIZERS}, got {optimizer!r}")
    if model_name not in DPSGD_MODELS:
        raise ValueError(f"model must be one of {DPSGD_MODELS}, got {model_name!r}")
    if dataset not in _DATASETS:
        raise ValueError(f"dataset must be one of {tuple(_DATASETS)}, got {dataset!r}")
    if accountant not in OPACUS_ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {OPACUS_ACCOUNTANTS}, got {accountant!r}")
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    check_delta(delta)
    pool, test = load_dataset(_DATASETS[dataset], data_dir)
    pool = _maybe_subsample(pool, train_size)
    x = torch.from_numpy(pool.x.reshape(len(pool), -1))
    y = torch.from_numpy(pool.y)
    xt = torch.from_numpy(test.x.reshape(len(test), -1))
    yt = torch.from_numpy(test.y)
    n = len(pool)
    bounds = dict(DPSGD_DOMAINS[dataset])
    lot_lo, lot_hi = bounds["lot_size"]
    if lot_lo >= n:
        raise ValueError(f"train_size must exceed the smallest lot size {lot_lo}, got {n}")
    bounds["lot_size"] = (lot_lo, min(lot_hi, n))
    domain = Domain(
        tuple(
            Hyperparameter(name, lo, hi, log=True, integer=name in ("epochs", "lot_size"))
            for name, (lo, hi) in bounds.items()
        )
    )

    def utility(config: Config, rng: np.random.Generator) -> UtilityResult:
        scores = []
        for seed in rng.integers(0, 2**31 - 1, size=runs):
            model = train_dpsgd(model_name, optimizer, x, y, pool.num_classes, config, int(seed))
            with torch.no_grad():
                scores.append(float((model(xt).argmax(dim=1) == yt).double().mean()))
        return UtilityResult.from_runs(scores)

    name = f"{optimizer}-{model_name}-{dataset}"
    return ParetoProblem(
        name=name,
        domain=domain,
        privacy=lambda c: dpsgd_epsilon(c, n, delta, accountant),
        utility=utility,
        delta=delta,
        distributions=DPSGD_DISTRIBUTIONS[dataset],
        description=f"{'DP-SGD' if optimizer == 'dpsgd' else 'DP-Adam'} ({model_name}) on {dataset} via Opacus, "
        f"{accountant.upper()} accountant",
    )


# --------------------------------------------------------------------------- the federated (DP-Hype) side
def vote_privacy_oracle(
    *,
    delta: float,
    num_candidates: int | None = None,
    accountant: str | None = None,
    noise: str = "gaussian",
) -> PrivacyOracle:
    """DP-Hype's privacy as a privacy oracle: ``{"sigma": s, "k": k} -> epsilon`` of the noisy vote sum.

    A `dphype.privacy.accounting.VoteRelease`, accounted by `dphype.privacy.accounting.epsilon`.

    Args:
        delta: The fixed delta.
        num_candidates: The number of candidates, or ``None``.
        accountant: The accountant; ``None``: the default of the noise kind.
        noise: ``"gaussian"`` or ``"skellam"``.

    Returns:
        The oracle.
    """
    from dphype.checks import check_delta
    from dphype.privacy.accounting import VoteRelease, epsilon

    check_delta(delta)

    def privacy(config: Config) -> float:
        release = VoteRelease(int(config["k"]), num_candidates, float(config["sigma"]), noise)
        return epsilon(release, delta, accountant)

    return privacy


def candidate_utility_oracle(
    score: Callable[[Sequence[Mapping[str, Any]]], np.ndarray],
    *,
    maximize: bool = True,
) -> UtilityOracle:
    """A utility oracle from a candidate scorer, e.g. ``dphype.ml.task.Task.score``.

    ``score`` receives a one-candidate list and returns one score per candidate in ``[0, 1]``, shape
    ``(1,)``, or lexicographic keys, shape ``(1, j)`` (e.g. ``TorchTask(validation="split")``'s
    ``[accuracy, -loss]``; a ``":loss"`` scheme's primary key is a negated loss, not in ``[0, 1]``): the
    utility is the primary key, column 0 (`dphype.selection.voting.primary_scores`); for ``maximize=False``
    it is ``1 - score``. Deterministic scorers have one run.

    Args:
        score: The candidate scorer.
        maximize: Whether higher scores are better.

    Returns:
        The oracle.
    """
    from dphype.selection.candidates import CandidateList
    from dphype.selection.voting import primary_scores

    def utility(config: Config, rng: np.random.Generator) -> UtilityResult:
        value = float(primary_scores(score(CandidateList([config])))[0])
        return UtilityResult.from_runs([value if maximize else 1.0 - value])

    return utility


def dphype_vote_problem(
    client_scores: np.ndarray,
    test_accuracy: np.ndarray,
    *,
    delta: float,
    noise: str = "gaussian",
    accountant: str | None = None,
    runs: int = 50,
    sigma_range: tuple[float, float] = (1.0, 100.0),
    max_k: int = 10,
) -> ParetoProblem:
    """DP-Hype itself as a DPareto problem over ``(sigma, k)`` for fixed local scores.

    Privacy: `vote_privacy_oracle`. Utility: the test accuracy of the argmax of
    ``sum_i top_k_votes(scores_i) + sum_i noise_share_i``, replayed by
    `dphype.privacy.noise.replay_noisy_sums` (the clients' own vote and noise functions), averaged over
    ``runs`` noise draws; ``test_accuracy[j]`` is the
    accuracy a model trained with candidate ``j`` reaches (e.g. from ``dphype compare``'s inputs).

    Args:
        client_scores: ``(clients, candidates)`` or ``(clients, candidates, j)`` (each client's lexicographic
            keys, see `dphype.selection.voting.top_k_votes`), at least 2 clients.
        test_accuracy: ``(candidates,)`` accuracies.
        delta: The fixed delta.
        noise: ``"gaussian"`` or ``"skellam"``.
        accountant: The accountant; ``None``: the default of the noise kind.
        runs: Noise draws per evaluation.
        sigma_range: The ``sigma`` axis.
        max_k: The largest ``k``.

    Returns:
        The problem.

    Raises:
        ValueError: ``client_scores`` has the wrong shape or fewer than 2 clients.
    """
    from dphype.privacy.noise import replay_noisy_sums
    from dphype.selection.voting import top_k_votes

    scores = np.asarray(client_scores, dtype=np.float64)
    acc = np.asarray(test_accuracy, dtype=np.float64)
    if scores.ndim not in (2, 3) or scores.shape[0] < 2 or scores.shape[1] != acc.shape[0]:
        raise ValueError(
            "client_scores must be (clients >= 2, candidates) or (clients >= 2, candidates, keys) matching "
            f"test_accuracy, got {scores.shape} and {acc.shape}"
        )
    n, p = scores.shape[:2]
    max_k = min(max_k, p)

    def utility(config: Config, rng: np.random.Generator) -> UtilityResult:
        k, sigma = int(config["k"]), float(config["sigma"])
        votes = np.sum([top_k_votes(row, k) for row in scores], axis=0)
        noisy = replay_noisy_sums(votes, sigma=sigma, clients=n, repetitions=runs, rng=rng, noise=noise)
        picks = np.argmax(noisy, axis=1)  # the server's argmax (dphype.selection.rules.select) on every release
        return UtilityResult.from_runs(np.nan_to_num(acc[picks], nan=0.0))

    return ParetoProblem(
        name="dphype-votes",
        domain=Domain((Hyperparameter("sigma", sigma_range[0], sigma_range[1], log=True),
                       Hyperparameter("k", 1, max_k, integer=True))),
        privacy=vote_privacy_oracle(delta=delta, num_candidates=p, accountant=accountant, noise=noise),
        utility=utility,
        delta=delta,
        distributions={"sigma": Distribution("loguniform", *sigma_range), "k": Distribution("uniform", 1, max_k)},
        description=f"DP-Hype top-k voting with {n} clients over {p} candidates ({noise} noise)",
    )


# ------------------------------------------------------------------------------------------ registry
def problem_names() -> tuple[str, ...]:
    """All names accepted by `make_problem`.

    Returns:
        The names.
    """
    names = ["svt", "logreg-output-perturbation"]
    names += [f"{o}-{m}-{d}" for o in DPSGD_OPTIMIZERS for m in DPSGD_MODELS for d in _DATASETS]
    return tuple(names)


def make_problem(
    name: str,
    *,
    runs: int | None = None,
    seed: int = 0,
    accountant: str = "rdp",
    train_size: int | None = None,
    data_dir: str | None = None,
) -> ParetoProblem:
    """Build the problem ``name``.

    Args:
        name: One of `problem_names`.
        runs: Overrides the problem's default R; ``None``: keep it.
        seed: Seeds the SVT problem's true queries.
        accountant: Opacus' accountant (DP-SGD problems).
        train_size: Subsamples the training pool; ``None``: all.
        data_dir: The folder holding a non-bundled data set.

    Returns:
        The problem.

    Raises:
        ValueError: ``name`` is unknown.
    """
    if name == "svt":
        return svt_problem(seed=seed, **({} if runs is None else {"runs": runs}))
    if name == "logreg-output-perturbation":
        return output_perturbation_problem(train_size=train_size, **({} if runs is None else {"runs": runs}))
    parts = name.split("-")
    if len(parts) == 3 and name in problem_names():
        return dpsgd_problem(
            parts[0], parts[1], parts[2], accountant=accountant, train_size=train_size, data_dir=data_dir,
            **({} if runs is None else {"runs": runs}),
        )
    raise ValueError(f"oracle must be one of {', '.join(problem_names())}; got {name!r}")
