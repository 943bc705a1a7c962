"""Release only the winner: report-noisy-max over the vote counts with client-made discrete Laplace noise.

In ``release="argmax"`` mode nobody sees the noisy vote vector; a committee of tallies computes its argmax
under MPC (`dphype.secure.tally`) and opens only the index. This module is the mechanism and its
accounting, framework-free.

The mechanism
-------------
``c`` = the integer vote counts of the contributing clients: the sum of their ballots, each of the request's
`dphype.selection.ballots.BallotForm` (integer entries in ``[0, G]``, ``G = max_entry = 2**bits - 1``; DP-Hype's
top-k ballot has ``G = 1``: 1 for each of the client's top ``k``). The released value is ``argmax_i (c_i + Z_i)``
with ties broken by the LOWEST index, where the ``Z_i`` are iid discrete Laplace, ``P(Z = z) = (1 - t)/(1 + t)
t^|z|`` on the integers, with ``t = exp(-epsilon / (shift * G))``, the threshold's ``shift`` (`THRESHOLD_SHIFT`):

* ``shift = 2`` under ``"replace-one"`` (one client's data replaced: every count moves by at most ``G``, in
  either direction, whatever the ballot's total);
* ``shift = 1`` under ``"add-remove"`` (one client added or removed: the counts are monotone, every count moves
  by at most ``G``, all in the same direction).

The noise depends on the ballot only through its l-infinity sensitivity ``G`` (the ``sensitivity`` arguments),
not on ``k``,
the ballot's total or the number of candidates: the released index is pure ``epsilon``-DP (``delta = 0``),
against the sum mode whose noise must hide a whole vote vector (L2 sensitivity ``sqrt(2k)`` for top-k).

Proof sketch (report-noisy-max, discrete, deterministic ties; Dwork & Roth 2014, Claim 3.9, adapted).
Write ``f(z) = (1-t)/(1+t) t^|z|``; then ``f(z + 1) >= t f(z)`` for every integer ``z`` (the ratio is ``t``
or ``1/t``), so the tail ``S(a) = P(Z >= a)`` satisfies ``S(a + 1) = sum_{z >= a} f(z + 1) >= t S(a)``:
raising the threshold by 1 costs at most a factor ``t``, by ``d`` integer steps at most ``t^d``. Fix candidate
``i`` and the other noises ``Z_{-i}``. Because the values are integers and ties go to the lowest index, ``i``
wins iff ``Z_i >= r(c, Z_{-i}) := M - c_i`` with ``M = max(max_{j<i} (c_j + Z_j) + 1, max_{j>i} (c_j + Z_j))``,
a threshold. For neighbouring counts ``c'``: under replace-one one client's ballot ``b`` becomes ``b'``, both of
the form, so ``|c'_j - c_j| = |b'_j - b_j| <= G`` for all ``j``, hence ``|M' - M| <= G``, ``|r' - r| <= 2G`` and
``P(i | c', Z_{-i}) = S(r') >= S(r + 2G) >= t^{2G} S(r) = e^{-epsilon} P(i | c, Z_{-i})``. Under add/remove
``c' - c = b`` in ``[0, G]^p`` (monotone: the added client's ballot), ``M' - M`` and ``c'_i - c_i`` both lie in
``[0, G]``, so ``|r' - r| <= G`` and the factor is ``t^G = e^{-epsilon}``. The relation is symmetric, which
gives the other direction. Taking the expectation over ``Z_{-i}`` (the same law under both neighbours) gives
``P(i | c') >= e^{-epsilon} P(i | c)`` for every ``i``: pure ``epsilon``-DP. Ties need no randomness: the
lowest-index rule is part of the threshold ``M``. Nothing in the argument reads the ballot's total or how many
entries are non-zero: only the per-entry range ``[0, G]``, which the tally committee checks on every ballot
(`dphype.selection.ballots.BallotForm.check`). A ballot outside the range would void the bound, which is why
the form is part of the approved request and checked before the argmax.

Graded ballots (issue 25). `dphype.selection.voting` makes ballots of entries in ``[0, G]`` from a client's
scores (by rank or by score): each is a deterministic function of the client's own data, so the argument
above applies to them unchanged with their ``G``. The noise grows with ``G`` (std about ``sqrt(2) shift G /
epsilon``), but so do the counts: a graded ballot pays for its resolution only where its entries use less than
the full range. With ``G = 1`` every formula here is DP-Hype's top-k release. The argmax release's default
ballot, ``"auto"`` (`dphype.selection.voting.auto_depth`), is a top-k ballot (``G = 1``) whose ``k`` is computed
from the approved request alone (the number of candidates, epsilon, the relation, ``n`` and the dropout
fraction), before and independently of any client's data: the same ``k`` under both neighbours, so the argument
holds for it as for any fixed ``k``.

The noise is made by the clients. A geometric variable ``G``, ``P(G = g) = (1 - t) t^g``, is the negative
binomial ``NB(1, 1 - t)`` (failures before the first success), and ``G_1 - G_2`` of two iid ones is discrete
Laplace with parameter ``t``. Negative binomials with the same success probability add up in their shape
(``NB(a, q) + NB(b, q) = NB(a + b, q)``): the law is infinitely divisible. Each client adds to every count
``NB(1/m, 1 - t) - NB(1/m, 1 - t)``, ``m = ceil((1 - xi) n)`` (`dphype.privacy.noise.min_survivors`),
so the shares of ANY ``m`` survivors add up to exactly one discrete Laplace per coordinate.

More survivors. With ``m' > m`` survivors the noise is ``Z + W``: ``Z`` (the shares of any ``m`` of them) is
discrete Laplace and ``W`` (the other ``m' - m`` shares) is independent of ``Z`` and of the data, with the same
law under both neighbours. Given ``W = w`` the release is report-noisy-max over the shifted counts
``c + w`` and ``c' + w``, which are neighbouring in the same sense (the shift cancels in ``c' - c``), so the
bound above holds for every ``w``, and averaging over ``w`` keeps it: ``epsilon`` is unchanged. Fewer than
``m`` survivors would carry too little noise; the tallies refuse to compute the argmax then
(`dphype.secure.tally`). Dropouts are assumed independent of the noise (as in the sum mode).

Accounting. The release is ``(epsilon, 0)``-DP. For composition with other releases (a node's lifetime, the
DP-FedAvg training after the selection) its Renyi curve is bounded by that of binary randomized response
with ``P(truth) = e^epsilon / (1 + e^epsilon)``: every ``(epsilon, 0)``-DP pair of output laws is a
post-processing of that pair (Kairouz, Oh & Viswanath, ICML 2015, Thm 2.4's privacy region at ``delta = 0``),
and Renyi divergence does not grow under post-processing. `winner_rdp` evaluates this curve in closed
form (equal to dp_accounting's ``RandomizedResponseDpEvent`` with 2 buckets and noise parameter
``2/(1 + e^epsilon)``, checked in the tests); it is below both ``epsilon`` and ``alpha epsilon^2 / 2`` (Bun &
Steinke 2016, Prop. 3.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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
from dphype.privacy.accounting import PrivacyReport, check_orders
from dphype.privacy.noise import check_survivors, min_survivors, secure_generator

#: The noise kind of the winner release (what a `dphype.privacy.accounting.PrivacyReport` names).
WINNER_NOISE = "discrete-laplace"
#: How far the threshold of report-noisy-max can move between neighbours per unit of the ballot's l-infinity
#: sensitivity (proof in the module docstring).
THRESHOLD_SHIFT: dict[str, int] = {"replace-one": 2, "add-remove": 1}


def check_sensitivity(sensitivity: Any) -> int:
    """The ballot's l-infinity sensitivity ``G``: an integer ``>= 1`` (a ballot form's ``max_entry``).

    Args:
        sensitivity: The value to check.

    Returns:
        ``G`` as an int.

    Raises:
        ValueError: Naming ``sensitivity`` and its range, for anything else.
    """
    if isinstance(sensitivity, bool) or not isinstance(sensitivity, (int, np.integer)) or sensitivity < 1:
        raise ValueError(f"sensitivity must be an integer >= 1 (the ballot form's max_entry), got {sensitivity!r}")
    return int(sensitivity)


def noise_parameter(epsilon: float, neighbouring: str = "replace-one", sensitivity: int = 1) -> float:
    """The discrete Laplace parameter ``t = exp(-epsilon / (shift * G))`` (module docstring).

    ``shift`` is 2 for replace-one and 1 for add/remove (`THRESHOLD_SHIFT`); ``G`` is the ballot's l-infinity
    sensitivity (its form's ``max_entry``; 1 for top-k).

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
    """``P(Z = z) = (1 - t)/(1 + t) t^|z|`` elementwise.

    Args:
        z: Integers, any shape.
        t: The discrete Laplace parameter, in ``(0, 1)``.

    Returns:
        The probabilities, of the shape of ``z``.
    """
    return (1.0 - t) / (1.0 + t) * t ** np.abs(np.asarray(z, dtype=np.float64))


def discrete_laplace_cdf(x: Any, t: float) -> np.ndarray:
    """``P(Z <= x)`` for integer ``x``: ``t^-x/(1 + t)`` below 0, ``1 - t^(x+1)/(1 + t)`` from 0 on.

    Args:
        x: Integers, any shape.
        t: The discrete Laplace parameter, in ``(0, 1)``.

    Returns:
        The probabilities, of the shape of ``x``.
    """
    x = np.asarray(x, dtype=np.float64)
    return np.where(x < 0, t ** np.abs(x) / (1.0 + t), 1.0 - t ** (np.abs(x) + 1.0) / (1.0 + t))


def noise_std(epsilon: float, neighbouring: str = "replace-one", sensitivity: int = 1) -> float:
    """Standard deviation of the total noise on one count: ``sqrt(2 t) / (1 - t)``.

    Args:
        epsilon: The release's epsilon, ``> 0``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.
        sensitivity: The ballot's l-infinity sensitivity ``G`` (`noise_parameter`).

    Returns:
        The standard deviation.
    """
    t = noise_parameter(epsilon, neighbouring, sensitivity)
    return math.sqrt(2.0 * t) / (1.0 - t)


def _nb_difference(size: int | tuple[int, ...], shape: float, t: float, rng: np.random.Generator) -> np.ndarray:
    """``NB(shape, 1 - t) - NB(shape, 1 - t)`` per entry as int64 (the one place this noise is sampled).

    ``shape = 1`` is discrete Laplace with parameter ``t``, and shapes add over independent draws.
    """
    return (rng.negative_binomial(shape, 1.0 - t, size=size)
            - rng.negative_binomial(shape, 1.0 - t, size=size)).astype(np.int64, copy=False)


def winner_share(
    size: int | tuple[int, ...],
    *,
    epsilon: float,
    neighbouring: str,
    clients: int,
    dropout: float,
    rng: np.random.Generator,
    sensitivity: int = 1,
) -> np.ndarray:
    """One client's noise share: ``NB(1/m, 1 - t) - NB(1/m, 1 - t)`` per entry, ``m`` the minimum survivors.

    Any ``m`` shares sum to discrete Laplace with parameter ``t`` (module docstring).

    Args:
        size: The share's shape, e.g. ``p`` for one entry per candidate.
        epsilon: The release's epsilon, ``> 0``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.
        clients: The number of clients ``n``.
        dropout: The tolerated dropout fraction ``xi``.
        rng: The generator to draw from (a client uses `client_winner_share`).
        sensitivity: The ballot's l-infinity sensitivity ``G`` (`noise_parameter`).

    Returns:
        The int64 share, of shape ``size``.

    Raises:
        ValueError: An argument is out of its range.
    """  # noqa: DOC502
    shape = 1.0 / min_survivors(check_clients(clients), check_dropout(dropout))
    return _nb_difference(size, shape, noise_parameter(epsilon, neighbouring, sensitivity), rng)


def client_winner_share(
    size: int | tuple[int, ...], *, epsilon: float, neighbouring: str, clients: int, dropout: float,
    sensitivity: int = 1,
) -> np.ndarray:
    """`winner_share` from a fresh `dphype.privacy.noise.secure_generator` (ChaCha20 keyed by the OS).

    The only draw the client path makes; no generator can be passed in.

    Args:
        size: The share's shape.
        epsilon: The release's epsilon, ``> 0``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.
        clients: The number of clients ``n``.
        dropout: The tolerated dropout fraction ``xi``.
        sensitivity: The ballot's l-infinity sensitivity ``G`` (`noise_parameter`).

    Returns:
        The int64 share, of shape ``size``.

    Raises:
        ValueError: An argument is out of its range.
    """  # noqa: DOC502
    return winner_share(size, epsilon=epsilon, neighbouring=neighbouring, clients=clients, dropout=dropout,
                        rng=secure_generator(), sensitivity=sensitivity)


def summed_winner_noise(
    size: int | tuple[int, ...],
    *,
    epsilon: float,
    neighbouring: str,
    clients: int,
    dropout: float,
    survivors: int,
    rng: np.random.Generator,
    sensitivity: int = 1,
) -> np.ndarray:
    """The sum of ``survivors`` independent `winner_share` draws in one draw, for replays.

    Each side is ``NB(survivors / m, 1 - t)`` (shapes add).

    Args:
        size: The sum's shape.
        epsilon: The release's epsilon, ``> 0``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.
        clients: The number of clients ``n``.
        dropout: The tolerated dropout fraction ``xi``.
        survivors: The number of shares summed, in ``[1, clients]``.
        rng: The generator to draw from.
        sensitivity: The ballot's l-infinity sensitivity ``G`` (`noise_parameter`).

    Returns:
        The int64 summed noise, of shape ``size``.

    Raises:
        ValueError: An argument is out of its range.
    """  # noqa: DOC502
    clients = check_clients(clients)
    shape = check_survivors(survivors, clients) / min_survivors(clients, check_dropout(dropout))
    return _nb_difference(size, shape, noise_parameter(epsilon, neighbouring, sensitivity), rng)


def report_noisy_max(noisy_counts: Any) -> np.ndarray:
    """Index of the largest noisy count along the last axis, the lowest index among ties.

    ``np.argmax``'s rule, and MPyC's ``mpc.argmax``'s: it keeps the earlier of two equal values.

    Args:
        noisy_counts: ``(..., p)`` noisy counts.

    Returns:
        The ``(...)`` winning indices.
    """
    return np.argmax(np.asarray(noisy_counts), axis=-1)


def replay_winners(
    vote_sum: np.ndarray,
    *,
    epsilon: float,
    neighbouring: str,
    clients: int,
    repetitions: int,
    rng: np.random.Generator,
    dropout: float = 0.0,
    survivors: int | None = None,
    per_client: bool = False,
    sensitivity: int = 1,
) -> np.ndarray:
    """Independent winner releases for the noiseless vote counts ``vote_sum``.

    The counts plus the discrete Laplace shares of ``survivors`` clients, report-noisy-max with lowest-index ties,
    as the tallies compute it: the replay of `dphype.modes.ArgmaxRelease` for benchmarks and the planner. The
    shares are drawn in one `summed_winner_noise` draw, or with ``per_client=True`` literally, one `winner_share`
    per client (the same law).

    Args:
        vote_sum: The noiseless vote counts, ``(p,)``, or one row per repetition, ``(repetitions, p)``.
        epsilon: The release's pure epsilon.
        neighbouring: The neighbouring relation, ``"replace-one"`` or ``"add-remove"``.
        clients: The number of clients ``n``.
        repetitions: How many releases to draw.
        rng: The generator to draw from.
        dropout: The tolerated dropout fraction ``xi``, in ``[0, 1)``.
        survivors: The number of clients whose shares are summed (default: all ``clients``).
        per_client: Draw one share per client and sum them, rather than their sum in one draw.
        sensitivity: The ballot's l-infinity sensitivity ``G`` (`noise_parameter`).

    Returns:
        The released indices, int64 ``(repetitions,)``.
    """
    votes = np.asarray(vote_sum)
    shape = (int(repetitions), votes.shape[-1])
    m = clients if survivors is None else survivors
    if per_client:
        noise = np.zeros(shape, dtype=np.int64)
        for _ in range(check_survivors(m, check_clients(clients))):
            noise += winner_share(shape, epsilon=epsilon, neighbouring=neighbouring, clients=clients, dropout=dropout,
                                  rng=rng, sensitivity=sensitivity)
    else:
        noise = summed_winner_noise(shape, epsilon=epsilon, neighbouring=neighbouring, clients=clients,
                                    dropout=dropout, survivors=m, rng=rng, sensitivity=sensitivity)
    return report_noisy_max(np.rint(votes).astype(np.int64) + noise).astype(np.int64)


def winner_probabilities(counts: Any, epsilon: float, neighbouring: str = "replace-one",
                         sensitivity: int = 1) -> np.ndarray:
    """Exact ``P(released index = i)`` for integer ``counts`` (independent of the sampler).

    The sum over the winner's noise ``z`` of ``f(z) prod_{j<i} P(Z_j <= c_i + z - c_j - 1) prod_{j>i} P(Z_j <=
    c_i + z - c_j)``, truncated where the remaining mass of ``f`` is below ``1e-17``.

    Args:
        counts: The ``(p,)`` integer vote counts.
        epsilon: The release's epsilon, ``> 0``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.
        sensitivity: The ballot's l-infinity sensitivity ``G`` (`noise_parameter`).

    Returns:
        The ``(p,)`` probabilities.
    """
    c = np.asarray(counts, dtype=np.int64)
    t = noise_parameter(epsilon, neighbouring, sensitivity)
    reach = int(math.ceil(math.log(1e-17 * (1.0 + t) / 2.0) / math.log(t))) + int(np.ptp(c)) + 1
    z = np.arange(-reach, reach + 1)
    f = discrete_laplace_pmf(z, t)
    out = np.empty(c.size)
    for i in range(c.size):
        level = c[i] + z  # the winner's noisy count
        prob = f.copy()
        for j in range(c.size):
            if j != i:
                prob *= discrete_laplace_cdf(level - c[j] - (1 if j < i else 0), t)
        out[i] = prob.sum()
    return out


# ------------------------------------------------------------------------------------- accounting
@dataclass(frozen=True)
class WinnerRelease:
    """What the server learns in ``release="argmax"`` mode: the index of the noisy maximum of the vote counts.

    With discrete Laplace noise for ``epsilon`` under ``neighbouring`` and the ballot's l-infinity sensitivity
    (module docstring). Pure DP: its epsilon is ``epsilon`` whenever at least the minimum survivors contributed,
    for any ``k`` and any ballot of entries in ``[0, sensitivity]``.

    Attributes:
        epsilon: The release's epsilon, ``> 0``.
        k: Votes per client, in ``[1, num_candidates]`` (the top-k ballot's; a graded ballot's depth).
        num_candidates: The number of candidates ``p``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.
        sensitivity: The ballot's largest entry ``G`` (its form's ``max_entry``; 1 for top-k).
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
        """The discrete Laplace parameter (`noise_parameter`).

        Returns:
            ``t``, in ``(0, 1)``.
        """
        return noise_parameter(self.epsilon, self.neighbouring, self.sensitivity)

    @property
    def noise_std(self) -> float:
        """Std of the total noise on one count (`noise_std`).

        Returns:
            The standard deviation.
        """
        return noise_std(self.epsilon, self.neighbouring, self.sensitivity)


def winner_report(release: WinnerRelease, delta: float, *, clients: int, dropout: float,
                  survivors: int | None = None, committee: int = 3) -> PrivacyReport:
    """The privacy statement of one winner release by ``clients`` clients tolerating ``dropout``.

    Pure ``release.epsilon`` whenever at least the minimum survivors contributed (module docstring: more survivors
    add data-independent noise and keep epsilon); ``survivors`` below that is refused. The release itself has
    delta 0 (``accountant`` says so); ``delta`` is the run's, at which it composes with other releases (pure
    ``epsilon``-DP is ``(epsilon, delta)``-DP for every delta). ``sigma`` is the std of the total noise per
    count of the minimum survivors, ``client_std`` one share's; ``l2_sensitivity`` is the per-count
    sensitivity ``G`` = ``release.sensitivity`` (what report-noisy-max needs: 1 for top-k).

    Args:
        release: The winner release.
        delta: The run's delta, in ``(0, 1)``.
        clients: The number of clients ``n``.
        dropout: The tolerated dropout fraction ``xi``.
        survivors: The number of contributing clients, at least the minimum survivors; ``None``: unknown.
        committee: The number of tallies (for the ``released`` text).

    Returns:
        The privacy statement.

    Raises:
        ValueError: An argument is out of its range, or ``survivors`` is below the minimum.
    """  # noqa: DOC502
    clients, dropout, delta = check_clients(clients), check_dropout(dropout), check_delta(delta)
    if survivors is not None:
        survivors = check_survivors(survivors, clients, min_survivors(clients, dropout))
    std = release.noise_std
    return PrivacyReport(
        epsilon=release.epsilon, delta=delta, accountant="pure epsilon (report-noisy-max; delta 0)",
        noise=WINNER_NOISE, sigma=std,
        client_std=std / math.sqrt(min_survivors(clients, dropout)), clients=clients, dropout=dropout, k=release.k,
        num_candidates=release.num_candidates, survivors=survivors, neighbouring=release.neighbouring,
        l2_sensitivity=float(release.sensitivity),
        released=f"winning index only (secure argmax among {committee} tallies on MPyC; no counts, no runner-up)",
        pure=True,
    )


def winner_rdp(epsilon: float, orders: Any) -> np.ndarray:
    """Renyi curve at ``orders`` bounding any ``(epsilon, 0)``-DP release: binary randomized response's.

    (Module docstring.) ``D_a = log((e^(a eps) + e^((1 - a) eps)) / (1 + e^eps)) / (a - 1)``, in log space.
    The same curve as dp_accounting's ``RandomizedResponseDpEvent(2 / (1 + e^epsilon), 2)`` (checked in
    tests/privacy/test_winner.py), without its per-order Python loop: a node's ledger evaluates it for every entry.

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
