"""Release only the winner: report-noisy-max over the vote counts with committee-made discrete Laplace noise.

In ``release="argmax"`` mode nobody sees the noisy vote vector; a committee of tallies checks every ballot, computes
the argmax under MPC (`dphype.secure.committee`) and opens only the index. This module is the mechanism and its
accounting, framework-free: the noise's law (`noise_parameter`, `discrete_laplace`; the noise kind `DiscreteLaplace`),
the committee's sampler (`JointSampler`), replays (`replay_winners`, `winner_probabilities`), the privacy statement
(`winner_report`) and the Renyi curve a composition adds (`winner_rdp`, `epsilon_with_samplers`).

The contract: ``argmax_i (c_i + Z_i)`` over the valid ballots' counts, ties to the lowest index, with ``Z_i`` iid
discrete Laplace of parameter ``t = exp(-epsilon / (shift * G))`` (``G`` the ballot's largest entry, ``shift``
`THRESHOLD_SHIFT`: 2 under replace-one, 1 under add-remove), is pure ``epsilon``-DP; the committee's sampler is
within total variation `SAMPLER_TV` of that noise per release, so the release is ``(epsilon,
sampler_delta(epsilon))``-DP. The mechanism, its proof sketch, the sampler's bound and the accounting:
docs/design/winner-release.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, localcontext
from typing import Any

import numpy as np

from dphype.checks import (
    check_clients,
    check_delta,
    check_dropout,
    check_epsilon,
    check_k,
    check_neighbouring,
    check_num_candidates,
)
from dphype.privacy.accounting import PrivacyReport, check_orders, rdp_epsilon
from dphype.privacy.noise import COMMITTEE_TALLIES, check_survivors, honest_tallies, min_valid_ballots
from dphype.privacy.noise_kinds import NoiseKind, register_noise_kind

#: How far the threshold of report-noisy-max can move between neighbours per unit of the ballot's l-infinity
#: sensitivity (proof: docs/design/winner-release.md).
THRESHOLD_SHIFT: dict[str, int] = {"replace-one": 2, "add-remove": 1}


@register_noise_kind
class DiscreteLaplace(NoiseKind):
    """The winner release's noise: discrete Laplace per count, drawn whole by the tallies inside the MPC.

    Not a share kind (two draws do not add up to one), so no configuration names it: the committee's `JointSampler`
    draws it within total variation `SAMPLER_TV` of the exact law (`discrete_laplace`, for replays); each release
    adds `sampler_delta`. A vote release it noised composes by `winner_rdp` of its pure epsilon.
    """

    name = "discrete-laplace"
    label = "discrete Laplace"
    description = "the winner release's, sampled jointly by the tallies inside the MPC"
    integer = True
    sampled = True

    def stated_rdp(self, orders: np.ndarray, *, k: int, sigma: float, epsilon: float, stated: str,
                   neighbouring: str) -> np.ndarray:
        """`winner_rdp` of ``epsilon`` stated under ``stated``, rescaled to ``neighbouring`` (`THRESHOLD_SHIFT`)."""
        return winner_rdp(epsilon * THRESHOLD_SHIFT[neighbouring] / THRESHOLD_SHIFT[stated], orders)


#: The noise kind of the winner release (what its `dphype.privacy.accounting.PrivacyReport` and ledger entries name).
WINNER_NOISE = DiscreteLaplace.name


def check_sensitivity(sensitivity: Any) -> int:
    """The ballot's l-infinity sensitivity ``G`` (a form's ``max_entry``), refused unless an integer ``>= 1``."""
    if isinstance(sensitivity, bool) or not isinstance(sensitivity, (int, np.integer)) or sensitivity < 1:
        raise ValueError(f"sensitivity must be an integer >= 1 (the ballot form's max_entry), got {sensitivity!r}")
    return int(sensitivity)


def noise_parameter(epsilon: float, neighbouring: str = "replace-one", sensitivity: int = 1) -> float:
    """The discrete Laplace parameter ``t = exp(-epsilon / (shift * G))`` (`THRESHOLD_SHIFT`; ``G = 1`` top-k).

    Args:
        epsilon: The release's epsilon, ``> 0``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.
        sensitivity: ``G``, an integer ``>= 1``.

    Returns:
        ``t``, in ``(0, 1)``.

    Raises:
        ValueError: ``epsilon``, ``neighbouring`` or ``sensitivity`` is invalid.
    """  # noqa: DOC502
    shift = THRESHOLD_SHIFT[check_neighbouring(neighbouring)] * check_sensitivity(sensitivity)
    return math.exp(-check_epsilon(epsilon) / shift)


def discrete_laplace_pmf(z: Any, t: float) -> np.ndarray:
    """``P(Z = z) = (1 - t)/(1 + t) t^|z|`` elementwise."""
    return (1.0 - t) / (1.0 + t) * t ** np.abs(np.asarray(z, dtype=np.float64))


def discrete_laplace_cdf(x: Any, t: float) -> np.ndarray:
    """``P(Z <= x)`` for integer ``x``: ``t^-x/(1 + t)`` below 0, ``1 - t^(x+1)/(1 + t)`` from 0 on."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(x < 0, t ** np.abs(x) / (1.0 + t), 1.0 - t ** (np.abs(x) + 1.0) / (1.0 + t))


def noise_std(epsilon: float, neighbouring: str = "replace-one", sensitivity: int = 1) -> float:
    """Standard deviation of the total noise on one count: ``sqrt(2 t) / (1 - t)`` (`noise_parameter`)."""
    t = noise_parameter(epsilon, neighbouring, sensitivity)
    return math.sqrt(2.0 * t) / (1.0 - t)


def discrete_laplace(size: int | tuple[int, ...], *, epsilon: float, neighbouring: str, rng: np.random.Generator,
                     sensitivity: int = 1) -> np.ndarray:
    """Exact discrete Laplace draws with the release's ``t`` (`noise_parameter`), for replays and the planner.

    The committee's `JointSampler` draws the same law under MPC to within total variation `SAMPLER_TV` per release.

    Args:
        size: The shape, e.g. ``(repetitions, p)``.
        epsilon: The release's epsilon, ``> 0``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.
        rng: The generator to draw from.
        sensitivity: The ballot's l-infinity sensitivity ``G``.

    Returns:
        The int64 draws, of shape ``size``.

    Raises:
        ValueError: An argument is out of its range.
    """  # noqa: DOC502
    success = 1.0 - noise_parameter(epsilon, neighbouring, sensitivity)  # X1 - X2, two geometrics (NB of shape 1)
    return (rng.negative_binomial(1.0, success, size=size)
            - rng.negative_binomial(1.0, success, size=size)).astype(np.int64, copy=False)


# -------------------------------------------------------------------------------- the joint sampler
#: The most total variation between the noise vector the committee samples for one release and exact iid discrete
#: Laplace (`JointSampler`; docs/design/winner-release.md).
SAMPLER_TV = 2.0 ** -64
#: The largest magnitude of one count plus its noise the committee's secure integers hold (`JointSampler`).
SAMPLER_MAX_DIGITS = 28


@dataclass(frozen=True)
class JointSampler:
    """How the tally committee samples ``size`` discrete Laplace draws inside the MPC (docs/design/winner-release.md).

    Each of the ``digits`` lowest digits of a geometric is ``[U < c_i]`` for a secret uniform ``precision``-bit ``U``;
    the difference of two geometrics is one draw; `total_variation` is at most `SAMPLER_TV` by `for_release`.

    Attributes:
        size: The number of draws ``p`` (one per candidate).
        t: The discrete Laplace parameter (`noise_parameter`).
        digits: The binary digits drawn per geometric, ``L``.
        precision: The bits of each uniform, ``M``.
        thresholds: The ``L`` public thresholds ``c_i``, lowest digit first.
    """

    size: int
    t: float
    digits: int
    precision: int
    thresholds: tuple[int, ...]

    @classmethod
    def for_release(cls, size: int, epsilon: float, neighbouring: str, sensitivity: int = 1) -> JointSampler:
        """The sampler of one release: the fewest digits and bits whose `total_variation` is within `SAMPLER_TV`.

        Args:
            size: The number of candidates ``p``.
            epsilon: The release's epsilon, ``> 0``.
            neighbouring: ``"replace-one"`` or ``"add-remove"``.
            sensitivity: The ballot's l-infinity sensitivity ``G``.

        Returns:
            The sampler.

        Raises:
            ValueError: An argument is out of range, or the noise would need more than `SAMPLER_MAX_DIGITS` digits (the
                message names the smallest epsilon it takes).
        """
        size = check_num_candidates(size)
        t = noise_parameter(epsilon, neighbouring, sensitivity)
        scale = THRESHOLD_SHIFT[neighbouring] * check_sensitivity(sensitivity)
        rate = float(epsilon) / scale  # t = exp(-rate)
        half = SAMPLER_TV / (4.0 * size)  # the tail and the rounding each get half of the budget
        digits = 1
        while 2.0 * math.exp(-rate * 2.0 ** digits) > half:
            digits += 1
            if digits > SAMPLER_MAX_DIGITS:
                least = scale * math.log(2.0 / half) / 2.0 ** SAMPLER_MAX_DIGITS
                raise ValueError(f"epsilon must be at least {least:.3g} for {size} candidates and this ballot, got "
                                 f"{epsilon!r}; raise epsilon\n(the committee's noise must fit "
                                 f"{SAMPLER_MAX_DIGITS} binary digits)")
        precision = math.ceil(math.log2(digits / half))
        with localcontext() as ctx:  # q_i = t^(2^i) / (1 + t^(2^i)) to 60 digits
            ctx.prec = 60
            powers = [(-Decimal(float(epsilon)) * 2**i / scale).exp() for i in range(digits)]  # the float epsilon
            thresholds = [int((a / (1 + a) * Decimal(2) ** precision).to_integral_value()) for a in powers]
        return cls(size=size, t=t, digits=digits, precision=precision, thresholds=tuple(thresholds))

    @property
    def total_variation(self) -> float:
        """The bound ``2 size (digits 2^-precision + 2 t^(2^digits))`` on the distance to exact iid noise."""
        tail = 2.0 * math.exp(math.log(self.t) * 2.0 ** self.digits)
        return 2.0 * self.size * (self.digits * 2.0 ** -self.precision + tail)

    def digit_probabilities(self) -> np.ndarray:
        """``c_i / 2^precision``: the ``(digits,)`` probabilities that each digit of a geometric is 1."""
        return np.array([c / 2.0 ** self.precision for c in self.thresholds])

    def pmf(self, z: Any) -> np.ndarray:
        """The exact law of one sampled draw (the difference of two sampled geometrics) at the integers ``z``."""
        q = self.digit_probabilities()
        values = np.arange(2 ** self.digits)
        ones = (values[:, None] >> np.arange(self.digits)) & 1
        geometric = np.prod(np.where(ones == 1, q, 1.0 - q), axis=1)
        law = np.convolve(geometric, geometric[::-1])  # X1 - X2 on [-(2^L - 1), 2^L - 1]
        zz = np.asarray(z, dtype=np.int64)
        offset = zz + 2 ** self.digits - 1
        inside = (offset >= 0) & (offset < law.size)
        return np.where(inside, law[np.clip(offset, 0, law.size - 1)], 0.0)

    def to_dict(self) -> dict[str, Any]:
        """What a tally hands its MPyC party: size, digits, precision and thresholds (decimal strings)."""
        return {"size": self.size, "digits": self.digits, "precision": self.precision,
                "thresholds": [str(c) for c in self.thresholds]}


def sampler_delta(epsilon: float, releases: int = 1) -> float:
    """The delta ``(1 + e^epsilon) releases SAMPLER_TV`` that sampled winner releases add (``inf`` on overflow).

    Each release's noise is within total variation `SAMPLER_TV` of the exact mechanism's, so ``(epsilon, delta)`` for
    the exact releases gives ``(epsilon, delta + (1 + e^epsilon) releases SAMPLER_TV)`` for the real ones.

    Args:
        epsilon: The guarantee's epsilon, ``>= 0``.
        releases: The number of sampled winner releases composed in it.

    Returns:
        The added delta.
    """
    if releases <= 0:
        return 0.0
    try:
        return (1.0 + math.exp(epsilon)) * releases * SAMPLER_TV
    except OverflowError:
        return math.inf


def report_noisy_max(noisy_counts: Any) -> np.ndarray:
    """Index of the largest noisy count along the last axis, the lowest among ties (as MPyC's ``mpc.argmax``)."""
    return np.argmax(np.asarray(noisy_counts), axis=-1)


def replay_winners(
    vote_sum: np.ndarray,
    *,
    epsilon: float,
    neighbouring: str,
    repetitions: int,
    rng: np.random.Generator,
    sensitivity: int = 1,
) -> np.ndarray:
    """Independent winner releases for the noiseless vote counts ``vote_sum`` (benchmarks and the planner).

    The counts plus exact discrete Laplace noise (`discrete_laplace`), report-noisy-max with lowest-index ties, as the
    tallies compute it; the noise depends on neither the clients, the dropout nor the committee's size.

    Args:
        vote_sum: The noiseless vote counts, ``(p,)`` or ``(repetitions, p)``.
        epsilon: The release's epsilon.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.
        repetitions: How many releases to draw.
        rng: The generator to draw from.
        sensitivity: The ballot's l-infinity sensitivity ``G``.

    Returns:
        The released indices, int64 ``(repetitions,)``.
    """
    votes = np.asarray(vote_sum)
    noise = discrete_laplace((int(repetitions), votes.shape[-1]), epsilon=epsilon, neighbouring=neighbouring, rng=rng,
                             sensitivity=sensitivity)
    return report_noisy_max(np.rint(votes).astype(np.int64) + noise).astype(np.int64)


def winner_probabilities(counts: Any, epsilon: float, neighbouring: str = "replace-one",
                         sensitivity: int = 1) -> np.ndarray:
    """Exact ``P(released index = i)`` for integer ``counts`` (independent of the sampler).

    The sum over the winner's noise ``z`` of ``f(z) prod_{j<i} P(Z_j <= c_i + z - c_j - 1) prod_{j>i} P(Z_j <= c_i +
    z - c_j)``, truncated where the remaining mass of ``f`` is below ``1e-17``.

    Args:
        counts: The ``(p,)`` integer vote counts.
        epsilon: The release's epsilon, ``> 0``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.
        sensitivity: The ballot's l-infinity sensitivity ``G``.

    Returns:
        The ``(p,)`` probabilities.
    """
    c = np.asarray(counts, dtype=np.int64)
    t = noise_parameter(epsilon, neighbouring, sensitivity)
    reach = int(math.ceil(math.log(1e-17 * (1.0 + t) / 2.0) / math.log(t))) + 1
    level = np.arange(c.min() - reach, c.max() + reach + 1)  # the winner's noisy count
    below = level[None, :] - c[:, None]
    with np.errstate(divide="ignore"):
        strict = np.log(discrete_laplace_cdf(below - 1, t))  # rows j < i must stay below the level
        loose = np.log(discrete_laplace_cdf(below, t))  # rows j > i may tie it
    zero = np.zeros((1, level.size))
    before = np.vstack([zero, np.cumsum(strict, axis=0)[:-1]])
    after = np.vstack([np.cumsum(loose[::-1], axis=0)[::-1][1:], zero])
    return (discrete_laplace_pmf(below, t) * np.exp(before + after)).sum(axis=1)


# ------------------------------------------------------------------------------------- accounting
@dataclass(frozen=True)
class WinnerEvent:
    """The winner release as a DP event: the index of the noisy maximum of the vote counts (``release="argmax"``).

    The release mode is `dphype.release.ArgmaxRelease`.

    Pure ``epsilon``-DP for exact noise whenever at least the minimum survivors contributed, for any ``k`` and any
    ballot of entries in ``[0, sensitivity]`` (docs/design/winner-release.md).

    Attributes:
        epsilon: The release's epsilon, ``> 0``.
        k: Votes per client, in ``[1, num_candidates]`` (a graded ballot's depth).
        num_candidates: The number of candidates ``p``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.
        sensitivity: The ballot's largest entry ``G`` (1 for top-k).
    """

    epsilon: float
    k: int
    num_candidates: int
    neighbouring: str = "replace-one"
    sensitivity: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        object.__setattr__(self, "num_candidates", check_num_candidates(self.num_candidates))
        object.__setattr__(self, "k", check_k(self.k, self.num_candidates))
        object.__setattr__(self, "neighbouring", check_neighbouring(self.neighbouring))
        object.__setattr__(self, "sensitivity", check_sensitivity(self.sensitivity))

    @property
    def t(self) -> float:
        """The discrete Laplace parameter (`noise_parameter`)."""
        return noise_parameter(self.epsilon, self.neighbouring, self.sensitivity)

    @property
    def noise_std(self) -> float:
        """Std of the total noise on one count (`noise_std`)."""
        return noise_std(self.epsilon, self.neighbouring, self.sensitivity)


def winner_report(release: WinnerEvent, delta: float, *, clients: int, dropout: float,
                  survivors: int | None = None, committee: int = COMMITTEE_TALLIES,
                  excluded: tuple[str, ...] = (), unattributed: tuple[str, ...] = ()) -> PrivacyReport:
    """The privacy statement of one winner release by ``clients`` clients tolerating ``dropout``.

    ``(release.epsilon, sampler_delta(release.epsilon))`` whatever the number of contributors; ``delta`` is the
    run's, at which it composes with other releases. ``sigma`` is the discrete Laplace std, ``client_std`` 0 (the
    clients add no noise), ``l2_sensitivity`` the per-count ``G``.

    Args:
        release: The winner release.
        delta: The run's delta, in ``(0, 1)``.
        clients: The number of clients ``n``.
        dropout: The tolerated dropout fraction ``xi``.
        survivors: The contributors whose ballots were counted, at least
            `dphype.privacy.noise.min_valid_ballots` (the tallies release nothing below); ``None``: unknown.
        committee: The number of tallies, ``>= 3``.
        excluded: The labels of the contributors whose ballots the committee left out as invalid.
        unattributed: Those it left out for a share that failed in transit or by its sender (`PrivacyReport`).

    Returns:
        The privacy statement.

    Raises:
        ValueError: An argument is out of its range, or ``survivors`` is below the floor.
    """  # noqa: DOC502
    clients, dropout, delta = check_clients(clients), check_dropout(dropout), check_delta(delta)
    if survivors is not None:
        survivors = check_survivors(survivors, clients, min_valid_ballots(clients, dropout))
    honest_tallies(committee)  # validates the committee's size
    return PrivacyReport(
        epsilon=release.epsilon, delta=delta,
        accountant="report-noisy-max (pure epsilon for exact noise; the MPC sampler's total variation as delta)",
        noise=WINNER_NOISE, sigma=release.noise_std, client_std=0.0, clients=clients, dropout=dropout, k=release.k,
        num_candidates=release.num_candidates, survivors=survivors, neighbouring=release.neighbouring,
        l2_sensitivity=float(release.sensitivity),
        released=(f"winning index only (secure argmax among {committee} tallies on MPyC; no counts, no runner-up); "
                  f"noise sampled jointly by the tallies inside the MPC (no tally knows any of it)"),
        release_delta=sampler_delta(release.epsilon), ballots_verified=True,
        excluded=tuple(str(label) for label in excluded), unattributed=tuple(str(label) for label in unattributed),
    )


def winner_rdp(epsilon: float, orders: Any) -> np.ndarray:
    """Renyi curve at ``orders`` bounding any ``(epsilon, 0)``-DP release: binary randomized response's.

    ``D_a = log((e^(a eps) + e^((1 - a) eps)) / (1 + e^eps)) / (a - 1)``, in log space: dp_accounting's
    ``RandomizedResponseDpEvent(2 / (1 + e^epsilon), 2)`` without its per-order loop (a ledger evaluates it per entry).

    Args:
        epsilon: The pure epsilon, ``> 0``.
        orders: The ``(m,)`` RDP orders, ``> 1``.

    Returns:
        The ``(m,)`` RDP curve.

    Raises:
        ValueError: ``epsilon`` or ``orders`` is invalid.
    """  # noqa: DOC502
    epsilon = check_epsilon(epsilon)
    a = check_orders(orders)
    return (np.logaddexp(a * epsilon, (1.0 - a) * epsilon) - np.logaddexp(0.0, epsilon)) / (a - 1.0)


def epsilon_with_samplers(rdp: Any, delta: float, releases: int) -> float:
    """The epsilon at ``delta`` of a composition with Renyi curve ``rdp`` that holds ``releases`` winner releases.

    The curve is the exact releases'; the real ones add `sampler_delta`, so the epsilon is the curve's at the largest
    ``delta' < delta`` with ``delta' + sampler_delta(epsilon(delta'), releases) <= delta``, among
    ``delta (1 - 10^-j)``, ``j = 9, 6, 3, 1``.

    Args:
        rdp: The ``(m,)`` composed Renyi curve on `dphype.privacy.accounting.RDP_ORDERS`.
        delta: The delta, in ``(0, 1)``.
        releases: The winner releases composed in it, ``>= 0``.

    Returns:
        The epsilon (``inf`` where no such ``delta'`` exists).
    """
    delta = check_delta(delta)
    if releases <= 0:
        return rdp_epsilon(rdp, delta)[0]
    for j in (9, 6, 3, 1):
        inner = delta * (1.0 - 10.0 ** -j)
        epsilon = rdp_epsilon(rdp, inner)[0]
        if inner + sampler_delta(epsilon, releases) <= delta:
            return epsilon
    return math.inf
