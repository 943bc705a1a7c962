"""The winner-only release (report-noisy-max with committee-made discrete Laplace noise), checked against exact
computations, a known-answer test of the tallies' shares and an empirical audit of the released index."""

import itertools
import math

import dp_accounting
import numpy as np
import pytest
from scipy.stats import chi2

from dphype.privacy.noise import check_survivors, min_survivors, secure_generator
from dphype.privacy.winner import (
    WinnerEvent,
    discrete_laplace,
    discrete_laplace_pmf,
    noise_parameter,
    noise_std,
    replay_winners,
    report_noisy_max,
    winner_probabilities,
    winner_rdp,
)


def neighbours(counts, k, neighbouring):
    """Every count vector one client away from ``counts`` (that client votes for exactly ``k`` candidates)."""
    p = len(counts)
    choices = [np.array([1 if i in s else 0 for i in range(p)]) for s in itertools.combinations(range(p), k)]
    c = np.asarray(counts)
    if neighbouring == "add-remove":
        return [c + b for b in choices]
    return [c - a + b for a in choices for b in choices if np.all(a <= c)]


def max_log_ratio(eps, neighbouring, *, calibrated_for=None):
    """Largest |log P(i | c) / P(i | c')| over small count vectors and their neighbours, k = 1 and 2."""
    cal_eps, cal_rel = calibrated_for or (eps, neighbouring)
    worst = 0.0
    for k in (1, 2):
        for c in itertools.product(range(3), repeat=3):
            pc = winner_probabilities(c, cal_eps, cal_rel)
            for d in neighbours(c, k, neighbouring):
                pd = winner_probabilities(d, cal_eps, cal_rel)
                worst = max(worst, float(np.max(np.abs(np.log(pc) - np.log(pd)))))
    return worst


@pytest.mark.parametrize("neighbouring", ["replace-one", "add-remove"])
@pytest.mark.parametrize("eps", [0.3, 1.0])
def test_exact_probability_ratio_is_at_most_e_to_the_epsilon_and_nearly_reached(eps, neighbouring):
    worst = max_log_ratio(eps, neighbouring)
    assert worst <= eps * (1 + 1e-9)
    assert worst >= 0.6 * eps  # the bound is not loose by much: the check can see a wrong calibration


def test_add_remove_calibration_is_not_enough_for_replace_one():
    # noise for add/remove (t = e^-eps) on replace-one neighbours exceeds eps: the factor 2 is needed
    assert max_log_ratio(1.0, "replace-one", calibrated_for=(1.0, "add-remove")) > 1.05


def test_exact_probabilities_match_monte_carlo_and_lowest_index_ties():
    c = np.array([3, 1, 3, 0])
    rng = np.random.default_rng(3)
    z = discrete_laplace((100_000, 4), epsilon=1.0, neighbouring="replace-one", rng=rng)
    freq = np.bincount(report_noisy_max(c + z), minlength=4) / 100_000
    exact = winner_probabilities(c, 1.0)
    assert exact.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.max(np.abs(freq - exact)) < 0.006
    assert exact[0] > exact[2]  # equal counts: the lower index wins the ties
    assert report_noisy_max(np.array([[2, 5, 5], [7, 7, 7]])).tolist() == [1, 0]


def chi_square_p_value(samples, t):
    """Chi-square goodness of fit of integer ``samples`` to discrete Laplace(t), tails pooled in the end bins."""
    lim = int(math.ceil(math.log(5.0 / len(samples)) / math.log(t)))  # expected count >= ~5 in each end bin
    edges = np.arange(-lim, lim + 1)
    pmf = discrete_laplace_pmf(edges, t)
    pmf[0] = t**lim / (1 + t)
    pmf[-1] = t**lim / (1 + t)
    observed = np.bincount(np.clip(samples, -lim, lim) + lim, minlength=edges.size)
    stat = float(np.sum((observed - len(samples) * pmf) ** 2 / (len(samples) * pmf)))
    return float(chi2.sf(stat, edges.size - 1))


@pytest.mark.parametrize(("eps", "neighbouring", "g"), [(1.0, "replace-one", 1), (0.5, "add-remove", 3)])
def test_replay_noise_is_discrete_laplace_and_a_scale_error_fails(eps, neighbouring, g):
    """The replays' noise (`discrete_laplace`, what the committee's sampler draws in the MPC) from the secure
    generator: discrete Laplace with the release's t; a 10% scale error is rejected at the same sample size."""
    total = discrete_laplace((40_000,), epsilon=eps, neighbouring=neighbouring, rng=secure_generator(), sensitivity=g)
    t = noise_parameter(eps, neighbouring, g)
    shift = {"replace-one": 2, "add-remove": 1}[neighbouring] * g
    assert chi_square_p_value(total, t) > 1e-4
    assert np.std(total) == pytest.approx(noise_std(eps, neighbouring, g), rel=0.03)
    assert chi_square_p_value(total, math.exp(-eps / (1.1 * shift))) < 1e-6
    assert chi_square_p_value(total, math.exp(-eps / (0.9 * shift))) < 1e-6


def test_replayed_winners_follow_the_exact_probabilities():
    rng = np.random.default_rng(11)
    counts = np.array([4, 5, 5, 1])
    won = replay_winners(counts, epsilon=1.0, neighbouring="replace-one", repetitions=60_000, rng=rng)
    np.testing.assert_allclose(np.bincount(won, minlength=4) / won.size, winner_probabilities(counts, 1.0), atol=0.01)


def test_winner_rdp_is_randomized_response_and_below_the_pure_dp_bounds():
    eps = 0.7
    orders = np.array([1.5, 2.0, 4.0, 16.0, 256.0])
    curve = winner_rdp(eps, orders)
    # Renyi divergence of order a between (e^eps, 1)/(1+e^eps) and its reverse, by hand
    direct = np.log((np.exp(orders * eps) + np.exp((1 - orders) * eps)) / (1 + math.exp(eps))) / (orders - 1)
    np.testing.assert_allclose(curve, direct, rtol=1e-9)
    # and dp_accounting's randomized response event (2 buckets, noise parameter 2 / (1 + e^eps))
    accountant = dp_accounting.rdp.RdpAccountant(orders=list(orders),
                                                 neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    event = dp_accounting.RandomizedResponseDpEvent(2 / (1 + math.exp(eps)), 2)
    np.testing.assert_allclose(curve, accountant.compose(event).rdp, rtol=1e-9)
    assert np.all(curve <= np.minimum(eps, orders * eps**2 / 2) + 1e-12)
    assert curve[-1] > 0.95 * eps


def test_release_description_and_bad_input():
    r = WinnerEvent(epsilon=0.5, k=3, num_candidates=10, neighbouring="add-remove")
    assert r.t == pytest.approx(math.exp(-0.5))
    assert r.noise_std == pytest.approx(math.sqrt(2 * r.t) / (1 - r.t))
    with pytest.raises(ValueError, match="k must be an integer in \\[1, 10\\]"):
        WinnerEvent(epsilon=0.5, k=11, num_candidates=10)
    with pytest.raises(ValueError, match="epsilon must be"):
        WinnerEvent(epsilon=0.0, k=1, num_candidates=10)
    with pytest.raises(ValueError, match="neighbouring must be one of"):
        noise_parameter(1.0, "swap")
    with pytest.raises(ValueError, match=r"survivors must be an integer in \[8, 10\]"):
        check_survivors(7, 10, min_survivors(10, 0.2))
    assert check_survivors(8, 10, min_survivors(10, 0.2)) == 8


def graded_neighbours(counts, max_entry, neighbouring):
    """Every count vector one client away from ``counts`` when a ballot is any vector of entries in [0, G]."""
    p = len(counts)
    ballots = [np.array(b) for b in itertools.product(range(max_entry + 1), repeat=p)]
    c = np.asarray(counts)
    if neighbouring == "add-remove":
        return [c + b for b in ballots]
    return [c - a + b for a in ballots for b in ballots if np.all(a <= c)]


@pytest.mark.parametrize("neighbouring", ["replace-one", "add-remove"])
def test_graded_ballots_exact_ratio_is_at_most_e_to_the_epsilon_with_sensitivity_g(neighbouring):
    eps, g = 0.8, 3
    worst = 0.0
    for c in itertools.product(range(0, 2 * g + 1, 2), repeat=2):
        pc = winner_probabilities(c, eps, neighbouring, sensitivity=g)
        for d in graded_neighbours(c, g, neighbouring):
            pd = winner_probabilities(d, eps, neighbouring, sensitivity=g)
            worst = max(worst, float(np.max(np.abs(np.log(pc) - np.log(pd)))))
    assert 0.6 * eps <= worst <= eps * (1 + 1e-9)
    # the top-k calibration (G = 1) on the same graded neighbours breaks the claim
    c = np.array([0, 2 * g]) if neighbouring == "add-remove" else np.array([g, g])
    d = c + np.array([g, 0]) if neighbouring == "add-remove" else c + np.array([g, -g])
    broken = np.abs(np.log(winner_probabilities(c, eps, neighbouring)) - np.log(winner_probabilities(d, eps,
                                                                                                     neighbouring)))
    assert broken.max() > 1.5 * eps


@pytest.mark.parametrize(("neighbouring", "shift"), [("replace-one", 2), ("add-remove", 1)])
@pytest.mark.parametrize("g", [1, 3, 15])
def test_calibration_against_the_closed_form(neighbouring, shift, g):
    eps = 0.7
    t = math.exp(-eps / (shift * g))  # written out here, independently of the module
    assert noise_parameter(eps, neighbouring, g) == pytest.approx(t, rel=1e-12)
    assert noise_std(eps, neighbouring, g) == pytest.approx(math.sqrt(2 * t) / (1 - t), rel=1e-12)
    # the variance of the discrete Laplace law by summation
    z = np.arange(-20_000, 20_001)
    assert float(np.sum(z**2 * discrete_laplace_pmf(z, t))) == pytest.approx(noise_std(eps, neighbouring, g) ** 2,
                                                                               rel=1e-9)
    release = WinnerEvent(epsilon=eps, k=2, num_candidates=5, neighbouring=neighbouring, sensitivity=g)
    assert release.t == pytest.approx(t) and release.noise_std == pytest.approx(noise_std(eps, neighbouring, g))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_sensitivity_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="sensitivity must be an integer >= 1"):
        noise_parameter(1.0, "replace-one", bad)
    with pytest.raises(ValueError, match="sensitivity must be an integer >= 1"):
        WinnerEvent(epsilon=1.0, k=1, num_candidates=3, sensitivity=bad)


def test_composed_epsilon_counts_every_winner_releases_sampler_delta():
    from dphype.privacy.accounting import RDP_ORDERS, rdp_epsilon
    from dphype.privacy.winner import epsilon_with_samplers, sampler_delta

    curve = 3 * winner_rdp(1.0, RDP_ORDERS)
    exact = rdp_epsilon(curve, 1e-5)[0]
    eps = epsilon_with_samplers(curve, 1e-5, 3)
    # at a delta less the samplers' part: a hair above the exact releases' epsilon, and the sum stays within delta
    assert exact <= eps <= exact * (1 + 1e-6)
    assert epsilon_with_samplers(curve, 1e-5, 0) == exact
    assert sampler_delta(eps, 3) < 1e-5 * 1e-9
    # samplers whose part is not negligible at this epsilon: no finite claim
    assert epsilon_with_samplers(curve, 1e-5, 10**20) == math.inf
