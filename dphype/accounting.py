"""Privacy accounting for DP-Hype: describe a release, then account for it.

A :class:`VoteRelease` says what the server sees: the sum of all clients' vote vectors plus noise whose
TOTAL standard deviation on every coordinate is ``sigma`` (Skellam: ``sigma**2`` is the total variance).
An accountant turns it into ``(epsilon, delta)``:

* ``"analytic"`` -- the analytic Gaussian mechanism (Balle & Wang, ICML 2018, Thm 8): exact for one
  Gaussian release. Default for Gaussian noise.
* ``"rdp"`` -- Renyi DP (Mironov 2017). Gaussian: ``alpha * L2^2 / (2 sigma^2)`` (Definition I.3; for
  top-k votes ``alpha k / sigma^2``, DP-Hype Thm III.1). Skellam: the bound of Agarwal, Kairouz & Liu
  (NeurIPS 2021) over integer orders. Both converted with DP-Hype Thm I.1 and minimised over ``alpha``.

Sensitivities (replace-one client, DP-Hype Lemma III.1 and Appendix F): top-k votes ``L2 = sqrt(2k)``,
``L1 = 2k``; raw scores in ``[0, 1]^p``: ``L2 = sqrt(p)``, ``L1 = p``.

Everything is solved by root finding (``scipy.optimize.brentq``); nothing is looked up in a table.
The ``check_*`` validators are shared with the Flower code.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Callable

from scipy.optimize import brentq
from scipy.special import log_ndtr

ACCOUNTANTS: tuple[str, ...] = ("analytic", "rdp")
NOISE_KINDS: tuple[str, ...] = ("gaussian", "skellam")
DEFAULT_ACCOUNTANT: dict[str, str] = {"gaussian": "analytic", "skellam": "rdp"}


# --------------------------------------------------------------------------------------------- validators
def check_positive(name: str, value: Any) -> float:
    """Return ``value`` as float; it must be a finite real number (not a bool) ``> 0``, else
    ``ValueError`` naming ``name`` and the allowed range."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_epsilon(epsilon: Any) -> float:
    """Return ``epsilon`` as float; it must be a finite number > 0."""
    return check_positive("epsilon", epsilon)


def check_delta(delta: Any) -> float:
    """Return ``delta`` as float; it must lie in the open interval (0, 1)."""
    if isinstance(delta, bool) or not isinstance(delta, Real) or not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
    return float(delta)


def check_int(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` as int; it must be an integer (not a bool) ``>= minimum``, else ``ValueError``
    naming ``name`` and the allowed range."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_num_candidates(num_candidates: Any) -> int:
    """Return the number of candidates ``p`` as int; it must be an integer >= 1."""
    return check_int("num_candidates", num_candidates, 1)


def check_k(k: Any, num_candidates: int | None = None) -> int:
    """Return the number of votes ``k`` as int; it must be an integer in ``[1, num_candidates]``."""
    upper = "num_candidates" if num_candidates is None else str(num_candidates)
    if (
        isinstance(k, bool)
        or not isinstance(k, Integral)
        or k < 1
        or (num_candidates is not None and k > num_candidates)
    ):
        raise ValueError(f"k must be an integer in [1, {upper}], got {k!r}")
    return int(k)


def check_dropout(dropout: Any) -> float:
    """Return the tolerated dropout fraction ``xi`` as float; it must lie in ``[0, 1)`` (Appendix A)."""
    if isinstance(dropout, bool) or not isinstance(dropout, Real) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be a number in [0, 1), got {dropout!r}")
    return float(dropout)


def check_clients(clients: Any) -> int:
    """Return the number of clients ``n`` as int; it must be an integer >= 2 (secure summation needs 2)."""
    return check_int("clients", clients, 2)


def check_sigma(sigma: Any) -> float:
    """Return the total noise std ``sigma`` as float; it must be a finite number > 0."""
    return check_positive("sigma", sigma)


def check_noise(noise: Any) -> str:
    """Return the noise kind; it must be one of :data:`NOISE_KINDS`."""
    if noise not in NOISE_KINDS:
        raise ValueError(f"noise must be one of {', '.join(NOISE_KINDS)}, got {noise!r}")
    return str(noise)


def resolve_accountant(accountant: str | None, noise: str) -> str:
    """Validate ``accountant`` for ``noise``; ``None`` or ``"auto"`` picks the default (analytic for Gaussian,
    rdp for Skellam).

    The analytic Gaussian accountant is exact only for Gaussian noise, so it is refused for Skellam noise.
    """
    noise = check_noise(noise)
    if accountant is None or accountant == "auto":
        return DEFAULT_ACCOUNTANT[noise]
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {', '.join(ACCOUNTANTS)} (or auto), got {accountant!r}")
    if noise == "skellam" and accountant != "rdp":
        raise ValueError(f"accountant must be 'rdp' for skellam noise, got {accountant!r}")
    return str(accountant)


def check_budget(
    epsilon: Any,
    delta: Any,
    k: Any,
    *,
    num_candidates: Any = None,
    clients: Any = None,
    dropout: Any = None,
) -> None:
    """Validate a full DP-Hype configuration at once (each argument only when given)."""
    check_epsilon(epsilon)
    check_delta(delta)
    p = None if num_candidates is None else check_num_candidates(num_candidates)
    check_k(k, p)
    if clients is not None:
        check_clients(clients)
    if dropout is not None:
        check_dropout(dropout)


# ------------------------------------------------------------------------------------------ pure RDP math
def gaussian_rdp(alpha: float, l2: float, sigma: float) -> float:
    """Renyi DP of the Gaussian mechanism at order ``alpha``: ``alpha L2^2 / (2 sigma^2)``.

    Mironov 2017, Prop. 7; DP-Hype Definition I.3. With ``L2 = sqrt(2k)`` this is Thm III.1's ``alpha k / sigma^2``.
    """
    return alpha * l2**2 / (2.0 * sigma**2)


def skellam_rdp(alpha: float, l2: float, l1: float, variance: float) -> float:
    """Renyi DP bound of the (symmetric) Skellam mechanism with total variance ``lambda`` at integer ``alpha``.

    Agarwal, Kairouz & Liu, "The Skellam Mechanism for Differentially Private Federated Learning"
    (NeurIPS 2021), as used in their accounting code (see dp-facts.md):
    ``alpha L2^2/(2 lambda) + min(((2 alpha - 1) L2^2 + 6 L1) / (4 lambda^2), 3 L1 / (2 lambda))``.
    Valid for integer ``alpha > 1`` only.
    """
    return alpha * l2**2 / (2.0 * variance) + min(
        ((2.0 * alpha - 1.0) * l2**2 + 6.0 * l1) / (4.0 * variance**2), 3.0 * l1 / (2.0 * variance)
    )


def rdp_to_dp(rdp_eps: float, alpha: float, delta: float) -> float:
    """DP-Hype Thm I.1 (Balle et al. 2020; Canonne, Kamath & Steinke 2020): ``(alpha, rdp_eps)``-RDP implies
    ``(rdp_eps + log((alpha-1)/alpha) - (log delta + log alpha)/(alpha - 1), delta)``-DP for ``alpha > 1``.
    """
    if not alpha > 1:
        raise ValueError(f"alpha must be > 1, got {alpha!r}")
    return rdp_eps + math.log1p(-1.0 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1.0)


def optimal_order(rdp_slope: float, delta: float) -> float:
    """The order ``alpha > 1`` minimising Thm I.1's epsilon for an RDP curve linear in alpha (``rdp_slope * alpha``).

    The derivative of ``s alpha + log(1 - 1/alpha) - (log delta + log alpha)/(alpha - 1)`` is
    ``s + (log delta + log alpha)/(alpha - 1)^2``; it has exactly one root, where
    ``s (alpha - 1)^2 + log delta + log alpha = 0`` (the left side increases in alpha). Solved by brentq on
    ``(1, 1 + sqrt(log(1/delta)/s)]``, where the left side goes from ``log delta < 0`` to ``log alpha > 0``.
    """
    log_delta = math.log(delta)
    upper = 1.0 + math.sqrt(-log_delta / rdp_slope)
    return brentq(
        lambda a: rdp_slope * (a - 1.0) ** 2 + log_delta + math.log(a), 1.0, upper, xtol=1e-14, rtol=1e-15
    )


def gaussian_rdp_epsilon(l2: float, sigma: float, delta: float) -> float:
    """Smallest epsilon from the Gaussian RDP curve and Thm I.1, minimised over continuous ``alpha > 1``."""
    slope = gaussian_rdp(1.0, l2, sigma)
    alpha = optimal_order(slope, delta)
    return max(0.0, rdp_to_dp(slope * alpha, alpha, delta))


def _integer_minimiser_candidates(slope: float, lo: int, hi: float, delta: float) -> set[int]:
    """Integer orders in ``[lo, hi]`` containing the minimiser of Thm I.1's epsilon for ``slope * alpha``.

    That epsilon is unimodal in alpha (:func:`optimal_order`), so on an integer interval it is minimal at
    the floor or ceil of the continuous minimiser, clipped to the interval.
    """
    a = optimal_order(slope, delta)
    return {int(min(max(c, lo), hi)) for c in (math.floor(a), math.ceil(a))}


def skellam_rdp_epsilon(l2: float, l1: float, variance: float, delta: float) -> tuple[float, int]:
    """Smallest epsilon (and its order) from :func:`skellam_rdp` and Thm I.1 over integer ``alpha >= 2``.

    Exact integer minimisation without a scan: ``skellam_rdp`` is linear in alpha with slope
    ``L2^2/(2 lambda) + L2^2/(2 lambda^2)`` up to the switch point ``alpha_s`` where the ``min`` picks its
    constant branch, and has slope ``L2^2/(2 lambda)`` after it. On each piece Thm I.1's epsilon is unimodal
    (:func:`optimal_order`), so its integer minimiser on the piece is the floor or ceil of the continuous
    minimiser clipped to the piece, or a piece end; the global minimum is the best of these few orders.
    """
    lam = variance
    base = l2**2 / (2.0 * lam)
    extra = l2**2 / (2.0 * lam**2)
    switch = (3.0 * l1 / (2.0 * lam) - (6.0 * l1 - l2**2) / (4.0 * lam**2)) / extra
    orders: set[int] = set()
    if switch >= 2.0:  # piece 1: integers in [2, floor(switch)], linear branch of the min
        orders |= _integer_minimiser_candidates(base + extra, 2, math.floor(switch), delta)
    orders |= _integer_minimiser_candidates(base, max(2, math.ceil(switch)), math.inf, delta)
    best = min((rdp_to_dp(skellam_rdp(a, l2, l1, lam), a, delta), a) for a in sorted(orders))
    return max(0.0, best[0]), int(best[1])


# ----------------------------------------------------------------------------------- analytic Gaussian
def _log_analytic_delta(eps: float, l2: float, sigma: float) -> float:
    """log of the analytic-Gaussian delta, computed in log space (no cancellation for tiny deltas)."""
    a = l2 / (2.0 * sigma) - eps * sigma / l2
    b = -l2 / (2.0 * sigma) - eps * sigma / l2
    la, lb = float(log_ndtr(a)), float(log_ndtr(b))
    gap = eps + lb - la  # < 0 whenever delta > 0
    if gap >= 0.0:
        return -math.inf
    return la + math.log(-math.expm1(gap))


def analytic_gaussian_delta(eps: float, l2: float, sigma: float) -> float:
    """Balle & Wang 2018, Thm 8: the smallest delta for which ``N(f(D), sigma^2 I)`` is (eps, delta)-DP,
    ``Phi(L2/(2 sigma) - eps sigma/L2) - e^eps Phi(-L2/(2 sigma) - eps sigma/L2)``.
    """
    return math.exp(_log_analytic_delta(eps, l2, sigma))


def _root_decreasing(fn: Callable[[float], float], target: float, start: float, name: str) -> float:
    """Solve ``fn(x) = target`` for ``x > 0`` when ``fn`` decreases in ``x``: bracket by doubling, then brentq
    on ``log x``."""
    lo = hi = math.log(start)
    for _ in range(400):
        if fn(math.exp(hi)) < target:
            break
        hi += math.log(2.0)
    else:
        raise ValueError(f"could not bracket {name}")
    for _ in range(400):
        if fn(math.exp(lo)) > target:
            break
        lo -= math.log(2.0)
    else:
        raise ValueError(f"could not bracket {name}")
    return math.exp(brentq(lambda t: fn(math.exp(t)) - target, lo, hi, xtol=1e-13, rtol=1e-14))


def analytic_gaussian_epsilon(l2: float, sigma: float, delta: float) -> float:
    """Smallest epsilon with ``analytic_gaussian_delta(epsilon) <= delta`` (brentq; 0 if already at eps = 0)."""
    log_delta = math.log(delta)
    if _log_analytic_delta(0.0, l2, sigma) <= log_delta:
        return 0.0
    f = lambda e: _log_analytic_delta(e, l2, sigma)  # noqa: E731  (decreasing in e)
    hi = 1.0
    while f(hi) > log_delta:
        hi *= 2.0
    return brentq(lambda e: f(e) - log_delta, 0.0, hi, xtol=1e-14, rtol=1e-14)


# ------------------------------------------------------------------------------------------ the release
@dataclass(frozen=True)
class VoteRelease:
    """What the server learns: the vote sum plus noise of TOTAL std ``sigma`` per coordinate.

    ``k`` votes per client over ``num_candidates`` candidates (``None``: unknown; top-k privacy does not
    depend on it, Section III). ``raw_scores=True`` is Appendix F's variant (scores in ``[0, 1]^p``,
    Gaussian noise only, ``num_candidates`` required; ``k`` then does not enter the sensitivity).
    """

    k: int
    num_candidates: int | None
    sigma: float
    noise: str = "gaussian"
    raw_scores: bool = False

    def __post_init__(self) -> None:
        p = None if self.num_candidates is None else check_num_candidates(self.num_candidates)
        check_k(self.k, p)
        check_sigma(self.sigma)
        check_noise(self.noise)
        if self.raw_scores:
            if p is None:
                raise ValueError("num_candidates must be given (an integer >= 1) for raw_scores releases")
            if self.noise != "gaussian":
                raise ValueError(
                    f"noise must be 'gaussian' for raw_scores releases (real-valued scores), got {self.noise!r}"
                )

    @property
    def l2_sensitivity(self) -> float:
        """Replace-one L2 sensitivity: ``sqrt(2k)`` (Lemma III.1) or ``sqrt(p)`` for raw scores (App. F)."""
        return math.sqrt(self.num_candidates if self.raw_scores else 2 * self.k)

    @property
    def l1_sensitivity(self) -> float:
        """Replace-one L1 sensitivity: ``2k`` for top-k votes, ``p`` for raw scores in ``[0, 1]``."""
        return float(self.num_candidates if self.raw_scores else 2 * self.k)


def _release_epsilon(release: VoteRelease, delta: float, accountant: str) -> float:
    l2 = release.l2_sensitivity
    if release.noise == "skellam":
        return skellam_rdp_epsilon(l2, release.l1_sensitivity, release.sigma**2, delta)[0]
    if accountant == "analytic":
        return analytic_gaussian_epsilon(l2, release.sigma, delta)
    return gaussian_rdp_epsilon(l2, release.sigma, delta)


def epsilon(release: VoteRelease, delta: float, accountant: str | None = None) -> float:
    """Epsilon of ``release`` at ``delta`` under ``accountant`` (``None``: the default for the noise kind)."""
    delta = check_delta(delta)
    return _release_epsilon(release, delta, resolve_accountant(accountant, release.noise))


def calibrate(
    epsilon: float,
    delta: float,
    k: int,
    *,
    num_candidates: int | None = None,
    accountant: str | None = None,
    noise: str = "gaussian",
    raw_scores: bool = False,
) -> VoteRelease:
    """Solve the smallest total noise std ``sigma`` giving ``(epsilon, delta)``-DP (Algorithm 1, line 1).

    Root finding with ``scipy.optimize.brentq`` on ``log sigma``: for ``"analytic"`` the analytic-Gaussian
    delta at ``epsilon`` is matched to ``delta``; for ``"rdp"`` the Thm I.1 epsilon is matched to
    ``epsilon``. Both decrease monotonically in sigma, so the root is unique.
    """
    target = check_epsilon(epsilon)
    delta = check_delta(delta)
    accountant = resolve_accountant(accountant, noise)
    probe = VoteRelease(k=k, num_candidates=num_candidates, sigma=1.0, noise=noise, raw_scores=raw_scores)
    l2 = probe.l2_sensitivity
    start = l2 * math.sqrt(2.0 * math.log(1.25 / delta)) / target  # classic Gaussian scale: a starting point
    if accountant == "analytic":
        sigma = _root_decreasing(
            lambda s: _log_analytic_delta(target, l2, s), math.log(delta), start, "sigma (analytic)"
        )
    else:
        sigma = _root_decreasing(
            lambda s: _release_epsilon(dataclasses.replace(probe, sigma=s), delta, accountant),
            target,
            start,
            "sigma (rdp)",
        )
    return dataclasses.replace(probe, sigma=sigma)


# ---------------------------------------------------------------------------------------- the report
@dataclass(frozen=True)
class PrivacyReport:
    """The privacy statement that accompanies one DP-Hype release."""

    epsilon: float
    delta: float
    accountant: str
    noise: str
    sigma: float
    client_std: float
    clients: int
    dropout: float
    k: int
    num_candidates: int | None
    survivors: int | None
    released: str = "noisy vote sum only (secure aggregation)"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict of all fields."""
        return dataclasses.asdict(self)


def privacy_report(
    release: VoteRelease,
    delta: float,
    *,
    clients: int,
    dropout: float,
    survivors: int | None = None,
    accountant: str | None = None,
) -> PrivacyReport:
    """Account for ``release`` as run by ``clients`` clients that tolerate a ``dropout`` fraction (App. A).

    With ``survivors=None`` the statement is the design guarantee (total std ``release.sigma``), valid
    whenever at least :func:`dphype.noise.min_survivors` clients contribute noise. With a known survivor
    count the total noise std is ``client_std * sqrt(survivors)`` and epsilon is recomputed for it, so too
    few survivors show up as an epsilon above the target rather than being hidden.
    """
    from dphype.noise import client_noise_std  # local import: noise.py imports the validators above

    delta = check_delta(delta)
    clients = check_clients(clients)
    dropout = check_dropout(dropout)
    accountant = resolve_accountant(accountant, release.noise)
    client_std = client_noise_std(release.sigma, clients, dropout)
    effective = release
    if survivors is not None:
        if isinstance(survivors, bool) or not isinstance(survivors, Integral) or not 1 <= survivors <= clients:
            raise ValueError(f"survivors must be an integer in [1, {clients}], got {survivors!r}")
        survivors = int(survivors)
        effective = dataclasses.replace(release, sigma=client_std * math.sqrt(survivors))
    return PrivacyReport(
        epsilon=_release_epsilon(effective, delta, accountant),
        delta=delta,
        accountant=accountant,
        noise=release.noise,
        sigma=effective.sigma,
        client_std=client_std,
        clients=clients,
        dropout=dropout,
        k=release.k,
        num_candidates=release.num_candidates,
        survivors=survivors,
    )


__all__ = [
    "ACCOUNTANTS",
    "NOISE_KINDS",
    "DEFAULT_ACCOUNTANT",
    "check_epsilon",
    "check_delta",
    "check_num_candidates",
    "check_k",
    "check_dropout",
    "check_clients",
    "check_sigma",
    "check_noise",
    "resolve_accountant",
    "check_budget",
    "gaussian_rdp",
    "skellam_rdp",
    "rdp_to_dp",
    "optimal_order",
    "gaussian_rdp_epsilon",
    "skellam_rdp_epsilon",
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "VoteRelease",
    "epsilon",
    "calibrate",
    "PrivacyReport",
    "privacy_report",
]
