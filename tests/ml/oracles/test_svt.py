"""The SVT problem (dphype.ml.oracles.svt) against DPareto's closed form and hand-computed F1 scores."""

import numpy as np
import pytest

from dphype.ml.oracles import make_problem
from dphype.ml.oracles.svt import f1_scores, svt_answers, svt_epsilon


def test_svt_privacy_is_dpareto_appendix_b():
    # (1 + (2C)^(1/3)) (1 + (2C)^(2/3)) / b
    assert svt_epsilon(1.0, 1) == pytest.approx((1 + 2 ** (1 / 3)) * (1 + 2 ** (2 / 3)))
    assert svt_epsilon(4.0, 4) == pytest.approx((1 + 2.0) * (1 + 4.0) / 4.0)
    with pytest.raises(ValueError, match="b must be"):
        svt_epsilon(0.0, 3)


def test_svt_stops_after_c_answers_and_is_exact_without_noise():
    rng = np.random.default_rng(0)
    answers = np.tile(np.array([1, 0, 1, 1, 0, 1], dtype=bool), (3, 1))
    w = svt_answers(answers, 1e-9, 2, rng)  # (almost) no noise: the first two true queries
    assert w.tolist() == [[1, 0, 1, 0, 0, 0]] * 3
    w_all = svt_answers(answers, 1e-9, 10, rng)
    assert (w_all == answers).all()


def test_f1_scores_hand_computed():
    truth = np.array([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=bool)
    pred = np.array([[1, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=bool)
    # row 0: TP=1, FP=1, FN=1 -> 2/4
    np.testing.assert_allclose(f1_scores(truth, pred), [0.5, 1.0, 1.0])


def test_svt_problem_oracles():
    problem = make_problem("svt", runs=30)
    rng = np.random.default_rng(1)
    sharp = problem.evaluate({"C": 10, "b": 0.01}, rng)  # tiny noise, C = #positives: perfect
    assert sharp.utility.mean == 1.0 and sharp.epsilon == pytest.approx(svt_epsilon(0.01, 10))
    noisy = problem.evaluate({"C": 3, "b": 50.0}, rng)
    assert noisy.utility.worst <= noisy.utility.mean <= noisy.utility.best
    assert len(noisy.utility.runs) == 30 and noisy.error == pytest.approx(1 - noisy.utility.mean)
