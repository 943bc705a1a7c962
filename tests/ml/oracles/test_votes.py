"""DP-Hype's vote release as a Pareto problem (dphype.ml.oracles.votes) against DP-Hype's accounting and votes."""

import numpy as np
import pytest

from dphype.ml.oracles.votes import candidate_utility_oracle, dphype_vote_problem, vote_privacy_oracle


def test_vote_privacy_oracle_is_dphype_accounting():
    from dphype.privacy.accounting import calibrate

    release = calibrate(1.0, 1e-5, 5, num_candidates=100, accountant="analytic", noise="gaussian")
    privacy = vote_privacy_oracle(delta=1e-5, num_candidates=100, accountant="analytic", noise="gaussian")
    assert privacy({"sigma": release.sigma, "k": 5}) == pytest.approx(1.0, rel=1e-6)
    assert privacy({"sigma": 2 * release.sigma, "k": 5}) < 1.0


def test_candidate_utility_oracle_from_a_task():
    class Task:
        maximize = False

        def score(self, candidates):
            return np.array([c["lr"] for c in candidates])

    utility = candidate_utility_oracle(Task().score, maximize=Task.maximize)
    assert utility({"lr": 0.25}, np.random.default_rng(0)).mean == pytest.approx(0.75)


def test_candidate_utility_oracle_uses_the_primary_key_of_lexicographic_scores():
    def score(candidates):  # TorchTask-style keys [accuracy, -loss]
        return np.array([[c["lr"], -3.0] for c in candidates])

    utility = candidate_utility_oracle(score)
    assert utility({"lr": 0.25}, np.random.default_rng(0)).mean == pytest.approx(0.25)


def test_dphype_vote_problem_accepts_lexicographic_keys():
    # every client's accuracy ties for all candidates; the second key (-loss) makes candidate 2 the winner
    keys = np.zeros((30, 5, 2))
    keys[:, :, 0] = 0.75
    keys[:, :, 1] = -1.0
    keys[:, 2, 1] = -0.1
    accuracy = np.array([0.5, 0.5, 0.9, 0.5, 0.5])
    problem = dphype_vote_problem(keys, accuracy, delta=1e-5, runs=20, noise="gaussian")
    assert problem.evaluate({"sigma": 1.0, "k": 1}, np.random.default_rng(1)).utility.mean == pytest.approx(0.9)


def test_dphype_vote_problem_trades_privacy_for_accuracy():
    rng = np.random.default_rng(0)
    scores = rng.random((40, 10)) * 0.5
    scores[:, 3] += 0.6  # every client ranks candidate 3 first
    accuracy = np.full(10, 0.5)
    accuracy[3] = 0.9
    problem = dphype_vote_problem(scores, accuracy, delta=1e-5, runs=40, noise="gaussian")
    quiet = problem.evaluate({"sigma": 2.0, "k": 1}, rng)
    loud = problem.evaluate({"sigma": 100.0, "k": 1}, rng)
    assert quiet.utility.mean == pytest.approx(0.9) and loud.utility.mean < quiet.utility.mean
    assert loud.epsilon < quiet.epsilon
    assert quiet.epsilon == pytest.approx(vote_privacy_oracle(delta=1e-5, num_candidates=10, noise="gaussian")(
        {"sigma": 2.0, "k": 1}))
