"""RDP composition of releases (votes, DP-FedAvg rounds) against dp_accounting (RDP, PLD), Opacus and an
independent numerical Renyi divergence of the Skellam mechanism."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent
from opacus.accountants.utils import get_noise_multiplier
from scipy.special import logsumexp
from scipy.stats import skellam

from dphype.privacy.accounting import (
    RDP_ORDERS,
    calibrate,
    calibrate_fedavg,
    fedavg_epsilon,
    fedavg_rdp,
    rdp_epsilon,
    vote_rdp,
    vote_sensitivity,
)
from dphype.privacy.noise_kinds import skellam_rdp_epsilon

DELTA = 1e-5


def test_vote_sensitivity_per_neighbouring_relation():
    assert vote_sensitivity(5) == (math.sqrt(10), 10.0)
    assert vote_sensitivity(5, "add-remove") == (math.sqrt(5), 5.0)
    with pytest.raises(ValueError, match="neighbouring must be one of replace-one, add-remove"):
        vote_sensitivity(5, "replace-two")


@pytest.mark.parametrize("neighbouring,l2sq", [("replace-one", 10.0), ("add-remove", 5.0)])
def test_gaussian_vote_curve_is_thm_iii1_and_matches_opacus(neighbouring, l2sq):
    sigma = 12.8
    curve = vote_rdp(5, sigma, "gaussian", neighbouring=neighbouring)
    np.testing.assert_allclose(curve, RDP_ORDERS * l2sq / (2 * sigma**2), rtol=1e-12)
    opacus = compute_rdp(q=1.0, noise_multiplier=sigma / math.sqrt(l2sq), steps=1, orders=RDP_ORDERS)
    np.testing.assert_allclose(curve, opacus, rtol=1e-12)


@pytest.mark.parametrize("releases,sigma", [(1, 11.8), (20, 30.0)])
def test_composed_gaussian_votes_match_dp_accounting_rdp_and_bound_pld(releases, sigma):
    eps, _ = rdp_epsilon(releases * vote_rdp(5, sigma, "gaussian"), DELTA)
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma / math.sqrt(10)), releases)
    reference = dp_accounting.rdp.RdpAccountant(orders=list(RDP_ORDERS)).compose(event).get_epsilon(DELTA)
    assert eps == pytest.approx(reference, rel=1e-12)
    pld = PLDAccountant().compose(event).get_epsilon(DELTA)
    assert pld <= eps <= 1.15 * pld  # RDP is an upper bound, and a close one here


@pytest.mark.parametrize("target", [0.25, 1.0, 3.0])
def test_single_skellam_release_on_the_grid_equals_the_exact_integer_search(target):
    release = calibrate(target, DELTA, 5, noise="skellam")
    eps, order = rdp_epsilon(vote_rdp(5, release.sigma, "skellam"), DELTA)
    exact, best = skellam_rdp_epsilon(math.sqrt(10), 10.0, release.sigma**2, DELTA)
    assert eps == pytest.approx(exact, rel=1e-12) and order == best
    assert eps == pytest.approx(target, rel=1e-9)


def _skellam_shift_renyi(alpha: float, variance: float) -> float:
    """D_alpha(Sk + 1 || Sk) for Sk = Pois(v/2) - Pois(v/2), by summing the pmf (independent of the bound)."""
    x = np.arange(-150, 151)  # the pmf beyond is below 1e-40 for these variances
    log_p = skellam.logpmf(x - 1, variance / 2, variance / 2)
    log_q = skellam.logpmf(x, variance / 2, variance / 2)
    assert np.all(np.isfinite(log_p)) and np.all(np.isfinite(log_q))
    return float(logsumexp(alpha * log_p + (1 - alpha) * log_q) / (alpha - 1))


@pytest.mark.parametrize("variance", [4.0, 30.0])
def test_skellam_curve_bounds_the_true_renyi_divergence_also_at_fractional_orders(variance):
    # replace-one moves k = 3 votes: 2k coordinates shift by +-1, independent noise per coordinate
    orders = np.array([1.5, 2.0, 2.5, 3.0, 7.0, 12.0])
    curve = vote_rdp(3, math.sqrt(variance), "skellam", orders=orders)
    true = np.array([6 * _skellam_shift_renyi(a, variance) for a in orders])
    assert np.all(curve >= true)
    if variance >= 30:  # at moderate variance and integer orders the bound is close to the truth
        integer = orders == np.round(orders)
        assert np.all(curve[integer] <= 1.1 * true[integer])


def test_fedavg_curve_matches_opacus_and_replace_one_halves_the_multiplier():
    z, rounds = 1.3, 7
    add_remove = fedavg_rdp(z, rounds, neighbouring="add-remove")
    opacus = compute_rdp(q=1.0, noise_multiplier=z, steps=rounds, orders=RDP_ORDERS)
    np.testing.assert_allclose(add_remove, opacus, rtol=1e-12)
    np.testing.assert_allclose(fedavg_rdp(z, rounds), fedavg_rdp(z / 2, rounds, neighbouring="add-remove"))
    eps_opacus, _ = get_privacy_spent(orders=RDP_ORDERS, rdp=opacus, delta=DELTA)
    assert fedavg_epsilon(z, rounds, DELTA, neighbouring="add-remove") == pytest.approx(eps_opacus, rel=1e-12)


@pytest.mark.parametrize("neighbouring", ["replace-one", "add-remove"])
def test_calibrate_fedavg_is_the_smallest_multiplier_within_budget(neighbouring):
    z = calibrate_fedavg(2.0, DELTA, 5, neighbouring=neighbouring)
    assert fedavg_epsilon(z, 5, DELTA, neighbouring=neighbouring) <= 2.0
    assert fedavg_epsilon(z - 2e-6, 5, DELTA, neighbouring=neighbouring) > 2.0


def test_calibrate_fedavg_against_opacus_and_pld():
    z = calibrate_fedavg(2.0, DELTA, 5, neighbouring="add-remove")
    # Opacus searches to an epsilon tolerance of 0.01 from above: its z is at least ours and close
    z_opacus = get_noise_multiplier(target_epsilon=2.0, target_delta=DELTA, sample_rate=1.0, steps=5)
    assert z <= z_opacus <= 1.01 * z
    assert calibrate_fedavg(2.0, DELTA, 5) == pytest.approx(2 * z, abs=2e-6)  # replace-one: sensitivity 2C
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), 5)
    assert PLDAccountant().compose(event).get_epsilon(DELTA) <= 2.0  # PLD is tighter than RDP


def test_vote_and_training_compose_by_adding_curves():
    vote = calibrate(1.0, DELTA, 5, noise="skellam")
    z = calibrate_fedavg(2.0, DELTA, 5)
    curve = vote_rdp(5, vote.sigma, "skellam") + fedavg_rdp(z, 5)
    total, _ = rdp_epsilon(curve, DELTA)
    assert max(1.0, 2.0) < total < 1.0 + 2.0  # more than either phase, less than basic composition


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: vote_rdp(5, 0.0, "gaussian"), "sigma must be a finite number > 0"),
        (lambda: vote_rdp(5, 1.0, "laplace"), "noise must be one of"),
        (lambda: vote_rdp(5, 1.0, "gaussian", orders=[0.5, 2.0]), "orders must be"),
        (lambda: fedavg_rdp(-1.0, 3), "noise_multiplier must be a finite number > 0"),
        (lambda: fedavg_rdp(1.0, 0), "rounds must be an integer >= 1"),
        (lambda: rdp_epsilon(np.ones(3), DELTA), "rdp must be"),
        (lambda: rdp_epsilon(RDP_ORDERS, 0.0), "delta must be a number in"),
        (lambda: calibrate_fedavg(0.0, DELTA, 3), "epsilon must be a finite number > 0"),
    ],
)
def test_composition_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
