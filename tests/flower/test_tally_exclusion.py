"""One misbehaving roster member costs its own ballot, never the release (argmax over the Message API, in process:
6 voters of one roster, 3 tally nodes, MPyC on loopback, the default dropout 0: at least 5 valid ballots).

Each attack is modified code on voter 0 only; every honest voter's ledger records its one vote, the result names the
member left out and the consensus (candidate 5) wins. A slow test runs one attack through Flower's simulation."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import CANDS, CLIENTS, TableTask, argmax_config, argmax_grid, scores_table

import dphype.flower.client.approval as client_approval
from dphype.flower.federation import voter_name
from dphype.flower.local import node_id
from dphype.flower.server import DPHype
from dphype.node.ledger import Ledger
from dphype.node.policy import NodePolicy
from dphype.release import CommitteeMode
from dphype.secure.committee import TallyError, field_modulus, share_context, split_shares, voter_id
from dphype.secure.relay import seal

CHEATER = voter_name(0)


def ledgers(grid) -> list[int]:
    return [len(Ledger(NodePolicy.from_node_config(grid.contexts[node_id(i)].node_config).ledger).entries())
            for i in range(CLIENTS)]


def modified_ballot(monkeypatch, shares_of):
    """Voter 0's ballot is ``shares_of(real, request, voter, ...)``: the sealed shares it sends (and signs)."""
    real = CommitteeMode.ballot

    def ballot(self, request, scores, *, maximize, clipping_range=None, voter=None):
        if voter != voter_id(1, CHEATER):
            return real(self, request, scores, maximize=maximize, voter=voter)
        return shares_of(lambda v: real(self, request, scores, maximize=maximize, voter=v), request, voter)

    monkeypatch.setattr(CommitteeMode, "ballot", ballot)


def dealt(request, voter, ballots):
    """Shares of ``ballots[j]``'s sharing for tally j, sealed correctly (modified code that skips the check)."""
    q = field_modulus()
    rows = [split_shares(b, 3, q)[j] for j, b in enumerate(ballots)]
    return [seal(key, np.asarray(row, dtype=np.uint64).tobytes(), context=share_context(request.digest(), j, voter))
            for j, (key, row) in enumerate(zip(request.tallies, rows, strict=True))]


class Impostor:
    """Voter 0's membership, answering under ``name`` and/or signing with ``sign``."""

    def __init__(self, membership, name=None, sign=None):
        self._membership, self._name, self._sign = membership, name, sign

    def __getattr__(self, attr):
        return getattr(self._membership, attr)

    @property
    def name(self):
        return self._name or self._membership.name

    def sign(self, *args):
        return self._sign(*args) if self._sign else self._membership.sign(*args)


def modified_membership(monkeypatch, **impostor):
    real = client_approval.approved_membership

    def approved(limits, approved_record):
        membership = real(limits, approved_record)
        return Impostor(membership, **impostor) if membership.name == CHEATER else membership

    monkeypatch.setattr(client_approval, "approved_membership", approved)


def bytes_to_tally_2(real, request, voter):
    shares = real(voter)
    return [shares[0], shares[1], os.urandom(len(shares[2]))]


def boost():
    ballot = np.zeros(len(CANDS), dtype=np.int64)
    ballot[0] = 30
    return ballot


ATTACKS = {  # attack -> (install, the member named, where: its own invalid ballot or unattributed)
    # (a) valid shares to tallies 0 and 1, bytes that do not open to tally 2 (signed by the member)
    "bytes that do not open at one tally": (lambda mp: modified_ballot(mp, bytes_to_tally_2), CHEATER, "unattributed"),
    # (b) its shares sealed under another member's label, sent as its own
    "sealed under another member's label": (lambda mp: modified_ballot(
        mp, lambda real, request, voter: real(voter_id(1, voter_name(1)))), CHEATER, "unattributed"),
    # (c) it answers as another member (node-1, who answers too), signed with its own key
    "answers as another member": (lambda mp: modified_membership(mp, name=voter_name(1)),
                                  f"{voter_name(1)} (node {node_id(0)})", "unattributed"),
    # (d) a garbage roster signature on every share
    "garbage roster signature": (lambda mp: modified_membership(mp, sign=lambda *a: b"\x01" * 64), CHEATER,
                                 "unattributed"),
    # no signature at all
    "no roster signature": (lambda mp: modified_membership(mp, sign=lambda *a: b""), CHEATER, "unattributed"),
    # invalid content: 30 votes for candidate 0
    "invalid content": (lambda mp: modified_ballot(mp, lambda real, request, voter: dealt(request, voter,
                                                                                           [boost()] * 3)), CHEATER,
                        "excluded"),
    # different ballots to different tallies (each a valid top-2 sharing, together on no line)
    "different ballots to different tallies": (lambda mp: modified_ballot(mp, lambda real, request, voter: dealt(
        request, voter, [np.eye(len(CANDS), dtype=np.int64)[[0, 1]].sum(axis=0)] * 2
        + [np.eye(len(CANDS), dtype=np.int64)[[2, 3]].sum(axis=0)])), CHEATER, "excluded"),
    # approved in the pre-flight, then no answer to the vote
    "no answer": (lambda mp: modified_ballot(mp, lambda real, request, voter: (_ for _ in ()).throw(
        RuntimeError("gone"))), f"node {node_id(0)} (no shares)", "unattributed"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_one_misbehaving_member_is_left_out_and_named_for_what_is_known_and_the_release_goes_on(tmp_path, monkeypatch,
                                                                                                 attack):
    """A share whose signature checks and whose content fails is its voter's (``excluded``); one that fails its
    signature, does not open, repeats or never arrives may be the relay's doing as much (``unattributed``)."""
    install, named, where = ATTACKS[attack]
    install(monkeypatch)
    grid, keys = argmax_grid(tmp_path)
    # epsilon 20: the noise (std ~0.1) cannot move the honest voters' lead of candidate 5
    result = DPHype(CANDS, argmax_config(epsilon=20.0), tallies=keys).start(grid, timeout=60)
    other = "excluded" if where == "unattributed" else "unattributed"
    assert (getattr(result.report, where), getattr(result.report, other)) == ((named,), ())
    assert result.report.survivors == CLIENTS - 1 and result.selected_index == 5
    assert named in result.summary() and named in result.to_dict()["privacy"][where]
    assert ledgers(grid) == [int(attack != "no answer")] + [1] * (CLIENTS - 1)  # every honest voter: one vote


def test_two_misbehaving_members_of_six_release_nothing_and_say_what_was_charged(tmp_path, monkeypatch):
    """Two of 6 (floor 5): the tallies open nothing, the error names both and what every voter paid: one vote."""
    real = CommitteeMode.ballot

    def ballot(self, request, scores, *, maximize, clipping_range=None, voter=None):
        shares = real(self, request, scores, maximize=maximize, voter=voter)
        if voter in (voter_id(1, voter_name(0)), voter_id(1, voter_name(1))):
            shares[1] = bytes(len(shares[1]))  # does not open at tally 1
        return shares

    monkeypatch.setattr(CommitteeMode, "ballot", ballot)
    grid, keys = argmax_grid(tmp_path)
    with pytest.raises(TallyError, match=r"(?s)tally 1 takes only 4 of 6 shares, under the committee's minimum "
                                         r"5; nothing released.*the 6 voters that sent their shares each recorded this "
                                         r"one vote in their ledger"):
        DPHype(CANDS, argmax_config(), tallies=keys).start(grid, timeout=60)
    assert ledgers(grid) == [1] * CLIENTS


def test_the_tallies_wait_is_set_from_start_and_checked(tmp_path):
    grid, keys = argmax_grid(tmp_path)
    server = DPHype(CANDS, argmax_config(), tallies=keys)
    for bad in (0.0, -1.0, float("nan"), float("inf"), 86400.5, True):
        with pytest.raises(ValueError, match="tally_timeout must be"):
            server.start(grid, timeout=60, tally_timeout=bad)
    assert grid.sent == []
    server.start(grid, timeout=60, tally_timeout=90.0)
    results = [m for m in grid.sent if m.metadata.message_type == "query.dphype_tally"
               and m.content.config_records["dphype_tally"].get("stage") == "result"]
    assert [m.content.config_records["dphype_tally"]["timeout"] for m in results] == [90.0] * 3


@pytest.mark.slow
def test_a_member_whose_bytes_do_not_open_at_one_tally_is_left_out_through_flower_simulation(tmp_path, monkeypatch):
    """The real Flower simulation (Ray): 10 voters of a simulated roster and 3 tallies; voter 0's ClientApp sends
    bytes that do not open to tally 2 (signed by its member key). It is left out and named, 9 ballots count."""
    from flwr.app import Context, Message
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from dphype.config import DPHypeConfig
    from dphype.flower import register_dphype
    from dphype.flower.client.policy_client import node_policy
    from dphype.flower.client.roles import simulated_role
    from dphype.flower.server.committee_server import connected_committee
    from dphype.flower.tally_node import load_tally_key
    from dphype.flower.wire import RECORD_KEY
    from dphype.protocol import VoteRequest
    from dphype.secure.roster import share_payload

    clients, keys = 10, tmp_path / "keys"
    for j in range(3):
        load_tally_key(keys / f"tally-{j}.key")
    scores = scores_table(clients + 3)
    monkeypatch.setenv("DPHYPE_NODE_POLICY", "dphype-max-epsilon=1000.0 dphype-lifetime-epsilon=1000000.0")

    def roles(msg: Message, context: Context, call_next):
        simulated_role(context, clients, 3, keys)
        return call_next(msg, context)

    def bytes_to_tally_2(msg: Message, context: Context, call_next):
        reply = call_next(msg, context)
        if (msg.metadata.message_type == "train.dphype_committee" and int(context.node_config["partition-id"]) == 0
                and not reply.has_error()):
            answer = reply.content.config_records[RECORD_KEY]
            shares, signatures = list(answer["shares"]), list(answer["signatures"])
            shares[2] = os.urandom(len(shares[2]))
            request = VoteRequest.from_record(msg.content.config_records[RECORD_KEY])
            signatures[2] = node_policy(context).membership().sign("committee-share", request.digest(),
                                                                   int(context.run_id), share_payload(2, shares[2]))
            answer["shares"], answer["signatures"] = shares, signatures
        return reply

    client_app = ClientApp(mods=[roles, bytes_to_tally_2])
    register_dphype(client_app, lambda ctx: TableTask(scores[int(ctx.node_config["partition-id"])]))
    out: dict = {}
    server_app = ServerApp()

    @server_app.main()
    def _main(grid, context):
        cfg = DPHypeConfig(epsilon=20.0, delta=1e-5, k=2, clients=clients, release="argmax")
        committee = connected_committee(grid, cfg, 3, connect_timeout=300, timeout=300)
        out["result"] = DPHype(CANDS, cfg, tallies=committee.keys).start(
            grid, timeout=300, connect_timeout=300, committee_nodes=committee.nodes, tally_timeout=300)

    run_simulation(server_app, client_app, num_supernodes=clients + 3,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    result = out["result"]
    assert result.report.unattributed == (voter_name(0),) and result.report.survivors == clients - 1
    assert result.selected_index == 5
