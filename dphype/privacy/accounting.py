"""Privacy accounting for DP-Hype: describe a release, then account for it.

A `VoteEvent` says what the server sees: the sum of all clients' vote vectors plus noise whose TOTAL standard
deviation on every coordinate is ``sigma`` (Skellam: ``sigma**2`` is the total variance). An accountant turns it
into ``(epsilon, delta)``:

* ``"analytic"`` -- the analytic Gaussian mechanism (Balle & Wang, ICML 2018, Thm 8): exact for one Gaussian
  release. Default for Gaussian noise.
* ``"rdp"`` -- Renyi DP (Mironov 2017). Gaussian: ``alpha * L2^2 / (2 sigma^2)`` (Definition I.3; for top-k votes
  ``alpha k / sigma^2``, DP-Hype Thm III.1). Skellam: the bound of Agarwal, Kairouz & Liu (NeurIPS 2021) over
  integer orders. Both converted with DP-Hype Thm I.1 and minimised over ``alpha``.

Sensitivities depend on the neighbouring relation (`NEIGHBOURING`):

* ``"replace-one"`` (the paper's, default; Lemma III.1, Appendix F): neighbouring federations differ in one
  client's data. Top-k votes ``L2 = sqrt(2k)``, ``L1 = 2k``; raw scores in ``[0, 1]^p``: ``L2 = sqrt(p)``,
  ``L1 = p``.
* ``"add-remove"`` (DP-FedAvg's convention): one federation has a client the other lacks. Top-k votes
  ``L2 = sqrt(k)``, ``L1 = k``; raw scores ``L2 = sqrt(p)``, ``L1 = p``. Every contributing client adds its
  noise share whatever it votes, so the missing client is modelled as present with a zero vote (the "zero-out"
  form, Kairouz et al., ICML 2021): the noise is the same in both federations and the analysis with the shifted
  mean applies unchanged.

Several releases (a node's votes over its lifetime, a vote followed by DP-FedAvg training) compose in RDP:
`vote_rdp` and `fedavg_rdp` give each release's curve on the order grid `RDP_ORDERS`, curves add up (Mironov 2017,
Prop. 1), and `rdp_epsilon` converts the sum with Thm I.1. `calibrate_fedavg` solves DP-FedAvg's noise multiplier
for a training budget. Everything is solved by root finding, nothing looked up in a table.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dphype.checks import (
    ACCOUNTANTS,
    DEFAULT_NOISE,
    NEIGHBOURING,
    check_budget,
    check_clients,
    check_delta,
    check_dropout,
    check_epsilon,
    check_int,
    check_k,
    check_neighbouring,
    check_num_candidates,
    check_positive,
    check_sigma,
)
from dphype.privacy.noise import check_survivors, client_noise_std
from dphype.privacy.noise_kinds import (
    check_noise,
    noise_kind,
    noise_kind_names,
    rdp_to_dp,
    resolve_accountant,
    vote_sensitivity,
)


# ------------------------------------------------------------------------------------------ root finding
def _root_decreasing(fn: Callable[[float], float], target: float, start: float, name: str) -> float:
    """Solve ``fn(x) = target`` for ``x > 0``, ``fn`` decreasing: bracket by doubling, then brentq on ``log x``."""
    # lazy import: scipy
    from scipy.optimize import brentq

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


# ------------------------------------------------------------------------------------------ the release
@dataclass(frozen=True)
class VoteEvent:
    """The noisy vote sum as a DP event: the vote sum plus noise of TOTAL std ``sigma`` per coordinate.

    An event, as dp-accounting names what an accountant composes; the release mode is `dphype.release.SumRelease`.

    Attributes:
        k: Votes per client.
        num_candidates: The number of candidates ``p`` (``None``: unknown; top-k privacy does not depend on it).
        sigma: The noise's total standard deviation per coordinate (Skellam: ``sigma**2`` is its variance).
        noise: The noise kind's name (`dphype.privacy.noise_kinds`).
        raw_scores: Appendix F's variant: scores in ``[0, 1]^p``, real noise only, ``num_candidates`` required;
            ``k`` then does not enter the sensitivity.
        neighbouring: The neighbouring relation of the guarantee (`NEIGHBOURING`).

    Raises:
        ValueError: A field is out of its range, or a raw-scores release lacks ``num_candidates`` or has integer
            noise.
    """

    k: int
    num_candidates: int | None
    sigma: float
    noise: str = DEFAULT_NOISE
    raw_scores: bool = False
    neighbouring: str = "replace-one"

    def __post_init__(self) -> None:
        p = None if self.num_candidates is None else check_num_candidates(self.num_candidates)
        check_k(self.k, p)
        check_sigma(self.sigma)
        kind = noise_kind(self.noise)
        check_neighbouring(self.neighbouring)
        if self.raw_scores:
            if p is None:
                raise ValueError("num_candidates must be given (an integer >= 1) for raw_scores releases")
            if kind.integer:
                real = [repr(name) for name in noise_kind_names(integer=False)]
                allowed = real[0] if len(real) == 1 else f"one of {', '.join(real)}"
                raise ValueError(
                    f"noise must be {allowed} for raw_scores releases (real-valued scores), got {self.noise!r}"
                )

    @property
    def sensitivities(self) -> tuple[float, float]:
        """``(L2, L1)``: `vote_sensitivity`; raw scores ``(sqrt(p), p)`` (each score moves by at most 1, App. F)."""
        if self.raw_scores:
            assert self.num_candidates is not None
            return math.sqrt(self.num_candidates), float(self.num_candidates)
        return vote_sensitivity(self.k, self.neighbouring)

    @property
    def l2_sensitivity(self) -> float:
        """The L2 sensitivity (`sensitivities`)."""
        return self.sensitivities[0]

    @property
    def l1_sensitivity(self) -> float:
        """The L1 sensitivity (`sensitivities`)."""
        return self.sensitivities[1]


def mechanism_epsilon(l2: float, l1: float, sigma: float, noise: str, delta: float, accountant: str) -> float:
    """Epsilon at ``delta`` of ONE release of a sum of sensitivities ``(l2, l1)`` plus noise of total std ``sigma``."""
    return noise_kind(noise).epsilon(l2, l1, sigma, delta, accountant)


def _release_epsilon(release: VoteEvent, delta: float, accountant: str) -> float:
    return mechanism_epsilon(
        release.l2_sensitivity, release.l1_sensitivity, release.sigma, release.noise, delta, accountant
    )


def epsilon(release: VoteEvent, delta: float, accountant: str | None = None) -> float:
    """Epsilon of ``release`` at ``delta`` under ``accountant`` (``None``/``"auto"``: the noise kind's default)."""
    delta = check_delta(delta)
    return _release_epsilon(release, delta, resolve_accountant(accountant, release.noise))


def calibrate(
    epsilon: float,
    delta: float,
    k: int,
    *,
    num_candidates: int | None = None,
    accountant: str | None = None,
    noise: str = DEFAULT_NOISE,
    raw_scores: bool = False,
    neighbouring: str = "replace-one",
) -> VoteEvent:
    """Solve the smallest total noise std ``sigma`` giving ``(epsilon, delta)``-DP (Algorithm 1, line 1).

    Root finding on ``log sigma``: for ``"analytic"`` the analytic-Gaussian delta at ``epsilon`` is matched to
    ``delta``; for ``"rdp"`` the Thm I.1 epsilon to ``epsilon``. Both decrease in sigma, so the root is unique.

    Args:
        epsilon: The privacy budget, ``> 0``.
        delta: The target delta, in ``(0, 1)``.
        k: Votes per client, in ``[1, num_candidates]``.
        num_candidates: The number of candidates ``p``, or ``None`` (top-k privacy does not depend on it).
        accountant: ``"analytic"``, ``"rdp"``, or ``None``/``"auto"`` for the noise kind's default.
        noise: The noise kind's name.
        raw_scores: Appendix F's real-valued votes (`VoteEvent`).
        neighbouring: ``"replace-one"`` or ``"add-remove"``.

    Returns:
        The calibrated release: its ``sigma`` is the solved total noise std.

    Raises:
        ValueError: An argument is invalid, or the root cannot be bracketed.
    """  # noqa: DOC502
    probe = VoteEvent(k=k, num_candidates=num_candidates, sigma=1.0, noise=noise, raw_scores=raw_scores,
                        neighbouring=neighbouring)
    sigma = calibrate_sigma(probe.l2_sensitivity, probe.l1_sensitivity, epsilon, delta, noise=noise,
                            accountant=accountant)
    return dataclasses.replace(probe, sigma=sigma)


@functools.lru_cache(maxsize=256)
def calibrate_sigma(l2: float, l1: float, epsilon: float, delta: float, *, noise: str,
                    accountant: str | None = None) -> float:
    """The smallest total noise std making one release of a sum of sensitivities ``(l2, l1)`` ``(epsilon, delta)``-DP.

    `calibrate`'s root finding for any sum (`mechanism_epsilon` decreases in sigma, so the root is unique). A pure
    function of its arguments, remembered per process: every simulated node of a run checks the same request.

    Args:
        l2: The L2 sensitivity, ``> 0``.
        l1: The L1 sensitivity, ``> 0``.
        epsilon: The privacy budget, ``> 0``.
        delta: The target delta, in ``(0, 1)``.
        noise: The noise kind's name.
        accountant: ``"analytic"``, ``"rdp"``, or ``None``/``"auto"`` for the noise kind's default.

    Returns:
        The total noise std ``sigma``.

    Raises:
        ValueError: An argument is invalid, or floating point cannot solve the equation (choose a larger epsilon).
    """  # noqa: DOC502
    target = check_epsilon(epsilon)
    delta = check_delta(delta)
    accountant = resolve_accountant(accountant, noise)
    l2, l1 = check_positive("l2", l2), check_positive("l1", l1)
    start = l2 * math.sqrt(2.0 * math.log(1.25 / delta)) / target  # classic Gaussian scale: a starting point
    equation = noise_kind(noise).sigma_equation(l2, target, delta, accountant)
    if equation is None:
        equation = (lambda s: mechanism_epsilon(l2, l1, s, noise, delta, accountant)), target
    try:
        return _root_decreasing(*equation, start, f"sigma ({accountant})")
    except (ValueError, OverflowError, RuntimeError) as err:  # valid arguments: floating point gave out
        raise ValueError(f"the noise std for epsilon {target!r} at delta {delta!r} cannot be solved: choose a larger "
                         f"epsilon\nnot in floating point ({err})") from err


# ---------------------------------------------------------------------------------------- the report
@dataclass(frozen=True)
class PrivacyReport:
    """The privacy statement that accompanies one DP-Hype release.

    Attributes:
        epsilon: The guarantee's epsilon at ``delta``.
        delta: The guarantee's delta.
        accountant: The accountant.
        noise: The noise kind's name.
        sigma: The total noise std the epsilon is computed for (the survivors' when they are known).
        client_std: Each client's noise share std.
        clients: The number of clients ``n``.
        dropout: The tolerated dropout fraction ``xi``.
        k: Votes per client.
        num_candidates: The number of candidates ``p``, or ``None``.
        survivors: The number of clients whose noise the release carries, or ``None`` (the design guarantee).
        neighbouring: The neighbouring relation of the guarantee.
        l2_sensitivity: The L2 sensitivity it implies.
        released: What the server learns.
        release_delta: The release's own delta where far below the run's (the winner release: its MPC sampler's,
            `dphype.privacy.winner.sampler_delta`); ``delta`` is then the run's, at which it composes. ``None``: the
            release spends ``delta``.
        ballots_verified: Whether a tally committee checked every ballot's form under MPC (SecAgg+ sums whatever the
            clients send, unverified).
        excluded: The labels (never the content) of the contributors whose ballots the committee left out as invalid:
            each sent a share that opened, was signed by it (in a federation with a roster) and failed the checks.
        unattributed: The contributors the committee left out for a share that failed its signature, did not open,
            repeated or never arrived: the relay's doing or the sender's, which the committee cannot tell apart (a
            relay can exclude honest voters so, as it can drop them).
    """

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
    neighbouring: str
    l2_sensitivity: float
    released: str = "noisy vote sum only (secure aggregation)"
    release_delta: float | None = None
    ballots_verified: bool = False
    excluded: tuple[str, ...] = ()
    unattributed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("excluded", "unattributed"):  # a list from JSON
            object.__setattr__(self, name, tuple(str(label) for label in getattr(self, name)))

    def ballots(self) -> str:
        """Whether the ballots were verified, and who was left out and why, in words."""
        if not self.ballots_verified:
            return ("NOT verified (SecAgg+ sums whatever the clients send: a client running modified code can cast "
                    "any vector; a tally committee, release=argmax, verifies every ballot)")
        left_out = (f"{len(self.excluded)} invalid left out, from contributors {', '.join(self.excluded)}"
                    if self.excluded else "none invalid")
        if self.unattributed:
            left_out += (f"; {len(self.unattributed)} left out unattributed (a share failed its signature, did not "
                         "open, repeated or never arrived: in transit or by the sender): "
                         f"{', '.join(self.unattributed)}")
        return f"verified by the tally committee under MPC ({left_out})"

    def guarantee(self) -> str:
        """The guarantee per client as ``"(epsilon, delta)-DP"``, with the release's own delta where it has one."""
        epsilon = "inf" if math.isinf(self.epsilon) else f"{self.epsilon:.4g}"
        delta = self.delta if self.release_delta is None else self.release_delta
        return f"({epsilon}, {delta:.2g})-DP" if self.release_delta is not None else f"({epsilon}, {delta:g})-DP"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict of all fields."""
        return dataclasses.asdict(self)


def privacy_report(
    release: VoteEvent,
    delta: float,
    *,
    clients: int,
    dropout: float,
    survivors: int | None = None,
    accountant: str | None = None,
) -> PrivacyReport:
    """Account for ``release`` as run by ``clients`` clients that tolerate a ``dropout`` fraction (App. A).

    ``survivors=None``: the design guarantee (total std ``release.sigma``), valid whenever at least
    `dphype.privacy.noise.min_survivors` clients contribute noise. A known count gives total std
    ``client_std * sqrt(survivors)`` and epsilon recomputed for it: too few survivors show as a larger epsilon.

    Args:
        release: The (calibrated) release.
        delta: The target delta, in ``(0, 1)``.
        clients: The number of clients ``n``, in ``[2, MAX_CLIENTS]``.
        dropout: The tolerated dropout fraction ``xi``, in ``[0, 1)``.
        survivors: The number of clients that contributed noise, in ``[1, clients]``, or ``None``.
        accountant: ``"analytic"``, ``"rdp"``, or ``None``/``"auto"`` for the noise kind's default.

    Returns:
        The privacy statement.

    Raises:
        ValueError: An argument is out of its range.
    """  # noqa: DOC502
    delta = check_delta(delta)
    clients = check_clients(clients)
    dropout = check_dropout(dropout)
    accountant = resolve_accountant(accountant, release.noise)
    client_std = client_noise_std(release.sigma, clients, dropout)
    effective = release
    if survivors is not None:
        survivors = check_survivors(survivors, clients)
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
        neighbouring=release.neighbouring,
        l2_sensitivity=release.l2_sensitivity,
    )


# ------------------------------------------------------------------------------- composition in RDP
#: The common RDP order grid: 1.1 to 10.9 by 0.1, every integer 11 to 256 (Skellam's bound holds at integer
#: orders), then about 60 geometrically spaced integers up to 2**17 for very small epsilons.
RDP_ORDERS: np.ndarray = np.concatenate(
    [1.0 + np.arange(1, 100) / 10.0, np.arange(11.0, 257.0), np.unique(np.round(np.geomspace(272, 2**17, 60)))]
)


def _rdp_accountant(orders: Any) -> Any:
    """A fresh dp_accounting ``RdpAccountant`` on ``orders``."""
    # lazy import: dp_accounting
    import dp_accounting  # local import: ~1 s, needed only for composition

    return dp_accounting.rdp.RdpAccountant(orders=list(check_orders(orders)))


def check_orders(orders: Any) -> np.ndarray:
    """RDP orders as a float64 ``(m,)`` array, refused unless non-empty, 1-d, finite and ``> 1``."""
    out = np.asarray(orders, dtype=np.float64)
    if out.ndim != 1 or out.size == 0 or not np.all(np.isfinite(out)) or np.any(out <= 1.0):
        raise ValueError("orders must be a non-empty 1-d array of finite RDP orders > 1")
    return out


def check_rdp_curve(rdp: Any, orders: Any = RDP_ORDERS, name: str = "rdp") -> np.ndarray:
    """An RDP curve as float64 ``(m,)``: one value in ``[0, inf]`` per order, refused naming ``name`` otherwise."""
    size = check_orders(orders).size
    curve = np.asarray(rdp, dtype=np.float64)
    if curve.shape != (size,) or np.any(np.isnan(curve)) or np.any(curve < 0):
        raise ValueError(f"{name} must be {size} values in [0, inf], one per RDP order")
    return curve


def vote_rdp(
    k: int, sigma: float, noise: str, *, neighbouring: str = "replace-one", orders: Any = RDP_ORDERS
) -> np.ndarray:
    """RDP curve ``(m,)`` at ``orders`` of one top-k vote release with noise of TOTAL std ``sigma`` (the kind's)."""
    return noise_kind(noise).vote_rdp(check_orders(orders), k, sigma, neighbouring)


def rdp_epsilon(rdp: Any, delta: float, orders: Any = RDP_ORDERS) -> tuple[float, float]:
    """The smallest Thm I.1 epsilon over ``orders`` of an RDP curve, and its order.

    Curves of several releases on the same orders are summed first (Mironov 2017, Prop. 1); an infinite curve value
    gives an infinite epsilon at that order.

    Args:
        rdp: The ``(m,)`` RDP curve.
        delta: The target delta, in ``(0, 1)``.
        orders: The RDP orders, shape ``(m,)``.

    Returns:
        ``(epsilon, order)``: the epsilon at ``delta`` (``>= 0``) and the order attaining it.

    Raises:
        ValueError: ``delta``, ``orders`` or the curve is invalid.
    """  # noqa: DOC502
    delta = check_delta(delta)
    orders, curve = check_orders(orders), check_rdp_curve(rdp, orders)
    eps = rdp_to_dp(curve, orders, delta)
    best = int(np.argmin(eps))
    return max(0.0, float(eps[best])), float(orders[best])


def rdp_delta(rdp: Any, epsilon: float, orders: Any = RDP_ORDERS) -> float:
    """Smallest delta (at most 1) over ``orders`` at which an RDP curve gives ``epsilon``.

    Thm I.1 solved for delta: ``log delta = (alpha - 1)(eps_alpha + log(1 - 1/alpha) - epsilon) - log alpha``.

    Args:
        rdp: The ``(m,)`` RDP curve.
        epsilon: The target epsilon, ``> 0``.
        orders: The RDP orders, shape ``(m,)``.

    Returns:
        The delta.

    Raises:
        ValueError: ``epsilon``, ``orders`` or the curve is invalid.
    """  # noqa: DOC502
    epsilon = check_epsilon(epsilon)
    orders, curve = check_orders(orders), check_rdp_curve(rdp, orders)
    log_delta = (orders - 1.0) * (curve + np.log1p(-1.0 / orders) - epsilon) - np.log(orders)
    return float(math.exp(min(0.0, float(np.min(log_delta)))))


def _fedavg_event(noise_multiplier: float, rounds: int, neighbouring: str) -> Any:
    """dp_accounting event of ``rounds`` DP-FedAvg rounds (effective multiplier, see `fedavg_rdp`)."""
    # lazy import: dp_accounting
    import dp_accounting

    effective = noise_multiplier / 2.0 if neighbouring == "replace-one" else noise_multiplier
    return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(effective), rounds)


def fedavg_rdp(
    noise_multiplier: float, rounds: int, *, neighbouring: str = "replace-one", orders: Any = RDP_ORDERS
) -> np.ndarray:
    """RDP curve at ``orders`` of ``rounds`` rounds of DP-FedAvg with fixed clipping, no subsampling.

    Flower's DP wrappers add Gaussian noise of std ``z C`` to the sum of updates clipped to norm ``C``: ``z`` is
    calibrated to the add/remove sensitivity ``C``. Replacing one client moves the sum by up to ``2C``, so under
    replace-one the effective multiplier is ``z / 2``.

    Args:
        noise_multiplier: Flower's noise multiplier ``z``, ``> 0``.
        rounds: The number of rounds, ``>= 1``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.
        orders: The RDP orders, shape ``(m,)``.

    Returns:
        The ``(m,)`` RDP curve.

    Raises:
        ValueError: An argument is invalid.
    """  # noqa: DOC502
    z = check_positive("noise_multiplier", noise_multiplier)
    rounds = check_int("rounds", rounds, 1)
    event = _fedavg_event(z, rounds, check_neighbouring(neighbouring))
    return _rdp_accountant(orders).compose(event).rdp


def fedavg_epsilon(
    noise_multiplier: float, rounds: int, delta: float, *, neighbouring: str = "replace-one"
) -> float:
    """Epsilon at ``delta`` of ``rounds`` DP-FedAvg rounds: `rdp_epsilon` of `fedavg_rdp`."""
    return rdp_epsilon(fedavg_rdp(noise_multiplier, rounds, neighbouring=neighbouring), delta)[0]


def calibrate_fedavg(epsilon: float, delta: float, rounds: int, *, neighbouring: str = "replace-one") -> float:
    """Smallest noise multiplier ``z`` (within 1e-6) for which ``rounds`` DP-FedAvg rounds are ``(epsilon, delta)``-DP.

    Accounted in RDP on `RDP_ORDERS` (`fedavg_epsilon`); pass ``z`` to Flower's fixed-clipping DP wrappers.
    dp_accounting's ``calibrate_dp_mechanism`` (it never returns a ``z`` over the budget) on a bracket found by
    doubling/halving ``sqrt(2 R log(1.25/delta)) / epsilon`` (times 2 under replace-one).

    Args:
        epsilon: The training budget, ``> 0``.
        delta: The target delta, in ``(0, 1)``.
        rounds: The number of rounds, ``>= 1``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.

    Returns:
        The noise multiplier ``z``.

    Raises:
        ValueError: An argument is invalid.
    """  # noqa: DOC502
    # lazy import: dp_accounting
    import dp_accounting

    target = check_epsilon(epsilon)
    delta = check_delta(delta)
    rounds = check_int("rounds", rounds, 1)
    neighbouring = check_neighbouring(neighbouring)

    def eps_of(z: float) -> float:
        return fedavg_epsilon(z, rounds, delta, neighbouring=neighbouring)

    scale = 2.0 if neighbouring == "replace-one" else 1.0
    lo = hi = scale * math.sqrt(2.0 * rounds * math.log(1.25 / delta)) / target
    while eps_of(hi) > target:
        hi *= 2.0
    while eps_of(lo) <= target:
        lo /= 2.0
    return float(
        dp_accounting.calibrate_dp_mechanism(
            lambda: _rdp_accountant(RDP_ORDERS),
            lambda z: _fedavg_event(z, rounds, neighbouring),
            target,
            delta,
            dp_accounting.ExplicitBracketInterval(lo, hi),
        )
    )

__all__ = [
    "ACCOUNTANTS",
    "check_epsilon",
    "check_delta",
    "check_num_candidates",
    "check_k",
    "check_dropout",
    "check_clients",
    "check_sigma",
    "check_noise",
    "NEIGHBOURING",
    "check_neighbouring",
    "vote_sensitivity",
    "resolve_accountant",
    "check_budget",
    "VoteEvent",
    "epsilon",
    "calibrate",
    "calibrate_sigma",
    "PrivacyReport",
    "privacy_report",
    "mechanism_epsilon",
    "RDP_ORDERS",
    "vote_rdp",
    "fedavg_rdp",
    "check_rdp_curve",
    "rdp_epsilon",
    "rdp_delta",
    "fedavg_epsilon",
    "calibrate_fedavg",
]
