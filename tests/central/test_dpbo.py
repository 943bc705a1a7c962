"""DP-BO (dphype.central.dpbo): mechanisms, sensitivities and GP-UCB on a finite set."""

import math

import numpy as np
import pytest

from dphype.central import dpbo


def test_exponential_mechanism_probabilities():
    probs = dpbo.exponential_mechanism_probabilities(np.array([0.0, 1.0, 2.0]), epsilon=2.0, sensitivity=0.5)
    # weights exp(eps u / (2 Delta)) = exp(2u) -> 1 : e^2 : e^4
    w = np.exp([0.0, 2.0, 4.0])
    np.testing.assert_allclose(probs, w / w.sum())
    assert probs.sum() == pytest.approx(1.0)
    # ratio between neighbours with utility shifted by at most Delta is bounded by e^eps
    with pytest.raises(ValueError, match="epsilon"):
        dpbo.exponential_mechanism_probabilities(np.zeros(3), epsilon=-1.0, sensitivity=1.0)
    with pytest.raises(ValueError, match="sensitivity"):
        dpbo.exponential_mechanism_probabilities(np.zeros(3), epsilon=1.0, sensitivity=0.0)


def test_laplace_scale_and_theorem7_sensitivity():
    assert dpbo.laplace_scale(0.3, 1.5) == pytest.approx(0.2)
    # min(g*/m, L/(m lmin)) + (lmax - lmin) L / (lmax lmin)
    sens = dpbo.lipschitz_gain_sensitivity(100, lipschitz=1.0, lam_min=0.1, lam_max=1.0, loss_bound=1.0)
    assert sens == pytest.approx(min(1 / 100, 1 / (100 * 0.1)) + 0.9 / 0.1)
    out = dpbo.dp_bo_lipschitz([0.7, 0.8], epsilon=2.0, validation_size=100, lipschitz=1.0,
                               lam_min=0.1, lam_max=1.0, loss_bound=1.0, rng=np.random.default_rng(0))
    assert out["laplace_scale"] == pytest.approx(sens / 2.0) and math.isfinite(out["noisy_gain"])
    assert out["delta"] == 0.0 and any("Assumption 2" in a for a in out["assumptions"])


def test_laplace_release_has_the_claimed_scale():
    rng = np.random.default_rng(0)
    draws = np.array([dpbo.dp_bo_lipschitz([0.5], epsilon=1.0, validation_size=10, lipschitz=1.0, lam_min=1.0,
                                           lam_max=1.0, loss_bound=1.0, rng=rng)["noisy_gain"] for _ in range(4000)])
    # Lap(b) has mean absolute deviation b; here b = min(1/10, 1/10) / 1 = 0.1
    assert np.mean(np.abs(draws - 0.5)) == pytest.approx(0.1, rel=0.08)


def test_beta_and_theorem1_sensitivity():
    assert dpbo.ucb_beta(3, 100, 1e-5) == pytest.approx(2 * math.log(100 * 9 * math.pi**2 / 3e-5))
    c = dpbo.neighbour_gap(0.01, 100, 1e-5)
    assert c == pytest.approx(2 * math.sqrt(0.01 * math.log(300 / 1e-5)))
    assert dpbo.mean_sensitivity(10, 100, 1e-5, 0.01) == pytest.approx(
        2 * math.sqrt(dpbo.ucb_beta(11, 100, 1e-5)) + c)
    with pytest.raises(ValueError, match="kernel_gap"):
        dpbo.neighbour_gap(1.5, 10, 1e-5)


def test_matern_kernel_is_normalised_and_gp_posterior_interpolates():
    x = np.array([[0.0], [0.5], [1.0]])
    k = dpbo.matern52(x, x, 0.5)
    np.testing.assert_allclose(np.diag(k), 1.0)
    s = math.sqrt(5.0)
    assert k[0, 1] == pytest.approx((1 + s + 5 / 3) * math.exp(-s))
    mean, std = dpbo.gp_posterior(k, [1], [0.8], noise_var=1e-8)
    assert mean[1] == pytest.approx(0.8, abs=1e-6) and std[1] < 1e-3 and std[0] > 0.5


def test_information_gain_bound_exceeds_any_single_set():
    x = np.linspace(0, 1, 8)[:, None]
    k = dpbo.matern52(x, x, 0.3)
    bound = dpbo.max_information_gain_bound(k, 3, 0.01)
    for a in ([0, 1, 2], [0, 4, 7], [3, 3, 3]):
        ka = k[np.ix_(a, a)]
        gain = 0.5 * np.linalg.slogdet(np.eye(3) + ka / 0.01)[1]
        assert gain <= bound + 1e-9


def test_dp_bo_finds_the_peak_with_a_large_budget_and_reports_assumptions():
    x = np.linspace(0, 1, 15)[:, None]
    truth = 0.9 - (x[:, 0] - 0.7) ** 2
    rng = np.random.default_rng(0)
    result = dpbo.dp_bo(lambda i: truth[i] + 0.01 * rng.standard_normal(), x, iterations=12, epsilon=1e4,
                        delta=1e-5, noise_var=1e-4, kernel_gap=1e-6, lengthscale=0.3, rng=rng)
    assert abs(x[result.index, 0] - 0.7) <= 0.15
    assert result.epsilon_spent == 2e4 and result.delta_spent == 2e-5
    info = result.to_dict()
    assert any("Assumption 1" in a for a in info["assumptions"]) and info["evaluations"] == 12
    # With epsilon = 1 the Theorem 1 sensitivity (~2 sqrt(beta)) makes the choice nearly uniform.
    weak = dpbo.dp_bo(lambda i: truth[i], x, iterations=12, epsilon=1.0, delta=1e-5, noise_var=1e-4,
                      kernel_gap=1e-6, release_gain=False, rng=rng)
    assert weak.probabilities.max() < 2.0 / len(x) and weak.noisy_gain is None and weak.epsilon_spent == 1.0


def test_dp_bo_bad_inputs():
    x = np.zeros((3, 1))
    with pytest.raises(ValueError, match="noise_var"):
        dpbo.dp_bo(lambda i: 0.5, x, iterations=2, epsilon=1.0, delta=1e-5, noise_var=0.0, kernel_gap=0.0,
                   rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="delta"):
        dpbo.dp_bo(lambda i: 0.5, x, iterations=2, epsilon=1.0, delta=2.0, noise_var=0.1, kernel_gap=0.0,
                   rng=np.random.default_rng(0))


def test_candidate_features_scale_lr_logarithmically():
    from dphype.selection.candidates import table_iii_grid

    feats = dpbo.candidate_features(list(table_iii_grid()))
    assert feats.shape == (100, 3) and feats.min() == 0.0 and feats.max() == 1.0
