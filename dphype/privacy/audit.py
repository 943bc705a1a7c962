"""Empirical privacy audit of the client noise path (dp-facts.md, "Empirical audit of the noise code").

If a mechanism is ``(eps, delta)``-DP, every test that tells neighbouring inputs apart satisfies
``FPR + e^eps FNR >= 1 - delta`` (and symmetrically). Running the mechanism ``N`` times on each
neighbour and bounding both error rates from above with one-sided Clopper-Pearson intervals (level
``beta/2`` each) gives ``eps_lb = log((1 - delta - FNR_ub) / FPR_ub)``, a lower bound on the true epsilon
with probability ``>= 1 - beta`` (Jagielski, Ullman & Oprea 2020; Nasr et al. 2021). An ``eps_lb``
above the claimed epsilon proves the implementation adds too little noise.

The mechanism audited is the REAL one: the released vector is the neighbour's vote sum plus the sum of
:func:`dphype.privacy.noise.noise_share` outputs of the surviving clients, with ``sigma`` from
:func:`dphype.privacy.accounting.calibrate`. Neighbours ``D, D'`` differ in one client who moves its ``k`` votes,
so the vote sums differ by ``w`` with ``k`` entries ``+1`` and ``k`` entries ``-1`` (``||w|| = sqrt(2k)``,
Lemma III.1). Coordinates where the sums agree carry noise independent of the test statistic and are
left out. The statistic is ``y = <out - f(D'), w> / ||w||``; the test guesses ``D`` when ``y > t`` for a
threshold ``t`` fixed before sampling.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta as beta_dist
from scipy.stats import norm

from dphype.checks import check_delta, check_epsilon, check_int, check_k, resolve_accountant
from dphype.privacy.accounting import calibrate
from dphype.privacy.noise import check_survivors, min_survivors, noise_share

ShareFn = Callable[..., np.ndarray]


def clopper_pearson_upper(successes: int, trials: int, alpha: float) -> float:
    """One-sided ``(1 - alpha)`` Clopper-Pearson upper bound on a binomial rate: ``Beta(1 - alpha; x + 1, n - x)``."""
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
    """``(eps_lb, FPR_ub, FNR_ub)`` from error counts of ``trials`` runs per neighbour.

    Both one-sided Clopper-Pearson bounds hold together with probability ``>= confidence`` (each at level
    ``(1 - confidence)/2``); then ``eps >= log((1 - delta - FNR_ub)/FPR_ub)`` and, swapping the roles of
    the neighbours, ``eps >= log((1 - delta - FPR_ub)/FNR_ub)``. The larger one is returned (0 if neither
    is positive).
    """
    level = (1.0 - confidence) / 2.0
    fpr_ub = clopper_pearson_upper(false_positives, trials, level)
    fnr_ub = clopper_pearson_upper(false_negatives, trials, level)
    best = 0.0
    for numerator, denominator in ((1.0 - delta - fnr_ub, fpr_ub), (1.0 - delta - fpr_ub, fnr_ub)):
        if numerator > 0.0:
            best = max(best, math.log(numerator / denominator))
    return best, fpr_ub, fnr_ub


def design_threshold(
    sigma: float, l2: float, trials: int, delta: float, confidence: float = 0.95, std_factor: float = 0.5
) -> float:
    """Threshold chosen before sampling: best for catching noise of std ``std_factor * sigma``.

    Under that design alternative ``y`` is ``N(0, s^2)`` for ``D'`` and ``N(l2, s^2)`` for ``D``
    (``s = std_factor * sigma``). For each ``t`` on a grid the error counts are set one binomial standard
    deviation above their expectations (a lower-quantile design, so the test keeps its power when counts
    fluctuate), and the ``t`` maximising :func:`epsilon_lower_bound` is returned. Depends only on the
    configuration, never on the audit's samples.
    """
    s = std_factor * sigma
    ts = np.linspace(l2 / 2.0, l2 / 2.0 + 8.0 * s, 801)
    p_fp, p_fn = norm.sf(ts / s), norm.cdf((ts - l2) / s)
    fp = np.floor(np.minimum(trials, trials * p_fp + np.sqrt(trials * p_fp * (1 - p_fp)))).astype(int)
    fn = np.floor(np.minimum(trials, trials * p_fn + np.sqrt(trials * p_fn * (1 - p_fn)))).astype(int)
    scores = [epsilon_lower_bound(int(a), int(b), trials, delta, confidence)[0] for a, b in zip(fp, fn)]
    return float(ts[int(np.argmax(scores))])


@dataclass(frozen=True)
class AuditResult:
    """Outcome of :func:`audit_vote_noise`; ``flagged`` means the noise is provably too small."""

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

    @property
    def flagged(self) -> bool:
        """True when the empirical lower bound exceeds the claimed epsilon."""
        return self.epsilon_lb > self.claimed_epsilon


def audit_vote_noise(
    *,
    epsilon: float,
    delta: float,
    k: int,
    clients: int,
    dropout: float = 0.0,
    noise: str = "gaussian",
    accountant: str | None = None,
    trials: int = 30_000,
    seed: int = 0,
    confidence: float = 0.95,
    threshold: float | None = None,
    share_fn: ShareFn = noise_share,
    survivors: int | None = None,
) -> AuditResult:
    """Audit the client noise path for a claimed ``(epsilon, delta)`` with ``trials`` runs per neighbour.

    ``sigma`` comes from :func:`dphype.privacy.accounting.calibrate`; each run sums ``share_fn`` outputs (same
    signature as :func:`dphype.privacy.noise.noise_share`) of ``survivors`` clients (default: the fewest allowed,
    ``min_survivors(clients, dropout)``, the worst case the accounting must cover). Pass a wrapped
    ``share_fn`` to audit a modified implementation. ``threshold=None`` uses :func:`design_threshold`.
    Vectorised: one ``(trials, 2k)`` draw per client and neighbour.
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
    t = design_threshold(release.sigma, l2, trials, delta, confidence) if threshold is None else float(threshold)

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
    )
