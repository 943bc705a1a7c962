"""DP-Hype server side (dphype.strategy) against real ClientApps over SecAgg+ (in process)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from flwr.clientapp import ClientApp
from local_grid import LocalGrid

from dphype import secure_sum as ss
from dphype.accounting import calibrate
from dphype.candidates import grid as candidate_grid
from dphype.client import DPHypeClient
from dphype.noise import noise_share
from dphype.strategy import DPHypeStrategy, VoteRequest, make_vote_request, run_dphype
from dphype.voting import top_k_votes

CANDS = candidate_grid(lr=[0.001, 0.01, 0.1, 0.5], momentum=[0.0, 0.9])  # 8 candidates


class TableTask:
    """Scores from a fixed table row per client (no training)."""

    maximize = True

    def __init__(self, scores: np.ndarray) -> None:
        self.scores = scores

    def score(self, candidates):
        if isinstance(self.scores, Exception):
            raise self.scores
        return self.scores


def _scores(n: int, seed: int = 0) -> np.ndarray:
    """Every client likes candidate 5 best; the rest of its ranking is random."""
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0.0, 0.8, size=(n, len(CANDS)))
    scores[:, 5] = 0.9
    return scores


def _app(scores, candidates_for=lambda pid: CANDS, seed_offset=100):
    def client_fn(context: Context):
        pid = int(context.node_config["partition-id"])
        task = TableTask(scores[pid])
        rng = np.random.default_rng(seed_offset + pid)
        return DPHypeClient(task, candidates_for(pid), rng=rng).to_client()

    return ClientApp(client_fn=client_fn, mods=[ss.secure_vote_mod])


def _context() -> Context:
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})


def _expected_sum(scores, request: VoteRequest, pids, seed_offset=100) -> np.ndarray:
    """Replay what the clients computed (same seeds) and add it up in plaintext."""
    total = np.zeros(len(CANDS), dtype=np.int64)
    for pid in pids:
        votes = top_k_votes(scores[pid], request.k)
        share = noise_share(
            len(CANDS),
            sigma=request.sigma,
            clients=request.clients,
            dropout=request.dropout,
            kind=request.noise,
            rng=np.random.default_rng(seed_offset + pid),
        )
        total += votes + share
    return total


def test_selection_end_to_end_matches_plaintext_replay():
    n = 6
    scores = _scores(n)
    grid = LocalGrid(_app(scores), n)
    result = run_dphype(grid, _context(), CANDS, epsilon=1.0, delta=1e-5, k=3, clients=n)
    request = make_vote_request(CANDS, epsilon=1.0, delta=1e-5, k=3, clients=n)
    expected = _expected_sum(scores, request, range(n))
    np.testing.assert_array_equal(result.noisy_sum, expected)
    assert result.selected_index == int(np.argmax(expected))
    assert result.selected == CANDS[result.selected_index]
    report = result.report
    assert report.survivors == n and report.clients == n and report.k == 3
    assert report.noise == "skellam" and report.accountant == "rdp"
    assert report.epsilon == pytest.approx(1.0, rel=1e-6)
    assert report.num_candidates == len(CANDS)


def test_large_budget_selects_the_consensus_candidate():
    n = 8
    grid = LocalGrid(_app(_scores(n, seed=4)), n)
    result = run_dphype(grid, _context(), CANDS, epsilon=200.0, delta=1e-5, k=2, clients=n)
    assert result.selected_index == 5  # 8 votes vs at most 8 - noise of std ~0.03
    assert result.selected == {"lr": 0.1, "momentum": 0.9}


def test_votes_never_travel_in_metrics():
    n = 4
    grid = LocalGrid(_app(_scores(n)), n)
    run_dphype(grid, _context(), CANDS, epsilon=1.0, delta=1e-5, k=3, clients=n)
    for reply in grid.replies:
        assert not reply.has_error()
        content = reply.content
        # The masked SecAgg+ vector is the only payload; the legacy parameters are cleared.
        assert all(len(rec) == 0 for rec in content.array_records.values())
        if "fitres.metrics" in content.config_records:
            assert len(content.config_records["fitres.metrics"]) == 0


def test_dropout_within_tolerance_is_reported():
    n = 5
    scores = list(_scores(n))
    scores[2] = RuntimeError("out of memory")
    grid = LocalGrid(_app(scores), n)
    result = run_dphype(
        grid, _context(), CANDS, epsilon=1.0, delta=1e-5, k=3, clients=n, dropout=0.2
    )
    request = make_vote_request(CANDS, epsilon=1.0, delta=1e-5, k=3, clients=n, dropout=0.2)
    expected = _expected_sum(_scores(n), request, [0, 1, 3, 4])
    np.testing.assert_array_equal(result.noisy_sum, expected)
    assert result.report.survivors == 4
    # 4 survivors each adding sigma^2 / 4: exactly the calibrated noise, epsilon on target.
    assert result.report.epsilon == pytest.approx(1.0, rel=1e-6)


def test_too_few_survivors_release_nothing():
    n = 5
    scores = list(_scores(n))
    scores[1] = RuntimeError("crash")
    scores[3] = RuntimeError("crash")
    grid = LocalGrid(_app(scores), n)
    with pytest.raises(ss.TooFewSurvivorsError, match="only 3 of 5") as info:
        run_dphype(grid, _context(), CANDS, epsilon=1.0, delta=1e-5, k=3, clients=n, dropout=0.2)
    assert "crash" in str(info.value)


def test_vanished_node_counts_as_dropout_with_a_timeout():
    # A deployed SuperNode that disappears never answers: with a stage timeout
    # SecAgg+ goes on without it and the survivor check decides the release.
    n = 5
    grid = LocalGrid(_app(_scores(n)), n, silent=[2])
    result = run_dphype(
        grid, _context(), CANDS, epsilon=1.0, delta=1e-5, k=3, clients=n, dropout=0.2, timeout=30.0
    )
    request = make_vote_request(CANDS, epsilon=1.0, delta=1e-5, k=3, clients=n, dropout=0.2)
    expected = _expected_sum(_scores(n), request, [0, 1, 3, 4])
    np.testing.assert_array_equal(result.noisy_sum, expected)
    assert result.report.survivors == 4
    assert grid.timeouts and set(grid.timeouts) == {30.0}  # every SecAgg+ stage is bounded
    strict = LocalGrid(_app(_scores(n)), n, silent=[2])
    with pytest.raises(ss.TooFewSurvivorsError, match="only 4 of 5"):
        run_dphype(strict, _context(), CANDS, epsilon=1.0, delta=1e-5, k=3, clients=n, timeout=30.0)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "60"])
def test_bad_timeouts_are_refused(bad):
    def run(**timeouts):
        grid = LocalGrid(_app(_scores(2)), 2)
        run_dphype(grid, _context(), CANDS, epsilon=1.0, delta=1e-5, k=3, clients=2, **timeouts)

    with pytest.raises(ValueError, match=r"^timeout must be a finite number > 0, got"):
        run(timeout=bad)
    with pytest.raises(ValueError, match=r"^connect_timeout must be a finite number > 0, got"):
        run(connect_timeout=bad)


def test_fingerprint_mismatch_fails_loudly():
    n = 4
    other = candidate_grid(lr=[0.001, 0.01, 0.1, 0.5], momentum=[0.9, 0.0])  # same set, other order
    grid = LocalGrid(_app(_scores(n), candidates_for=lambda pid: other if pid == 0 else CANDS), n)
    with pytest.raises(ss.TooFewSurvivorsError, match="fingerprint mismatch"):
        run_dphype(grid, _context(), CANDS, epsilon=1.0, delta=1e-5, k=3, clients=n)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": float("inf")}, "epsilon"),
        ({"delta": 1.0}, "delta"),
        ({"k": 0}, "k must be"),
        ({"k": 9}, "k must be"),
        ({"clients": 1}, "clients must be"),
        ({"clients": ss.MAX_CLIENTS + 1}, "clients must be in \\[2, 10000\\]"),
        ({"dropout": 1.0}, "dropout"),
        ({"noise": "laplace"}, "noise"),
        ({"noise": "skellam", "accountant": "analytic"}, "accountant"),
        ({"epsilon": 1e-7, "delta": 1e-10, "clients": 1000}, "clipping range"),
    ],
)
def test_bad_configuration_is_refused_up_front(overrides, message):
    kwargs = dict(epsilon=1.0, delta=1e-5, k=3, clients=4)
    kwargs.update(overrides)
    with pytest.raises(ValueError, match=message):
        make_vote_request(CANDS, **kwargs)


def test_gaussian_request_uses_analytic_accountant_by_default():
    request = make_vote_request(CANDS, epsilon=1.0, delta=1e-5, k=5, clients=10, noise="gaussian")
    assert request.accountant == "analytic"
    assert request.sigma == pytest.approx(calibrate(1.0, 1e-5, 5, noise="gaussian").sigma)


def test_vote_request_round_trips_through_fit_config():
    request = make_vote_request(CANDS, epsilon=0.5, delta=1e-6, k=2, clients=7, dropout=0.1)
    config = request.to_config()
    assert config[ss.PHASE_KEY] == ss.VOTE_PHASE
    assert all(isinstance(v, (int, float, str, bool)) for v in config.values())
    assert VoteRequest.from_config(config) == request
    del config["dphype.sigma"]
    with pytest.raises(ValueError, match="missing dphype.sigma"):
        VoteRequest.from_config(config)
    with pytest.raises(ValueError, match="not a DP-Hype vote request"):
        VoteRequest.from_config({"dphype.phase": "train"})


def test_strategy_requires_matching_candidates():
    request = make_vote_request(CANDS, epsilon=1.0, delta=1e-5, k=3, clients=4)
    other = candidate_grid(lr=[0.1, 0.2])
    with pytest.raises(ValueError, match="fingerprint mismatch"):
        DPHypeStrategy(other, request)


def test_gaussian_release_is_reported_as_approximate():
    n = 4
    grid = LocalGrid(_app(_scores(n)), n)
    result = run_dphype(
        grid, _context(), CANDS, epsilon=1.0, delta=1e-5, k=3, clients=n, noise="gaussian"
    )
    assert result.noisy_sum.dtype == np.float64
    assert "approximate" in result.report.released
    assert result.report.accountant == "analytic"
