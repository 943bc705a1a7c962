"""The attacks against the whole DP-Hype client (``register_dphype``: node policy,
privacy ledger, DP-Hype's SecAgg+ with its checks of every stage) and the real server (``DPHype``, or one
that tampers with its messages), in process: each fails closed -- every client refuses with a sanitized
reason, no secret share leaves it, nothing is spent that was not sent, and the epsilon a node's ledger
records is at least what the server could release. Honest rounds with dropouts still release the exact
sum.

Unless a test says otherwise the nodes run the default node policy (:data:`dphype.node.policy.POLICY_KEYS`:
epsilon 1, delta 1e-5, at least 10 clients and 4 neighbours, lifetime epsilon 4), so ``N = 10`` clients.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from helpers import CANDS, CLIENTS, TableTask, argmax_config, argmax_grid, client_app, scores_table
from helpers import sum_config as flower_config

from dphype.cli import main
from dphype.flower import DPHype, PreflightError, register_dphype
from dphype.flower.client import node_policy
from dphype.flower.local import LocalGrid, node_id
from dphype.flower.server.readiness import run_preflight
from dphype.flower.server.secagg_server import advertise_record, run_secure_sum
from dphype.flower.tally_node import load_tally_key
from dphype.flower.wire import (
    APPROVAL_STATE,
    COMMITTEE_VOTE_TYPE,
    PREFLIGHT_TYPE,
    RECORD_KEY,
    STAGE_KEY,
    TALLY_KEY,
    TALLY_TYPE,
)
from dphype.node.ledger import Ledger
from dphype.node.policy import POLICY_ENV, NodePolicy, PolicyError, check_vote_request, default_ledger_path
from dphype.privacy.accounting import mechanism_epsilon, vote_sensitivity
from dphype.privacy.noise import client_noise_std
from dphype.protocol import VoteRequest
from dphype.secure import secagg as secagg_protocol
from dphype.secure.secure_sum import SecureSumError

N = 10


def config(**overrides):
    """test_flower's configuration, selected by the argmax (the selection rule is not what these tests check)."""
    return flower_config(**{"rule": "max-votes", **overrides})


def votes_spent(n: int = N) -> list[int]:
    """How many votes each node's ledger holds (default ledger per partition-id, under the test's FLWR_HOME)."""
    return [len(Ledger(default_ledger_path(pid)).entries()) for pid in range(n)]


def recorded_epsilon(pid: int) -> float:
    """Epsilon of the votes node ``pid``'s ledger recorded (at its delta, 1e-5)."""
    return Ledger(default_ledger_path(pid)).spent(1e-5)


def released_epsilon(request: VoteRequest, noise_shares: int) -> float:
    """Epsilon (delta 1e-5, RDP for Skellam) of a sum that really holds ``noise_shares`` clients' shares."""
    cfg = request.config
    std = client_noise_std(request.sigma, cfg.clients, cfg.dropout) * np.sqrt(noise_shares)
    return mechanism_epsilon(*vote_sensitivity(cfg.k, "replace-one"), std, cfg.noise, 1e-5, "rdp")


def refusal_codes(grid: LocalGrid) -> list[str]:
    """Reason codes of the clients' error replies (a client raises a sanitized ``Refusal: <code>: <detail>``)."""
    return sorted(reply.error.reason.split(": ")[1] for reply in grid.replies
                  if reply.has_error() and reply.error.reason.startswith("Refusal: "))


def secret_replies(grid: LocalGrid) -> list[dict]:
    """Replies that carried a share of a secret: encrypted shares (share_keys) or unmasking shares."""
    out = []
    for reply in grid.replies:
        if reply.has_error() or STAGE_KEY not in reply.content.config_records:
            continue
        content = dict(reply.content.config_records[STAGE_KEY])
        if content.get("ciphertexts") or content.get("b_shares") or content.get("s_shares"):
            out.append(content)
    return out


def approve(grid: LocalGrid, selection: DPHype) -> list[int]:
    """A server's pre-flight of ``selection``'s request to every node (whatever the count): the ready nodes."""
    content = RecordDict({RECORD_KEY: ConfigRecord(selection.request.to_record())})
    replies = grid.send_and_receive([Message(content, nid, PREFLIGHT_TYPE) for nid in grid.get_node_ids()])
    return sorted(r.metadata.src_node_id for r in replies if r.content[RECORD_KEY]["status"] == "ready")


def vote_round(grid: LocalGrid, selection: DPHype, nodes: list[int], *, min_survivors: int | None = None):
    """A server's secure-sum round of ``selection``'s request over ``nodes``; it unmasks with as few as
    ``min_survivors`` contributors (default all: an honest server of a request without dropout)."""
    return run_secure_sum(grid, nodes, selection.request.digest(), size=len(CANDS), noise="skellam",
                          min_survivors=len(nodes) if min_survivors is None else min_survivors)


class TamperingGrid(LocalGrid):
    """A server that rewrites each stage's content (``tamper(node, content) -> content``) before delivery,
    and can act (``before(stage, grid)``) before a stage is sent."""

    def __init__(self, app: ClientApp, n: int, tamper: Callable[[str, int, dict], dict] | None = None,
                 before: Callable[[str, LocalGrid], Any] | None = None, **kwargs: Any) -> None:
        super().__init__(app, n, **kwargs)
        self.tamper = tamper
        self.before = before

    def push_messages(self, messages):
        messages = list(messages)
        stages = {m.content.config_records[STAGE_KEY]["stage"] for m in messages
                  if STAGE_KEY in m.content.config_records}
        for stage in stages:
            if self.before is not None:
                self.before(stage, self)
        if self.tamper is not None:
            for msg in messages:
                record = msg.content.config_records.get(STAGE_KEY)
                if record is not None:
                    new = self.tamper(str(record["stage"]), msg.metadata.dst_node_id, dict(record))
                    msg.content.config_records[STAGE_KEY] = ConfigRecord(new)
        return super().push_messages(messages)


# ------------------------------------------------------------------------------------------- honest rounds
def test_honest_round_with_a_dropout_in_every_stage_releases_the_exact_sum(recorded_votes):
    n = 14  # xi = 0.4: at least 9 contributors
    drop = {1: "advertise", 4: "share_keys", 6: "masked_input", 7: "consistency", 8: "unmask"}

    def lose(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        record = msg.content.config_records.get(STAGE_KEY)
        if record is not None and drop.get(int(context.node_config["partition-id"])) == record["stage"]:
            raise ConnectionError("node lost")
        return call_next(msg, context)

    scores = scores_table(n)
    app = register_dphype(ClientApp(mods=[lose]), lambda ctx: TableTask(scores[int(ctx.node_config["partition-id"])]))
    grid = LocalGrid(app, n, node_config={"dphype-min-clients": 9})
    selection = DPHype(CANDS, config(clients=n, dropout=0.4))
    result = selection.start(grid)
    # nodes 7 and 8 were lost after sending their masked vectors: their votes are in the sum
    assert result.report.survivors == 11 and len(recorded_votes) == 11
    np.testing.assert_array_equal(result.noisy_sum, np.sum(recorded_votes, axis=0))
    assert refusal_codes(grid) == []  # no refusal: only the lost nodes' errors
    assert votes_spent(n) == [0 if pid in (1, 4, 6) else 1 for pid in range(n)]
    # what each ledger recorded covers the release: its 11 noise shares (the ledger assumed 9)
    released = released_epsilon(selection.request, result.report.survivors)
    assert all(recorded_epsilon(pid) >= released for pid in range(n) if pid not in (1, 4, 6))


# ------------------------------------------------------------------------------------------ the attacks
def keys_at(blob: bytes, indices: list[int]) -> bytes:
    """The keys at ``indices`` of a concatenated key list (32 bytes each)."""
    return b"".join(blob[32 * i:32 * i + 32] for i in indices)


def only(stage_name: str, change: Callable[[int, dict], dict]) -> Callable[[str, int, dict], dict]:
    return lambda stage, node, content: change(node, content) if stage == stage_name else content


@pytest.mark.parametrize(("tamper", "code"), [
    (only("share_keys", lambda node, c: {**c, "threshold": 1}), "secagg_setup"),
    (only("share_keys", lambda node, c: {**c, "neighbours": 2, "threshold": 2}), "secagg_setup"),
    (only("share_keys", lambda node, c: {**c, **{k: keys_at(c[k], [c["nodes"].index(node)]) for k in
                                                 ("c_keys", "s_keys", "g_keys")}, "nodes": [node],
                                         "neighbours": 0}), "secagg_neighbours")])
def test_fake_round_with_threshold_1_or_no_neighbours_gets_no_share(tamper, code):
    grid = TamperingGrid(client_app(scores_table(N)), N, tamper)
    with pytest.raises(SecureSumError, match=f"Client failures: {N} x Refusal: {code}: "):
        DPHype(CANDS, config(clients=N)).start(grid)
    assert refusal_codes(grid) == [code] * N
    assert secret_replies(grid) == []  # no share of any secret left a client
    assert votes_spent() == [0] * N  # and no vote was cast


def test_overclaimed_clients_with_a_small_share_set_get_nothing():
    # the request claims 1023 clients (sigma split over 1023 shares); 12 take part, and the server runs the
    # round with them as if that were enough
    n = 12
    claim = DPHype(CANDS, config(clients=1023))
    grid = LocalGrid(client_app(scores_table(n)), n)
    ready = approve(grid, claim)
    assert len(ready) == n  # the request alone cannot tell
    with pytest.raises(SecureSumError, match=rf"{n} x Refusal: secagg_neighbours: {n} nodes in the round, outside "
                                             r"\[1023, 1023\]"):
        vote_round(grid, claim, ready)  # the server unmasks once all 12 contributed
    assert secret_replies(grid) == [] and votes_spent(n) == [0] * n  # recorded 0, released nothing


def test_partitioned_graph_at_xi_0_gets_nothing():
    # two cliques of 5 (10 clients announced, xi = 0): each half is shown a key list of its own half only
    halves = [[node_id(i) for i in range(5)], [node_id(i) for i in range(5, 10)]]

    def split(stage: str, node: int, content: dict) -> dict:
        if stage != "share_keys":
            return content
        half = next(h for h in halves if node in h)
        keep = [i for i, n in enumerate(content["nodes"]) if n in half]
        return {**content, "nodes": half, **{k: keys_at(content[k], keep) for k in ("c_keys", "s_keys", "g_keys")},
                "neighbours": 4, "threshold": 3}

    grid = TamperingGrid(client_app(scores_table(N)), N, split)
    with pytest.raises(SecureSumError, match=rf"{N} x Refusal: secagg_neighbours: 5 nodes in the round, outside "
                                             r"\[10, 10\]"):
        DPHype(CANDS, config(clients=N)).start(grid)
    assert secret_replies(grid) == [] and votes_spent() == [0] * N


def test_request_switched_between_stages_aborts_the_round():
    honest = DPHype(CANDS, config(clients=N))
    switched = DPHype(CANDS, config(clients=1023))  # a pre-flight of another request arrives mid-round

    def preflight_again(stage: str, grid: LocalGrid) -> None:
        if stage == "masked_input":
            answers = approve_raw(grid, switched)
            assert {a["code"] for a in answers} == {"secagg_round"}

    grid = TamperingGrid(client_app(scores_table(N)), N, before=preflight_again)
    with pytest.raises(SecureSumError, match=f"{N} x Refusal: malformed_request: no vote request was approved"):
        honest.start(grid)
    assert votes_spent() == [0] * N  # no vote computed, nothing recorded, nothing released
    # the next honest run starts afresh from a new pre-flight
    assert honest.start(LocalGrid(client_app(scores_table(N)), N)).report.survivors == N


def test_the_vote_charges_the_guarantee_the_preflight_approved_without_checking_it_again(monkeypatch):
    import dphype.flower.client as client

    checked: list[float] = []

    def counted(request, policy):
        checked.append(request.config.epsilon)
        return check_vote_request(request, policy)

    monkeypatch.setattr(client, "check_vote_request", counted)
    selection = DPHype(CANDS, config(clients=N))
    selection.start(LocalGrid(client_app(scores_table(N)), N))
    assert checked == [1.0] * N  # once per node, in the pre-flight; the vote's process reuses its result
    expected = check_vote_request(selection.request, NodePolicy())
    for pid in range(N):
        (entry,) = Ledger(default_ledger_path(pid)).entries()
        assert entry.request == selection.request.digest()
        assert (entry.epsilon, entry.total_std, entry.survivors) == (expected.epsilon, expected.total_std, N)
        assert recorded_epsilon(pid) >= released_epsilon(selection.request, N) * (1 - 1e-9)


def test_a_policy_tightened_between_preflight_and_vote_is_enforced_at_the_vote(monkeypatch):
    def tighten(stage: str, grid: LocalGrid) -> None:
        if stage == "masked_input":  # the operator lowers the node's limit while the round runs
            monkeypatch.setenv(POLICY_ENV, "dphype-max-epsilon=0.5")

    grid = TamperingGrid(client_app(scores_table(N)), N, before=tighten)
    with pytest.raises(SecureSumError, match=f"{N} x Refusal: policy: this node's privacy policy does not admit"):
        DPHype(CANDS, config(clients=N)).start(grid)
    assert votes_spent() == [0] * N


def approve_raw(grid: LocalGrid, selection: DPHype) -> list[dict]:
    content = RecordDict({RECORD_KEY: ConfigRecord(selection.request.to_record())})
    replies = LocalGrid.send_and_receive(grid, [Message(content, nid, PREFLIGHT_TYPE)
                                                for nid in grid.get_node_ids()])
    return [dict(r.content[RECORD_KEY]) for r in replies]


def test_the_rounds_first_stage_rides_on_the_preflight_bound_to_the_approved_request():
    selection = DPHype(CANDS, config(clients=N))
    grid = LocalGrid(client_app(scores_table(N)), N)
    approve(grid, selection)  # an approval whose round never started is replaced by the next pre-flight
    assert selection.start(grid).report.survivors == N
    stages = [str(m.content.config_records[STAGE_KEY]["stage"]) for m in grid.sent[N:]]
    assert stages == [s for s in ("advertise", "share_keys", "masked_input", "consistency", "unmask") for _ in range(N)]
    assert {m.metadata.message_type for m in grid.sent[N:2 * N]} == {PREFLIGHT_TYPE}
    keys = [dict(r.content.config_records[STAGE_KEY]) for r in grid.replies[N:2 * N]]
    assert all(r.content.config_records[RECORD_KEY]["status"] == "ready" for r in grid.replies[N:2 * N])
    assert all(len(k["c_key"]) == len(k["s_key"]) == len(k["g_key"]) == 32 for k in keys)
    # an advertise for another request than the one the pre-flight carries is refused, and nothing is approved
    other = secagg_protocol.message("advertise", round=bytes(16), request="ff" * 32)
    fresh = DPHype(CANDS, config(clients=N, k=2)).request  # not voted on in this run
    content = RecordDict({RECORD_KEY: ConfigRecord(fresh.to_record()), STAGE_KEY: ConfigRecord(other)})
    replies = grid.send_and_receive([Message(content, nid, PREFLIGHT_TYPE) for nid in grid.get_node_ids()])
    assert {(r.content[RECORD_KEY]["status"], r.content[RECORD_KEY]["code"]) for r in replies} == {
        ("refused", "secagg_round")}
    assert all(STAGE_KEY not in r.content.config_records for r in replies)
    with pytest.raises(SecureSumError, match=f"{N} x Refusal: malformed_request: no vote request was approved"):
        vote_round(grid, selection, sorted(grid.get_node_ids()))
    assert votes_spent() == [1] * N


def test_forged_share_ciphertexts_charge_no_budget():
    def forge(stage: str, node: int, content: dict) -> dict:
        if stage != "masked_input":
            return content
        return {**content, "ciphertexts": [c[:-1] + bytes([c[-1] ^ 1]) for c in content["ciphertexts"]]}

    grid = TamperingGrid(client_app(scores_table(N)), N, forge)
    with pytest.raises(SecureSumError, match=f"{N} x Refusal: secagg_neighbours: a share ciphertext failed"):
        DPHype(CANDS, config(clients=N)).start(grid)
    assert votes_spent() == [0] * N


@pytest.mark.parametrize("skip", ["consistency", "masked_input"])
def test_a_skipped_stage_aborts_the_round(skip):
    after = {"consistency": "unmask", "masked_input": "consistency"}[skip]

    def skip_stage(stage: str, node: int, content: dict) -> dict:
        return {**content, "stage": after} if stage == skip else content

    grid = TamperingGrid(client_app(scores_table(N)), N, skip_stage)
    with pytest.raises(SecureSumError, match=f"{N} x Refusal: secagg_round: stage '{after}' arrived where "
                                             f"'{skip}' was due"):
        DPHype(CANDS, config(clients=N)).start(grid)
    assert [r for r in secret_replies(grid) if r.get("b_shares") or r.get("s_shares")] == []
    # skipping the consistency round: the masked vectors were sent (and recorded), never unmasked
    assert votes_spent() == [1 if skip == "consistency" else 0] * N


def test_survivor_lists_that_differ_between_nodes_are_refused():
    # the server tells half the nodes that the other half dropped, and the other half the reverse
    half = {node_id(i) for i in range(5)}

    def views(stage: str, node: int, content: dict) -> dict:
        if stage != "consistency":
            return content
        listed = list(zip(content["survivors"], content["receipts"], strict=True))
        mine = [(n, r) for n, r in listed if (n in half) == (node in half)]
        return {**content, "survivors": [n for n, _ in mine], "receipts": [r for _, r in mine]}

    grid = TamperingGrid(client_app(scores_table(N)), N, views)
    with pytest.raises(SecureSumError):
        DPHype(CANDS, config(clients=N)).start(grid)
    assert refusal_codes(grid) == ["secagg_unmask"] * N  # 5 survivors: fewer than 10 at xi = 0
    assert [r for r in secret_replies(grid) if r.get("b_shares") or r.get("s_shares")] == []


def test_absurd_requests_are_refused_before_scoring():
    calls: list[int] = []

    class CountingTask(TableTask):
        def score(self, candidates):
            calls.append(1)
            return super().score(candidates)

    scores = scores_table(N)
    app = register_dphype(ClientApp(), lambda ctx: CountingTask(scores[int(ctx.node_config["partition-id"])]))
    grid = LocalGrid(app, N)
    honest = DPHype(CANDS, config(clients=N))
    too_many = {**honest.request.to_record(), "dphype.clients": 2**40}  # n beyond the maximum (no config holds it)
    for lie in (VoteRequest(CANDS, honest.config, 1e9).to_record(), too_many):  # and sigma far beyond the calibration
        answers = approve_raw(grid, type("S", (), {"request": type("R", (), {"to_record": lambda self, r=lie: r})()})())
        assert {a["code"] for a in answers} == {"malformed_request"}
    assert calls == []


@pytest.mark.parametrize("delta", [0.5, 0.9])
def test_requests_at_delta_0_5_and_0_9_are_refused_in_the_preflight(delta):
    grid = LocalGrid(client_app(scores_table(N)), N)
    with pytest.raises(PreflightError, match=f"{N} of {N} clients are not ready: {N} x refused: policy "):
        DPHype(CANDS, config(clients=N, delta=delta)).start(grid)
    # the same noise announced as delta 1e-5: the client recomputes epsilon from sigma
    lying = DPHype(CANDS, config(clients=N))
    lying.request = VoteRequest(CANDS, lying.config, DPHype(CANDS, config(clients=N, delta=delta)).request.sigma)
    with pytest.raises(PreflightError, match=f"{N} x refused: noise_too_small"):
        lying.start(grid)
    assert {m.metadata.message_type for m in grid.sent} == {PREFLIGHT_TYPE}  # no vote round
    assert votes_spent() == [0] * N


def test_repeated_requests_stop_at_the_lifetime_budget(capsys):
    def run(run_id: int) -> LocalGrid:  # the same nodes (their ledgers) in run after run
        return LocalGrid(client_app(scores_table(N)), N, node_config={"dphype-lifetime-epsilon": 2.5}, run_id=run_id)

    selection = DPHype(CANDS, config(clients=N))  # the same request every time, epsilon 1 each
    accepted = 0
    with pytest.raises(PreflightError, match=f"{N} of {N} clients are not ready: {N} x refused: policy "):
        for run_id in range(1, 300):
            selection.start(run(run_id))
            accepted += 1
    assert 3 <= accepted <= 8  # RDP composition: more than 2 votes of epsilon 1 fit in 2.5
    for run_id in range(1000, 1003):  # every later request is refused in the pre-flight, before any client scores
        grid = run(run_id)
        with pytest.raises(PreflightError, match=f"{N} x refused: policy "):
            selection.start(grid)
        assert [m.metadata.message_type for m in grid.sent] == [PREFLIGHT_TYPE] * N
    # the ledger shows the spend: every vote of the same request recorded, composed within the budget
    assert votes_spent() == [accepted] * N
    assert {e.request for e in Ledger(default_ledger_path(3)).entries()} == {selection.request.digest()}
    capsys.readouterr()
    assert main(["ledger", "--partition-id", "3", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert shown["path"] == str(default_ledger_path(3)) and shown["votes"] == accepted
    assert 2.0 < shown["epsilon"] <= 2.5


def test_a_server_named_candidate_path_is_never_opened(tmp_path):
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
                                             PREFLIGHT_TYPE) for i in range(N)])
    answers = [dict(reply.content[RECORD_KEY]) for reply in replies]
    assert [(a["status"], a["code"]) for a in answers] == [("refused", "malformed_request")] * N
    assert opened == [] and "alice" not in json.dumps(answers)
    assert all(APPROVAL_STATE not in context.state.config_records for context in grid.contexts.values())  # not approved


def test_errors_carrying_data_reach_the_server_sanitized(tmp_path):
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
    with pytest.raises(PreflightError, match="4 x refused: policy "):  # the defaults: epsilon 20 is too much
        DPHype(CANDS, config(clients=4, epsilon=20.0)).start(grid)
    monkeypatch.setenv(POLICY_ENV, "dphype-max-epsilon=20 dphype-min-clients=4 dphype-min-neighbours=2 "
                                   "dphype-lifetime-epsilon=20")
    assert DPHype(CANDS, config(clients=4, epsilon=20.0)).start(grid).report.epsilon == pytest.approx(20.0)
    monkeypatch.setenv(POLICY_ENV, "dphype-max-epsilon=twenty")  # a broken policy refuses, never falls back
    with pytest.raises(PreflightError, match="4 x refused: node_policy") as info:
        DPHype(CANDS, config(clients=4, epsilon=20.0)).start(grid)
    assert "twenty" not in str(info.value)


# ------------------------------------------------------------------------------------ release modes
def test_a_sum_vote_on_an_approved_argmax_request_fails_closed_and_opens_nothing(tmp_path):
    """Release-mode switch: the nodes approve an argmax request (pure epsilon, noise calibrated to hide
    one index) and the server runs the SecAgg+ sum on it, with the round's first stage riding on the pre-flight or
    in a stage of its own. Its noisy count vector would carry far more epsilon than the ledger's pure epsilon:
    every node refuses (``release_mode``) before a round key, a share or a masked vector leaves it, so nothing
    is opened and nothing is charged (the ledger's 0 is at least the release's nothing)."""
    grid, keys = argmax_grid(tmp_path)
    voters = [node_id(i) for i in range(CLIENTS)]
    request = DPHype(CANDS, argmax_config(), tallies=keys).request
    round_id, advertise = advertise_record(request.digest())
    with pytest.raises(PreflightError, match=f"{CLIENTS} x refused: release_mode"):
        run_preflight(grid, request, voters, 60, advertise)
    ready, _, _ = run_preflight(grid, request, voters, 60)  # approved without the SecAgg+ stage ...
    assert sorted(ready) == voters
    with pytest.raises(SecureSumError, match=f"{CLIENTS} x Refusal: release_mode"):  # ... its own advertise fails
        run_secure_sum(grid, voters, request.digest(), size=len(CANDS), noise="skellam", min_survivors=CLIENTS)
    assert not [r for r in grid.replies if not r.has_error() and STAGE_KEY in r.content.config_records]
    assert all(not Ledger(NodePolicy.from_node_config(grid.contexts[n].node_config).ledger).entries()
               for n in voters)


def test_issue_23_a_committee_vote_or_a_tally_collect_on_an_approved_sum_request_is_refused(tmp_path):
    """The reverse switch: a sum request approved in the pre-flight, then the committee vote (sealed shares) or a
    tally's collect on it: both refuse with ``release_mode``; nothing is sealed, charged or collected."""
    grid, keys = argmax_grid(tmp_path)
    voters = [node_id(i) for i in range(CLIENTS)]
    summed = DPHype(CANDS, config(clients=CLIENTS, epsilon=4.0)).request
    ready, _, _ = run_preflight(grid, summed, voters, 60)
    assert sorted(ready) == voters
    vote = [Message(RecordDict({RECORD_KEY: ConfigRecord(summed.to_record())}), n, COMMITTEE_VOTE_TYPE) for n in voters]
    replies = grid.send_and_receive(vote)
    assert sorted(r.error.reason.split(": ")[1] for r in replies) == ["release_mode"] * CLIENTS
    tally = node_id(CLIENTS)
    collect = {**summed.to_record(), "stage": "collect", "contributors": [], "shares": []}
    (reply,) = grid.send_and_receive([Message(RecordDict({TALLY_KEY: ConfigRecord(collect)}), tally, TALLY_TYPE)])
    assert reply.error.reason.startswith("Refusal: release_mode: a tally collects shares only")
    assert all(not Ledger(NodePolicy.from_node_config(grid.contexts[n].node_config).ledger).entries()
               for n in voters)


@pytest.mark.parametrize("taken", [3, 2, 1])
def test_a_committee_vote_for_a_committee_other_than_the_approved_one_is_refused_before_anything_leaves(tmp_path,
                                                                                                     taken):
    """After the pre-flight approved the pinned committee, the server sends the committee vote with a request naming
    ``taken`` tally keys it holds itself in place of the approved ones (with two or three it opens every ballot in
    clear): every node refuses (``malformed_request``) before a sealed share leaves it and before its ledger is
    charged, because the vote must carry the approved request itself (its digest)."""
    grid, keys = argmax_grid(tmp_path)
    voters = [node_id(i) for i in range(CLIENTS)]
    approved = DPHype(CANDS, argmax_config(), tallies=keys).request
    ready, _, _ = run_preflight(grid, approved, voters, 60)
    assert sorted(ready) == voters
    server_keys = tuple(load_tally_key(tmp_path / f"server-{j}.key").public for j in range(taken))
    swapped = DPHype(CANDS, argmax_config(), tallies=server_keys + keys[taken:]).request
    assert swapped.tallies != approved.tallies and swapped.config == approved.config
    vote = [Message(RecordDict({RECORD_KEY: ConfigRecord(swapped.to_record())}), n, COMMITTEE_VOTE_TYPE)
            for n in voters]
    replies = grid.send_and_receive(vote)
    answered = [r.metadata.src_node_id for r in replies if not r.has_error()]
    assert not answered, f"nodes {answered} sealed their ballots to a committee the pre-flight did not approve"
    assert sorted(r.error.reason.split(": ")[1] for r in replies) == ["malformed_request"] * CLIENTS
    assert all("not the one approved in the pre-flight" in r.error.reason for r in replies)
    charged = [n for n in voters if Ledger(NodePolicy.from_node_config(grid.contexts[n].node_config).ledger).entries()]
    assert not charged, f"nodes {charged} charged their ledgers for a vote on an unapproved committee"


def test_a_sum_request_re_run_in_the_same_run_is_refused_and_charged_once():
    """One vote per request and run: a SecAgg+ vote cannot be given twice (its noise share and masks belong to
    one round), so the server's re-run of the request in the same run is refused in the pre-flight, before any
    node scores, and each ledger holds the one vote."""
    grid = LocalGrid(client_app(scores_table(N)), N)
    selection = DPHype(CANDS, config(clients=N))
    selection.start(grid)
    sent = len(grid.sent)
    with pytest.raises(PreflightError, match=f"{N} x refused: already_voted"):
        selection.start(grid)
    assert [m.metadata.message_type for m in grid.sent[sent:]] == [PREFLIGHT_TYPE] * N
    assert votes_spent() == [1] * N


def test_a_vote_memory_that_does_not_parse_fails_closed():
    """A node whose vote memory has a line that does not parse (a torn append, an edit) refuses every vote
    (``ledger_error``) instead of reading it as 'never voted' and voting, and being charged, again."""
    grid = LocalGrid(client_app(scores_table(N)), N)
    selection = DPHype(CANDS, config(clients=N))
    selection.start(grid)
    for pid in range(N):
        memory = default_ledger_path(pid).with_name(default_ledger_path(pid).name + ".votes")
        memory.write_text('{"run": 1, "requ\n' + memory.read_text())  # a torn line, then this run's vote
    with pytest.raises(PreflightError, match=f"{N} x refused: ledger_error"):
        selection.start(grid)
    assert votes_spent() == [1] * N
