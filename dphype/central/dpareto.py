"""DPareto: Bayesian optimisation of the privacy-utility Pareto front (Avent et al., PoPETs 2020).

`dpareto` is Alg. 2: ``k0`` random seed configurations, then ``k`` iterations that fit two
independent GPs (Matern 5/2, BoTorch ``SingleTaskGP`` + ``fit_gpytorch_mll``) to ``log(epsilon)``
and ``logit(error)`` (Sec. 3.2, "A Note on Output Domains") and evaluate the configuration
maximising the hypervolume-based probability of improvement (HVPoI, Eq. 3) against the anti-ideal
point. BoTorch's ``qLogNoisyExpectedHypervolumeImprovement`` is available as ``method="qnehvi"``.
The baselines are random sampling with DPareto's distributions (Appendix C / Sec. 3.3) and grid
search (Sec. 4.3).

Cost control (the search's own overhead, not the oracles): the acquisition is maximised over a
finite candidate pool (fresh uniform points of the unit cube plus Gaussian perturbations of the
current Pareto-optimal inputs) in one batched tensor operation; GP hyperparameters are refitted
only every ``refit_every`` iterations, warm-started from the previous fit; in between, the GPs
are only conditioned on the new data (exact posterior, fixed hyperparameters).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import ndtr

from dphype.central.pareto import (
    DEFAULT_REFERENCE,
    hypervolume_improvement,
    hypervolume_trace,
    pareto_front,
    staircase,
)
from dphype.checks import check_int
from dphype.ml.oracles.problem import Evaluation, ParetoProblem
from dphype.ml.oracles.space import Config, sample_configs

METHODS: tuple[str, ...] = ("hvpoi", "qnehvi", "random", "grid")

#: Quasi-MC samples per qLogNEHVI evaluation (BoTorch's default is 128; fewer keeps it usable
#: for hundreds of iterations on a CPU).
QNEHVI_SAMPLES = 32

#: Numerical floors for the output transforms (GP targets only; the data keep their values).
EPSILON_FLOOR = 1e-10
ERROR_CLAMP = 1e-3


# -------------------------------------------------------------------------------- objective transforms
def transform_objectives(points: np.ndarray) -> np.ndarray:
    """``(epsilon, error) -> (log epsilon, logit error)`` (Sec. 3.2), monotone, floored and clamped to stay finite."""
    pts = np.asarray(points, dtype=np.float64)
    eps = np.log(np.maximum(pts[..., 0], EPSILON_FLOOR))
    err = np.clip(pts[..., 1], ERROR_CLAMP, 1.0 - ERROR_CLAMP)
    return np.stack([eps, np.log(err) - np.log1p(-err)], axis=-1)


def untransform_objectives(values: np.ndarray) -> np.ndarray:
    """Inverse of `transform_objectives`: ``(exp(a), sigmoid(b))``."""
    vals = np.asarray(values, dtype=np.float64)
    return np.stack([np.exp(vals[..., 0]), 1.0 / (1.0 + np.exp(-vals[..., 1]))], axis=-1)


# ------------------------------------------------------------------------------------ the acquisition
def probability_of_improvement(
    front: np.ndarray,
    mean: np.ndarray,
    std: np.ndarray,
    reference: Sequence[float] | np.ndarray = (np.inf, np.inf),
) -> np.ndarray:
    """DPareto Eq. (1)-(2): ``P[f(lambda) in Gamma~]`` under independent Gaussian predictions.

    ``Gamma~`` is where the hypervolume increment ``Delta_PF`` is positive: points not dominated
    by ``front`` inside the box below ``reference`` (an infinite reference gives the unbounded
    non-dominated region). With the front's staircase ``h`` (`dphype.central.pareto.staircase`,
    level ``h_j`` on ``[lo_j, hi_j)``), ``Gamma~`` is the disjoint union of the strips
    ``[lo_j, hi_j) x (-inf, h_j)``, so ``PoI = sum_j (Phi(hi_j) - Phi(lo_j)) Phi(h_j)`` with
    arguments standardised per candidate: the integral of Eq. (2) in closed form.

    Args:
        front: ``(m, 2)`` non-dominated points.
        mean: ``(N, 2)`` predictive means, in the same space as ``front`` and ``reference``.
        std: ``(N, 2)`` predictive standard deviations.
        reference: The anti-ideal point (infinite: the unbounded non-dominated region).

    Returns:
        The ``(N,)`` probabilities of improvement.
    """
    lo, hi, level = staircase(pareto_front(front), reference)
    m = np.asarray(mean, dtype=np.float64)
    s = np.asarray(std, dtype=np.float64)
    width = ndtr((hi[None, :] - m[:, :1]) / s[:, :1]) - ndtr((lo[None, :] - m[:, :1]) / s[:, :1])
    below = ndtr((level[None, :] - m[:, 1:]) / s[:, 1:])
    return np.clip((width * below).sum(axis=1), 0.0, 1.0)


def hvpoi(
    observed: np.ndarray,
    mean_t: np.ndarray,
    std_t: np.ndarray,
    reference: Sequence[float] = DEFAULT_REFERENCE,
) -> tuple[np.ndarray, np.ndarray]:
    """DPareto Eq. (3): ``alpha(lambda) = Delta_PF(m(lambda)) * PoI(lambda)``.

    ``Delta_PF`` is the hypervolume gain (anti-ideal ``reference``) of the GP means mapped back to
    ``(epsilon, error)``. ``PoI`` is the probability that the hypervolume improves, computed in the transformed
    space where the GPs are Gaussian; the transforms are monotone, so the front, the box and ``Gamma~`` map onto
    themselves (the error reference 1 maps to ``+inf``).

    Args:
        observed: ``(n, 2)`` evaluated ``(epsilon, error)`` points, whose front is ``PF(V)``.
        mean_t: ``(N, 2)`` GP means in the transformed space.
        std_t: ``(N, 2)`` GP standard deviations in the transformed space.
        reference: The anti-ideal point.

    Returns:
        ``(alpha, PoI)``, each of shape ``(N,)``.
    """
    front = pareto_front(observed)
    ref = np.asarray(reference, dtype=np.float64)
    ref_t = np.array([math.log(ref[0]), np.inf if ref[1] >= 1.0 else math.log(ref[1] / (1.0 - ref[1]))])
    poi = probability_of_improvement(transform_objectives(front), mean_t, std_t, ref_t)
    gain = hypervolume_improvement(front, untransform_objectives(mean_t), reference)
    return gain * poi, poi


# ------------------------------------------------------------------------------------------ surrogate
@contextmanager
def single_thread() -> Iterator[None]:
    """Run the small GP linear algebra on one thread (more threads gain nothing there), then restore.

    Yields:
        Nothing; the body runs single-threaded.
    """
    # lazy import: torch
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class Surrogate:
    """Two independent ``SingleTaskGP`` s (Matern 5/2 with BoTorch's Gamma priors) on the unit cube.

    Targets are standardised here (not by an outcome transform), so that the fitted
    hyperparameters stay valid when new data arrive. Between refits the GPs are only
    conditioned on the data: one Cholesky factor of ``K + noise I`` per model per iteration.
    `predict` then needs only the ``N x n`` cross-covariance of the pool with the data
    (gpytorch's ``ExactGP.__call__`` would also build the ``N x N`` pool covariance).

    Args:
        dim: The dimension of the unit cube.
        refit_every: Refit the hyperparameters every this many updates.
        fit_maxiter: The optimiser's iterations per fit.
    """

    def __init__(self, dim: int, refit_every: int, fit_maxiter: int) -> None:
        self.dim = dim
        self.refit_every = refit_every
        self.fit_maxiter = fit_maxiter
        self.models: list[Any] = []
        self.stats = np.zeros((2, 2))
        self.fits = 0
        self._since_fit = 0
        self._cache: list[tuple[Any, Any, Any]] = []

    def _targets(self, y_t: np.ndarray) -> np.ndarray:
        mu = y_t.mean(axis=0)
        sd = y_t.std(axis=0)
        self.stats = np.stack([mu, np.where(sd > 1e-9, sd, 1.0)])
        return (y_t - self.stats[0]) / self.stats[1]

    def update(self, x_unit: np.ndarray, y_t: np.ndarray) -> None:
        """Condition on all data; refit the hyperparameters (warm start) every ``refit_every`` calls."""
        # lazy import: BoTorch; GPyTorch; torch
        import torch
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import SingleTaskGP
        from botorch.models.utils.gpytorch_modules import get_matern_kernel_with_gamma_prior
        from gpytorch.mlls import ExactMarginalLogLikelihood
        from linear_operator.utils.cholesky import psd_safe_cholesky

        x = torch.from_numpy(np.ascontiguousarray(x_unit, dtype=np.float64))
        y = torch.from_numpy(self._targets(y_t))
        refit = not self.models or self._since_fit + 1 >= self.refit_every
        if not self.models:
            self.models = [
                SingleTaskGP(x, y[:, j : j + 1], covar_module=get_matern_kernel_with_gamma_prior(self.dim),
                             outcome_transform=None)
                for j in range(2)
            ]
        else:
            for j, model in enumerate(self.models):
                model.set_train_data(x, y[:, j], strict=False)
        if refit:
            for model in self.models:
                model.train()
                mll = ExactMarginalLogLikelihood(model.likelihood, model)
                fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": self.fit_maxiter}})
            self.fits += 1
            self._since_fit = 0
        else:
            self._since_fit += 1
        self._cache = []
        with torch.no_grad():
            for j, model in enumerate(self.models):
                model.eval()
                k = model.covar_module(x).to_dense()
                k = k + model.likelihood.noise * torch.eye(len(x), dtype=x.dtype)
                chol = psd_safe_cholesky(k)  # adds jitter if duplicates make k near-singular
                resid = (y[:, j] - model.mean_module(x)).unsqueeze(-1)
                self._cache.append((x, chol, torch.cholesky_solve(resid, chol)))

    def predict(self, x_unit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(N, 2)`` predictive mean and std of the latent functions (R&W Eq. 2.25-2.26), transformed space."""
        # lazy import: torch
        import torch

        z = torch.from_numpy(np.ascontiguousarray(x_unit, dtype=np.float64))
        means, stds = [], []
        with torch.no_grad():
            for model, (x, chol, alpha) in zip(self.models, self._cache):
                cross = model.covar_module(z, x).to_dense()
                prior_var = model.covar_module(z, diag=True)
                v = torch.linalg.solve_triangular(chol, cross.T, upper=False)
                means.append((model.mean_module(z) + (cross @ alpha).squeeze(-1)).numpy())
                stds.append((prior_var - (v * v).sum(dim=0)).clamp_min(1e-12).sqrt().numpy())
        mean = np.stack(means, axis=1) * self.stats[1] + self.stats[0]
        std = np.stack(stds, axis=1) * self.stats[1]
        return mean, std


# ------------------------------------------------------------------------------------------ the result
@dataclass
class SearchResult:
    """Evaluations of one search in order, with its hypervolume trace and timings.

    Attributes:
        problem: The problem's name.
        method: The search method, one of `METHODS`.
        evaluations: The evaluations, in order.
        reference: The anti-ideal point of the hypervolume.
        oracle_seconds: Seconds spent in oracle calls.
        overhead_seconds: Seconds spent elsewhere (the search itself).
        fits: GP hyperparameter fits.
        trace: ``(n,)`` hypervolume after each evaluation.
    """

    problem: str
    method: str
    evaluations: list[Evaluation]
    reference: tuple[float, float]
    oracle_seconds: float = 0.0
    overhead_seconds: float = 0.0
    fits: int = 0
    trace: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def points(self, which: str = "mean") -> np.ndarray:
        """``(n, 2)`` points ``(epsilon, 1 - utility)``, utility of the ``mean``, ``best`` or ``worst`` run."""
        return np.array(
            [[e.epsilon, 1.0 - getattr(e.utility, which)] for e in self.evaluations], dtype=np.float64
        ).reshape(-1, 2)

    @property
    def hypervolume(self) -> float:
        """The final hypervolume (0 before any evaluation)."""
        return float(self.trace[-1]) if len(self.trace) else 0.0


class _Runner:
    """Evaluates configurations, timing oracle calls separately from everything else.

    Args:
        problem: The problem.
        method: The search method (for the result).
        reference: The anti-ideal point of the hypervolume.
        seed: Seeds the oracle's runs.
    """

    def __init__(self, problem: ParetoProblem, method: str, reference: Sequence[float], seed: int) -> None:
        self.problem = problem
        self.rng = np.random.default_rng(seed)
        self.result = SearchResult(problem.name, method, [], (float(reference[0]), float(reference[1])))
        self.started = time.perf_counter()

    def evaluate(self, config: Config) -> Evaluation:
        t0 = time.perf_counter()
        ev = self.problem.evaluate(config, self.rng)
        self.result.oracle_seconds += time.perf_counter() - t0
        self.result.evaluations.append(ev)
        return ev

    def finish(self) -> SearchResult:
        self.result.trace = hypervolume_trace(self.result.points(), self.result.reference)
        total = time.perf_counter() - self.started
        self.result.overhead_seconds = max(0.0, total - self.result.oracle_seconds)
        return self.result


def _check_counts(seeds: int, iterations: int) -> None:
    check_int("seeds", seeds, 1)
    check_int("iterations", iterations, 0)


def seed_configs(problem: ParetoProblem, count: int, seed: int) -> list[Config]:
    """The ``k0`` initial configurations from the problem's sampling laws (shared with random search, Fig. 5)."""
    return sample_configs(problem.domain, problem.distributions, count, np.random.default_rng([seed, 0]))


# ------------------------------------------------------------------------------------------- searches
def random_search(problem: ParetoProblem, *, seeds: int, iterations: int, seed: int = 0,
                  reference: Sequence[float] = DEFAULT_REFERENCE) -> SearchResult:
    """Random sampling baseline: `dpareto`'s ``k0`` seed configurations, then ``iterations`` draws (Appendix C).

    Args:
        problem: The problem.
        seeds: ``k0``, ``>= 1``.
        iterations: Further draws, ``>= 0``.
        seed: Seeds the draws.
        reference: The anti-ideal point of the hypervolume.

    Returns:
        The search's evaluations.

    Raises:
        ValueError: ``seeds`` or ``iterations`` is out of its range.
    """  # noqa: DOC502
    _check_counts(seeds, iterations)
    runner = _Runner(problem, "random", reference, seed)
    rest = sample_configs(problem.domain, problem.distributions, iterations, np.random.default_rng([seed, 2]))
    for config in seed_configs(problem, seeds, seed) + rest:
        runner.evaluate(config)
    return runner.finish()


def grid_search(problem: ParetoProblem, evaluations: int, *, seed: int = 0,
                reference: Sequence[float] = DEFAULT_REFERENCE) -> SearchResult:
    """Grid baseline (Sec. 4.3): the largest full grid, ``g^d <= evaluations``, in a seeded random order."""
    _check_counts(evaluations, 0)
    per_axis = max(1, int(math.floor(evaluations ** (1.0 / problem.domain.dim) + 1e-9)))
    runner = _Runner(problem, "grid", reference, seed)
    configs = problem.domain.grid(per_axis)
    for i in np.random.default_rng(seed).permutation(len(configs)):
        runner.evaluate(configs[i])
    return runner.finish()


def _pool(domain_dim: int, x_front: np.ndarray, size: int, local: int, rng: np.random.Generator) -> np.ndarray:
    """Candidate pool: ``size`` uniform points plus ``local`` perturbations (std 0.05) of front inputs."""
    parts = [rng.random((size, domain_dim))]
    if local and len(x_front):
        centres = x_front[rng.integers(0, len(x_front), local)]
        parts.append(np.clip(centres + rng.normal(0.0, 0.05, centres.shape), 0.0, 1.0))
    return np.concatenate(parts)


def dpareto(
    problem: ParetoProblem,
    *,
    seeds: int = 16,
    iterations: int = 256,
    method: str = "hvpoi",
    seed: int = 0,
    reference: Sequence[float] = DEFAULT_REFERENCE,
    pool_size: int = 768,
    local_pool: int = 256,
    refit_every: int = 16,
    fit_maxiter: int = 75,
) -> SearchResult:
    """DPareto Alg. 2 with HVPoI (Eq. 3) or BoTorch's qLogNEHVI (``method="qnehvi"``).

    ``seeds`` (``k0``) random configurations from the problem's sampling laws, then ``iterations``
    (``k``) configurations each maximising the acquisition over a fresh candidate pool. Ties in
    HVPoI (e.g. all zero when every GP mean is dominated) are broken by the larger PoI.

    Args:
        problem: The problem.
        seeds: ``k0``, ``>= 1``.
        iterations: ``k``, ``>= 0``.
        method: ``"hvpoi"`` or ``"qnehvi"``.
        seed: Seeds the search.
        reference: The anti-ideal point of the hypervolume.
        pool_size: Uniform candidates per iteration, ``>= 1``.
        local_pool: Perturbations of front inputs per iteration, ``>= 0``.
        refit_every: Refit the GPs every this many iterations, ``>= 1``.
        fit_maxiter: The optimiser's iterations per fit, ``>= 1``.

    Returns:
        The search's evaluations.

    Raises:
        ValueError: An argument is out of its range.
    """
    _check_counts(seeds, iterations)
    if method not in ("hvpoi", "qnehvi"):
        raise ValueError(f"method must be 'hvpoi' or 'qnehvi' for dpareto, got {method!r}")
    if pool_size < 1 or local_pool < 0 or refit_every < 1 or fit_maxiter < 1:
        raise ValueError(
            "pool_size, refit_every, fit_maxiter must be >= 1 and local_pool >= 0; set them so\n"
            f"got {pool_size}, {refit_every}, {fit_maxiter}, {local_pool}"
        )
    # lazy import: torch
    import torch

    torch.manual_seed(seed)
    domain = problem.domain
    runner = _Runner(problem, method, reference, seed)
    for config in seed_configs(problem, seeds, seed):
        runner.evaluate(config)
    surrogate = Surrogate(domain.dim, refit_every, fit_maxiter)
    pool_rng = np.random.default_rng([seed, 1])
    for _ in range(iterations):
        observed = runner.result.points()
        x_unit = domain.to_unit([e.config for e in runner.result.evaluations])
        with single_thread():
            surrogate.update(x_unit, transform_objectives(observed))
            front = pareto_front(observed)
            on_front = (observed[:, None, :] == front[None, :, :]).all(axis=2).any(axis=1)
            pool = _pool(domain.dim, x_unit[on_front], pool_size, local_pool, pool_rng)
            if method == "hvpoi":
                mean_t, std_t = surrogate.predict(pool)
                alpha, poi = hvpoi(observed, mean_t, std_t, reference)
                best = int(np.lexsort((-poi, -alpha))[0])
            else:
                best = int(np.argmax(_qnehvi_values(surrogate, x_unit, pool, reference)))
        runner.evaluate(domain.from_unit(pool[best : best + 1])[0])
    result = runner.finish()
    result.fits = surrogate.fits
    return result


def _qnehvi_values(surrogate: Surrogate, x_unit: np.ndarray, pool: np.ndarray,
                   reference: Sequence[float]) -> np.ndarray:
    """BoTorch's qLogNEHVI (q = 1) of every pool point, maximising ``(-epsilon, -error)`` from ``(-ref)``."""
    # lazy import: BoTorch; torch
    import torch
    from botorch.acquisition.multi_objective.logei import qLogNoisyExpectedHypervolumeImprovement
    from botorch.acquisition.multi_objective.objective import GenericMCMultiOutputObjective
    from botorch.models import ModelListGP
    from botorch.sampling.normal import SobolQMCNormalSampler

    stats = torch.from_numpy(surrogate.stats)

    def to_objectives(samples: torch.Tensor, X: torch.Tensor | None = None) -> torch.Tensor:
        raw = samples * stats[1] + stats[0]
        return -torch.stack([raw[..., 0].exp(), torch.sigmoid(raw[..., 1])], dim=-1)

    acq = qLogNoisyExpectedHypervolumeImprovement(
        model=ModelListGP(*surrogate.models),
        ref_point=[-float(reference[0]), -float(reference[1])],
        X_baseline=torch.from_numpy(x_unit),
        objective=GenericMCMultiOutputObjective(to_objectives),
        sampler=SobolQMCNormalSampler(sample_shape=torch.Size([QNEHVI_SAMPLES])),
        prune_baseline=True,
        cache_root=False,
    )
    with torch.no_grad():
        values = torch.cat([acq(chunk.unsqueeze(1)) for chunk in torch.from_numpy(pool).split(256)])
    return values.numpy()


def run_search(
    problem: ParetoProblem,
    method: str,
    *,
    seeds: int,
    iterations: int,
    seed: int = 0,
    reference: Sequence[float] = DEFAULT_REFERENCE,
    **options: Any,
) -> SearchResult:
    """One search with ``seeds + iterations`` oracle evaluations by ``method``.

    Args:
        problem: The problem.
        method: One of `METHODS`.
        seeds: ``k0``, ``>= 1``.
        iterations: Further evaluations, ``>= 0``.
        seed: Seeds the search.
        reference: The anti-ideal point of the hypervolume.
        **options: `dpareto`'s options (``hvpoi`` and ``qnehvi`` only).

    Returns:
        The search's evaluations.

    Raises:
        ValueError: ``method`` is unknown, or an argument is out of its range.
    """
    if method in ("hvpoi", "qnehvi"):
        return dpareto(problem, seeds=seeds, iterations=iterations, method=method, seed=seed,
                       reference=reference, **options)
    _check_counts(seeds, iterations)
    if method == "random":
        return random_search(problem, seeds=seeds, iterations=iterations, seed=seed, reference=reference)
    if method == "grid":
        return grid_search(problem, seeds + iterations, seed=seed, reference=reference)
    raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
