"""Argmax mode end to end over the Message API, in process: clients, 3 tally nodes, MPyC on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from helpers import CANDS, CLIENTS, alive, argmax_grid, sum_config
from helpers import argmax_config as config

import dphype.flower.server.committee_server as committee_server
import dphype.flower.tally_node as flower_tally
from dphype.config import DPHypeConfig
from dphype.flower import DPHype, PreflightError
from dphype.flower.local import node_id
from dphype.flower.server.committee_server import connected_committee, run_committee_selection
from dphype.flower.wire import TALLY_KEY, TALLY_STATE
from dphype.node.ledger import Ledger
from dphype.node.pki import issue_mpyc_party, make_ca
from dphype.node.policy import NodePolicy
from dphype.privacy.winner import WINNER_NOISE
from dphype.release import DEFAULT_ARGMAX_BALLOT
from dphype.secure.committee import Tally, TallyError, client_sealed_shares, voter_id
from dphype.selection.ballots import BallotForm


def test_argmax_selection_releases_only_the_index_and_every_client_records_pure_epsilon(tmp_path):
    grid, keys = argmax_grid(tmp_path)
    result = DPHype(CANDS, config(), tallies=keys).start(grid, timeout=60)
    # every client puts candidate 5 first: the noisy max is 5 unless the noise (std ~0.5 here) moves 6 votes
    assert result.selected_index == 5 and result.selected == CANDS[5]
    out = result.to_dict()
    # no counts, no confidence, no ranking of the others
    assert out["noisy_sum"] is None and out["confidence"] is None and out["estimate"] is None
    assert result.table() == [{"rank": 1, "index": 5, **CANDS[5]}]
    assert (result.report.epsilon, result.report.noise, result.report.survivors) == (4.0, WINNER_NOISE, CLIENTS)
    types = [m.metadata.message_type for m in grid.sent]
    assert types.count("train.dphype_committee") == CLIENTS and "train.dphype" not in types
    for i in range(CLIENTS):
        policy = NodePolicy.from_node_config(grid.contexts[node_id(i)].node_config)
        (entry,) = Ledger(policy.ledger).entries()
        assert (entry.noise, entry.epsilon) == (WINNER_NOISE, pytest.approx(4.0))
    # the server relayed ciphertexts only: no share it forwarded opens without the tally's key
    collect = [m for m in grid.sent if m.metadata.message_type == "query.dphype_tally"
               and m.content.config_records[TALLY_KEY].get("stage") == "collect"]
    assert len(collect) == 3 and all(len(m.content.config_records[TALLY_KEY]["shares"]) == CLIENTS
                                     for m in collect)


def test_an_unreachable_tally_stops_the_run_before_the_clients_are_asked(tmp_path):
    grid, keys = argmax_grid(tmp_path, silent=[CLIENTS + 2])  # tally 2 never answers
    with pytest.raises(TallyError, match="tally 2 is unreachable .* nothing was sent to the clients"):
        DPHype(CANDS, config(), tallies=keys).start(grid, timeout=1)
    assert {m.metadata.message_type for m in grid.sent} == {"query.dphype_tally"}


def test_a_tally_that_never_computes_makes_the_others_time_out_and_nothing_is_released(tmp_path, monkeypatch):
    grid, keys = argmax_grid(tmp_path)
    real = flower_tally._TallyNode.stage

    def drop_compute(self, record):  # tally 1 acknowledges but never hands its MPyC party the job
        if self.index == 1 and record.get("stage") == "compute":
            return {"started": True}
        return real(self, record)

    monkeypatch.setattr(flower_tally._TallyNode, "stage", drop_compute)
    server = DPHype(CANDS, config(), tallies=keys)
    with pytest.raises(TallyError, match="tally 0 failed the result stage .*tally 0 did not answer within 1 s"):
        run_committee_selection(grid, server.request, preflight=server._preflight, timeout=60, connect_timeout=5,
                             tally_timeout=1.0)


@pytest.mark.slow  # two whole selections; the tally's own refusal is tested fast in tests/secure/test_committee.py
def test_a_second_opening_for_the_same_request_is_refused_by_the_tallies(tmp_path):
    grid, keys = argmax_grid(tmp_path)
    server = DPHype(CANDS, config(), tallies=keys)
    server.start(grid, timeout=60)
    with pytest.raises(TallyError, match="tally 0 failed the collect stage .*refuses a second opening for request"):
        server.start(grid, timeout=60)


def test_committee_nodes_from_the_callers_hello_are_checked_and_not_asked_again(tmp_path):
    grid, keys = argmax_grid(tmp_path)
    tallies = [node_id(CLIENTS + j) for j in range(3)]
    server = DPHype(CANDS, config(), tallies=keys)
    with pytest.raises(ValueError, match="committee_nodes must name 3 distinct nodes"):
        server.start(grid, timeout=60, committee_nodes=tallies[:2])
    with pytest.raises(ValueError, match="committee_nodes must name 3 distinct nodes"):
        server.start(grid, timeout=60, committee_nodes=[tallies[0], tallies[0], tallies[1]])
    with pytest.raises(TallyError, match="committee node 12345 is not connected"):
        server.start(grid, timeout=60, committee_nodes=[*tallies[:2], 12345])
    summed = DPHype(CANDS, DPHypeConfig(epsilon=1.0, delta=1e-5, k=2, clients=CLIENTS))
    with pytest.raises(ValueError,
                       match=r"committee_nodes applies to the committee releases \(argmax, committee-sum\) only"):
        summed.start(grid, timeout=60, committee_nodes=tallies)
    assert grid.sent == []  # every refusal above came before any message
    result = server.start(grid, timeout=60, committee_nodes=tallies)
    assert result.selected_index in range(len(CANDS))
    assert not [m for m in grid.sent if m.metadata.message_type == "query.dphype_tally"
                and m.content.config_records[TALLY_KEY].get("stage") == "hello"]


def test_bad_committees_are_refused_before_anything_runs(tmp_path):
    grid, keys = argmax_grid(tmp_path)
    with pytest.raises(ValueError, match="at least 3 tallies, got 2"):
        DPHype(CANDS, config(), tallies=keys[:2])
    with pytest.raises(ValueError, match="duplicate tallies"):
        DPHype(CANDS, config(), tallies=(keys[0], keys[1], keys[0]))
    # a node that pins other tallies refuses in the pre-flight: too few are ready, nothing is released
    for i in range(CLIENTS):
        grid.contexts[node_id(i)].node_config["dphype-tallies"] = ",".join(k.hex() for k in keys[:2])
    with pytest.raises(PreflightError, match="tally_committee"):
        DPHype(CANDS, config(), tallies=keys).start(grid, timeout=60)
    assert np.all([not Ledger(NodePolicy.from_node_config(grid.contexts[node_id(i)].node_config).ledger).entries()
                   for i in range(CLIENTS)])


def test_clients_refusing_the_committee_vote_send_nothing_and_too_few_shares_release_nothing(tmp_path, monkeypatch):
    grid, keys = argmax_grid(tmp_path)
    from dphype.release import ArgmaxRelease

    real = ArgmaxRelease.ballot
    calls = []

    def flaky(self, request, scores, *, maximize, clipping_range=None, voter=None):  # the 2nd and 3rd votes fail
        calls.append(1)
        if len(calls) in (2, 3):
            raise RuntimeError("disk full at /secret/path")
        return real(self, request, scores, maximize=maximize, voter=voter)

    monkeypatch.setattr(ArgmaxRelease, "ballot", flaky)
    # 6 clients, dropout 0: the committee counts at least 5 valid ballots (one misbehaving member in 10 tolerated)
    with pytest.raises(PreflightError, match=r"(?s)only 4 clients sent their shares, fewer than the committee's "
                                             r"minimum of valid ballots 5; .*the 4 voters that sent their shares each "
                                             r"recorded this one vote"):
        DPHype(CANDS, config(), tallies=keys).start(grid, timeout=60)
    errors = [r.error.reason for r in grid.replies if r.has_error()]
    assert errors and all("secret" not in e for e in errors) and any("client_error" in e for e in errors)
    assert not any(m.metadata.message_type == "query.dphype_tally" and
                   m.content.config_records[TALLY_KEY].get("stage") == "collect" for m in grid.sent)


def modified_ballots(monkeypatch, cheaters, boost):
    """Modified client code on the ``cheaters`` (voter ids): their ballot is ``boost``, shared without the check."""
    from dphype.release import CommitteeMode
    from dphype.secure.committee import field_modulus, share_context, split_shares
    from dphype.secure.relay import seal

    real = CommitteeMode.ballot

    def ballot(self, request, scores, *, maximize, clipping_range=None, voter=None):
        if voter not in cheaters:
            return real(self, request, scores, maximize=maximize, voter=voter)
        shares = split_shares(boost, 3, field_modulus())
        return [seal(key, np.asarray(share, dtype=np.uint64).tobytes(),
                     context=share_context(request.digest(), j, voter))
                for j, (key, share) in enumerate(zip(request.tallies, shares, strict=True))]

    monkeypatch.setattr(CommitteeMode, "ballot", ballot)


def test_a_malicious_voters_boost_is_excluded_and_named_and_too_many_release_nothing(tmp_path, monkeypatch):
    """Malicious voters: one client running modified code casts 30 votes for candidate 0 (every honest
    client ranks candidate 5 first). The tallies leave its ballot out and name it; the consensus wins; the result and
    its summary name the sender, never the content. With two such clients fewer valid ballots than the minimum
    remain (6 clients, dropout 0.2: at least 5 contributors, at least 4 valid ballots): two are left out and named,
    three release nothing and the error names them."""
    from dphype.flower.federation import voter_name
    from dphype.secure.committee import voter_id

    boost = np.zeros(len(CANDS), dtype=np.int64)
    boost[0] = 30
    grid, keys = argmax_grid(tmp_path)
    modified_ballots(monkeypatch, {voter_id(1, voter_name(0))}, boost)
    # epsilon 20: the noise (std 0.1) cannot move the 4 votes between candidate 5 and the next
    result = DPHype(CANDS, config(dropout=0.2, epsilon=20.0), tallies=keys).start(grid, timeout=60)
    assert result.selected_index == 5 and result.report.excluded == (voter_name(0),)
    assert (result.report.survivors, result.report.ballots_verified) == (CLIENTS - 1, True)
    assert f"1 invalid left out, from contributors {voter_name(0)}" in result.summary()
    grid, keys = argmax_grid(tmp_path / "2", run_id=2)
    modified_ballots(monkeypatch, {voter_id(2, voter_name(0)), voter_id(2, voter_name(1))}, boost)
    result = DPHype(CANDS, config(dropout=0.2), tallies=keys).start(grid, timeout=60)
    assert result.report.excluded == (voter_name(0), voter_name(1)) and result.report.survivors == CLIENTS - 2
    grid, keys = argmax_grid(tmp_path / "3", run_id=3)
    modified_ballots(monkeypatch, {voter_id(3, voter_name(i)) for i in range(3)}, boost)
    with pytest.raises(TallyError, match=rf"only 3 valid ballots, fewer than the committee's minimum 4 .*contributors "
                                         rf"{voter_name(0)}, {voter_name(1)}, {voter_name(2)}"):
        DPHype(CANDS, config(dropout=0.2), tallies=keys).start(grid, timeout=60)


def test_the_committee_opens_the_noisy_sum_of_the_verified_ballots_and_the_rule_selects(tmp_path, monkeypatch):
    """Release="committee-sum": the whole noisy vector of the valid ballots (for the GP rule), the tallies' noise,
    a boosted ballot left out and named; every client's ledger records the sum release's epsilon."""
    from dphype.flower.federation import voter_name
    from dphype.secure.committee import voter_id

    boost = np.zeros(len(CANDS), dtype=np.int64)
    boost[0] = 30
    grid, keys = argmax_grid(tmp_path)
    modified_ballots(monkeypatch, {voter_id(1, voter_name(0))}, boost)
    cfg = config(release="committee-sum", epsilon=100.0, dropout=0.2, rule="max-votes")  # noise std ~0.2
    result = DPHype(CANDS, cfg, tallies=keys).start(grid, timeout=60)
    assert result.noisy_sum is not None and result.noisy_sum.shape == (len(CANDS),)
    assert result.selection is not None and result.selected_index == 5  # every honest client ranks 5 first
    assert result.noisy_sum[0] < 15  # the 30 votes were not counted
    assert result.report.excluded == (voter_name(0),) and result.report.noise == "skellam"
    for i in range(1, CLIENTS):
        policy = NodePolicy.from_node_config(grid.contexts[node_id(i)].node_config)
        (entry,) = Ledger(policy.ledger).entries()
        assert entry.noise == "skellam" and entry.epsilon <= 100.0 * (1 + 1e-6)


def test_the_servers_description_names_the_release_and_only_what_applies_to_it(tmp_path):
    _, keys = argmax_grid(tmp_path)
    winner = repr(DPHype(CANDS, config(), tallies=keys))
    assert "release='argmax'" in winner and "tallies=3" in winner and "neighbouring='replace-one'" in winner
    assert "delta" not in winner and "noise=" not in winner and "rule=" not in winner
    summed = repr(DPHype(CANDS, config(release="sum")))
    assert "release='sum'" in summed and "delta=1e-05" in summed and "rule='gp'" in summed


def test_an_argmax_result_carries_the_preflights_notes_as_a_sum_result_does(tmp_path, monkeypatch):
    """Both aggregators' results get the pre-flight's notes (here: simulated nodes with per-run ledgers), through
    the one dispatch of ``DPHype.start``."""
    import dphype.flower.client.policy_client as client_policy

    monkeypatch.setattr(client_policy, "simulated", lambda: True)  # as in a Ray worker of Flower's simulation
    grid, keys = argmax_grid(tmp_path)
    result = DPHype(CANDS, config(), tallies=keys).start(grid, timeout=60, connect_timeout=60)
    assert result.notes == (f"{CLIENTS} of {CLIENTS} nodes are simulated with a per-run ledger: their lifetime "
                            "budget restarts with every run (an operator who names dphype-ledger keeps one across "
                            "runs)",)


def collect_messages(grid) -> list:
    """The ``collect`` stages the server sent to the tallies (the sealed shares it relayed)."""
    return [m for m in grid.sent if m.metadata.message_type == "query.dphype_tally"
            and m.content.config_records[TALLY_KEY].get("stage") == "collect"]


def voters_epsilon(grid) -> list[float]:
    """Every voter's recorded epsilon (pure epsilon of its committee votes, summed as the ledger lists them)."""
    return [sum(e.epsilon for e in Ledger(NodePolicy.from_node_config(grid.contexts[node_id(i)].node_config)
                                          .ledger).entries()) for i in range(CLIENTS)]


@pytest.mark.parametrize("federation", [False, True])
@pytest.mark.parametrize("relabel", ["one_share_as_all", "one_share_as_another"])
def test_one_ballot_relabelled_as_many_contributors_fails_closed(tmp_path, relabel, federation):
    """One ballot counted many times: the server relays client 0's sealed shares as every contributor's
    (their noise: one share instead of six, epsilon >= 2.36 where the ledgers record 1.00), or as
    another contributor's, its signatures moved along (with a roster). A share is bound to its contributor's node id
    and run and refused by content when repeated; with a roster it is bound to the member's name and signed by its
    identity, and a share under another member's name does not verify: every tally leaves those shares out, fewer
    than the committee's minimum of valid ballots remain and the collect stage fails at every tally, no
    index is opened, the ledger's epsilon (>= 0) covers it."""
    grid, keys = argmax_grid(tmp_path, federation=federation)
    real = grid.push_messages

    def relay(messages):
        messages = list(messages)
        for m in messages:
            record = m.content.config_records.get(TALLY_KEY)
            if record is not None and record.get("stage") == "collect":
                contributors, shares = list(record["contributors"]), list(record["shares"])
                signatures = list(record.get("signatures", []))
                if relabel == "one_share_as_all":
                    record["shares"] = [shares[0]] * len(shares)
                    if federation:
                        record["signatures"] = [signatures[0]] * len(shares)
                else:  # client 1's label on client 0's share, client 0 left out
                    record["contributors"], record["shares"] = contributors[1:], [shares[0], *shares[2:]]
                    if federation:
                        record["signatures"] = [signatures[0], *signatures[2:]]
        return real(messages)

    grid.push_messages = relay
    taken = "1 of 6" if relabel == "one_share_as_all" else "4 of 5"  # at least 5 valid ballots needed
    reason = (f"tally_refused: tally 0 takes only {taken} shares, under the committee's minimum 5; nothing "
              "released\n" + (r"left out first: node-1, its roster signature does not verify" if federation else
                              r"left out first: 1001, its share is not this contributor's"))
    with pytest.raises(TallyError, match=f"tally 0 failed the collect stage .*{reason}"):
        DPHype(CANDS, config(), tallies=keys).start(grid, timeout=60)
    assert not [m for m in grid.sent if m.metadata.message_type == "query.dphype_tally"
                and m.content.config_records[TALLY_KEY].get("stage") in ("compute", "result")]
    assert voters_epsilon(grid) == [pytest.approx(4.0)] * CLIENTS  # each paid for its one vote; nothing opened


@pytest.mark.parametrize("federation", [False, True])
def test_the_same_ciphertexts_replayed_to_the_tallies_in_a_later_run_or_after_a_restart_open_nothing(
        tmp_path, federation):
    """Replay to the tallies in a later run: after an honest run, the server sends the tallies the same
    collect stages (the same ciphertexts) in a new run (they are bound to their run: they do not open) and, with
    the old run id reused, to a restarted tally whose context state is gone (its record beside the key refuses the
    request served in that run). Every voter's ledger holds the one release that was opened. With a roster (the
    same one) the signatures are bound to their run too."""
    grid, keys = argmax_grid(tmp_path, federation=federation)
    DPHype(CANDS, config(), tallies=keys).start(grid, timeout=60)
    replayed = collect_messages(grid)
    assert len(replayed) == 3
    for run_id, reason in ((2, "tally_refused: tally [012] takes only 0 of 6 shares, .*" +
                            ("its roster signature does not verify" if federation else
                             "is not this contributor's for request .*, this run and this tally")),
                           (1, "tally_refused: tally [012].*refuses a second opening for request")):
        later, _ = argmax_grid(tmp_path, run_id=run_id, federation=federation)  # the same tally keys (and records)
        for node, context in later.contexts.items():  # the same federation, fresh contexts
            context.node_config.update({k: v for k, v in grid.contexts[node].node_config.items()
                                        if k in ("dphype-roster", "dphype-identity")})
        messages = [Message(RecordDict({TALLY_KEY: ConfigRecord(dict(m.content.config_records[TALLY_KEY]))}),
                            m.metadata.dst_node_id, "query.dphype_tally") for m in replayed]
        replies = later.send_and_receive(messages)
        assert len(replies) == 3 and all(r.has_error() for r in replies)
        assert all(re.search(f"(?s)Refusal: {reason}", r.error.reason) for r in replies)
    assert voters_epsilon(grid) == [pytest.approx(4.0)] * CLIENTS  # one vote, one release: pure epsilon 4 each


def test_every_malformed_or_out_of_range_tally_stage_is_refused_with_a_refusal_code(tmp_path):
    """Every malformed stage, and a ``compute`` or ``result`` wait outside (0, MAX_RESULT_WAIT] (NaN or infinity
    would park the tally, or its party, forever), is refused with a refusal code, never a raw ``KeyError`` or
    ``ValueError`` text. (Unauthenticated: a roster's own checks are in test_roster.)"""
    grid, keys = argmax_grid(tmp_path, federation=False)
    tally = node_id(CLIENTS)
    request = DPHype(CANDS, config(), tallies=keys).request.to_record()
    wait = flower_tally.MAX_RESULT_WAIT
    stages = {
        "malformed_request": [{"stage": stage, "timeout": t} for stage in ("compute", "result") for t in
                              (float("nan"), float("inf"), -1.0, 0.0, wait * (1 + 1e-9), True, "5")]
        + [{"stage": "result"}, {"stage": "compute"}, {"stage": "bogus"}, {}, {"stage": "collect"},
           {**request, "stage": "collect"},  # no contributors, no shares
           {**request, "stage": "collect", "contributors": [1, 2], "shares": [b"x"]},
           {**request, "stage": "collect", "contributors": ["a"], "shares": [b"x"]}],
        "tally_refused": [{"stage": "result", "timeout": wait}, {"stage": "result", "timeout": 1e-9},
                          {"stage": "compute", "timeout": 1.0}],  # in range, but nothing is running or collected
    }
    for code, contents in stages.items():
        replies = grid.send_and_receive([Message(RecordDict({TALLY_KEY: ConfigRecord(c)}), tally, "query.dphype_tally")
                                         for c in contents])
        assert len(replies) == len(contents)
        assert [r.error.reason.split(": ")[:2] for r in replies] == [["Refusal", code]] * len(contents), code
    (reply,) = grid.send_and_receive([Message(RecordDict(), tally, "query.dphype_tally")])  # no stage record at all
    assert reply.error.reason.startswith("Refusal: malformed_request")
    (reply,) = grid.send_and_receive([Message(RecordDict({TALLY_KEY: ConfigRecord({"stage": "compute"})}),
                                              node_id(0), "query.dphype_tally")])  # a voter asked as a tally
    assert reply.error.reason.startswith("Refusal: tally_refused: this node is not a tally")


def test_the_server_says_when_the_ballot_does_not_vote_with_the_configured_k(tmp_path, caplog):
    """The default ballot chooses its own k: the server's log names it and the configured k it does not use (and
    how to vote with it); a top-k ballot with the same k says nothing of the kind."""
    grid, keys = argmax_grid(tmp_path)
    server = DPHype(CANDS, config(k=3), tallies=keys)
    votes = server.config.mode.votes_per_client(server.config, len(CANDS))
    assert server.config.ballot == DEFAULT_ARGMAX_BALLOT and votes != 3
    with caplog.at_level("WARNING"):
        server.start(grid, timeout=60)
    assert (f"the {DEFAULT_ARGMAX_BALLOT!r} ballot votes for {votes} candidates per client, not the configured k=3 "
            "(set ballot='top-k' to vote with k=3)") in caplog.text
    caplog.clear()
    grid, keys = argmax_grid(tmp_path, run_id=2)
    with caplog.at_level("WARNING"):
        DPHype(CANDS, config(k=3, ballot="top-k"), tallies=keys).start(grid, timeout=60)
    assert "votes for" not in caplog.text


def test_a_sum_release_samples_its_voters_among_the_nodes_that_answer_as_voters(tmp_path):
    grid, _ = argmax_grid(tmp_path)  # the committee's 3 tallies are connected too, and refuse a sum pre-flight
    tallies = [node_id(CLIENTS + j) for j in range(3)]
    summed = sum_config(clients=CLIENTS, dropout=0.0)  # every sampled node must be ready
    committee = connected_committee(grid, summed, connect_timeout=5, timeout=10)
    assert committee.others == tuple(tallies) and committee.keys == () and committee.nodes == ()
    assert sorted(committee.voters.get_node_ids()) == [node_id(i) for i in range(CLIENTS)]
    result = DPHype(CANDS, summed).start(committee.selection_grid, timeout=60, connect_timeout=5)
    assert result.report.survivors == CLIENTS
    preflight = [m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "query.dphype"]
    assert sorted(preflight) == [node_id(i) for i in range(CLIENTS)]  # no tally was asked to vote
    # more voters than the tallies leave: the run waits for them, then says so
    with pytest.raises(PreflightError, match=r"only 6 of clients=7 voters connected within 0.3 s: start more "
                                             r"voters, or set clients lower\n\(besides 3 tally"):
        connected_committee(grid, sum_config(clients=CLIENTS + 1), connect_timeout=0.3, timeout=10)


def test_with_exactly_the_voters_connected_a_sum_release_asks_no_node_its_role(tmp_path):
    grid, _ = argmax_grid(tmp_path, tallies=0)
    committee = connected_committee(grid, sum_config(clients=CLIENTS), connect_timeout=5, timeout=10)
    assert committee.others == () and grid.sent == []


@pytest.mark.parametrize("abort_at", ["compute", "result"])
def test_a_server_that_aborts_a_release_at_any_stage_leaves_no_mpc_party_running(tmp_path, monkeypatch, abort_at):
    """The server stops before a stage (it never sends it): before ``compute`` no party was started; before
    ``result`` (tally 1 never started its party either) the two parties waiting for it end by the compute stage's
    deadline, the server's ``tally_timeout``."""
    grid, keys = argmax_grid(tmp_path)
    real_stage, real_ask = flower_tally._TallyNode.stage, committee_server._ask

    def drop_compute(self, record):
        if self.index == 1 and record.get("stage") == "compute":
            return {"started": True}
        return real_stage(self, record)

    def abort(grid_, nodes, content, *args):
        if next(iter(content.values()))["stage"] == abort_at:
            raise TallyError("the server aborts")
        return real_ask(grid_, nodes, content, *args)

    monkeypatch.setattr(flower_tally._TallyNode, "stage", drop_compute)
    monkeypatch.setattr(committee_server, "_ask", abort)
    server = DPHype(CANDS, config(), tallies=keys)
    with pytest.raises(TallyError, match="the server aborts"):
        run_committee_selection(grid, server.request, preflight=server._preflight, timeout=60, connect_timeout=5,
                                tally_timeout=1.0)
    saved = [json.loads(grid.contexts[node_id(CLIENTS + j)].state.config_records[TALLY_STATE]["json"])
             for j in range(3)]
    pids = [s["pid"] for s in saved if s["pid"] is not None]
    assert len(pids) == (0 if abort_at == "compute" else 2)
    deadline = time.monotonic() + 1.0 + 10.0  # the deadline, and the time to start an interpreter on a busy machine
    try:
        while any(alive(pid) for pid in pids):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        for pid in filter(alive, pids):
            os.kill(pid, signal.SIGKILL)


def test_a_request_re_run_in_the_same_run_after_too_few_valid_ballots_charges_each_honest_voter_once(tmp_path,
                                                                                                       monkeypatch):
    """The server re-runs a failed request in the same run: a relay damaged two voters' shares in transit, so the
    tallies take 4 of 6 shares, below the floor of 5, and refuse before the request counts as served; the server
    then runs the same request again (pre-flight, votes, tallies). Every voter answers with the very shares it sent
    the first time and is not charged again, even after a restart that lost its context state: its memory of the
    vote is on disk beside its ledger. One opening, one vote in each ledger."""
    grid, keys = argmax_grid(tmp_path)
    server = DPHype(CANDS, config(), tallies=keys)
    real_ask = committee_server._ask
    damaged = []

    def damage_in_transit(grid_, nodes, content, *args):
        records = list(content.values())
        if records[0]["stage"] == "collect" and not damaged:
            damaged.append(True)
            for record in records:
                record["shares"] = [bytes([b ^ 1 for b in share]) if i < 2 else share
                                    for i, share in enumerate(record["shares"])]
        return real_ask(grid_, nodes, content, *args)

    monkeypatch.setattr(committee_server, "_ask", damage_in_transit)
    with pytest.raises(TallyError, match="takes only 4 of 6 shares, under the committee's minimum"):
        server.start(grid, timeout=60)
    voters = [node_id(i) for i in range(CLIENTS)]
    for n in voters:  # a restart: the node's context state is gone, its disk is not
        grid.contexts[n].state = RecordDict()
    result = server.start(grid, timeout=60)
    assert result.selected_index == 5
    sealed = {}
    for reply in grid.replies:
        if not reply.has_error() and reply.metadata.message_type == "train.dphype_committee":
            sealed.setdefault(reply.metadata.src_node_id, []).append(list(reply.content.config_records["dphype"]
                                                                          ["shares"]))
    assert sorted(sealed) == voters and all(len(s) == 2 and s[0] == s[1] for s in sealed.values())
    for n in voters:
        assert len(Ledger(NodePolicy.from_node_config(grid.contexts[n].node_config).ledger).entries()) == 1


def test_a_tally_refuses_a_request_listing_its_key_at_another_index_whose_shares_are_another_partys(tmp_path):
    """The clients seal share j (Shamir x-coordinate j + 1) to the j-th key of the request: a tally listed at
    another index than its own would feed its MPyC party another party's points."""
    grid, keys = argmax_grid(tmp_path, federation=False)
    swapped = DPHype(CANDS, config(), tallies=(keys[1], keys[0], keys[2])).request
    collect = {**swapped.to_record(), "stage": "collect", "contributors": [], "shares": []}
    (reply,) = grid.send_and_receive([Message(RecordDict({TALLY_KEY: ConfigRecord(collect)}), node_id(CLIENTS),
                                              "query.dphype_tally")])
    assert reply.error.reason.startswith("Refusal: tally_refused: tally 0 is not tally 0 of this request's committee")


def test_a_tally_whose_operator_set_tls_runs_its_mpyc_party_with_ssl_in_its_tls_folder(tmp_path, monkeypatch):
    """``dphype-tally-tls``: the party must run with MPyC's ``--ssl`` (mutual TLS and the party-name pin) in that
    folder; without it the parties would talk plain TCP although the node's operator asked for TLS. The command is
    read where the node starts it (a party whose peers never start may end before its /proc entry is read)."""
    started: list[tuple[list[str], object]] = []
    real_popen = subprocess.Popen

    def popen(args, *rest, **kwargs):
        started.append(([str(a) for a in args] if isinstance(args, list | tuple) else [str(args)], kwargs.get("cwd")))
        return real_popen(args, *rest, **kwargs)

    monkeypatch.setattr(flower_tally.subprocess, "Popen", popen)
    grid, keys = argmax_grid(tmp_path, federation=False)
    tally = node_id(CLIENTS)
    folder = issue_mpyc_party(make_ca(tmp_path / "pki", "committee CA"), tmp_path / "tls-0", 0)
    grid.contexts[tally].node_config[flower_tally.TALLY_TLS] = str(folder)
    tallies = [Tally(j) for j in range(3)]
    for t in tallies:
        t.open_round("req-tls", 5, 1, form=BallotForm.top_k(1), noise=np.zeros(5, dtype=np.int64))
    sealed = client_sealed_shares("req-tls", np.eye(5, dtype=np.int64)[2], [t.public for t in tallies],
                                  voter_id(0, "a"))
    tallies[0].receive("a", sealed[0])
    grid.contexts[tally].state.config_records[TALLY_STATE] = ConfigRecord(
        {"json": json.dumps({"job": tallies[0].job(), "pid": None, "out": None})})
    (reply,) = grid.send_and_receive([Message(RecordDict({TALLY_KEY: ConfigRecord({"stage": "compute",
                                                                                     "timeout": 120.0})}),
                                              tally, "query.dphype_tally")])
    assert not reply.has_error()
    pid = json.loads(grid.contexts[tally].state.config_records[TALLY_STATE]["json"])["pid"]
    try:
        ((command, cwd),) = [(args, cwd) for args, cwd in started if any("tally_party" in a for a in args)]
        assert "--ssl" in command and Path(str(cwd)).resolve() == folder.resolve()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_tally_key_others_may_read_is_refused(tmp_path):
    """The tally's X25519 key opens every share sealed to it: created 0600, and one that others may read is refused
    (as a roster identity key is) before the tally uses it."""
    file = tmp_path / "keys" / "tally-0.key"
    made = flower_tally.load_tally_key(file)
    assert file.stat().st_mode & 0o777 == 0o600 and file.parent.stat().st_mode & 0o777 == 0o700
    file.chmod(0o644)
    with pytest.raises(ValueError, match=r"tally-0\.key' is readable by others \(mode 644\).*chmod 600"):
        flower_tally.load_tally_key(file)
    file.chmod(0o400)
    assert flower_tally.load_tally_key(file).public == made.public
