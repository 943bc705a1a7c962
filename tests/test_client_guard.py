"""Issue 8's attacks against the whole DP-Hype client (``register_dphype``: node policy, privacy ledger, the
SecAgg+ checks of every stage) and the real server (``DPHype``, or one that tampers with its messages), in
process: each fails closed -- every client refuses with a sanitized reason, no secret share leaves it,
nothing is spent that was not sent, and nothing is released. Honest rounds with dropouts still release
the exact sum.

Unless a test says otherwise the nodes run the default node policy (:data:`dphype.node.policy.POLICY_KEYS`:
epsilon 1, delta 1e-5, at least 10 clients and 4 neighbours, lifetime epsilon 4), so ``N = 10`` clients.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from test_flower import CANDS, TableTask, client_app, scores_table
from test_flower import config as flower_config
from test_secagg_guard_flower import TamperingGrid, _secret_replies

from dphype.cli import main
from dphype.flower import DPHype, PreflightError, register_dphype
from dphype.flower.client import RECORD_KEY, node_policy
from dphype.flower.local import LocalGrid, node_id
from dphype.flower.secagg import run_secure_sum, secagg_graph
from dphype.flower.server import PREFLIGHT_MESSAGE_TYPE
from dphype.node.ledger import Ledger
from dphype.node.policy import POLICY_ENV, NodePolicy, PolicyError, default_ledger_path
from dphype.protocol import VoteRequest
from dphype.secure.guard import dphype_encoding
from dphype.secure.secagg_params import CORRUPT_FRACTION
from dphype.secure.secure_sum import SecureSumError

N = 10


def config(**overrides):
    """test_flower's configuration, selected by the argmax (the selection rule is not what these tests check)."""
    return flower_config(**{"rule": "argmax", **overrides})


def votes_spent(n: int = N) -> list[int]:
    """How many votes each node's ledger holds (default ledger per partition-id, under the test's FLWR_HOME)."""
    return [len(Ledger(default_ledger_path(pid)).entries()) for pid in range(n)]


def refusal_codes(grid: LocalGrid) -> list[str]:
    """Reason codes of the clients' error replies (a client raises a sanitized ``Refusal: <code>: <detail>``)."""
    return sorted(reply.error.reason.split(": ")[1] for reply in grid.replies
                  if reply.has_error() and reply.error.reason.startswith("Refusal: "))


def approve(grid: LocalGrid, selection: DPHype) -> list[int]:
    """A server's pre-flight of ``selection``'s request to every node (whatever the count): the ready nodes."""
    content = RecordDict({RECORD_KEY: ConfigRecord(selection.request.to_record())})
    replies = grid.send_and_receive([Message(content, nid, PREFLIGHT_MESSAGE_TYPE) for nid in grid.get_node_ids()])
    return sorted(r.metadata.src_node_id for r in replies if r.content[RECORD_KEY]["status"] == "ready")


def vote_round(grid: LocalGrid, selection: DPHype, nodes: list[int]):
    """A server's SecAgg+ round of ``selection``'s request over ``nodes`` (all of which must contribute)."""
    return run_secure_sum(grid, nodes, selection.request.to_record(), size=len(CANDS), noise="skellam",
                          min_survivors=len(nodes))


# ------------------------------------------------------------------------------------------- honest rounds
def test_honest_round_with_a_dropout_in_every_stage_releases_the_exact_sum(recorded_votes):
    drop = {1: Stage.SETUP, 4: Stage.SHARE_KEYS, 6: Stage.COLLECT_MASKED_VECTORS, 8: Stage.UNMASK}

    def lose(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
        if configs is not None and drop.get(int(context.node_config["partition-id"])) == configs[Key.STAGE]:
            raise ConnectionError("node lost")
        return call_next(msg, context)

    scores = scores_table(N)
    app = register_dphype(ClientApp(mods=[lose]), lambda ctx: TableTask(scores[int(ctx.node_config["partition-id"])]))
    grid = LocalGrid(app, N, node_config={"dphype-min-clients": 7})  # ceil((1 - 0.3) 10) contributors
    result = DPHype(CANDS, config(clients=N, dropout=0.3)).start(grid)
    # node 8 was lost after sending its masked vector: its vote is in the sum, its masks were removed
    assert result.report.survivors == 7 and len(recorded_votes) == 7
    np.testing.assert_array_equal(result.noisy_sum, np.sum(recorded_votes, axis=0))
    assert result.report.epsilon == pytest.approx(1.0, rel=1e-6)
    assert refusal_codes(grid) == []  # no refusal: only the four lost nodes' errors
    assert sum(reply.has_error() for reply in grid.replies) == 4
    assert votes_spent() == [0 if pid in (1, 4, 6) else 1 for pid in range(N)]


# ------------------------------------------------------------------------------------------ the attacks
def threshold_1(node: int, configs: ConfigRecord) -> None:
    configs[Key.THRESHOLD] = 1


def only_own_key(node: int, configs: ConfigRecord) -> None:
    for key in [k for k in configs if k not in (Key.STAGE, str(node))]:
        del configs[key]


@pytest.mark.parametrize(("stage", "tamper", "code"), [(Stage.SETUP, threshold_1, "secagg_setup"),
                                                       (Stage.SHARE_KEYS, only_own_key, "secagg_neighbours")])
def test_issue_8_fake_round_with_threshold_1_and_no_neighbours_gets_no_share(stage, tamper, code):
    grid = TamperingGrid(client_app(scores_table(N)), N, stage, tamper)
    with pytest.raises(SecureSumError, match=f"nothing was released. Client failures: {N} x Refusal: {code}: "):
        DPHype(CANDS, config(clients=N)).start(grid)
    assert refusal_codes(grid) == [code] * N
    assert _secret_replies(grid, Stage.SHARE_KEYS) == []  # no share of any secret left a client
    assert votes_spent() == [0] * N  # and no vote was cast


@pytest.mark.parametrize("lie", ["overlap", "self dead"])
def test_issue_8_unmask_lists_that_would_reveal_both_secrets_are_refused(lie):
    def tamper(node: int, configs: ConfigRecord) -> None:
        active = list(configs[Key.ACTIVE_NODE_ID_LIST])
        configs[Key.DEAD_NODE_ID_LIST] = [node] if lie == "self dead" else [next(a for a in active if a != node)]

    grid = TamperingGrid(client_app(scores_table(N)), N, Stage.UNMASK, tamper)
    with pytest.raises(SecureSumError, match=f"Client failures: {N} x Refusal: secagg_unmask: "):
        DPHype(CANDS, config(clients=N)).start(grid)
    assert refusal_codes(grid) == ["secagg_unmask"] * N
    assert _secret_replies(grid, Stage.UNMASK) == []  # no client handed out a share: the sum stays masked
    assert votes_spent() == [1] * N  # the masked vectors were sent, so the votes count


@pytest.mark.parametrize("delta", [0.5, 0.9])
def test_issue_8_requests_at_delta_0_5_and_0_9_are_refused_in_the_preflight(delta):
    grid = LocalGrid(client_app(scores_table(N)), N)
    with pytest.raises(PreflightError, match=f"{N} of {N} clients are not ready: {N} x refused: policy_delta"):
        DPHype(CANDS, config(clients=N, delta=delta)).start(grid)
    # the same noise announced as delta 1e-5: the client recomputes epsilon from sigma
    lying = DPHype(CANDS, config(clients=N))
    lying.request = VoteRequest(CANDS, lying.config, DPHype(CANDS, config(clients=N, delta=delta)).request.sigma)
    with pytest.raises(PreflightError, match=f"{N} x refused: noise_too_small"):
        lying.start(grid)
    assert {m.metadata.message_type for m in grid.sent} == {PREFLIGHT_MESSAGE_TYPE}  # no vote round
    assert votes_spent() == [0] * N


def test_issue_8_an_overclaimed_number_of_clients_is_refused_before_any_share_leaves():
    n = 12
    claim = DPHype(CANDS, config(clients=1023))  # sigma split over 1023 clients, 12 take part
    grid = LocalGrid(client_app(scores_table(n)), n)
    ready = approve(grid, claim)
    assert len(ready) == n  # the request alone cannot tell
    with pytest.raises(SecureSumError, match=rf"{n} x Refusal: secagg_setup: sample_num={n} is outside \[1023, 1023\]"):
        vote_round(grid, claim, ready)

    secure_1023 = secagg_graph(1023, 1023, None, None, CORRUPT_FRACTION)

    def claim_1023(node: int, configs: ConfigRecord) -> None:  # the setup claims 1023 clients too
        configs.update({Key.SAMPLE_NUMBER: 1023, Key.SHARE_NUMBER: secure_1023.num_shares,
                        Key.THRESHOLD: secure_1023.threshold, **dphype_encoding(1023)})

    tampering = TamperingGrid(client_app(scores_table(n)), n, Stage.SETUP, claim_1023)
    assert approve(tampering, claim) == ready
    with pytest.raises(SecureSumError, match=f"{n} x Refusal: secagg_neighbours: \\d+ neighbours in a round of 1023 "):
        vote_round(tampering, claim, ready)  # the neighbour keys give the claim away
    assert _secret_replies(tampering, Stage.SHARE_KEYS) == []
    assert votes_spent(n) == [0] * n


def test_issue_8_repeated_requests_stop_at_the_lifetime_budget(capsys):
    grid = LocalGrid(client_app(scores_table(N)), N, node_config={"dphype-lifetime-epsilon": 2.5})
    selection = DPHype(CANDS, config(clients=N))  # the same request every time, epsilon 1 each
    accepted = 0
    with pytest.raises(PreflightError, match=f"{N} of {N} clients are not ready: {N} x refused: lifetime_budget"):
        for _ in range(300):
            selection.start(grid)
            accepted += 1
    assert 3 <= accepted <= 8  # RDP composition: more than 2 votes of epsilon 1 fit in 2.5
    sent = len(grid.sent)
    for _ in range(3):  # every later request is refused in the pre-flight, before any client scores
        with pytest.raises(PreflightError, match=f"{N} x refused: lifetime_budget"):
            selection.start(grid)
    assert len(grid.sent) == sent + 3 * N
    assert {m.metadata.message_type for m in grid.sent[sent:]} == {PREFLIGHT_MESSAGE_TYPE}
    # the ledger shows the spend: every vote of the same request recorded, composed within the budget
    assert votes_spent() == [accepted] * N
    assert {e.request for e in Ledger(default_ledger_path(3)).entries()} == {selection.request.digest()}
    capsys.readouterr()
    assert main(["ledger", "--partition-id", "3", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert shown["path"] == str(default_ledger_path(3)) and shown["votes"] == accepted
    assert 2.0 < shown["epsilon"] <= 2.5


def test_issue_8_a_server_named_candidate_path_is_never_opened(tmp_path):
    secret = tmp_path / "candidates.json"
    secret.write_text('[{"patient": "alice", "hiv": "positive"}]')
    opened: list = []
    sys.addaudithook(lambda event, args: opened.append(args) if event == "open" and str(args[0]) == str(secret)
                     else None)
    # the run config names the file too: the client reads neither
    grid = LocalGrid(client_app(scores_table(N)), N, run_config={"candidates": str(secret)})
    record = DPHype(CANDS, config(clients=N)).request.to_record()
    record["dphype.candidates"] = str(secret)  # instead of the list itself
    replies = grid.send_and_receive([Message(RecordDict({RECORD_KEY: ConfigRecord(record)}), node_id(i),
                                             PREFLIGHT_MESSAGE_TYPE) for i in range(N)])
    answers = [dict(reply.content[RECORD_KEY]) for reply in replies]
    assert [(a["status"], a["code"]) for a in answers] == [("refused", "malformed_request")] * N
    assert opened == [] and "alice" not in json.dumps(answers)
    assert all(RECORD_KEY not in context.state.config_records for context in grid.contexts.values())  # not approved


def test_issue_8_errors_carrying_data_reach_the_server_sanitized(tmp_path):
    # the node's own candidate copy has a duplicate entry whose text carries data
    own = tmp_path / "own.json"
    own.write_text(json.dumps([{"patient": "alice", "hiv": "positive"}] * 2))
    grid = LocalGrid(client_app(scores_table(N)), N, node_config={"dphype-candidates": str(own)})
    with pytest.raises(PreflightError, match=f"{N} x refused: node_policy") as info:
        DPHype(CANDS, config(clients=N)).start(grid)
    assert "alice" not in str(info.value) and str(own) not in str(info.value)

    # in the vote: the ledger turns unreadable (and would quote its path) between pre-flight and vote
    grid = LocalGrid(client_app(scores_table(N)), N)
    selection = DPHype(CANDS, config(clients=N))
    ready = approve(grid, selection)
    for pid in range(N):
        default_ledger_path(pid).write_text('{"patient": "alice"}')
    with pytest.raises(SecureSumError, match=f"{N} x Refusal: ledger_error: ") as info:
        vote_round(grid, selection, ready)
    reasons = " ".join(reply.error.reason for reply in grid.replies if reply.has_error())
    for text in (str(info.value), reasons):
        assert "alice" not in text and str(default_ledger_path(0).parent) not in text


# ------------------------------------------------------------------------------------- policy channels
def context(node_config: dict) -> Context:
    # the server's run config names limits too: never read
    return Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(),
                   run_config={"dphype-max-epsilon": 99.0, "epsilon": 99.0, "max_epsilon": 99.0})


def test_the_policy_is_the_node_configs_over_the_environments(monkeypatch, tmp_path):
    monkeypatch.setenv(POLICY_ENV, f'dphype-max-epsilon=3 dphype-min-clients=4 dphype-ledger="{tmp_path}/l.json"')
    policy = node_policy(context({"partition-id": 2, "dphype-max-epsilon": 2.0}))
    assert (policy.max_epsilon, policy.min_clients, policy.ledger) == (2.0, 4, tmp_path / "l.json")
    monkeypatch.delenv(POLICY_ENV)
    policy = node_policy(context({"partition-id": 2, "num-partitions": 5}))
    assert policy == NodePolicy(ledger=default_ledger_path(2))  # the documented defaults
    for bad in ("partition-id=3", "dphype-max-epsilonn=2", "dphype-max-epsilon=0", "dphype-max-epsilon=", "x.toml"):
        monkeypatch.setenv(POLICY_ENV, bad)
        with pytest.raises(PolicyError):
            node_policy(context({"partition-id": 2}))


def test_the_simulation_operators_channel_admits_its_own_run(monkeypatch):
    grid = LocalGrid(client_app(scores_table(4)), 4)
    with pytest.raises(PreflightError, match="4 x refused: policy_epsilon"):  # the defaults: epsilon 20 is too much
        DPHype(CANDS, config(clients=4, epsilon=20.0)).start(grid)
    monkeypatch.setenv(POLICY_ENV, "dphype-max-epsilon=20 dphype-min-clients=4 dphype-min-neighbours=2 "
                                   "dphype-lifetime-epsilon=20")
    assert DPHype(CANDS, config(clients=4, epsilon=20.0)).start(grid).report.epsilon == pytest.approx(20.0)
    monkeypatch.setenv(POLICY_ENV, "dphype-max-epsilon=twenty")  # a broken policy refuses, never falls back
    with pytest.raises(PreflightError, match="4 x refused: node_policy") as info:
        DPHype(CANDS, config(clients=4, epsilon=20.0)).start(grid)
    assert "twenty" not in str(info.value)
