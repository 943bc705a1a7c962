"""Noise kinds: one class per kind of noise a release may carry, registered under its public name.

The public name travels in configurations, requests, reports, ledgers and ``--noise``. Every kind is a `NoiseKind`
(its name, and the Renyi curve of a vote release it noised, as a ledger composes it); `any_noise_kind` turns any
registered name into its kind. The kinds of the sum release are `ShareNoiseKind`: its noise is the sum of
independent shares, so the law must be closed under sums (independent draws add up to a draw at the summed
variance). `noise_kind` and `noise_kind_names` see these only (what a configuration and ``--noise`` may name), and
every module that samples, calibrates, encodes or bounds the shares asks them.

The share kinds: `Gaussian` (``N(0, v)``, float64; the paper's) and `Skellam` (``Pois(v/2) - Pois(v/2)``, int64;
Agarwal, Kairouz & Liu, NeurIPS 2021). The winner release's discrete Laplace, drawn whole by the tallies, registers
beside its mechanism (`dphype.privacy.winner.DiscreteLaplace`). A new kind is one subclass decorated with
`register_noise_kind`.

The accountants' mathematics lives beside the kind it accounts for: Thm I.1's conversion of Renyi DP to
``(epsilon, delta)`` (`rdp_to_dp`, minimised with `optimal_order`), the Gaussian mechanism's RDP and analytic
(Balle & Wang 2018) bounds, and the Skellam mechanism's RDP bound.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, cast

import numpy as np

from dphype.checks import ACCOUNTANTS, check_k, check_neighbouring, check_sigma
from dphype.registry import Registry


# ---------------------------------------------------------------------------------- RDP to (epsilon, delta): Thm I.1
def rdp_to_dp(rdp_eps: Any, alpha: Any, delta: float) -> Any:
    """Convert RDP to ``(epsilon, delta)``-DP: DP-Hype Thm I.1, elementwise.

    Balle et al. 2020; Canonne, Kamath & Steinke 2020: ``(alpha, rdp_eps)``-RDP implies
    ``(rdp_eps + log((alpha-1)/alpha) - (log delta + log alpha)/(alpha - 1), delta)``-DP for ``alpha > 1``.

    Args:
        rdp_eps: The RDP epsilon, a float or an array.
        alpha: Its order, ``> 1``, broadcasting with ``rdp_eps``.
        delta: The target delta, in ``(0, 1)``.

    Returns:
        The epsilon at ``delta``, of the broadcast shape.

    Raises:
        ValueError: An order is not ``> 1``.
    """
    if np.any(~(np.asarray(alpha) > 1)):
        raise ValueError(f"alpha must be > 1, got {alpha!r}")
    alpha = np.asarray(alpha, dtype=np.float64)  # an integer order may exceed int64 (the optimum at huge noise)
    return rdp_eps + np.log1p(-1.0 / alpha) - (math.log(delta) + np.log(alpha)) / (alpha - 1.0)


def optimal_order(rdp_slope: float, delta: float) -> float:
    """The order ``alpha > 1`` minimising Thm I.1's epsilon for an RDP curve ``rdp_slope * alpha``.

    The derivative ``s + (log delta + log alpha)/(alpha - 1)^2`` has one root, where
    ``s (alpha - 1)^2 + log delta + log alpha = 0`` (increasing in alpha); brentq on ``log(alpha - 1)`` over
    ``(1, 1 + sqrt(log(1/delta)/s)]``, where the left side goes from ``log delta < 0`` to ``log alpha > 0`` (in
    ``log(alpha - 1)`` the tolerance is relative, so a tiny slope's far root costs no more steps).

    Args:
        rdp_slope: The slope ``s > 0``.
        delta: The target delta, in ``(0, 1)``.

    Returns:
        The minimising order.
    """
    # lazy import: scipy
    from scipy.optimize import brentq  # local imports of scipy: seconds, needed only when solving

    log_delta = math.log(delta)
    upper = 0.5 * math.log(-log_delta / rdp_slope)  # log(alpha - 1) at the bracket's right end
    u = brentq(lambda u: rdp_slope * math.exp(2.0 * u) + log_delta + math.log1p(math.exp(u)),
               min(-700.0, upper - 1.0), upper, xtol=1e-14, rtol=1e-15)
    return 1.0 + math.exp(u)


def _integer_minimiser_candidates(slope: float, lo: int, hi: float, delta: float) -> set[int]:
    """Integer orders in ``[lo, hi]`` holding the minimiser (the epsilon is unimodal: floor or ceil, clipped)."""
    a = optimal_order(slope, delta)
    return {int(min(max(c, lo), hi)) for c in (math.floor(a), math.ceil(a))}


def vote_sensitivity(k: int, neighbouring: str = "replace-one") -> tuple[float, float]:
    """``(L2, L1)`` of the top-k vote sum: ``(sqrt(2k), 2k)`` replace-one (Lemma III.1), ``(sqrt(k), k)`` add-remove."""
    k = check_k(k)
    moved = 2 * k if check_neighbouring(neighbouring) == "replace-one" else k
    return math.sqrt(moved), float(moved)


# ------------------------------------------------------------------------------------------------- a kind
class NoiseKind(ABC):
    """One kind of noise a release may carry: its names and how a vote release it noised composes; registered once.

    Attributes:
        name: The public name (configuration, wire, report, ledger, CLI).
        label: The name in prose (reports, errors).
        description: One line for the CLI's help.
        integer: Whether its draws are integers (exact under secure summation and in the tallies' MPC).
        sampled: Whether a release's noise is sampled within a total variation of the exact law, each release adding
            its sampler's delta to a composition (`dphype.privacy.winner.epsilon_with_samplers`).
    """

    name: ClassVar[str]
    label: ClassVar[str]
    description: ClassVar[str]
    integer: ClassVar[bool]
    sampled: ClassVar[bool] = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @abstractmethod
    def stated_rdp(self, orders: np.ndarray, *, k: int, sigma: float, epsilon: float, stated: str,
                   neighbouring: str) -> np.ndarray:
        """The ``(m,)`` RDP curve under ``neighbouring`` of one vote release this kind noised.

        The release is stated as ``k`` votes, noise of total std ``sigma`` and ``epsilon`` under the relation
        ``stated`` (a ledger entry, a run's privacy report); each kind takes from it what its mechanism needs.
        """


class ShareNoiseKind(NoiseKind):
    """A kind of the sum release: its shares' sampling, accounting, tail and secure-sum grid; its law closed under sums.

    Attributes:
        fixed_point_scale: A client's ``votes + share`` travel to the secure sum as ``round(x * fixed_point_scale)``.
        accountants: The accountants valid for it (names of `dphype.checks.ACCOUNTANTS`), its default first.
    """

    fixed_point_scale: ClassVar[int]
    accountants: ClassVar[tuple[str, ...]]

    @property
    def default_accountant(self) -> str:
        """The accountant used when none is named: the first of ``accountants``."""
        return self.accountants[0]

    @abstractmethod
    def draw(self, size: int | tuple[int, ...], variance: float, rng: np.random.Generator) -> np.ndarray:
        """``size`` independent draws of ``variance`` each from ``rng``: int64 for an integer kind, else float64."""

    @abstractmethod
    def tail(self, threshold: float, variance: float) -> float:
        """An upper bound on ``P(|X| > threshold)`` for one draw ``X`` of ``variance``."""

    @abstractmethod
    def rdp(self, orders: np.ndarray, l2: float, l1: float, sigma: float) -> np.ndarray:
        """The ``(m,)`` RDP curve of one release of a sum of sensitivities ``(l2, l1)`` plus noise of std ``sigma``."""

    @abstractmethod
    def epsilon(self, l2: float, l1: float, sigma: float, delta: float, accountant: str) -> float:
        """Epsilon at ``delta`` of one such release under ``accountant`` (one of ``accountants``)."""

    def sigma_equation(self, l2: float, epsilon: float, delta: float,
                       accountant: str) -> tuple[Callable[[float], float], float] | None:
        """An equation ``(f, target)``, ``f(sigma)`` decreasing, that calibration solves; ``None``: match `epsilon`."""
        return None

    @abstractmethod
    def vote_profile(self, epsilons: np.ndarray, sigma: float, k: int) -> np.ndarray:
        """The ``(E,)`` privacy profile ``delta(eps')`` of the audit's statistic for ``k`` votes."""

    def vote_rdp(self, orders: np.ndarray, k: int, sigma: float, neighbouring: str) -> np.ndarray:
        """The ``(m,)`` RDP curve of one top-k vote release (`vote_sensitivity`) with noise of total std ``sigma``."""
        return self.rdp(orders, *vote_sensitivity(k, neighbouring), check_sigma(sigma))

    def stated_rdp(self, orders: np.ndarray, *, k: int, sigma: float, epsilon: float, stated: str,
                   neighbouring: str) -> np.ndarray:
        """`vote_rdp` from the mechanism (``k``, ``sigma``); the stated epsilon and relation are not needed."""
        return self.vote_rdp(orders, k, sigma, neighbouring)


# ----------------------------------------------------------------------------------------------- registry
_KINDS: Registry[NoiseKind] = Registry("noise", "noise kind")
_Kind = TypeVar("_Kind", bound=type[NoiseKind])


def register_noise_kind(kind: _Kind) -> _Kind:
    """Class decorator registering one instance of ``kind``; a taken name or an unknown accountant is refused."""
    if issubclass(kind, ShareNoiseKind) and (not kind.accountants or not set(kind.accountants) <= set(ACCOUNTANTS)):
        raise ValueError(f"noise kind {kind.name!r}: accountants must be a non-empty subset of "
                         f"{', '.join(ACCOUNTANTS)}, got {kind.accountants!r}")
    _KINDS.add(kind.name, kind())
    return kind


def _is_share_kind(kind: NoiseKind) -> bool:
    return isinstance(kind, ShareNoiseKind)


def noise_kind_names(integer: bool | None = None, *, shares: bool = True) -> tuple[str, ...]:
    """The share kinds' names (every kind's: ``shares=False``) in registration order; by ``integer``: its ones only."""
    return tuple(kind.name for kind in _KINDS
                 if (not shares or _is_share_kind(kind)) and (integer is None or kind.integer == integer))


def noise_kind(name: Any) -> ShareNoiseKind:
    """The share kind named ``name``; any other name is refused (ValueError listing the share kinds)."""
    return cast(ShareNoiseKind, _KINDS.get(name, keep=_is_share_kind))


def any_noise_kind(name: Any) -> NoiseKind:
    """The registered kind named ``name``, a share kind or the winner release's; an unknown name is refused."""
    return _KINDS.get(name)


def check_noise(noise: Any) -> str:
    """Check the noise kind's name and return it as str."""
    return noise_kind(noise).name


def resolve_accountant(accountant: str | None, noise: str) -> str:
    """Validate ``accountant`` for ``noise``; ``None`` or ``"auto"`` picks the kind's default.

    Args:
        accountant: One of `dphype.checks.ACCOUNTANTS`, ``"auto"`` or ``None``.
        noise: The noise kind's name.

    Returns:
        One of the kind's ``accountants``.

    Raises:
        ValueError: ``noise`` or ``accountant`` is unknown, or the accountant is not valid for the kind (the analytic
            Gaussian accountant is exact only for Gaussian noise).
    """
    kind = noise_kind(noise)
    if accountant is None or accountant == "auto":
        return kind.default_accountant
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {', '.join(ACCOUNTANTS)} (or auto), got {accountant!r}")
    if accountant not in kind.accountants:
        allowed = repr(kind.accountants[0]) if len(kind.accountants) == 1 else f"one of {', '.join(kind.accountants)}"
        raise ValueError(f"accountant must be {allowed} for {kind.name} noise, got {accountant!r}")
    return str(accountant)


# ---------------------------------------------------------------------------------------------------------- Gaussian
def gaussian_rdp(alpha: float, l2: float, sigma: float) -> float:
    """Gaussian RDP at ``alpha``: ``alpha L2^2 / (2 sigma^2)`` (Mironov 2017, Prop. 7; Thm III.1: ``L2 = sqrt(2k)``)."""
    return alpha * l2**2 / (2.0 * sigma**2)


def gaussian_rdp_epsilon(l2: float, sigma: float, delta: float) -> float:
    """Smallest epsilon at ``delta`` from the Gaussian RDP curve and Thm I.1 over continuous ``alpha > 1``."""
    slope = gaussian_rdp(1.0, l2, sigma)
    alpha = optimal_order(slope, delta)
    return max(0.0, rdp_to_dp(slope * alpha, alpha, delta))


def _log_analytic_delta(eps: float, l2: float, sigma: float) -> float:
    """Log of the analytic-Gaussian delta, computed in log space (no cancellation for tiny deltas)."""
    # lazy import: scipy
    from scipy.special import log_ndtr

    a = l2 / (2.0 * sigma) - eps * sigma / l2
    b = -l2 / (2.0 * sigma) - eps * sigma / l2
    la, lb = float(log_ndtr(a)), float(log_ndtr(b))
    gap = eps + lb - la  # < 0 whenever delta > 0
    if gap >= 0.0:
        return -math.inf
    return la + math.log(-math.expm1(gap))


def analytic_gaussian_delta(eps: float, l2: float, sigma: float) -> float:
    """The smallest delta for which ``N(f(D), sigma^2 I)`` is (eps, delta)-DP (Balle & Wang 2018, Thm 8).

    ``Phi(L2/(2 sigma) - eps sigma/L2) - e^eps Phi(-L2/(2 sigma) - eps sigma/L2)``, computed in log space.

    Args:
        eps: The epsilon, ``>= 0``.
        l2: The L2 sensitivity.
        sigma: The noise standard deviation.

    Returns:
        The delta.
    """
    return math.exp(_log_analytic_delta(eps, l2, sigma))


def analytic_gaussian_epsilon(l2: float, sigma: float, delta: float) -> float:
    """Smallest epsilon with ``analytic_gaussian_delta(epsilon) <= delta`` (brentq); ``0`` if met at 0."""
    # lazy import: scipy
    from scipy.optimize import brentq

    log_delta = math.log(delta)
    if _log_analytic_delta(0.0, l2, sigma) <= log_delta:
        return 0.0
    f = lambda e: _log_analytic_delta(e, l2, sigma)  # noqa: E731  (decreasing in e)
    hi = 1.0
    while f(hi) > log_delta:
        hi *= 2.0
    return brentq(lambda e: f(e) - log_delta, 0.0, hi, xtol=1e-14, rtol=1e-14)


@register_noise_kind
class Gaussian(ShareNoiseKind):
    """``N(0, v)`` as float64; the paper's noise.

    Its shares are real, so each client rounds ``votes + share`` to the grid ``1 / fixed_point_scale`` before the
    secure sum: the release is the Gaussian mechanism plus a rounding error, its guarantee approximate. Accountants:
    the analytic Gaussian mechanism (the default, exact for one release), then RDP.
    """

    name = "gaussian"
    label = "Gaussian"
    description = "the paper's, real shares rounded to a fixed-point grid under SecAgg+"
    integer = False
    fixed_point_scale = 2**10
    accountants = ("analytic", "rdp")

    def draw(self, size: int | tuple[int, ...], variance: float, rng: np.random.Generator) -> np.ndarray:
        """``N(0, variance)`` entries as float64."""
        return rng.normal(0.0, math.sqrt(variance), size=size).astype(np.float64, copy=False)

    def tail(self, threshold: float, variance: float) -> float:
        """Exact: ``2 Phi(-threshold / std)``."""
        # lazy import: scipy
        from scipy.stats import norm  # local import of scipy.stats: seconds, needed only here

        return float(2.0 * norm.sf(threshold / math.sqrt(variance)))

    def rdp(self, orders: np.ndarray, l2: float, l1: float, sigma: float) -> np.ndarray:
        """dp_accounting's ``GaussianDpEvent`` with noise multiplier ``sigma / L2`` (Thm III.1); ``l1`` unused."""
        # lazy import: dp_accounting
        import dp_accounting  # local import: ~1 s, needed only for composition

        accountant = dp_accounting.rdp.RdpAccountant(orders=list(orders))
        return accountant.compose(dp_accounting.GaussianDpEvent(sigma / l2)).rdp

    def epsilon(self, l2: float, l1: float, sigma: float, delta: float, accountant: str) -> float:
        """`analytic_gaussian_epsilon`, or `gaussian_rdp_epsilon` for ``"rdp"``."""
        if accountant == "analytic":
            return analytic_gaussian_epsilon(l2, sigma, delta)
        return gaussian_rdp_epsilon(l2, sigma, delta)

    def sigma_equation(self, l2: float, epsilon: float, delta: float,
                       accountant: str) -> tuple[Callable[[float], float], float] | None:
        """Analytic: ``log`` `analytic_gaussian_delta` at ``epsilon`` matched to ``log delta``; ``None`` for RDP."""
        if accountant != "analytic":
            return None
        return (lambda s: _log_analytic_delta(epsilon, l2, s)), math.log(delta)

    def vote_profile(self, epsilons: np.ndarray, sigma: float, k: int) -> np.ndarray:
        """``N(0, sigma^2)`` against ``N(L2, sigma^2)``: the analytic Gaussian delta (Balle & Wang 2018, Thm 8)."""
        l2 = vote_sensitivity(k)[0]
        return np.array([analytic_gaussian_delta(float(e), l2, sigma) for e in epsilons])


# ----------------------------------------------------------------------------------------------------------- Skellam
def skellam_rdp(alpha: float | np.ndarray, l2: float, l1: float, variance: float) -> Any:
    """Renyi DP bound of the symmetric Skellam mechanism with total variance ``lambda`` at integer ``alpha > 1``.

    Agarwal, Kairouz & Liu (NeurIPS 2021), as in their accounting code:
    ``alpha L2^2/(2 lambda) + min(((2 alpha - 1) L2^2 + 6 L1) / (4 lambda^2), 3 L1 / (2 lambda))``.

    Args:
        alpha: The Renyi order, or an array of orders (integers ``> 1``).
        l2: The L2 sensitivity.
        l1: The L1 sensitivity.
        variance: The noise's total variance ``lambda``.

    Returns:
        The RDP epsilon, of the shape of ``alpha``.
    """
    return alpha * l2**2 / (2.0 * variance) + np.minimum(
        ((2.0 * alpha - 1.0) * l2**2 + 6.0 * l1) / (4.0 * variance**2), 3.0 * l1 / (2.0 * variance)
    )


def skellam_rdp_epsilon(l2: float, l1: float, variance: float, delta: float) -> tuple[float, int]:
    """Smallest epsilon (and its order) from `skellam_rdp` and Thm I.1 over integer ``alpha >= 2``.

    Exact without a scan: ``skellam_rdp`` is linear in alpha with slope ``L2^2/(2 lambda) + L2^2/(2 lambda^2)`` up
    to the switch point where the ``min`` takes its constant branch, and slope ``L2^2/(2 lambda)`` after it. On each
    piece Thm I.1's epsilon is unimodal (`optimal_order`), so the integer minimiser is the floor or ceil of the
    continuous one clipped to the piece, or a piece end; the best of these few orders wins.

    Args:
        l2: The L2 sensitivity.
        l1: The L1 sensitivity.
        variance: The noise's total variance ``lambda``.
        delta: The target delta, in ``(0, 1)``.

    Returns:
        ``(epsilon, alpha)``: the epsilon at ``delta`` (``>= 0``) and the integer order attaining it.
    """
    lam = variance
    base = l2**2 / (2.0 * lam)
    extra = base / lam  # l2^2 / (2 lam^2), without squaring lam (which may overflow)
    # (3 l1 / (2 lam) - (6 l1 - l2^2) / (4 lam^2)) / extra, multiplied out so that a huge lam neither overflows nor
    # divides by an extra that underflowed to 0
    switch = (3.0 * l1 * lam - (6.0 * l1 - l2**2) / 2.0) / l2**2
    orders: set[int] = set()
    if switch >= 2.0:  # piece 1: integers in [2, floor(switch)], linear branch of the min
        orders |= _integer_minimiser_candidates(base + extra, 2, math.floor(switch), delta)
    orders |= _integer_minimiser_candidates(base, max(2, math.ceil(switch)), math.inf, delta)
    best = min((rdp_to_dp(float(skellam_rdp(a, l2, l1, lam)), a, delta), a) for a in sorted(orders))
    return max(0.0, best[0]), int(best[1])


@register_noise_kind
class Skellam(ShareNoiseKind):
    """The symmetric Skellam ``Pois(v/2) - Pois(v/2)`` as int64 (Poisson laws add; Agarwal, Kairouz & Liu 2021).

    Integer shares, so secure summation (and the tallies' MPC) is exact and the release is exactly the Skellam
    mechanism. Accountant: RDP only (`skellam_rdp`).
    """

    name = "skellam"
    label = "Skellam"
    description = "integer, exact under SecAgg+"
    integer = True
    fixed_point_scale = 1
    accountants = ("rdp",)

    def draw(self, size: int | tuple[int, ...], variance: float, rng: np.random.Generator) -> np.ndarray:
        """``Pois(variance / 2) - Pois(variance / 2)`` entries as int64."""
        mu = variance / 2.0
        return (rng.poisson(mu, size=size) - rng.poisson(mu, size=size)).astype(np.int64, copy=False)

    def tail(self, threshold: float, variance: float) -> float:
        """Chernoff bound with log-MGF ``2 mu (cosh l - 1)``, ``variance = 2 mu``, at ``l = asinh(m / (2 mu))``.

        Applied to the integer ``m = floor(threshold) + 1`` (``X > threshold`` iff ``X >= m``).

        Args:
            threshold: The bound on ``|X|``.
            variance: The draw's variance.

        Returns:
            The probability bound.
        """
        mu = variance / 2.0
        m = math.floor(threshold) + 1.0
        lam = math.asinh(m / (2.0 * mu))
        log_bound = -(lam * m - (math.hypot(m, 2.0 * mu) - 2.0 * mu))  # 2 mu (cosh lam - 1), overflow-free
        return min(1.0, 2.0 * math.exp(log_bound))

    def rdp(self, orders: np.ndarray, l2: float, l1: float, sigma: float) -> np.ndarray:
        """`skellam_rdp` at variance ``sigma^2`` and order ``ceil(alpha)``.

        The bound holds at integer orders; at ``ceil(alpha)`` it bounds the order ``alpha`` because Renyi divergence
        does not decrease with the order (van Erven & Harremoes 2014, Thm 3).

        Args:
            orders: The RDP orders.
            l2: The L2 sensitivity.
            l1: The L1 sensitivity.
            sigma: The noise's total standard deviation.

        Returns:
            The RDP curve.
        """
        return np.asarray(skellam_rdp(np.maximum(np.ceil(orders), 2.0), l2, l1, sigma**2), dtype=np.float64)

    def epsilon(self, l2: float, l1: float, sigma: float, delta: float, accountant: str) -> float:
        """`skellam_rdp_epsilon` at variance ``sigma^2``."""
        return skellam_rdp_epsilon(l2, l1, sigma**2, delta)[0]

    def vote_profile(self, epsilons: np.ndarray, sigma: float, k: int) -> np.ndarray:
        """The audit statistic's profile, summed exactly over its integer support.

        ``<noise, w>`` is a sum of ``2k`` independent symmetric Skellams, ``Skellam(k sigma^2, k sigma^2)``, shifted by
        ``<w, w> = 2k`` under ``D``; ``sum_x max(0, P_D(x) - e^eps' P_D'(x))`` is summed within 40 std of both means,
        plus the mass outside (an upper bound on the terms left out). Both laws are symmetric, so the divergence is the
        same in both directions.

        Args:
            epsilons: ``(E,)`` epsilons.
            sigma: The released noise's total std.
            k: Votes per client.

        Returns:
            The ``(E,)`` deltas.
        """
        # lazy import: scipy
        from scipy.stats import skellam  # local import of scipy.stats: seconds, needed only by the audit

        mu, shift = k * sigma**2, 2 * k
        half = math.ceil(40.0 * math.sqrt(2.0 * mu))
        x = np.arange(-half, half + shift + 1)
        p_d_prime, p_d = skellam.pmf(x, mu, mu), skellam.pmf(x - shift, mu, mu)
        outside = 2.0 * float(skellam.sf(half, mu, mu))
        excess = p_d[None, :] - np.exp(epsilons)[:, None] * p_d_prime[None, :]
        return np.asarray(np.maximum(excess, 0.0).sum(axis=1) + outside, dtype=np.float64)
