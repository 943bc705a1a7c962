"""Empirical privacy audit of the real client noise path (Clopper-Pearson bounds against the claimed profile)."""

import math

import numpy as np
import pytest
from helpers import sampled_noise
from scipy.stats import binom, skellam

from dphype.privacy.accounting import calibrate
from dphype.privacy.audit import (
    PROFILE_GRID,
    audit_vote_noise,
    claimed_profile,
    clopper_pearson_upper,
    design_threshold,
    epsilon_lower_bound,
)
from dphype.privacy.noise import client_noise_share, noise_share


def scaled_share(factor):
    """A deliberately broken client: ``factor`` times the calibrated noise std."""

    def share(size, *, sigma, **kwargs):
        return noise_share(size, sigma=sigma * factor, **kwargs)

    return share


def secure_share(size, *, rng, **kwargs):
    """The client path: shares from the OS-keyed ChaCha20 generator (the audit's seeded rng is unused)."""
    return client_noise_share(size, **kwargs)


def third_secure_share(size, *, rng, sigma, **kwargs):
    """A broken secure client: a third of the calibrated noise std."""
    return client_noise_share(size, sigma=sigma / 3.0, **kwargs)


def test_clopper_pearson_upper_is_exact_one_sided_bound():
    n, alpha = 200, 0.025
    for x in (0, 3, 50, 199):
        ub = clopper_pearson_upper(x, n, alpha)
        # defining property: P[Bin(n, ub) <= x] = alpha
        assert binom.cdf(x, n, ub) == pytest.approx(alpha, rel=1e-6)
    assert clopper_pearson_upper(n, n, alpha) == 1.0
    assert clopper_pearson_upper(0, n, alpha) == pytest.approx(1 - alpha ** (1 / n))


def test_epsilon_lower_bound_formula():
    eps, fpr_ub, fnr_ub = epsilon_lower_bound(30, 29000, 30000, 1e-5, confidence=0.95)
    assert eps == pytest.approx(math.log((1 - 1e-5 - fnr_ub) / fpr_ub))
    # a perfect distinguisher with few trials still gives only a finite bound
    eps_perfect, _, _ = epsilon_lower_bound(0, 0, 1000, 1e-5)
    assert 0 < eps_perfect < math.log(1000)
    # indistinguishable -> no evidence
    assert epsilon_lower_bound(15000, 15000, 30000, 1e-5)[0] == 0.0


def profile(sigma, k, noise, epsilon=1.0):
    epsilons = PROFILE_GRID * epsilon
    return epsilons, claimed_profile(epsilons, sigma=sigma, k=k, noise=noise)


def test_threshold_is_fixed_by_configuration_only():
    sigma = calibrate(1.0, 1e-5, 5, noise="gaussian").sigma
    t1 = design_threshold(sigma, math.sqrt(10), 30000, *profile(sigma, 5, "gaussian"))
    t2 = design_threshold(sigma, math.sqrt(10), 30000, *profile(sigma, 5, "gaussian"))
    assert t1 == t2 and math.sqrt(10) / 2 <= t1 < 4 * sigma


@pytest.mark.parametrize("k", [1, 2])
def test_skellam_profile_is_the_exact_divergence_of_the_statistic(k):
    # independent of the "Poisson laws add" argument: convolve the 2k coordinates' Skellam pmfs explicitly
    sigma = 3.0
    support = np.arange(-60, 61)
    one = skellam.pmf(support, sigma**2 / 2, sigma**2 / 2)
    law = one
    for _ in range(2 * k - 1):
        law = np.convolve(law, one)  # <noise, w> = sum of +-coordinates; symmetric, so signs do not matter
    shifted = np.concatenate([np.zeros(2 * k), law[:-2 * k]])  # the law of <noise, w> + 2k under D
    epsilons = np.array([0.0, 0.3, 1.0, 2.0])
    expected = [np.maximum(shifted - math.exp(e) * law, 0.0).sum() for e in epsilons]
    np.testing.assert_allclose(claimed_profile(epsilons, sigma=sigma, k=k, noise="skellam"), expected, rtol=1e-9,
                               atol=1e-12)


@pytest.mark.parametrize("noise", ["gaussian", "skellam"])
def test_claimed_profile_is_within_the_accountants_guarantee(noise):
    release = calibrate(1.0, 1e-5, 5, noise=noise)
    (at_claim,) = claimed_profile(np.array([1.0]), sigma=release.sigma, k=5, noise=noise)
    assert at_claim <= 1e-5 * (1 + 1e-6)  # the exact profile is at most what the accountant states
    if noise == "gaussian":
        assert at_claim == pytest.approx(1e-5, rel=1e-4)  # the analytic accountant is exact


@pytest.mark.parametrize(
    "noise,clients,dropout",
    [("gaussian", 50, 0.1), ("skellam", 10, 0.3)],
)
@pytest.mark.parametrize("factor", [0.71, 0.5])  # 0.71: a sensitivity sqrt(2) too small
def test_correct_noise_passes_and_too_little_noise_is_caught(noise, clients, dropout, factor):
    kw = dict(epsilon=1.0, delta=1e-5, k=5, clients=clients, dropout=dropout, noise=noise, trials=30_000)
    good = audit_vote_noise(seed=1, **kw)
    assert not good.flagged and good.epsilon_lb < good.claimed_epsilon and good.profile_excess < 0
    assert good.survivors == math.ceil((1 - dropout) * clients - 1e-9)
    bad = audit_vote_noise(seed=2, share_fn=scaled_share(factor), **kw)
    assert bad.threshold == good.threshold  # fixed in advance, not fitted to the samples
    assert bad.flagged and bad.profile_excess > 0 and 0 <= bad.profile_epsilon <= 4.0


def test_correct_noise_never_flagged_over_seeds():
    # false alarms must be rare: the bound is valid with prob >= 95% and the test is far from tight
    audits = [audit_vote_noise(epsilon=1.0, delta=1e-5, k=5, clients=4, noise=noise, trials=30_000, seed=s)
              for s in range(4) for noise in ("gaussian", "skellam")]
    assert not any(a.flagged for a in audits) and max(a.epsilon_lb for a in audits) < 1.0


def test_audit_bad_input():
    with pytest.raises(ValueError, match="trials"):
        audit_vote_noise(epsilon=1.0, delta=1e-5, k=5, clients=10, trials=10, noise="gaussian")
    with pytest.raises(ValueError, match="survivors"):
        audit_vote_noise(epsilon=1.0, delta=1e-5, k=5, clients=10, survivors=11, noise="gaussian")
    with pytest.raises(ValueError, match="epsilon"):
        audit_vote_noise(epsilon=0.0, delta=1e-5, k=5, clients=10, noise="gaussian")


def test_audit_uses_the_shares_it_is_given():
    calls = []

    def spy(size, **kwargs):
        calls.append((size, kwargs["kind"]))
        return noise_share(size, **kwargs)

    audit_vote_noise(epsilon=1.0, delta=1e-5, k=2, clients=5, trials=500, share_fn=spy, noise="skellam")
    assert calls == [((500, 4), "skellam")] * 10  # 5 survivors x 2 neighbours, shape (trials, 2k)


@pytest.mark.parametrize("noise,clients,dropout", [("gaussian", 10, 0.1), ("skellam", 4, 0.25)])
def test_audit_of_the_secure_client_path(noise, clients, dropout):
    # The secure generator cannot be seeded, so the audit runs at confidence 1 - 1e-6: a correct
    # implementation is flagged with probability <= 1e-6. The threshold, fixed in advance, is designed
    # against a third of the noise std, which the audit then catches with a wide margin.
    confidence = 1 - 1e-6
    sigma = calibrate(1.0, 1e-5, 5, noise=noise).sigma
    threshold = design_threshold(sigma, math.sqrt(10), 30_000, *profile(sigma, 5, noise), confidence, std_factor=1 / 3)
    kw = dict(epsilon=1.0, delta=1e-5, k=5, clients=clients, dropout=dropout, noise=noise, trials=30_000)
    kw.update(confidence=confidence, threshold=threshold)
    assert not audit_vote_noise(share_fn=secure_share, **kw).flagged
    assert audit_vote_noise(share_fn=third_secure_share, **kw).flagged


def committee_sampler(epsilon):
    """The committee's noise sampler for an argmax request, through the real tally path (`ArgmaxRelease.tally_noise`,
    which a tally node calls)."""
    from dphype.config import DPHypeConfig
    from dphype.protocol import make_vote_request
    from dphype.selection.candidates import candidate_grid

    config = DPHypeConfig(epsilon=epsilon, delta=1e-5, k=1, clients=10, release="argmax")
    request = make_vote_request(config, candidate_grid(lr=[1.0, 2.0]), tallies=tuple(bytes([j + 1]) * 32
                                                                                     for j in range(3)))
    return request.mode.tally_noise(request)


def test_audit_of_the_committees_sampled_noise():
    """The argmax release with the committee's noise, drawn from the exact law of its MPC sampler, on
    counts one client apart (replace-one: its vote moves from candidate 1 to 0). The Clopper-Pearson lower bound on
    epsilon stays below the claim; a sampler made for 3 times the epsilon (a third of the noise scale) is caught."""
    from dphype.privacy.winner import report_noisy_max

    trials = 30_000
    d, d_prime = np.array([1, 0]), np.array([0, 1])

    def audit(epsilon):
        sampler = committee_sampler(epsilon)
        false_neg = int(np.sum(report_noisy_max(d + sampled_noise(sampler, (trials, 2))) != 0))
        false_pos = int(np.sum(report_noisy_max(d_prime + sampled_noise(sampler, (trials, 2))) == 0))
        return epsilon_lower_bound(false_pos, false_neg, trials, delta=0.0)[0]

    honest = audit(1.0)
    assert 0.5 < honest <= 1.0  # 2 counts: the exact log ratio is 0.57
    assert audit(3.0) > 1.0


@pytest.mark.parametrize("neighbouring", ["replace-one", "add-remove"])
def test_audit_of_the_winner_release_with_graded_ballots(neighbouring):
    """The argmax release with ballots of entries in [0, 15] (G = 15), with the committee's sampled noise.

    The neighbours are the worst case of a graded ballot: one client moves G from one candidate to the other
    (replace-one) or adds G to one (add-remove). The test "index 0 wins" must not show more than epsilon, and a
    client whose noise is calibrated for top-k (G = 1) is caught.
    """
    from dphype.privacy.winner import JointSampler, report_noisy_max

    eps, trials, g = 1.0, 30_000, 15
    if neighbouring == "replace-one":
        d, d_prime = np.array([g, 0]), np.array([0, g])
    else:
        d, d_prime = np.array([g, 0]), np.array([g, g])

    def released(counts, sensitivity):
        sampler = JointSampler.for_release(2, eps, neighbouring, sensitivity)
        return report_noisy_max(counts + sampled_noise(sampler, (trials, 2)))

    def audit(sensitivity):
        false_neg = int(np.sum(released(d, sensitivity) != 0))  # guess D when index 0 wins
        false_pos = int(np.sum(released(d_prime, sensitivity) == 0))
        return epsilon_lower_bound(false_pos, false_neg, trials, delta=0.0)[0]

    honest = audit(g)
    assert 0.3 * eps < honest <= eps
    assert audit(1) > 2 * eps  # noise calibrated for top-k ballots on graded ones is caught
