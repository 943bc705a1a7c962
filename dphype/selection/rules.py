"""The server's selection rule on the released noisy vote sum, and the confidence in its pick.

Everything here is post-processing of ONE released vector ``y = v + e`` (the vote sum ``v`` plus noise of
known total std ``sigma`` on every coordinate, Algorithm 1 line 11) and of public facts: the candidates'
feature space (`dphype.selection.candidates.CandidateList.feature_space`) and, optionally, the total vote mass
``M = m k`` (each of the ``m`` contributing clients casts exactly ``k`` votes; ``m`` and ``k`` are public).
No function reads the private votes, so the release's privacy guarantee covers every output (post-processing).

Rules (one `SelectionRule` subclass each, registered under its name: `rule_names`, `selection_rule`):

* ``"max-votes"`` -- Algorithm 1, line 12: the candidate with the most noisy votes (ties: lowest index).
* ``"gp"`` -- structure-aware: a Gaussian process over the public space models the vote surface ``v``;
  the pick is the argmax of its posterior mean given ``y``. Noise variance: the KNOWN ``sigma^2``. Prior
  mean: the constant ``M / p`` when the vote mass is known (and the posterior is conditioned on the exact
  total ``sum(v) = M``), else the release's own average. Kernel: ``s * prod_numeric Matern52(l_i) *
  Categorical(l_c)`` (GPyTorch's ``MaternKernel`` with ARD over the log/linear axes scaled to ``[0, 1]``,
  BoTorch's ``CategoricalKernel`` over the categorical axes). Hyperparameters (lengthscales, outputscale
  ``s``) are inferred from the release itself on a fixed grid (`GPSettings`): the posterior mean is
  averaged over the grid with weights ``marginal likelihood x prior`` (Bayesian model averaging; log-uniform
  priors). Where the space carries no structure
  (`dphype.selection.candidates.FeatureSpace.no_structure`), the rule falls back to ``"max-votes"`` and says why.

Batched algebra (the benchmarks replay hundreds of releases per setting): for one lengthscale vector the
unit-scale kernel ``K0 = U diag(lambda) U^T`` is eigendecomposed once; for every outputscale ``s`` and
every release (``z = U^T (y - m)``) the log marginal likelihood is
``-1/2 sum_j [z_j^2 / (s lambda_j + sigma^2) + log(s lambda_j + sigma^2)] - p/2 log(2 pi)``
(Rasmussen & Williams 2006, Eq. 2.30, in the eigenbasis) and the posterior mean is
``m + U (z * s lambda / (s lambda + sigma^2))`` (Eq. 2.25): matrix products over the whole batch. The
grid is exhaustive and fixed, so the result is deterministic, and identical for identical inputs.

Confidence (`select_release`): samples of the posterior of ``v`` given the release (flat prior for
``"max-votes"``: ``N(y, sigma^2 I)``; the model-averaged GP posterior for ``"gp"``) give the probability that
the pick is the top-voted candidate and that it is within ``tolerance`` votes of the top; the margin is the
rule's estimate for the pick minus the runner-up's, in units of ``sigma``. Theorem IV.1's bound for the
max-votes rule (`good_selection_probability_bound`) lives here too.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
from numpy.typing import ArrayLike
from threadpoolctl import threadpool_limits

from dphype.checks import check_int, check_positive, check_sigma
from dphype.registry import Registry

if TYPE_CHECKING:
    from dphype.selection.candidates import FeatureSpace

#: The product's default rule (chosen by the benchmarks: results/releases.md, "Selection at small federations").
DEFAULT_RULE = "gp"
#: A pick whose probability of being within ``tolerance`` of the top is below this carries a warning.
LOW_CONFIDENCE = 0.5
#: Posterior samples behind a confidence (fixed seed: deterministic; Monte Carlo error <= 0.008 at 1 std).
CONFIDENCE_SAMPLES = 4000


# --------------------------------------------------------------------------------------------- validators
class SelectionRule(ABC):
    """A selection rule: its picks on released noisy vote sums, its posterior, and when another rule runs instead.

    Stateless; registered once (`register_rule`). Everything it computes is post-processing (module docstring).

    Attributes:
        name: The public name (configuration, CLI ``--rule``, results).
        description: One line for the CLI's help.
        models: Whether its estimate of the vote sum is a model's, not the release itself.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    models: ClassVar[bool]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def runs_as(self, space: FeatureSpace | None, sigma: float | None = None) -> tuple[SelectionRule, str | None]:
        """The rule that runs on releases over ``space`` with noise ``sigma`` (``None``: some), and why not this one.

        Args:
            space: The candidates' public feature space, or ``None``.
            sigma: The total noise std on each coordinate (``0``: no noise); ``None``: some noise, not yet known.

        Returns:
            ``(rule, None)`` when this rule runs, else ``(fallback, reason)``.
        """
        return self, None

    @abstractmethod
    def picks(self, y: np.ndarray, space: FeatureSpace | None, sigma: float, *, clients: int | None, k: int | None,
              settings: GPSettings | None) -> np.ndarray:
        """The rule's pick on every release (`select_batch`, after `runs_as`).

        Args:
            y: ``(R, p)`` finite releases.
            space: The candidates' public feature space, or ``None``.
            sigma: The total noise std on each coordinate.
            clients: The public number of clients whose votes are in the sum, or ``None``.
            k: The public votes per client, or ``None``.
            settings: The ``"gp"`` rule's hyperparameter grid, or ``None``.

        Returns:
            The ``(R,)`` picks.
        """

    @abstractmethod
    def posterior(self, y: np.ndarray, space: FeatureSpace | None, sigma: float, *, clients: int | None,
                  k: int | None, settings: GPSettings | None) -> tuple[np.ndarray, np.ndarray]:
        """The rule's estimate of the vote sum and samples of its posterior given one release (`select_release`).

        Args:
            y: ``(1, p)`` releases.
            space: The candidates' public feature space, or ``None``.
            sigma: The total noise std on each coordinate.
            clients: The public number of clients whose votes are in the sum, or ``None``.
            k: The public votes per client, or ``None``.
            settings: The ``"gp"`` rule's hyperparameter grid, or ``None``.

        Returns:
            The ``(p,)`` estimate and ``(CONFIDENCE_SAMPLES, p)`` posterior samples (deterministic).
        """


_RULES: Registry[SelectionRule] = Registry("rule", "selection rule", renamed={"argmax": "max-votes"})
_Rule = TypeVar("_Rule", bound=type[SelectionRule])


def register_rule(rule: _Rule) -> _Rule:
    """Class decorator: register one instance of ``rule`` under ``rule.name`` (a taken name is refused)."""
    _RULES.add(rule.name, rule())
    return rule


def rule_names() -> tuple[str, ...]:
    """The registered rules' names, in registration order."""
    return _RULES.names()


def selection_rule(name: Any) -> SelectionRule:
    """The registered rule named ``name``; an unknown name is refused (ValueError listing the names)."""
    return _RULES.get(name)


def check_rule(rule: Any) -> str:
    """Check a selection rule's name and return it as str."""
    return selection_rule(rule).name


def _as_releases(noisy: ArrayLike, name: str = "noisy") -> np.ndarray:
    """A finite ``(R, p)`` float64 array (a single ``(p,)`` release becomes ``(1, p)``)."""
    arr = np.asarray(noisy, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty array of shape (p,) or (releases, p), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite")
    return arr


# --------------------------------------------------------------------------------------------- argmax
def select(noisy_sum: ArrayLike) -> int:
    """Index of most noisy votes (Algorithm 1, line 12; ties: lowest); refuses an empty, non-1-D or non-finite sum."""
    arr = np.asarray(noisy_sum, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"noisy_sum must be a non-empty 1-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("noisy_sum must be finite")
    return int(np.argmax(arr))


def selection_gap(vote_sum: ArrayLike, good: Sequence[int]) -> float:
    """Gap ``gamma`` of Eq. (3): min votes over good candidates minus max votes over the others (every index not good).

    Args:
        vote_sum: The ``(p,)`` noiseless aggregated vote vector.
        good: The indices of ``H_good``, at least one, leaving at least one bad candidate.

    Returns:
        The gap (negative when a bad candidate has more votes than a good one).

    Raises:
        ValueError: ``vote_sum`` is empty or not 1-D, ``good`` is empty, out of range or covers every candidate.
    """
    arr = np.asarray(vote_sum, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"vote_sum must be a non-empty 1-D array, got shape {arr.shape}")
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

    The proof bounds ``Pr[z_i - z_j >= gamma]`` for ``z_i - z_j ~ N(0, 2 sigma^2)`` by the Gaussian tail and takes a
    union bound over the bad candidates; ``num_good`` only has to be ``>= 1``. For ``gamma <= 0`` the theorem gives
    nothing and 0 is returned; a negative right-hand side is reported as 0.

    Args:
        gap: ``gamma`` of Eq. (3) (`selection_gap`), finite.
        sigma: The std of the total Gaussian noise on each coordinate of the vote sum, ``> 0``.
        num_good: ``|H_good|``, an integer ``>= 1``.
        num_bad: ``|H_bad|``, an integer ``>= 0``.

    Returns:
        The lower bound on the probability of a good selection, in ``[0, 1]``.

    Raises:
        ValueError: An argument is out of its range.
    """
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


# ------------------------------------------------------------------------------------------ the GP rule
@dataclass(frozen=True)
class GPSettings:
    """The hyperparameter grid of the ``"gp"`` rule (public constants; nothing here is read from data).

    Lengthscales: the product of ``lengthscales`` over the axes, or ``max_grid`` points of a scrambled Sobol design
    over it (fixed seed). Outputscales ``s``: ``num_outputscales`` log-spaced values between the variance of random
    voting, ``n q (1 - q)`` with ``q = k / p``, and of unanimous voting, ``n^2 q (1 - q)``, when ``n`` and ``k`` are
    known; else ``sigma^2 * 10^[-3, 3]``; ``outputscales`` (units of ``sigma^2``) replaces that grid. Prior: uniform
    over the grid (log-uniform in every lengthscale and in ``s``), or with ``botorch_prior`` BoTorch's
    ``LogNormal(sqrt(2) + log(d)/2, sqrt(3))`` per lengthscale (Hvarfner et al., ICML 2024).

    Attributes:
        lengthscales: Candidate lengthscales of every axis, in units of the axis' ``[0, 1]`` range.
        num_outputscales: The number of outputscales in the default grid.
        outputscales: Outputscales in units of ``sigma^2`` replacing the default grid, or ``None``.
        max_grid: The most lengthscale vectors in the grid.
        botorch_prior: Use BoTorch's lengthscale prior instead of the uniform one.

    Raises:
        ValueError: A field is out of its range.
    """

    lengthscales: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4)
    num_outputscales: int = 25
    outputscales: tuple[float, ...] | None = None
    max_grid: int = 512
    botorch_prior: bool = False

    def __post_init__(self) -> None:
        for name in ("lengthscales", "outputscales"):
            values = getattr(self, name)
            if values is None and name == "outputscales":
                continue
            if isinstance(values, (str, bytes)) or len(values) == 0:
                raise ValueError(f"{name} must be a non-empty tuple of numbers > 0, got {values!r}")
            for v in values:
                check_positive(name, v)
        check_int("num_outputscales", self.num_outputscales, 1)
        check_int("max_grid", self.max_grid, 1)

    def outputscale_grid(self, sigma: float, clients: int | None, k: int | None, p: int) -> np.ndarray:
        """The ``(S,)`` outputscale grid in vote units squared (class docstring)."""
        if self.outputscales is not None:
            return np.asarray(self.outputscales, dtype=np.float64) * sigma**2
        q = None if clients is None or k is None else k / p
        if q is None or q >= 1.0:
            return sigma**2 * np.logspace(-3.0, 3.0, self.num_outputscales)
        assert clients is not None
        return np.geomspace(clients * q * (1 - q), clients**2 * q * (1 - q), self.num_outputscales)


def _lengthscale_grid(num_axes: int, settings: GPSettings) -> np.ndarray:
    """``(L, num_axes)`` lengthscale vectors: the full product grid, or a Sobol subset of it."""
    values = np.asarray(settings.lengthscales, dtype=np.float64)
    if len(values) ** num_axes <= settings.max_grid:
        mesh = np.meshgrid(*([values] * num_axes), indexing="ij")
        return np.stack([m.ravel() for m in mesh], axis=1).reshape(-1, num_axes)
    # lazy import: scipy
    from scipy.stats import qmc

    u = qmc.Sobol(num_axes, scramble=True, seed=0).random(settings.max_grid)
    return values[np.minimum((u * len(values)).astype(np.int64), len(values) - 1)]


def _log_lengthscale_prior(grid: np.ndarray) -> np.ndarray:
    """Log prior (up to a constant) of each grid vector: BoTorch's ``LogNormal`` per axis, normal in ``log l``."""
    loc, scale = math.sqrt(2.0) + 0.5 * math.log(grid.shape[1]), math.sqrt(3.0)
    return (-0.5 * ((np.log(grid) - loc) / scale) ** 2).sum(axis=1)


def unit_kernels(space: FeatureSpace, lengthscales: np.ndarray) -> np.ndarray:
    """Unit-outputscale ``(L, p, p)`` kernel matrices of the candidates, one per row of ``lengthscales``.

    GPyTorch's ``MaternKernel(nu=2.5)`` with ARD over the ``d`` numeric axes, times BoTorch's ``CategoricalKernel``
    (``exp(-mean_i [x_i != x'_i] / l)``) when there are categorical axes.

    Args:
        space: The candidates' public feature space (``p`` candidates, ``d`` numeric axes).
        lengthscales: ``(L, d)`` lengthscales, plus a last column (``(L, d + 1)``) for the categorical kernel.

    Returns:
        The kernel matrices.
    """
    # lazy import: torch
    import torch

    with warnings.catch_warnings():  # GPyTorch still decorates helpers with torch.jit.script, which torch deprecates
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=DeprecationWarning)
        # lazy import: BoTorch; GPyTorch
        from botorch.models.kernels import CategoricalKernel
        from gpytorch.kernels import MaternKernel

    ls = torch.as_tensor(np.asarray(lengthscales, dtype=np.float64))
    batch = torch.Size([ls.shape[0]])
    p, d = space.numeric.shape
    out = torch.ones(batch + (p, p), dtype=torch.float64)
    with torch.no_grad():
        if d:
            kern = MaternKernel(nu=2.5, ard_num_dims=d, batch_shape=batch).to(torch.float64)
            kern.lengthscale = ls[:, None, :d]
            out = out * kern(torch.as_tensor(space.numeric).expand(batch + (p, d))).to_dense()
        if space.categorical.shape[1]:
            cat = CategoricalKernel(batch_shape=batch).to(torch.float64)
            cat.lengthscale = ls[:, None, d:d + 1]
            codes = torch.as_tensor(space.categorical, dtype=torch.float64)
            out = out * cat(codes.expand(batch + codes.shape)).to_dense()
    return out.numpy()


@dataclass(frozen=True)
class _Spectra:
    """Grid for one space: ``grid``, ``log_prior``, the kernels' ``eigval``, ``eigvec`` and ``u1 = U^T 1``."""

    grid: np.ndarray
    log_prior: np.ndarray
    eigval: np.ndarray
    eigvec: np.ndarray
    u1: np.ndarray


_SPECTRA: dict[tuple[Any, ...], _Spectra] = {}


def _spectra(space: FeatureSpace, settings: GPSettings) -> _Spectra:
    """Eigendecompositions of the grid's kernels for ``space`` (kept for the last few spaces)."""
    key = (space.numeric.tobytes(), space.numeric.shape, space.categorical.tobytes(), space.categorical.shape,
           settings)
    if key not in _SPECTRA:
        num_axes = space.numeric.shape[1] + (1 if space.categorical.shape[1] else 0)
        grid = _lengthscale_grid(num_axes, settings)
        log_prior = _log_lengthscale_prior(grid) if settings.botorch_prior else np.zeros(len(grid))
        eigval, eigvec = np.linalg.eigh(unit_kernels(space, grid))
        if len(_SPECTRA) >= 8:
            _SPECTRA.pop(next(iter(_SPECTRA)))
        _SPECTRA[key] = _Spectra(grid, log_prior, np.clip(eigval, 0.0, None), eigvec, eigvec.sum(axis=1))
    return _SPECTRA[key]


@dataclass
class SurfaceFit:
    """The ``"gp"`` rule's fit of ``R`` releases.

    Attributes:
        mean: ``(R, p)`` posterior mean of the vote sum, averaged over the hyperparameter grid.
        lengthscales: ``(R, a)`` most probable lengthscales per release.
        outputscale: ``(R,)`` most probable outputscale per release (vote units squared).
        prior_mean: ``(R,)`` the prior mean per release.
    """

    mean: np.ndarray
    lengthscales: np.ndarray
    outputscale: np.ndarray
    prior_mean: np.ndarray


@dataclass(frozen=True)
class _Release:
    """Validated inputs of a fit: ``(R, p)`` releases ``y``, ``sigma`` and the public ``clients`` and ``k``."""

    y: np.ndarray
    sigma: float
    clients: int | None
    k: int | None

    @property
    def vote_mass(self) -> float | None:
        """The public total ``M = n k`` of the noiseless votes, or ``None``."""
        return None if self.clients is None or self.k is None else float(self.clients * self.k)

    def prior_mean(self) -> np.ndarray:
        """The ``(R,)`` prior means: ``M / p``, or each release's own average when ``M`` is unknown."""
        mass = self.vote_mass
        return self.y.mean(axis=1) if mass is None else np.full(self.y.shape[0], mass / self.y.shape[1])


def _release(noisy: ArrayLike, space: FeatureSpace, sigma: float, clients: Any, k: Any) -> _Release:
    y = _as_releases(noisy)
    sigma = check_sigma(sigma)
    if (clients is None) != (k is None):
        raise ValueError("clients and k must be given together (the vote mass is clients * k)")
    if clients is not None:
        clients = check_int("clients", clients, 1)
        k = check_int("k", k, 1)
        if k > y.shape[1]:
            raise ValueError(f"k must be an integer in [1, {y.shape[1]}] (number of candidates), got {k}")
    if space.num_candidates != y.shape[1]:
        raise ValueError(f"noisy has {y.shape[1]} entries per release, the feature space {space.num_candidates}")
    if space.no_structure is not None:
        raise ValueError(f"the feature space carries no structure: {space.no_structure}")
    return _Release(y, sigma, clients, k)


@dataclass
class _Chunk:
    """One chunk of grid points ``G``: everything the rule needs about the releases there.

    Attributes:
        index: The chunk's slice of the grid.
        log_post: ``(G, R, S)`` log marginal likelihood (R&W Eq. 2.30 in the eigenbasis) plus log prior.
        z: ``(G, R, p)`` centred releases in the eigenbases.
        shrink: ``(G, S, p)`` posterior mean factors ``s lambda / (s lambda + sigma^2)``.
        post_var: ``(G, S, p)`` posterior covariance factors ``s lambda sigma^2 / (s lambda + sigma^2)``.
        u1: ``(G, p)``, or ``None`` (no sum constraint).
    """

    index: slice
    log_post: np.ndarray
    z: np.ndarray
    shrink: np.ndarray
    post_var: np.ndarray
    u1: np.ndarray | None

    def mean_coefficients(self, weights: np.ndarray) -> np.ndarray:
        """The ``(G, R, p)`` weighted sum over outputscales of the posterior mean's eigen-coefficients.

        One outputscale: ``m + U (z * shrink)`` (R&W Eq. 2.25). With a known vote mass ``M`` it is conditioned on
        ``1^T v = M``, a noiseless linear observation: ``mu + C 1 (M - 1^T mu) / (1^T C 1)``, ``C = U diag(post_var)
        U^T``, ``M - 1^T mu = -u1 . (z * shrink)``.

        Args:
            weights: ``(G, R, S)`` weights.

        Returns:
            The coefficients.
        """
        out = self.z * (weights @ self.shrink)
        if self.u1 is not None:
            c1 = self.post_var * self.u1[:, None, :]  # (G, S, p): eigen-coefficients of C 1
            step = -((self.z * self.u1[:, None, :]) @ self.shrink.transpose(0, 2, 1))  # (G, R, S)
            step /= np.maximum(np.einsum("gsp,gp->gs", c1, self.u1), 1e-300)[:, None, :]
            out += (weights * step) @ c1
        return out


#: entries ``G R p`` per vectorised chunk of grid points (bounds memory at a few times 8 x this many bytes)
_CHUNK_ENTRIES = 2**21


def _grid_chunks(centred: np.ndarray, spectra: _Spectra, sigma: float, scales: np.ndarray,
                 constrained: bool) -> Any:
    """Yield `_Chunk` s covering the grid for the centred ``(R, p)`` releases and the ``(S,)`` outputscales."""
    r, p = centred.shape
    noise_var = sigma**2
    size = max(1, _CHUNK_ENTRIES // (r * p))
    for start in range(0, len(spectra.grid), size):
        index = slice(start, start + size)
        lam = scales[None, :, None] * spectra.eigval[index][:, None, :]  # (G, S, p): eigenvalues of s K0
        var = lam + noise_var
        z = centred[None, :, :] @ spectra.eigvec[index]  # (G, R, p)
        log_post = -0.5 * ((z**2) @ (1.0 / var).transpose(0, 2, 1) + np.log(var).sum(axis=2)[:, None, :]
                           + p * math.log(2 * math.pi))
        log_post += spectra.log_prior[index][:, None, None]
        yield _Chunk(index, log_post, z, lam / var, lam * noise_var / var,
                     spectra.u1[index] if constrained else None)


def fit_surface(
    noisy: ArrayLike,
    space: FeatureSpace,
    sigma: float,
    *,
    clients: int | None = None,
    k: int | None = None,
    settings: GPSettings | None = None,
) -> SurfaceFit:
    """Fit the ``"gp"`` rule's vote surface to every release of ``noisy`` (module docstring).

    ``clients`` and ``k`` give the vote mass ``M`` (prior mean ``M / p``, exact sum constraint) and the outputscale
    range; unknown, the prior mean is each release's own average, without constraint. The posterior mean is averaged
    over the grid with weights ``exp(log marginal likelihood + log prior)``, accumulated chunk by chunk.

    Args:
        noisy: ``(R, p)`` releases (or one ``(p,)`` release).
        space: The candidates' public feature space.
        sigma: The total noise std on each coordinate, ``> 0``.
        clients: The public number of clients whose votes are in the sum, or ``None``.
        k: The public votes per client, or ``None`` (given together with ``clients``).
        settings: The hyperparameter grid; ``None``: `GPSettings` ``()``.

    Returns:
        The fit: posterior means ``(R, p)`` and the most probable hyperparameters.

    Raises:
        ValueError: An input is invalid, or ``space`` carries no structure (`select_batch` falls back instead).
    """  # noqa: DOC502
    rel = _release(noisy, space, sigma, clients, k)
    settings = GPSettings() if settings is None else settings
    with _one_blas_thread():
        spectra = _spectra(space, settings)
        return _fit(rel, spectra, settings.outputscale_grid(rel.sigma, rel.clients, rel.k, space.num_candidates))


def _one_blas_thread() -> Any:
    """Single-threaded BLAS: extra threads gain nothing on ``p x p`` matrices and spin on a busy machine."""
    return threadpool_limits(limits=1, user_api="blas")


def _fit(rel: _Release, spectra: _Spectra, scales: np.ndarray) -> SurfaceFit:
    r, p = rel.y.shape
    prior_mean = rel.prior_mean()
    best = np.full(r, -np.inf)
    best_cell = np.zeros(r, dtype=np.int64)
    total = np.zeros((r, p))
    norm = np.zeros(r)
    for chunk in _grid_chunks(rel.y - prior_mean[:, None], spectra, rel.sigma, scales, rel.vote_mass is not None):
        flat = chunk.log_post.transpose(1, 0, 2).reshape(r, -1)  # (R, G S)
        top = flat.max(axis=1)
        new_best = np.maximum(best, top)
        better = top > best
        best_cell[better] = chunk.index.start * len(scales) + np.argmax(flat[better], axis=1)
        weights = np.exp(chunk.log_post - new_best[None, :, None])
        rescale = np.exp(best - new_best)
        coef = chunk.mean_coefficients(weights)  # (G, R, p)
        # sum_g coef_g @ U_g^T as one product: (R, G p) @ (G p, p)
        basis = spectra.eigvec[chunk.index].transpose(0, 2, 1).reshape(-1, p)
        total = total * rescale[:, None] + coef.transpose(1, 0, 2).reshape(r, -1) @ basis
        norm = norm * rescale + weights.sum(axis=(0, 2))
        best = new_best
    return SurfaceFit(mean=prior_mean[:, None] + total / norm[:, None],
                      lengthscales=spectra.grid[best_cell // len(scales)],
                      outputscale=scales[best_cell % len(scales)], prior_mean=prior_mean)


def posterior_samples(
    noisy_sum: ArrayLike,
    space: FeatureSpace,
    sigma: float,
    *,
    clients: int | None = None,
    k: int | None = None,
    settings: GPSettings | None = None,
    num_samples: int = CONFIDENCE_SAMPLES,
    seed: int = 0,
) -> np.ndarray:
    """Draws of the vote sum from the ``"gp"`` rule's posterior given one release.

    A grid point ``(l, s)`` is drawn from the hyperparameter posterior, then ``v ~ N(mean, C)`` in its eigenbasis;
    with a known vote mass the draw is conditioned on ``1^T v = M`` by Matheron's rule,
    ``v + C 1 (M - 1^T v) / (1^T C 1)`` (exact for Gaussians).

    Args:
        noisy_sum: The ``(p,)`` release.
        space: The candidates' public feature space.
        sigma: The total noise std on each coordinate, ``> 0``.
        clients: The public number of clients whose votes are in the sum, or ``None``.
        k: The public votes per client, or ``None`` (given together with ``clients``).
        settings: The hyperparameter grid; ``None``: `GPSettings` ``()``.
        num_samples: The number of draws ``N``, ``>= 1``.
        seed: Makes the draws reproducible.

    Returns:
        ``(N, p)`` draws.

    Raises:
        ValueError: An input is invalid, ``noisy_sum`` holds more than one release, or ``space`` has no structure.
    """
    rel = _release(noisy_sum, space, sigma, clients, k)
    if rel.y.shape[0] != 1:
        raise ValueError(f"noisy_sum must be one release of shape (p,), got shape {np.shape(noisy_sum)}")
    num_samples = check_int("num_samples", num_samples, 1)
    settings = GPSettings() if settings is None else settings
    p = space.num_candidates
    scales = settings.outputscale_grid(rel.sigma, rel.clients, rel.k, p)
    prior_mean = float(rel.prior_mean()[0])
    with _one_blas_thread():
        spectra = _spectra(space, settings)
        chunks = list(_grid_chunks(rel.y - prior_mean, spectra, rel.sigma, scales, rel.vote_mass is not None))
    log_post = np.concatenate([c.log_post[:, 0, :] for c in chunks])  # (L, S)
    prob = np.exp(log_post - log_post.max()).ravel()
    rng = np.random.default_rng(seed)
    cells = rng.choice(prob.size, size=num_samples, p=prob / prob.sum())
    grid_index, scale_index = np.divmod(cells, log_post.shape[1])
    z = np.concatenate([c.z[:, 0, :] for c in chunks])[grid_index]  # (N, p)
    shrink = np.concatenate([c.shrink for c in chunks])[grid_index, scale_index]
    post_var = np.concatenate([c.post_var for c in chunks])[grid_index, scale_index]
    coef = z * shrink + rng.standard_normal((num_samples, p)) * np.sqrt(post_var)  # unconstrained draws
    if rel.vote_mass is not None:
        u1 = spectra.u1[grid_index]
        c1 = post_var * u1
        coef -= ((coef * u1).sum(axis=1) / np.maximum((c1 * u1).sum(axis=1), 1e-300))[:, None] * c1
    draws = np.empty_like(coef)
    for g in np.unique(grid_index):  # each grid point's eigenbasis once, not gathered per draw ((N, p, p) floats)
        rows = grid_index == g
        draws[rows] = np.einsum("nq,pq->np", coef[rows], spectra.eigvec[g])
    return prior_mean + draws


# ------------------------------------------------------------------------------------------------ the rules
@register_rule
class MaxVotes(SelectionRule):
    """Algorithm 1, line 12: the most noisy votes (ties: lowest index); its posterior is ``N(y, sigma^2 I)``."""

    name = "max-votes"
    description = "the paper's: the most noisy votes"
    models = False

    def picks(self, y: np.ndarray, space: FeatureSpace | None, sigma: float, *, clients: int | None, k: int | None,
              settings: GPSettings | None) -> np.ndarray:
        """``argmax`` of every release."""
        return np.argmax(y, axis=1)

    def posterior(self, y: np.ndarray, space: FeatureSpace | None, sigma: float, *, clients: int | None,
                  k: int | None, settings: GPSettings | None) -> tuple[np.ndarray, np.ndarray]:
        """The release itself, and ``N(y, sigma^2 I)`` samples (flat prior)."""
        return y[0], y + sigma * np.random.default_rng(0).standard_normal((CONFIDENCE_SAMPLES, y.shape[1]))


@register_rule
class GP(SelectionRule):
    """Structure-aware: the argmax of a Gaussian process's posterior mean over the public space (module docstring)."""

    name = "gp"
    description = "structure-aware, a Gaussian process over the candidate space"
    models = True

    def runs_as(self, space: FeatureSpace | None, sigma: float | None = None) -> tuple[SelectionRule, str | None]:
        """`Argmax` when ``sigma == 0``, ``space`` is ``None`` or carries no structure; else this rule."""
        if isinstance(sigma, (int, float)) and not isinstance(sigma, bool) and sigma == 0:
            return selection_rule("max-votes"), "no noise: the release is the vote sum itself"
        reason = "no feature space given" if space is None else space.no_structure
        return (self, None) if reason is None else (selection_rule("max-votes"), reason)

    def picks(self, y: np.ndarray, space: FeatureSpace | None, sigma: float, *, clients: int | None, k: int | None,
              settings: GPSettings | None) -> np.ndarray:
        """The argmax of `fit_surface`'s posterior mean on every release."""
        assert space is not None
        return np.argmax(fit_surface(y, space, sigma, clients=clients, k=k, settings=settings).mean, axis=1)

    def posterior(self, y: np.ndarray, space: FeatureSpace | None, sigma: float, *, clients: int | None,
                  k: int | None, settings: GPSettings | None) -> tuple[np.ndarray, np.ndarray]:
        """`fit_surface`'s mean and `posterior_samples`."""
        assert space is not None
        estimate = fit_surface(y, space, sigma, clients=clients, k=k, settings=settings).mean[0]
        return estimate, posterior_samples(y[0], space, sigma, clients=clients, k=k, settings=settings)


# ------------------------------------------------------------------------------------------ batch rules
@dataclass(frozen=True)
class BatchSelection:
    """A rule's picks on ``R`` releases.

    Attributes:
        picks: ``(R,)`` selected indices.
        rule: The rule that ran.
        fallback: Why the requested rule fell back to another (`SelectionRule.runs_as`), or ``None``.
    """

    picks: np.ndarray
    rule: str
    fallback: str | None = None


def select_batch(
    noisy: ArrayLike,
    space: FeatureSpace | None,
    sigma: float,
    *,
    rule: str = DEFAULT_RULE,
    clients: int | None = None,
    k: int | None = None,
    settings: GPSettings | None = None,
) -> BatchSelection:
    """``rule``'s pick on every release of ``noisy``, or its fallback's (`SelectionRule.runs_as`) with the reason.

    Args:
        noisy: ``(R, p)`` releases (or one ``(p,)`` release).
        space: The candidates' public feature space, or ``None``.
        sigma: The total noise std on each coordinate (``0``: no noise).
        rule: One of `rule_names`.
        clients: The public number of clients whose votes are in the sum, or ``None``.
        k: The public votes per client, or ``None`` (given together with ``clients``).
        settings: The ``"gp"`` rule's hyperparameter grid; ``None``: `GPSettings` ``()``.

    Returns:
        The ``(R,)`` picks, the rule that ran and the reason for a fallback.

    Raises:
        ValueError: An input is invalid.
    """  # noqa: DOC502
    runs, reason = selection_rule(rule).runs_as(space, sigma)
    y = _as_releases(noisy)
    return BatchSelection(runs.picks(y, space, sigma, clients=clients, k=k, settings=settings), runs.name, reason)


# ---------------------------------------------------------------------------------- one release + confidence
@dataclass(frozen=True)
class Selection:
    """The server's pick on one release and the confidence in it (all post-processing of the release).

    Attributes:
        index: The selected candidate.
        rule: The rule that ran.
        requested: The rule asked for; it differs from ``rule`` on a fallback, explained by ``fallback``.
        fallback: Why the requested rule fell back to another (`SelectionRule.runs_as`), or ``None``.
        estimate: ``(p,)`` the rule's estimate of the vote sum (the release itself for ``"max-votes"``).
        sigma: The total noise std on the release.
        p_top: Posterior probability that ``index`` is the top-voted candidate.
        p_top_group: Posterior probability that it is within ``tolerance`` votes of the top.
        tolerance: Votes below the top that still count as the top group.
        margin: The estimate's lead over the runner-up in units of ``sigma``.
        warning: Set when ``p_top_group`` is below `LOW_CONFIDENCE` or ``p_top`` below twice the chance of a
            random pick (``2 / p``).
    """

    index: int
    rule: str
    requested: str
    fallback: str | None
    estimate: np.ndarray
    sigma: float
    p_top: float
    p_top_group: float
    tolerance: float
    margin: float
    warning: str | None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable summary (without the estimate vector)."""
        return {"selected": self.index, "rule": self.rule, "requested_rule": self.requested,
                "fallback": self.fallback, "p_top": self.p_top, "p_top_group": self.p_top_group,
                "tolerance_votes": self.tolerance, "margin_sigma": self.margin, "sigma": self.sigma,
                "warning": self.warning}


def select_release(
    noisy_sum: ArrayLike,
    sigma: float,
    *,
    space: FeatureSpace | None = None,
    rule: str = DEFAULT_RULE,
    clients: int | None = None,
    k: int | None = None,
    tolerance: float | None = None,
    settings: GPSettings | None = None,
) -> Selection:
    """Select a candidate from one released noisy vote sum and say how sure the pick is (module docstring).

    Args:
        noisy_sum: The ``(p,)`` release.
        sigma: The total noise std actually on the sum (`dphype.privacy.accounting.PrivacyReport.sigma`).
        space: The public feature space (``None`` makes ``"gp"`` fall back).
        rule: One of `rule_names`.
        clients: The public number of contributing clients, or ``None``; with ``k`` it gives the vote mass.
        k: The public votes per client, or ``None`` (given together with ``clients``).
        tolerance: Votes below the top that still count as the top group (default: a tenth of ``clients``, at
            least 1; 0 if ``clients`` is unknown).
        settings: The ``"gp"`` rule's hyperparameter grid; ``None``: `GPSettings` ``()``.

    Returns:
        The pick, its estimate and the confidence in it.

    Raises:
        ValueError: An input is invalid: more than one release, ``clients`` without ``k`` or the converse, a negative
            or infinite ``tolerance``.
    """
    rule = check_rule(rule)
    sigma = check_sigma(sigma)
    y = _as_releases(noisy_sum, "noisy_sum")
    if y.shape[0] != 1:
        raise ValueError(f"noisy_sum must be one release of shape (p,), got shape {np.shape(noisy_sum)}")
    if (clients is None) != (k is None):
        raise ValueError("clients and k must be given together (the vote mass is clients * k)")
    if clients is not None:
        clients, k = check_int("clients", clients, 1), check_int("k", k, 1)
    if tolerance is None:
        tolerance = 0.0 if clients is None else max(1.0, 0.1 * clients)
    elif isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < math.inf:
        raise ValueError(f"tolerance must be a finite number >= 0 (votes), got {tolerance!r}")
    chosen = select_batch(y, space, sigma, rule=rule, clients=clients, k=k, settings=settings)
    estimate, samples = selection_rule(chosen.rule).posterior(y, space, sigma, clients=clients, k=k,
                                                              settings=settings)
    index = int(chosen.picks[0])
    p_top = float(np.mean(np.argmax(samples, axis=1) == index))
    p_group = float(np.mean(samples[:, index] >= samples.max(axis=1) - tolerance))
    others = np.delete(estimate, index)
    margin = float((estimate[index] - others.max()) / sigma) if others.size else math.inf
    warning = None
    chance = 1.0 / y.shape[1]
    if p_group < LOW_CONFIDENCE or p_top < 2.0 * chance:
        warning = (f"low confidence: the pick is the top-voted candidate with probability {p_top:.3f} (a random "
                   f"pick: {chance:.3f}) and within {tolerance:g} votes of it with probability {p_group:.2f}; "
                   f"margin {margin:.2f} sigma. The release is dominated by noise: more clients, a larger epsilon "
                   "or the k that `dphype plan` recommends would help.")
    return Selection(index=index, rule=chosen.rule, requested=rule, fallback=chosen.fallback,
                     estimate=np.asarray(estimate), sigma=sigma, p_top=p_top, p_top_group=p_group,
                     tolerance=float(tolerance), margin=margin, warning=warning)
