"""The framework-free protocol (dphype.protocol) with the sum release (dphype.release.SumRelease): request, client
ballot, release, replay (its math, dphype.privacy.noise.replay_noisy_sums)."""

from __future__ import annotations

import numpy as np
import pytest

from dphype.checks import MAX_CLIENTS
from dphype.config import DPHypeConfig
from dphype.privacy.accounting import calibrate
from dphype.privacy.noise import replay_noisy_sums
from dphype.protocol import (
    VoteRequest,
    check_request,
    make_vote_request,
    score_candidates,
)
from dphype.refusal import REFUSAL_CODES, Refusal
from dphype.release import SumRelease
from dphype.secure import secure_sum as ss
from dphype.selection.candidates import candidate_grid

CANDS = candidate_grid(lr=[0.001, 0.01, 0.1], decay=[0.5, 1.0])  # 6 candidates
LOSSES = np.array([0.9, 0.1, 0.5, 0.2, 0.8, 0.3])  # best three: 1, 3, 5


def request(**overrides) -> VoteRequest:
    values = dict(epsilon=1.0, delta=1e-5, k=3, clients=4)
    values.update(overrides)
    return make_vote_request(DPHypeConfig(**values), CANDS)


class Table:
    def __init__(self, scores, maximize=False):
        self.scores, self.maximize = scores, maximize

    def score(self, candidates):
        if isinstance(self.scores, Exception):
            raise self.scores
        return self.scores


# ------------------------------------------------------------------------------------------ request
def test_request_round_trips_through_its_record():
    req = request(epsilon=0.5, delta=1e-6, k=2, clients=7, dropout=0.1)
    record = req.to_record()
    assert all(isinstance(v, (int, float, str, bool)) for v in record.values())
    assert VoteRequest.from_record(record) == req
    assert VoteRequest.from_record(record).digest() == req.digest()
    assert req.digest() != request(epsilon=0.5, delta=1e-6, k=2, clients=7, dropout=0.2).digest()
    del record["dphype.sigma"]
    with pytest.raises(Refusal, match="malformed_request: the request has no 'dphype.sigma'") as info:
        VoteRequest.from_record(record)
    assert info.value.code == "malformed_request"


def test_a_malformed_request_never_echoes_candidate_values():
    record = request().to_record()
    record["dphype.candidates"] = '[{"patient": "alice", "hiv": "positive"}, {"patient": "alice", "hiv": "positive"}]'
    with pytest.raises(Refusal) as info:
        VoteRequest.from_record(record)
    assert info.value.code == "malformed_request"
    assert "alice" not in str(info.value) and "positive" not in str(info.value)


def test_request_is_calibrated():
    req = request(noise="gaussian")
    assert req.config.accountant == "analytic"
    assert req.sigma == pytest.approx(calibrate(1.0, 1e-5, 3, noise="gaussian").sigma)
    assert request().config.accountant == "rdp" and request().config.noise == "skellam"
    assert request(clients=10, dropout=0.25).min_survivors == 8


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": float("inf")}, "epsilon"),
        ({"delta": 1.0}, "delta"),
        ({"k": 0}, r"k must be an integer in \[1, "),
        ({"k": 7}, r"k must be an integer in \[1, 6\]"),
        ({"clients": 1}, "clients must be"),
        ({"clients": MAX_CLIENTS + 1}, r"clients must be an integer in \[2, 10000\]"),
        ({"dropout": 1.0}, "dropout"),
        ({"noise": "laplace"}, "noise"),
        ({"noise": "skellam", "accountant": "analytic"}, "accountant"),
        ({"epsilon": 1e-7, "delta": 1e-10, "clients": 1000}, "clipping range"),
    ],
)
def test_bad_configuration_is_refused_up_front(overrides, message):
    with pytest.raises(ValueError, match=message):
        request(**overrides)


# --------------------------------------------------------------------------------------- client side
@pytest.fixture
def drawn_shares(record_returns):
    """The shares the sum ballot draws, as dphype.privacy.noise.client_noise_share returns them."""
    import dphype.release.sum as sum_release

    return record_returns(sum_release, "client_noise_share")


def test_sum_ballot_is_top_k_plus_the_share_encoded(drawn_shares):
    req = request()
    vector = SumRelease().ballot(req, LOSSES, maximize=False, clipping_range=ss.CLIPPING_RANGE)
    (share,) = drawn_shares
    assert share.dtype == np.int64 and share.shape == (6,)
    np.testing.assert_array_equal(vector, np.array([0, 1, 0, 1, 0, 1]) + share)


def test_sum_ballot_draws_a_fresh_secure_share_every_time(monkeypatch):
    import dphype.privacy.noise as noise

    keys = []
    original = noise.secure_generator
    monkeypatch.setattr(noise, "secure_generator", lambda: keys.append(1) or original())
    req = request(epsilon=0.1)  # share std ~ 50: two equal draws of 6 entries are practically impossible
    first = SumRelease().ballot(req, LOSSES, maximize=False, clipping_range=ss.CLIPPING_RANGE)
    second = SumRelease().ballot(req, LOSSES, maximize=False, clipping_range=ss.CLIPPING_RANGE)
    assert len(keys) == 2 and not np.array_equal(first, second)


def test_gaussian_votes_are_on_the_fixed_point_grid(drawn_shares):
    req = request(noise="gaussian")
    vector = SumRelease().ballot(req, LOSSES, maximize=False, clipping_range=ss.CLIPPING_RANGE)
    np.testing.assert_array_equal(vector, np.rint(vector))
    (share,) = drawn_shares
    np.testing.assert_allclose(vector / ss.fixed_point_scale("gaussian"), np.array([0, 1, 0, 1, 0, 1]) + share,
                               atol=0.5 / ss.fixed_point_scale("gaussian"))


def test_sum_ballot_refuses_values_beyond_the_rounds_range():
    req = request(epsilon=0.1)  # share std ~ 50 against a range of 2: refused, never clipped
    with pytest.raises(ValueError, match="exceed the secure-sum range"):
        SumRelease().ballot(req, LOSSES, maximize=False, clipping_range=2)


def test_lexicographic_keys_break_ties_of_the_first_score(drawn_shares):
    # losses tie at 0.2 for candidates 0, 2, 4; the second key (lower is better) picks 4 then 2
    keys = np.array([[0.2, 0.9], [0.7, 0.0], [0.2, 0.5], [0.6, 0.0], [0.2, 0.1], [0.9, 0.0]])
    req = request(k=2, epsilon=100.0)
    vector = SumRelease().ballot(req, keys, maximize=False, clipping_range=ss.CLIPPING_RANGE)
    (share,) = drawn_shares
    np.testing.assert_array_equal(vector, np.array([0, 0, 1, 0, 1, 0]) + share)


def test_check_request_refuses_another_list_and_too_little_noise():
    req = request()
    check_request(req, local_candidates=CANDS)
    other = candidate_grid(lr=[0.001, 0.01, 0.1], decay=[1.0, 0.5])  # same set, other order
    with pytest.raises(Refusal, match="candidate_mismatch"):
        check_request(req, local_candidates=other)
    record = req.to_record()
    record["dphype.sigma"] = req.sigma / 2  # a server cheating on the noise
    with pytest.raises(Refusal, match="noise_too_small: .* more than the announced epsilon"):
        check_request(VoteRequest.from_record(record))


@pytest.mark.parametrize(
    "bad", [LOSSES[:5], np.append(LOSSES, 0.4), LOSSES.reshape(2, 3), np.zeros((5, 2)), np.zeros((6, 2, 1)),
            np.zeros((6, 0))])
def test_wrong_shapes_are_refused(bad):
    with pytest.raises(Refusal, match=r"score_shape: task.score must return shape \(6,\) or \(6, j\)"):
        score_candidates(Table(bad), CANDS)


def test_a_failing_task_is_refused_without_its_message():
    with pytest.raises(Refusal, match="task_error: task.score raised RuntimeError") as info:
        score_candidates(Table(RuntimeError("patient alice: out of memory")), CANDS)
    assert "alice" not in str(info.value)


def test_a_task_check_names_the_candidate_keys_it_cannot_use():
    from dphype.ml.torch_task import TorchTask, make_task

    task: TorchTask = make_task("adult", 0, 50, epochs=1)
    bad = candidate_grid(lr=[0.01, 0.1], hidden=[32, 64])
    with pytest.raises(Refusal, match="unsupported_candidates: .*key\\(s\\) 'hidden' that batched SGD training"):
        score_candidates(task, bad)
    task.check(CANDS)  # lr and decay: fine


def test_progress_is_passed_when_the_task_takes_it():
    received = []

    class WithProgress(Table):
        def score(self, candidates, *, progress=None):
            received.append(progress)
            return self.scores

    score_candidates(WithProgress(LOSSES), CANDS, progress=print)
    assert received == [print]
    assert score_candidates(Table(LOSSES), CANDS, progress=print).shape == (6,)  # not passed when not taken


def test_refusal_codes_are_closed():
    assert set(REFUSAL_CODES) >= {"malformed_request", "candidate_mismatch", "task_error", "score_shape"}
    with pytest.raises(ValueError, match="code must be one of"):
        Refusal("stack_trace", "anything")


# --------------------------------------------------------------------------------------------- release
def test_release_selects_and_accounts_for_the_survivors():
    req = request(clients=5, dropout=0.2)
    total = np.array([1, 9, 3, 9, 0, 2])
    result = SumRelease().release(req, total, 4)
    assert result.selected_index == 1 and result.selected == CANDS[1]  # tie -> lowest index
    assert result.report.survivors == 4 and result.report.epsilon == pytest.approx(1.0, rel=1e-6)
    assert result.to_dict()["noisy_sum"] == total.tolist()
    full = SumRelease().release(req, total, 5)
    assert full.report.epsilon < 1.0  # five shares carry more than the calibrated noise
    with pytest.raises(ValueError, match=r"survivors must be an integer in \[4, 5\]"):
        SumRelease().release(req, total, 3)
    with pytest.raises(ValueError, match=r"noisy_sum must have shape \(6,\)"):
        SumRelease().release(req, total[:5], 5)


def test_gaussian_release_is_reported_as_approximate():
    result = SumRelease().release(request(noise="gaussian"), np.zeros(6), 4)
    assert "approximate" in result.report.released and result.report.accountant == "analytic"


# ---------------------------------------------------------------------------------------------- replay
@pytest.mark.parametrize("noise", ["gaussian", "skellam"])
def test_replay_in_one_draw_has_the_distribution_of_the_summed_shares(noise: str) -> None:
    from scipy.stats import ks_2samp

    sigma, clients, dropout = 6.0, 25, 0.2
    common = dict(sigma=sigma, clients=clients, dropout=dropout, noise=noise, repetitions=4000)
    literal = replay_noisy_sums(np.zeros(5), per_client=True, rng=np.random.default_rng(0), **common).ravel()
    total = replay_noisy_sums(np.zeros(5), rng=np.random.default_rng(1), **common).ravel()
    expected_var = sigma**2 / (1 - dropout)  # all n clients present: n * sigma^2 / ((1 - xi) n)
    for sample in (literal, total):
        assert abs(sample.mean()) < 4 * np.sqrt(expected_var / sample.size)
        assert sample.var() == pytest.approx(expected_var, rel=0.05)
    assert ks_2samp(literal, total).pvalue > 1e-3
    survivors = replay_noisy_sums(np.zeros(5), survivors=20, rng=np.random.default_rng(2), **common)
    assert survivors.var() == pytest.approx(sigma**2, rel=0.05)  # (1 - xi) n survivors carry sigma^2


def test_replay_without_noise_returns_the_votes():
    votes = np.array([3, 7, 7, 1])
    clean = replay_noisy_sums(votes, sigma=0.0, clients=10, repetitions=3, rng=np.random.default_rng(0))
    assert clean.shape == (3, 4) and np.all(clean == votes)


def test_release_runs_the_configured_rule_and_states_its_confidence():
    votes = np.array([0, 40, 5, 38, 0, 36])  # the lr=0.01 / 0.1 rows hold the votes
    structured = SumRelease().release(request(clients=50), votes, 50)
    assert structured.selection.requested == "gp" and structured.to_dict()["confidence"]["rule"] in ("gp", "max-votes")
    assert 0 <= structured.selection.p_top <= 1 and structured.selection.margin >= 0
    plain = SumRelease().release(request(clients=50, rule="max-votes"), votes, 50)
    assert plain.selection.rule == "max-votes" and plain.selected_index == 1


def test_add_remove_neighbours_need_less_noise_and_are_reported():
    replace = request(clients=10)
    add_remove = request(clients=10, neighbouring="add-remove")
    assert add_remove.sigma < replace.sigma
    result = SumRelease().release(add_remove, np.zeros(6), 10)
    assert result.report.neighbouring == "add-remove" and result.report.epsilon == pytest.approx(1.0, rel=1e-6)
    assert VoteRequest.from_record(add_remove.to_record()) == add_remove
