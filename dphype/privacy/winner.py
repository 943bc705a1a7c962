"""Release only the winner: report-noisy-max over the vote counts with committee-made discrete Laplace noise.

In ``release="argmax"`` mode nobody sees the noisy vote vector; a committee of tallies computes its argmax
under MPC (`dphype.secure.tally`), after checking every ballot, and opens only the index. This module is the
mechanism and its accounting, framework-free.

The mechanism
-------------
``c`` = the integer vote counts of the contributing clients' valid ballots: their sum, each of the request's
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

The noise is made by the tally committee, never by the clients. A geometric variable ``G``, ``P(G = g) = (1 - t)
t^g``, is the negative binomial ``NB(1, 1 - t)`` (failures before the first success), and ``G_1 - G_2`` of two iid
ones is discrete Laplace with parameter ``t``. Negative binomials with the same success probability add up in their
shape (``NB(a, q) + NB(b, q) = NB(a + b, q)``): the law is infinitely divisible. Each of the ``parties`` tallies
draws, with the operating system's CSPRNG (`committee_noise_share`), its share ``NB(1/h, 1 - t) - NB(1/h, 1 - t)``
per count, ``h = parties - threshold`` (`dphype.privacy.noise.honest_tallies`: the fewest honest tallies under
MPyC's honest majority, 2 of 3), and inputs it to the MPC, which adds the valid ballots and every share and opens
only the argmax (`dphype.secure.tally_party`). The shares of ANY ``h`` tallies add up to exactly one discrete
Laplace per count. A client's ballot carries no noise: the committee checks under MPC that it is a valid ballot
(`dphype.selection.ballots`: entries in ``[0, G]``, its total in range; top-k: 0 or 1, exactly ``k`` ones) and
leaves out an invalid one, so no client can hide a boost in its noise, and a client's effect on every count is at
most ``G`` (one vote for top-k).

More noise shares (proof sketch). The released index is report-noisy-max over ``c + Z + W``: ``Z`` is the sum of
the shares of any ``h`` honest tallies (discrete Laplace, as above) and ``W`` the sum of the other
``parties - h`` shares, independent of ``Z`` and of the data, with the same law under both neighbours; a
semi-honest tally may even know its own share, so condition on ``W = w``. Given ``w`` the release is
report-noisy-max over the shifted counts ``c + w`` and ``c' + w``, which are neighbouring in the same sense (the
shift cancels in ``c' - c``), so the bound above holds for every ``w``, and averaging over ``w`` keeps it:
``epsilon`` is unchanged, whatever the known shares are. The same argument covered the clients' shares before
(more survivors than the minimum); now the noise depends on neither the clients nor the dropout, and only the
valid ballots of the contributors are counted, each moving every count by at most ``G`` (the sensitivity the
proof assumes). The names of the contributors whose ballots were invalid are released too: an honest client's
ballot is valid whatever its data (it checks its own ballot before it shares), so that list is a function of the other
clients' ballots only and costs an honest client nothing. A tally that deviates from the protocol (MPyC's model is
semi-honest) is out of scope.

Utility cost. All ``parties`` shares are added: the total noise is ``NB(parties/h) - NB(parties/h)``, of variance
``parties/h`` times one discrete Laplace's (1.5 for 3 tallies, std x 1.22), where the client-made noise of
the previous release carried ``n/m`` (1 without dropout, ``1/(1 - xi)`` with a tolerated dropout ``xi``) and had
to be trusted to the clients. Replayed (200,000 releases, epsilon 1, replace-one, counts ``[12, 11, 10, 9, 8]``):
the top candidate wins 0.527 of the time with one discrete Laplace (the client-made noise without dropout) and 0.456
with the committee's noise of 3 tallies; among 100 candidates (the other 95 counts 0) 0.493 against 0.403, and one
of the top 3 wins 0.839 against 0.763. The planner's chance of a good pick for ``dphype new``'s app (8
candidates, 10 clients, epsilon 1) goes from 0.81 (k = 2) to 0.73 (k = 1). On Adult's real votes (``dphype bench
tradeoff --betas iid --epsilons 1 --release argmax``, 100 candidates, 500 replays, the same cached votes) the gap to
Opt moves from 0.35 to 0.36 points at n = 20, k = 15 (replace-one; every replay within 1 point either way) and from
3.13 to 3.22 at n = 10, k = 20 (add/remove: 1.77 to 1.88).

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
from dphype.privacy.noise import COMMITTEE_TALLIES, check_survivors, honest_tallies, min_survivors

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


def committee_noise_share(size: int | tuple[int, ...], epsilon: float, neighbouring: str, parties: int, *,
                          rng: np.random.Generator, sensitivity: int = 1) -> np.ndarray:
    """One tally's noise share: ``NB(1/h, 1 - t) - NB(1/h, 1 - t)`` per entry (`dphype.privacy.noise.honest_tallies`).

    The shares of any ``h`` tallies add up to discrete Laplace with parameter ``t`` (module docstring). A tally
    draws its share with ``rng = dphype.privacy.noise.secure_generator()`` (`dphype.secure.tally.Tally.job`).

    Args:
        size: The share's shape, e.g. ``p`` for one entry per candidate.
        epsilon: The release's epsilon, ``> 0``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.
        parties: The committee's size, ``>= 3``.
        rng: The generator to draw from.
        sensitivity: The ballot's l-infinity sensitivity ``G`` (`noise_parameter`).

    Returns:
        The int64 share, of shape ``size``.

    Raises:
        ValueError: An argument is out of its range.
    """  # noqa: DOC502
    t = noise_parameter(epsilon, neighbouring, sensitivity)
    return _nb_difference(size, 1.0 / honest_tallies(parties), t, rng)


def committee_noise(size: int | tuple[int, ...], *, epsilon: float, neighbouring: str, parties: int,
                    rng: np.random.Generator, sensitivity: int = 1) -> np.ndarray:
    """The sum of all ``parties`` tallies' `committee_noise_share` draws in one draw, for replays.

    Each side is ``NB(parties / h, 1 - t)`` (shapes add): variance ``parties / h`` times one discrete Laplace's.

    Args:
        size: The sum's shape.
        epsilon: The release's epsilon, ``> 0``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.
        parties: The committee's size, ``>= 3``.
        rng: The generator to draw from.
        sensitivity: The ballot's l-infinity sensitivity ``G`` (`noise_parameter`).

    Returns:
        The int64 summed noise, of shape ``size``.

    Raises:
        ValueError: An argument is out of its range.
    """  # noqa: DOC502
    shape = int(parties) / honest_tallies(parties)
    return _nb_difference(size, shape, noise_parameter(epsilon, neighbouring, sensitivity), rng)


def committee_noise_std(epsilon: float, neighbouring: str = "replace-one", parties: int = COMMITTEE_TALLIES,
                        sensitivity: int = 1) -> float:
    """Standard deviation of the committee's whole noise on one count: ``sqrt(parties / h)`` times `noise_std`.

    Args:
        epsilon: The release's epsilon, ``> 0``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.
        parties: The committee's size, ``>= 3``.
        sensitivity: The ballot's l-infinity sensitivity ``G`` (`noise_parameter`).

    Returns:
        The standard deviation.
    """
    return noise_std(epsilon, neighbouring, sensitivity) * math.sqrt(int(parties) / honest_tallies(parties))


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
    repetitions: int,
    rng: np.random.Generator,
    parties: int = COMMITTEE_TALLIES,
    per_tally: bool = False,
    sensitivity: int = 1,
) -> np.ndarray:
    """Independent winner releases for the noiseless vote counts ``vote_sum``.

    The counts plus the noise shares of ``parties`` tallies, report-noisy-max with lowest-index ties, as the
    tallies compute it: the replay of `dphype.modes.ArgmaxRelease` for benchmarks and the planner. The shares are
    drawn in one `committee_noise` draw, or with ``per_tally=True`` literally, one `committee_noise_share` per
    tally (the same law). The noise depends on neither the clients nor the dropout.

    Args:
        vote_sum: The noiseless vote counts, ``(p,)``, or one row per repetition, ``(repetitions, p)``.
        epsilon: The release's pure epsilon.
        neighbouring: The neighbouring relation, ``"replace-one"`` or ``"add-remove"``.
        repetitions: How many releases to draw.
        rng: The generator to draw from.
        parties: The committee's size, ``>= 3``.
        per_tally: Draw one share per tally and sum them, rather than their sum in one draw.
        sensitivity: The ballot's l-infinity sensitivity ``G`` (`noise_parameter`).

    Returns:
        The released indices, int64 ``(repetitions,)``.
    """
    votes = np.asarray(vote_sum)
    shape = (int(repetitions), votes.shape[-1])
    if per_tally:
        noise = np.zeros(shape, dtype=np.int64)
        for _ in range(int(parties)):
            noise += committee_noise_share(shape, epsilon, neighbouring, parties, rng=rng,
                                           sensitivity=sensitivity)
    else:
        noise = committee_noise(shape, epsilon=epsilon, neighbouring=neighbouring, parties=parties, rng=rng,
                                sensitivity=sensitivity)
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
                  survivors: int | None = None, committee: int = COMMITTEE_TALLIES,
                  excluded: tuple[str, ...] = ()) -> PrivacyReport:
    """The privacy statement of one winner release by ``clients`` clients tolerating ``dropout``.

    Pure ``release.epsilon`` (module docstring: the committee's noise of any ``h`` honest tallies carries it,
    whatever the other shares and the number of contributors); ``survivors``, the contributors whose valid ballots
    were counted, below the minimum is refused (the tallies release nothing then). The release itself has delta 0
    (``accountant`` says so); ``delta`` is the run's, at which it composes with other releases (pure
    ``epsilon``-DP is ``(epsilon, delta)``-DP for every delta). ``sigma`` is the std of the discrete Laplace that
    any ``h`` tallies' shares add up to, ``client_std`` 0 (the clients add no noise); ``l2_sensitivity`` is the
    per-count sensitivity ``G`` = ``release.sensitivity`` (what report-noisy-max needs: 1 for top-k).

    Args:
        release: The winner release.
        delta: The run's delta, in ``(0, 1)``.
        clients: The number of clients ``n``.
        dropout: The tolerated dropout fraction ``xi``.
        survivors: The number of contributors whose ballots were counted, at least the minimum survivors;
            ``None``: unknown.
        committee: The number of tallies, ``>= 3``.
        excluded: The contributors whose ballots the committee found invalid and left out (their labels).

    Returns:
        The privacy statement.

    Raises:
        ValueError: An argument is out of its range, or ``survivors`` is below the minimum.
    """  # noqa: DOC502
    clients, dropout, delta = check_clients(clients), check_dropout(dropout), check_delta(delta)
    if survivors is not None:
        survivors = check_survivors(survivors, clients, min_survivors(clients, dropout))
    std, h = release.noise_std, honest_tallies(committee)
    total = committee_noise_std(release.epsilon, release.neighbouring, committee, release.sensitivity)
    return PrivacyReport(
        epsilon=release.epsilon, delta=delta, accountant="pure epsilon (report-noisy-max; delta 0)",
        noise=WINNER_NOISE, sigma=std, client_std=0.0, clients=clients, dropout=dropout, k=release.k,
        num_candidates=release.num_candidates, survivors=survivors, neighbouring=release.neighbouring,
        l2_sensitivity=float(release.sensitivity),
        released=(f"winning index only (secure argmax among {committee} tallies on MPyC; no counts, no runner-up); "
                  f"noise made by the tallies: any {h} of the {committee} shares add up to the discrete Laplace "
                  f"above, all {committee} to std {total:.4g}"),
        pure=True, ballots_verified=True, excluded=tuple(str(label) for label in excluded),
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
