"""Output-perturbed logistic regression (dphype.ml.oracles.output_perturbation): Gaussian privacy, projected SGD."""

import numpy as np
import pytest

from dphype.ml.oracles import make_problem
from dphype.ml.oracles.output_perturbation import OutputPerturbationSetup, train_psgd_logreg
from dphype.ml.reference import majority_of_test_split


def test_output_perturbation_privacy_is_analytic_gaussian():
    from dphype.privacy.noise_kinds import analytic_gaussian_epsilon

    problem = make_problem("logreg-output-perturbation", runs=5, train_size=500)
    sens = OutputPerturbationSetup().sensitivity(0.01, 500)
    assert sens == pytest.approx(2 * 2.0 / (0.01 * 500))
    assert problem.privacy({"gamma": 0.01, "sigma": 1.0}) == pytest.approx(analytic_gaussian_epsilon(sens, 1.0, 1e-6))
    ev = problem.evaluate({"gamma": 0.1, "sigma": 0.1}, np.random.default_rng(0))
    assert majority_of_test_split("adult") + 0.02 < ev.utility.mean <= 1.0  # measured 0.787 against 0.760
    noisy = problem.evaluate({"gamma": 0.1, "sigma": 10.0}, np.random.default_rng(0))
    assert noisy.utility.mean < ev.utility.mean - 0.1  # output noise 100x larger: measured 0.548


def test_psgd_logreg_stays_in_the_ball():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 4))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = np.sign(x[:, 0] + 0.1)
    w = train_psgd_logreg(x, y, 2.0, epochs=3, batch_size=8, rng=rng)
    assert np.linalg.norm(w) <= 0.5 + 1e-12 and w[0] > 0
