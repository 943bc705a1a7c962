"""Empirical privacy audit of the client noise path (Jagielski, Ullman & Oprea 2020; Nasr et al. 2021).

If a mechanism is ``(eps, delta)``-DP, every test that tells neighbouring inputs apart satisfies
``FPR + e^eps FNR >= 1 - delta`` (and symmetrically). Running the mechanism ``N`` times on each neighbour and
bounding both error rates from above with one-sided Clopper-Pearson intervals (level ``beta/2`` each) gives
``eps_lb = log((1 - delta - FNR_ub) / FPR_ub)``, a lower bound on the true epsilon with probability
``>= 1 - beta``. An ``eps_lb`` above the claimed epsilon proves the implementation adds too little noise.

The mechanism audited is the REAL one: the neighbour's vote sum plus the surviving clients'
`dphype.privacy.noise.noise_share` outputs, ``sigma`` from `dphype.privacy.accounting.calibrate`. Neighbours
``D, D'`` differ in one client who moves its ``k`` votes, so the vote sums differ by ``w`` with ``k`` entries
``+1`` and ``k`` entries ``-1`` (``||w|| = sqrt(2k)``, Lemma III.1); coordinates where they agree carry noise
independent of the statistic and are left out. The statistic is ``y = <out - f(D'), w> / ||w||``; the test
guesses ``D`` when ``y > t`` for a threshold ``t`` fixed before sampling.

One ``delta`` alone makes a weak audit (only far-tail thresholds can show a large ``eps_lb``), so the same two
bounds are also checked against the whole privacy profile of the noise the accountant analysed
(`claimed_profile`, exact for Gaussian and Skellam noise): every ``(eps', delta(eps'))`` pair bounds both error
rates, and near the centre of the two laws far fewer trials refute too small a noise (`profile_excess`). The bounds
hold together with probability ``>= 1 - beta``, so a correct implementation (whose statistic has exactly the
claimed profile, or a smaller one when more than ``ceil((1 - xi) n)`` clients add noise) is flagged with
probability at most ``beta`` whatever the number of ``eps'`` checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta as beta_dist
from scipy.stats import norm

from dphype.checks import DEFAULT_NOISE, check_delta, check_epsilon, check_int, check_k
from dphype.privacy.accounting import calibrate
from dphype.privacy.noise import check_survivors, min_survivors, noise_share
from dphype.privacy.noise_kinds import noise_kind, resolve_accountant

ShareFn = Callable[..., np.ndarray]


def clopper_pearson_upper(successes: int, trials: int, alpha: float) -> float:
    """One-sided ``(1 - alpha)`` Clopper-Pearson upper bound on a binomial rate: ``Beta(1 - alpha; x + 1, n - x)``.

    Args:
        successes: The count ``x``, in ``[0, trials]``.
        trials: The number of trials ``n``, ``>= 1``.
        alpha: The level, in ``(0, 1)``.

    Returns:
        The upper bound, 1 when every trial succeeded.

    Raises:
        ValueError: An argument is out of its range.
    """
    if not 0 <= successes <= trials or trials < 1:
        raise ValueError(f"successes must be in [0, trials] with trials >= 1, got {successes}/{trials}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if successes == trials:
        return 1.0
    return float(beta_dist.ppf(1.0 - alpha, successes + 1, trials - successes))


def epsilon_lower_bound(
    false_positives: int, false_negatives: int, trials: int, delta: float, confidence: float = 0.95
) -> tuple[float, float, float]:
    """A lower bound on epsilon from the error counts of ``trials`` runs per neighbour.

    Both one-sided Clopper-Pearson bounds hold together with probability ``>= confidence``; then
    ``eps >= log((1 - delta - FNR_ub)/FPR_ub)`` and, swapping the neighbours,
    ``eps >= log((1 - delta - FPR_ub)/FNR_ub)``.

    Args:
        false_positives: The test's false positives (guessed ``D`` on ``D'``).
        false_negatives: Its false negatives (guessed ``D'`` on ``D``).
        trials: Runs per neighbour.
        delta: The claimed delta.
        confidence: The probability with which both bounds hold together.

    Returns:
        ``(eps_lb, FPR_ub, FNR_ub)``: the larger lower bound (0 if neither is positive) and the two upper bounds.

    Raises:
        ValueError: A count is out of ``[0, trials]`` or the confidence is out of ``(0, 1)``.
    """  # noqa: DOC502
    level = (1.0 - confidence) / 2.0
    fpr_ub = clopper_pearson_upper(false_positives, trials, level)
    fnr_ub = clopper_pearson_upper(false_negatives, trials, level)
    best = 0.0
    for numerator, denominator in ((1.0 - delta - fnr_ub, fpr_ub), (1.0 - delta - fpr_ub, fnr_ub)):
        if numerator > 0.0:
            best = max(best, math.log(numerator / denominator))
    return best, fpr_ub, fnr_ub


#: Epsilons (multiples of the claimed epsilon) at which the claimed privacy profile is checked.
PROFILE_GRID: np.ndarray = np.linspace(0.0, 4.0, 401)


def claimed_profile(epsilons: np.ndarray, *, sigma: float, k: int, noise: str) -> np.ndarray:
    """The claimed ``(E,)`` profile ``delta(eps')`` of the audit statistic at total noise std ``sigma``.

    `dphype.privacy.noise_kinds.NoiseKind.vote_profile`: the hockey-stick divergence between the statistic's laws
    under ``D`` and ``D'`` (Gaussian: the analytic Gaussian delta; Skellam: summed exactly over the support).
    """
    return noise_kind(noise).vote_profile(np.asarray(epsilons, dtype=np.float64), sigma, k)


def profile_excess(
    false_positives: np.ndarray | int,
    false_negatives: np.ndarray | int,
    trials: int,
    epsilons: np.ndarray,
    deltas: np.ndarray,
    confidence: float = 0.95,
) -> tuple[np.ndarray, np.ndarray]:
    """By how much the error counts refute the claimed profile ``deltas`` at ``epsilons`` (vectorised over counts).

    An ``(eps', delta')``-DP mechanism has ``delta' >= 1 - FNR - e^eps' FPR`` and ``delta' >= 1 - FPR - e^eps' FNR``
    for every test. With `epsilon_lower_bound`'s bounds this gives ``delta_lb(eps')`` at every ``eps'`` at once;
    ``excess = max over eps' of delta_lb - delta_claim``, positive when provably less private than claimed.

    Args:
        false_positives: A count, or ``(C,)`` counts.
        false_negatives: As many counts as ``false_positives``.
        trials: Runs per neighbour.
        epsilons: ``(E,)`` epsilons ``eps'``.
        deltas: ``(E,)`` claimed deltas at ``epsilons`` (`claimed_profile`).
        confidence: The probability with which both bounds hold together.

    Returns:
        ``(excess, epsilon)``: ``(C,)`` excesses and the ``(C,)`` epsilons where they are attained.
    """
    level = (1.0 - confidence) / 2.0
    fp, fn = np.atleast_1d(false_positives), np.atleast_1d(false_negatives)
    fpr_ub = np.where(fp >= trials, 1.0, beta_dist.ppf(1.0 - level, fp + 1, np.maximum(trials - fp, 1)))
    fnr_ub = np.where(fn >= trials, 1.0, beta_dist.ppf(1.0 - level, fn + 1, np.maximum(trials - fn, 1)))
    growth = np.exp(np.asarray(epsilons, dtype=np.float64))[None, :]
    fpr_ub, fnr_ub = fpr_ub[:, None], fnr_ub[:, None]
    lower = np.maximum(1.0 - fnr_ub - growth * fpr_ub, 1.0 - fpr_ub - growth * fnr_ub)
    gap = lower - np.asarray(deltas, dtype=np.float64)[None, :]
    best = np.argmax(gap, axis=1)
    return gap[np.arange(len(best)), best], np.asarray(epsilons)[best]


def design_threshold(
    sigma: float,
    l2: float,
    trials: int,
    epsilons: np.ndarray,
    deltas: np.ndarray,
    confidence: float = 0.95,
    std_factor: float = 0.7,
) -> float:
    """Threshold chosen before sampling: best for refuting the claimed profile when the noise is too small.

    The design alternative is noise of std ``s = std_factor * sigma`` (0.7: a sensitivity ``sqrt(2)`` too small, or a
    share of half the variance): ``y ~ N(0, s^2)`` under ``D'``, ``N(l2, s^2)`` under ``D``. For each ``t`` on a grid
    the error counts are set one binomial std above their expectations, and the ``t`` maximising `profile_excess` is
    returned. It depends only on the configuration, never on the samples.

    Args:
        sigma: The claimed noise's total std.
        l2: The L2 sensitivity ``sqrt(2k)``.
        trials: Runs per neighbour.
        epsilons: ``(E,)`` epsilons ``eps'``.
        deltas: ``(E,)`` claimed deltas at ``epsilons``.
        confidence: The probability with which both error-rate bounds hold together.
        std_factor: The design alternative's noise std as a multiple of ``sigma``.

    Returns:
        The threshold ``t`` on the statistic.
    """
    s = std_factor * sigma
    ts = np.linspace(l2 / 2.0, l2 / 2.0 + 4.0 * s, 161)
    p_fp, p_fn = norm.sf(ts / s), norm.cdf((ts - l2) / s)
    fp = np.floor(np.minimum(trials, trials * p_fp + np.sqrt(trials * p_fp * (1 - p_fp)))).astype(int)
    fn = np.floor(np.minimum(trials, trials * p_fn + np.sqrt(trials * p_fn * (1 - p_fn)))).astype(int)
    excess, _ = profile_excess(fp, fn, trials, epsilons, deltas, confidence)
    return float(ts[int(np.argmax(excess))])


@dataclass(frozen=True)
class AuditResult:
    """Outcome of `audit_vote_noise`; ``flagged`` means the noise is provably too small.

    Attributes:
        epsilon_lb: The lower bound on epsilon at ``delta`` (`epsilon_lower_bound`).
        claimed_epsilon: The epsilon audited.
        delta: The delta audited.
        sigma: The calibrated total noise std.
        noise: The noise kind's name.
        survivors: The number of clients whose shares were summed.
        threshold: The test's threshold on the statistic.
        trials: Runs per neighbour.
        false_positives: Guessed ``D`` on ``D'``.
        false_negatives: Guessed ``D'`` on ``D``.
        fpr_upper: The upper bound on the false-positive rate.
        fnr_upper: The upper bound on the false-negative rate.
        confidence: The probability with which the bounds hold together.
        profile_excess: The largest excess of the measured over the claimed profile (`profile_excess`).
        profile_epsilon: The ``eps'`` where it is attained.
    """

    epsilon_lb: float
    claimed_epsilon: float
    delta: float
    sigma: float
    noise: str
    survivors: int
    threshold: float
    trials: int
    false_positives: int
    false_negatives: int
    fpr_upper: float
    fnr_upper: float
    confidence: float
    profile_excess: float
    profile_epsilon: float

    @property
    def flagged(self) -> bool:
        """True when the samples refute the claim: ``epsilon_lb`` above it, or ``profile_excess > 0``."""
        return self.epsilon_lb > self.claimed_epsilon or self.profile_excess > 0.0


def audit_vote_noise(
    *,
    epsilon: float,
    delta: float,
    k: int,
    clients: int,
    dropout: float = 0.0,
    noise: str = DEFAULT_NOISE,
    accountant: str | None = None,
    trials: int = 30_000,
    seed: int = 0,
    confidence: float = 0.95,
    threshold: float | None = None,
    share_fn: ShareFn = noise_share,
    survivors: int | None = None,
) -> AuditResult:
    """Audit the client noise path for a claimed ``(epsilon, delta)`` with ``trials`` runs per neighbour.

    Each run sums ``share_fn`` outputs of ``survivors`` clients (pass a wrapped ``share_fn`` to audit a modified
    implementation); one ``(trials, 2k)`` draw per client and neighbour.

    Args:
        epsilon: The claimed epsilon, ``> 0``.
        delta: The claimed delta, in ``(0, 1)``.
        k: Votes per client.
        clients: The number of clients ``n``.
        dropout: The tolerated dropout fraction ``xi``.
        noise: The noise kind's name.
        accountant: ``"analytic"``, ``"rdp"``, or ``None``/``"auto"`` for the noise kind's default.
        trials: Runs per neighbour, ``>= 100``.
        seed: Seeds the draws.
        confidence: The probability with which the error-rate bounds hold together, in ``(0, 1)``.
        threshold: The test's threshold; ``None``: `design_threshold`.
        share_fn: The noise path audited, with the signature of `dphype.privacy.noise.noise_share`.
        survivors: The clients whose shares are summed; ``None``: ``min_survivors(clients, dropout)``, the worst
            case the accounting must cover.

    Returns:
        The audit's counts, bounds and verdict (``flagged``).

    Raises:
        ValueError: An argument is out of its range.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    k = check_k(k)
    accountant = resolve_accountant(accountant, noise)
    check_int("trials", trials, 100)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    release = calibrate(epsilon, delta, k, accountant=accountant, noise=noise)
    survivors = min_survivors(clients, dropout) if survivors is None else check_survivors(survivors, clients)

    l2 = release.l2_sensitivity
    w = np.concatenate([np.ones(k), -np.ones(k)])
    # D': every survivor votes for the last k of these 2k candidates; D: one of them moves to the first k.
    sum_d_prime = np.concatenate([np.zeros(k), np.full(k, float(survivors))])
    sum_d = sum_d_prime + w
    epsilons = PROFILE_GRID * epsilon
    deltas = claimed_profile(epsilons, sigma=release.sigma, k=k, noise=noise)
    if threshold is None:
        t = design_threshold(release.sigma, l2, trials, epsilons, deltas, confidence)
    else:
        t = float(threshold)

    rng = np.random.default_rng(seed)
    statistics = []
    for votes in (sum_d, sum_d_prime):
        total = np.zeros((trials, 2 * k))
        for _ in range(survivors):
            total += share_fn(
                (trials, 2 * k), sigma=release.sigma, clients=clients, dropout=dropout, kind=noise, rng=rng
            )
        statistics.append(((votes + total) - sum_d_prime) @ w / l2)
    y_d, y_d_prime = statistics
    false_negatives = int(np.count_nonzero(y_d <= t))
    false_positives = int(np.count_nonzero(y_d_prime > t))
    eps_lb, fpr_ub, fnr_ub = epsilon_lower_bound(false_positives, false_negatives, trials, delta, confidence)
    excess, at = profile_excess(false_positives, false_negatives, trials, epsilons, deltas, confidence)
    return AuditResult(
        epsilon_lb=eps_lb,
        claimed_epsilon=epsilon,
        delta=delta,
        sigma=release.sigma,
        noise=noise,
        survivors=survivors,
        threshold=t,
        trials=trials,
        false_positives=false_positives,
        false_negatives=false_negatives,
        fpr_upper=fpr_ub,
        fnr_upper=fnr_ub,
        confidence=confidence,
        profile_excess=float(excess[0]),
        profile_epsilon=float(at[0]),
    )
