"""DP-Hype's Flower adapters (dphype.flower) end to end against real Message-API ClientApps, in process."""

from __future__ import annotations

import time

import numpy as np
import pytest
from flwr.app import Message, RecordDict
from flwr.clientapp import ClientApp
from helpers import CANDS, client_app, grid_of, scores_table
from helpers import sum_config as config

from dphype.flower import DPHype, PreflightError, register_dphype, selected_candidate, train_config
from dphype.flower.local import node_id
from dphype.flower.wire import PREFLIGHT_TYPE, SCORES_STATE, VOTE_TYPE
from dphype.node.policy import NodePolicy
from dphype.secure import secure_sum as ss
from dphype.selection.candidates import candidate_grid


def test_selection_releases_the_exact_sum_of_the_clients_noisy_votes(recorded_votes):
    n = 6
    grid = grid_of(client_app(scores_table(n)), n)
    result = DPHype(CANDS, config(rule="max-votes")).start(grid)  # the default rule (gp) need not pick the argmax
    assert len(recorded_votes) == n
    np.testing.assert_array_equal(result.noisy_sum, np.sum(recorded_votes, axis=0))
    assert result.selected_index == int(np.argmax(result.noisy_sum))
    assert result.selected == CANDS[result.selected_index]
    report = result.report
    assert report.survivors == n and report.clients == n and report.k == 3
    assert report.noise == "skellam" and report.accountant == "rdp"
    assert report.epsilon == pytest.approx(1.0, rel=1e-6)
    # pre-flight first, then only the secure-sum round; all of it under DP-Hype's own message types
    types = [m.metadata.message_type for m in grid.sent]
    assert types[:n] == [PREFLIGHT_TYPE] * n and set(types[n:]) == {VOTE_TYPE}


def test_large_budget_selects_the_consensus_candidate():
    grid = grid_of(client_app(scores_table(8, seed=4)), 8)
    result = DPHype(CANDS, config(epsilon=100.0, k=2, clients=8)).start(grid)
    assert result.selected_index == 5  # 8 votes against at most 8 - noise of std ~0.03
    sent = train_config(result.best_params, rounds=2)
    sent["server-round"] = 1  # what a strategy adds beside it
    msg = Message(RecordDict({"config": sent}), dst_node_id=1, message_type="train")
    assert selected_candidate(msg) == {"lr": 0.1, "momentum": 0.9} and msg.content["config"]["rounds"] == 2


def test_the_users_own_handlers_keep_their_messages():
    seen: list[str] = []
    grid = grid_of(client_app(scores_table(4), own_messages=seen), 4)
    DPHype(CANDS, config(clients=4)).start(grid)
    assert seen == []  # DP-Hype's messages never reach the user's train handler
    (reply,) = grid.send_and_receive([Message(RecordDict(), 1000, "train")])
    assert seen == ["train"] and reply.content["config"]["seen"] == 1


def test_votes_travel_only_masked():
    grid = grid_of(client_app(scores_table(4)), 4)
    DPHype(CANDS, config(clients=4)).start(grid)
    for reply in grid.replies:
        assert not reply.has_error()
        assert all(len(rec) == 0 for rec in reply.content.array_records.values())
        metrics = reply.content.config_records.get("fitres.metrics")
        assert metrics is None or len(metrics) == 0


def test_scores_are_dropped_after_the_vote():
    grid = grid_of(client_app(scores_table(3)), 3)
    DPHype(CANDS, config(clients=3)).start(grid)
    for context in grid.contexts.values():
        assert SCORES_STATE not in context.state.array_records


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        (RuntimeError("patient alice"),
         "refused: task_error (task.score raised RuntimeError; to resolve: the ClientApp's task raised"),
        (np.zeros(5), "refused: score_shape"),
    ],
)
def test_preflight_refusals_reach_the_server_with_their_reason(broken, reason):
    scores = list(scores_table(5))
    scores[2] = broken
    grid = grid_of(client_app(scores), 5)
    start = time.perf_counter()
    with pytest.raises(PreflightError, match=r"1 of 5 clients are not ready: 1 x ") as info:
        DPHype(CANDS, config(clients=5)).start(grid)
    assert time.perf_counter() - start < 30
    assert reason in str(info.value) and "alice" not in str(info.value)
    assert "nothing was released" in str(info.value)
    assert all(m.metadata.message_type == PREFLIGHT_TYPE for m in grid.sent)  # no vote round


def test_a_candidate_list_mismatch_is_counted(tmp_path):
    other = tmp_path / "other.json"  # the node's own copy: same set, other order
    other.write_text(candidate_grid(lr=[0.001, 0.01, 0.1, 0.5], momentum=[0.9, 0.0]).to_json())

    def policy(ctx):  # one policy per node, from a function of its context
        own = {"dphype-candidates": str(other)} if ctx.node_config["partition-id"] < 3 else {}
        return NodePolicy.from_node_config({**ctx.node_config, **own})

    grid = grid_of(client_app(scores_table(4), policy=policy), 4)
    with pytest.raises(PreflightError, match="3 of 4 clients are not ready: 3 x refused: candidate_mismatch"):
        DPHype(CANDS, config(clients=4)).start(grid)


def test_refusals_within_the_dropout_tolerance_do_not_stop_the_vote(recorded_votes):
    scores = list(scores_table(5))
    scores[2] = RuntimeError("out of memory")
    grid = grid_of(client_app(scores), 5)
    result = DPHype(CANDS, config(clients=5, dropout=0.2)).start(grid)
    assert result.report.survivors == 4 and len(recorded_votes) == 4
    np.testing.assert_array_equal(result.noisy_sum, np.sum(recorded_votes, axis=0))
    # 4 survivors each adding sigma^2 / 4: exactly the calibrated noise, epsilon on target
    assert result.report.epsilon == pytest.approx(1.0, rel=1e-6)


def test_a_node_that_vanishes_counts_as_a_dropout():
    grid = grid_of(client_app(scores_table(5)), 5, silent=[2])
    result = DPHype(CANDS, config(clients=5, dropout=0.2)).start(grid, timeout=0.5)
    assert result.report.survivors == 4
    # the pre-flight waited 0.5 s for node 2, and the vote went on without it
    assert [m.metadata.message_type for m in grid.sent if m.metadata.dst_node_id == node_id(2)] == [
        PREFLIGHT_TYPE]
    strict = grid_of(client_app(scores_table(5)), 5, silent=[2])
    with pytest.raises(PreflightError, match="1 x no answer within the timeout"):
        DPHype(CANDS, config(clients=5)).start(strict, timeout=0.5)


def test_a_vote_that_was_not_approved_in_the_preflight_is_refused():
    grid = grid_of(client_app(scores_table(3)), 3)
    selection = DPHype(CANDS, config(clients=3))
    selection._preflight(grid, sorted(grid.get_node_ids()), None)
    other = DPHype(CANDS, config(clients=3, epsilon=2.0))  # a different request in the vote round
    from dphype.flower.server.secagg_server import run_secure_sum

    with pytest.raises(ss.SecureSumError, match="3 x .*secagg_round: the round is for another request"):
        run_secure_sum(grid, grid.get_node_ids(), other.request.digest(), size=8, noise="skellam",
                       min_survivors=3)
    errors = [r.error.reason for r in grid.replies if r.has_error()]
    assert len(errors) == 3
    assert all(SCORES_STATE in c.state.array_records for c in grid.contexts.values())  # no vote


def test_waits_for_nodes_then_gives_up():
    grid = grid_of(client_app(scores_table(3)), 3)
    with pytest.raises(PreflightError, match="only 3 of clients=4 nodes connected within 0.6 s"):
        DPHype(CANDS, config(clients=4)).start(grid, connect_timeout=0.6)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "60"])
def test_bad_timeouts_are_refused(bad):
    grid = grid_of(client_app(scores_table(3)), 3)
    selection = DPHype(CANDS, config(clients=3))
    with pytest.raises(ValueError, match=r"^timeout must be a finite number > 0, got"):
        selection.start(grid, timeout=bad)
    with pytest.raises(ValueError, match=r"^connect_timeout must be a finite number > 0, got"):
        selection.start(grid, connect_timeout=bad)
    assert grid.sent == []


def test_bad_configuration_is_refused_before_any_client_works():
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 8\]"):
        DPHype(CANDS, config(k=9))
    with pytest.raises(ValueError, match="candidates must be a CandidateList"):
        DPHype([{"lr": 0.1}], config())
    with pytest.raises(ValueError, match="policy must be a NodePolicy, a function of the context or None"):
        register_dphype(ClientApp(), lambda ctx: None, policy={"dphype-max-epsilon": 1.0})


def test_the_result_states_the_secure_sum_and_its_bounds():
    grid = grid_of(client_app(scores_table(6)), 6)
    result = DPHype(CANDS, config()).start(grid)
    secure = result.to_dict()["secure_sum"]
    assert secure["num_shares"] >= 2 * secure["threshold"] - 1 and secure["corrupt_fraction"] == pytest.approx(1 / 3)
    # Bell et al.'s bounds of the secure graph (sigma = 40, eta = 20)
    assert secure["log2_insecure"] <= -40 and secure["log2_failure"] <= -20
    # the round's first stage (advertise) rode on the pre-flight: no round trip of its own
    assert set(secure["stage_seconds"]) == {"share_keys", "masked_input", "consistency", "unmask", "finish"}
    assert 0 <= secure["clip_probability"] < 1e-9 and "delta +" in secure["statement"]


def test_construction_runs_no_simulation(monkeypatch):
    def no_planner(*args, **kwargs):
        raise AssertionError("the planner ran on construction")

    monkeypatch.setattr("dphype.protocol.check_plan", no_planner)
    DPHype(CANDS, config(epsilon=0.05, clients=4, min_success=0.9))
    with pytest.raises(ValueError, match="k must be an integer"):  # server-checkable input still refused at once
        DPHype(CANDS, config(k=9))


def test_the_planner_runs_on_demand_and_before_any_client_works():
    weak = DPHype(CANDS, config(epsilon=0.05, clients=4))  # far too little signal for 4 clients
    assert weak.plan().success < 0.5 and any("release is noise" in w for w in weak.plan().warnings)
    refused = DPHype(CANDS, config(epsilon=0.05, clients=4, min_success=0.9))
    grid = grid_of(client_app(scores_table(4)), 4)
    with pytest.raises(ValueError, match=r"^clients=4 is too few to select at epsilon 0.05: .*, or min-success = 0 "
                                         r"to run anyway\n.* simulates a good pick with 0\.\d+ < min-success 0.9"):
        refused.start(grid)
    assert grid.sent == []


# ---------------------------------------------------------------------------- fail before work
def test_a_secagg_setting_that_cannot_work_fails_before_any_client_scores():
    """Dropout 0.5 at 20 clients has no secure SecAgg+ graph: refused on construction, not after the scoring."""
    with pytest.raises(ValueError, match=r"no secure SecAgg\+ parameters for clients=20, .*dropout=0.5"):
        DPHype(CANDS, config(clients=20, dropout=0.5))
    with pytest.raises(ValueError, match="num_shares and reconstruction_threshold must be given together"):
        DPHype(CANDS, config(clients=20), num_shares=5)
    with pytest.raises(ValueError, match="no SecAgg\\+ round can sum the votes of clients=2 with dropout=0: "):
        DPHype(CANDS, config(clients=2))  # two clients' sum would tell each the other's vote


def test_waiting_for_nodes_logs_progress_and_names_the_remedy(caplog):
    import logging

    from dphype.flower.server.readiness import wait_for_nodes

    grid = grid_of(client_app(scores_table(3)), 3)
    with caplog.at_level(logging.INFO, logger="flwr"), pytest.raises(PreflightError) as info:
        wait_for_nodes(grid, 4, timeout=0.6, every=0.15)
    assert caplog.text.count("DP-Hype: waiting for nodes: 3 of clients=4 connected after") >= 2
    assert "only 3 of clients=4 nodes connected within 0.6 s; nothing was sent: start more" in str(info.value)


@pytest.mark.parametrize("bad", [np.full(8, np.nan), np.full(8, 0.5), np.tile([[0.7, -0.3]], (8, 1))])
def test_uninformative_scores_are_refused(bad):
    """A client whose task scores every candidate alike (or not at all) is refused with its own reason code."""
    table = list(scores_table(5))
    table[2] = bad
    with pytest.raises(PreflightError, match=r"1 x refused: uninformative_scores \(task.score "):
        DPHype(CANDS, config(clients=5)).start(grid_of(client_app(table), 5))
