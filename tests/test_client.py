"""DP-Hype client side (dphype.client)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.common import FitIns, ndarrays_to_parameters
from flwr.compat.common import recorddict_compat as compat
from local_grid import LocalGrid, node_id

from dphype import secure_sum as ss
from dphype.candidates import CandidateMismatchError
from dphype.candidates import grid as candidate_grid
from dphype.client import DPHypeClient, make_client_app
from dphype.noise import noise_share
from dphype.strategy import make_vote_request

CANDS = candidate_grid(lr=[0.001, 0.01, 0.1], decay=[0.5, 1.0])  # 6 candidates


class LossTask:
    """Lower is better; counts how often it was asked to score."""

    maximize = False

    def __init__(self, scores) -> None:
        self.scores = scores
        self.calls = 0

    def score(self, candidates):
        self.calls += 1
        return self.scores


LOSSES = np.array([0.9, 0.1, 0.5, 0.2, 0.8, 0.3])  # best three: 1, 3, 5


def _request(**overrides):
    kwargs = dict(epsilon=1.0, delta=1e-5, k=3, clients=4)
    kwargs.update(overrides)
    return make_vote_request(CANDS, **kwargs)


def test_fit_returns_encoded_noisy_top_k_votes_and_no_metrics():
    request = _request()
    client = DPHypeClient(LossTask(LOSSES), CANDS, rng=np.random.default_rng(7))
    params, num_examples, metrics = client.fit([], request.to_config())
    assert num_examples == 1  # makes SecAgg+'s weighted mean an exact sum
    assert metrics == {}
    assert len(params) == 1 and params[0].shape == (6,)
    share = noise_share(
        6, sigma=request.sigma, clients=4, dropout=0.0, kind="skellam", rng=np.random.default_rng(7)
    )
    np.testing.assert_array_equal(params[0], np.array([0, 1, 0, 1, 0, 1]) + share)


def test_noise_comes_from_fresh_os_entropy():
    client = DPHypeClient(LossTask(LOSSES), CANDS)
    config = _request(epsilon=0.1).to_config()
    first, _, _ = client.fit([], config)
    second, _, _ = client.fit([], config)
    assert not np.array_equal(first[0], second[0])
    assert not any("seed" in key for key in config)


def test_gaussian_votes_are_on_the_fixed_point_grid():
    request = _request(noise="gaussian")
    client = DPHypeClient(LossTask(LOSSES), CANDS, rng=np.random.default_rng(1))
    (vector,), _, _ = client.fit([], request.to_config())
    np.testing.assert_array_equal(vector, np.rint(vector))
    votes = vector / ss.GAUSSIAN_SCALE
    share = noise_share(
        6, sigma=request.sigma, clients=4, dropout=0.0, kind="gaussian", rng=np.random.default_rng(1)
    )
    np.testing.assert_allclose(votes, np.array([0, 1, 0, 1, 0, 1]) + share, atol=0.5 / ss.GAUSSIAN_SCALE)


def test_fingerprint_mismatch_is_refused_before_scoring():
    other = candidate_grid(lr=[0.001, 0.01, 0.1], decay=[1.0, 0.5])
    task = LossTask(LOSSES)
    client = DPHypeClient(task, other)
    with pytest.raises(CandidateMismatchError, match="fingerprint mismatch"):
        client.fit([], _request().to_config())
    assert task.calls == 0


@pytest.mark.parametrize(
    "bad",
    [LOSSES[:5], np.append(LOSSES, 0.4), LOSSES.reshape(2, 3), np.zeros((5, 2)), np.zeros((6, 2, 1)), np.zeros((6, 0))],
)
def test_wrong_length_scores_are_refused(bad):
    client = DPHypeClient(LossTask(bad), CANDS)
    with pytest.raises(ValueError, match="one score per candidate"):
        client.fit([], _request().to_config())


def test_lexicographic_keys_break_ties_of_the_first_score():
    # losses tie at 0.2 for candidates 0, 2, 4; the second key (lower is better) picks 4 then 2
    keys = np.array([[0.2, 0.9], [0.7, 0.0], [0.2, 0.5], [0.6, 0.0], [0.2, 0.1], [0.9, 0.0]])
    request = _request(k=2)
    client = DPHypeClient(LossTask(keys), CANDS, rng=np.random.default_rng(3))
    params, _, _ = client.fit([], request.to_config())
    share = noise_share(
        6, sigma=request.sigma, clients=4, dropout=0.0, kind="skellam", rng=np.random.default_rng(3)
    )
    np.testing.assert_array_equal(params[0], np.array([0, 0, 1, 0, 1, 0]) + share)


def test_too_little_noise_is_refused():
    config = _request().to_config()
    config["dphype.sigma"] = config["dphype.sigma"] / 2  # a server cheating on the noise
    client = DPHypeClient(LossTask(LOSSES), CANDS)
    with pytest.raises(ValueError, match="more than the announced epsilon"):
        client.fit([], config)


def test_client_budget_policy():
    client = DPHypeClient(LossTask(LOSSES), CANDS, max_epsilon=0.5)
    with pytest.raises(ValueError, match="max_epsilon"):
        client.fit([], _request(epsilon=1.0).to_config())
    client.fit([], _request(epsilon=0.5).to_config())


def test_non_vote_requests_are_refused():
    client = DPHypeClient(LossTask(LOSSES), CANDS)
    with pytest.raises(ValueError, match="not a DP-Hype vote request"):
        client.fit([], {"dphype.phase": "train"})
    assert client.get_parameters({}) == []


def test_client_app_refuses_plaintext_vote_requests():
    app = make_client_app(lambda ctx: LossTask(LOSSES), CANDS)
    grid = LocalGrid(app, 1)
    content = compat.fitins_to_recorddict(
        FitIns(ndarrays_to_parameters([]), _request().to_config()), True
    )
    (reply,) = grid.send_and_receive([Message(content, node_id(0), MessageType.TRAIN, group_id="1")])
    assert reply.has_error()
    assert "plaintext" in reply.error.reason


def test_client_app_builds_task_and_candidates_from_context():
    seen = []

    def task_fn(context):
        seen.append(context.node_config["partition-id"])
        return LossTask(LOSSES)

    app = make_client_app(task_fn, lambda ctx: CANDS)
    grid = LocalGrid(app, 3)
    strategy = ss.SecureSumStrategy(
        clients=3, size=6, noise="skellam", min_survivors=3, fit_config=_request(clients=3).to_config()
    )
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    total = ss.run_secure_sum(grid, context, strategy)
    assert sorted(seen) == [0, 1, 2]
    assert total.shape == (6,)


def test_progress_is_reported_when_the_task_supports_it():
    received = []

    class ProgressTask(LossTask):
        def score(self, candidates, *, progress=None):
            received.append(progress)
            progress(1, 1)
            return self.scores

    client = DPHypeClient(ProgressTask(LOSSES), CANDS)
    client.fit([], _request().to_config())
    assert len(received) == 1 and callable(received[0])
