"""Propose-test tuning (dphype.central.propose_test, Ding & Wu Alg. 1)."""

import math

import numpy as np
import pytest

from dphype.central import propose_test as pt


def test_advanced_composition_and_basic_minimum():
    eps0, t, d = 0.1, 50, 1e-5
    adv = math.sqrt(2 * t * math.log(1 / d)) * eps0 + t * eps0 * math.expm1(eps0)
    assert pt.advanced_composition(eps0, t, d) == pytest.approx(min(t * eps0, adv))
    assert pt.advanced_composition(1.0, 3, d) == pytest.approx(3.0)  # basic is tighter here
    assert pt.advanced_composition(0.5, 0, d) == 0.0


def test_worst_case_iterations_bound_holds_on_adversarial_runs():
    assert pt.worst_case_iterations(0.1, 0.0) == 21
    assert pt.worst_case_iterations(0.05, 0.5) == 21
    rng = np.random.default_rng(0)
    for _ in range(200):
        utilities = rng.random((5, 20))
        res = pt.propose_test(utilities, eps0=rng.uniform(0.05, 5.0), granularity=0.1, lower_bound=0.0,
                              delta_slack=1e-5, rng=rng)
        assert res.iterations <= 21


def test_calibrate_eps0_spends_exactly_the_budget_in_the_worst_case():
    eps0 = pt.calibrate_eps0(1.0, 1e-5, 0.05, 0.5)
    assert pt.advanced_composition(eps0, pt.worst_case_iterations(0.05, 0.5), 1e-5) == pytest.approx(1.0)


def test_no_noise_limit_climbs_to_the_best_utility_by_doubling():
    # One clearly best candidate and a huge eps0: deterministic doubling steps.
    utilities = np.tile(np.array([0.2, 0.55, 0.3]), (10, 1))
    res = pt.propose_test(utilities, eps0=1e9, granularity=0.05, lower_bound=0.0, delta_slack=1e-5,
                          rng=np.random.default_rng(0))
    assert res.index == 1
    # u: 0 -> .05 -> .15 -> .35 (step 8 fails: .75 > .55) -> step 4 fails (.55 + eps?) ...
    assert 0.5 <= res.utility_level <= 0.55 + 1e-9
    assert res.iterations <= 2 * math.ceil(1 / 0.05) + 1
    accepted = [s[2] for s in res.steps]
    assert accepted[:3] == [True, True, True] and not accepted[-1]


def test_reports_budget_for_realised_and_worst_case_iterations():
    rng = np.random.default_rng(3)
    res = pt.propose_test(rng.random((10, 30)), eps0=0.1, granularity=0.01, lower_bound=0.0,
                          delta_slack=1e-5, rng=rng)
    info = res.to_dict()
    assert info["iterations"] == res.iterations >= 1
    assert info["epsilon_tuning"] == pytest.approx(pt.advanced_composition(0.1, res.iterations, 1e-5))
    assert info["epsilon_tuning_worst_case"] >= info["epsilon_tuning"]
    assert any("1/k" in a for a in info["assumptions"])


def test_threshold_and_query_noise_scales():
    # With k parts and eps0, the threshold noise is Lap(2/(k eps0)): check its spread on the first proposal.
    k, eps0 = 4, 0.5
    firsts = []
    for seed in range(3000):
        rng = np.random.default_rng(seed)
        res = pt.propose_test(np.full((k, 1), 0.0), eps0=eps0, granularity=0.5, lower_bound=0.0,
                              delta_slack=1e-5, rng=rng)
        firsts.append(res.steps[0][2])
    # P(0 + Lap(4/(k eps0)) >= 0.5 + Lap(2/(k eps0))) for b1 = 1, b2 = 2: difference of Laplaces.
    rng = np.random.default_rng(1)
    mc = np.mean(rng.laplace(0, 2.0, 400_000) - rng.laplace(0, 1.0, 400_000) >= 0.5)
    assert np.mean(firsts) == pytest.approx(mc, abs=0.03)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"granularity": 0.0}, "granularity"), ({"lower_bound": 1.0}, "lower_bound"), ({"eps0": 0.0}, "epsilon")],
)
def test_bad_inputs(kwargs, match):
    args = {"eps0": 0.1, "granularity": 0.1, "lower_bound": 0.0, "delta_slack": 1e-5, **kwargs}
    with pytest.raises(ValueError, match=match):
        pt.propose_test(np.full((2, 3), 0.5), rng=np.random.default_rng(0), **args)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        pt.propose_test(np.array([[0.5, np.nan]]), eps0=0.1, granularity=0.1, lower_bound=0.0,
                        delta_slack=1e-5, rng=np.random.default_rng(0))
