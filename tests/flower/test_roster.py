"""A federation of known members through the real client, tallies and server.

Nodes read their roster and identity from their own node config; without one they refuse unless their operator
allows an unauthenticated federation; the roster approved in the pre-flight is the one every later stage uses; the
tallies open only shares signed by distinct roster voters under their own roster; the result says which federation
voted. (SecAgg+'s key list against the roster, Sybils included, is tests/secure/test_roster.py's.)
"""

from __future__ import annotations

import os
import re

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from helpers import (
    CANDS,
    CLIENTS,
    PERMISSIVE,
    UNAUTHENTICATED,
    argmax_config,
    argmax_grid,
    client_app,
    scores_table,
    sum_config,
)

from dphype.flower import DPHype, PreflightError
from dphype.flower.federation import simulated_federation
from dphype.flower.local import LocalGrid, node_id
from dphype.flower.server.secagg_server import advertise_record, run_secure_sum
from dphype.flower.tally_node import load_tally_key
from dphype.flower.wire import PREFLIGHT_TYPE, RECORD_KEY, STAGE_KEY, TALLY_KEY
from dphype.node.ledger import Ledger
from dphype.node.policy import NodePolicy, PolicyError
from dphype.secure import relay
from dphype.secure.committee import TallyError
from dphype.secure.roster import IdentityKey, Member, Roster, share_payload, sign
from dphype.secure.secagg import Advertised
from dphype.secure.secure_sum import SecureSumError

N = 6


def sum_grid(**node_config) -> LocalGrid:
    return LocalGrid(client_app(scores_table(N)), N, node_config={**PERMISSIVE, **node_config})


def spent(grid: LocalGrid, nodes=range(N)) -> list[int]:
    return [len(Ledger(NodePolicy.from_node_config(grid.contexts[node_id(i)].node_config).ledger).entries())
            for i in nodes]


def preflight_codes(grid: LocalGrid) -> list[str]:
    return sorted(str(r.content.config_records[RECORD_KEY].get("code")) for r in grid.replies
                  if not r.has_error() and RECORD_KEY in r.content.config_records
                  and r.content.config_records[RECORD_KEY].get("status") == "refused")


# ------------------------------------------------------------------------------------------ no roster
def test_a_node_without_a_roster_refuses_in_the_preflight_naming_the_keys():
    grid = LocalGrid(client_app(scores_table(N)), N, node_config=PERMISSIVE, federation=False)
    with pytest.raises(PreflightError, match="no_roster .*dphype-roster and dphype-identity.*"
                                             "dphype-allow-unauthenticated = true"):
        DPHype(CANDS, sum_config()).start(grid, timeout=60)
    assert preflight_codes(grid) == ["no_roster"] * N and spent(grid) == [0] * N


@pytest.mark.parametrize("allowed", [True, False, "true", "false"])
def test_an_unauthenticated_federation_takes_part_only_when_its_operator_says_so(allowed):
    grid = LocalGrid(client_app(scores_table(N)), N, node_config={**PERMISSIVE, "dphype-allow-unauthenticated":
                                                                  allowed}, federation=False)
    if allowed in (True, "true"):
        result = DPHype(CANDS, sum_config()).start(grid, timeout=60)
        assert result.federation == "unauthenticated" and "\nfederation: unauthenticated\n" in result.summary()
    else:
        with pytest.raises(PreflightError, match="no_roster"):
            DPHype(CANDS, sum_config()).start(grid, timeout=60)


def test_the_result_names_the_roster_the_nodes_voted_under():
    grid = sum_grid()
    result = DPHype(CANDS, sum_config()).start(grid, timeout=60)
    roster = Roster.load(str(grid.contexts[node_id(0)].node_config["dphype-roster"]))
    assert result.federation == f"roster {roster.fingerprint} ({N} members)"
    assert f"federation: roster {roster.fingerprint} ({N} members)" in result.summary()
    assert result.to_dict()["federation"] == result.federation


@pytest.mark.parametrize(("config", "message"), [
    ({"dphype-roster": "/r.json"}, "dphype-roster and dphype-identity go together"),
    ({"dphype-identity": "/k"}, "dphype-roster and dphype-identity go together"),
    ({"dphype-allow-unauthenticated": "yes"}, "dphype-allow-unauthenticated must be true or false"),
    ({"dphype-roster": "", "dphype-identity": "/k"}, "dphype-roster must be a non-empty path"),
])
def test_the_federation_keys_of_the_node_config_are_checked(config, message):
    with pytest.raises(PolicyError, match=message):
        NodePolicy.from_node_config(config)


def test_a_node_whose_identity_is_not_in_its_roster_refuses_as_misconfigured(tmp_path):
    roster = Roster("acme", (Member("a", "voter", IdentityKey.generate().public),))
    key = IdentityKey.generate().save(tmp_path / "k")
    policy = NodePolicy(roster=str(roster.save(tmp_path / "r.json")), identity=str(key))
    with pytest.raises(PolicyError, match="is not a member of roster acme"):
        policy.membership()


def test_mixed_federations_stop_the_run_before_the_vote():
    grid = sum_grid()
    grid.contexts[node_id(0)].node_config.update(UNAUTHENTICATED)  # one operator opted out of the roster
    with pytest.raises(PreflightError, match="different federations"):
        DPHype(CANDS, sum_config()).start(grid, timeout=60)
    assert spent(grid) == [0] * N


# ------------------------------------------------------------------------------------------ roster changes
def grow(path: str) -> None:
    """The operator adds a member to the node's roster file (another digest)."""
    roster = Roster.load(path)
    roster.with_member(Member("newcomer", "voter", IdentityKey.generate().public)).save(path)


def test_a_roster_change_between_the_preflight_and_the_secure_vote_is_refused():
    class Changing(LocalGrid):
        def push_messages(self, messages):
            messages = list(messages)
            if any(m.metadata.message_type == "train.dphype" for m in messages) and not self.changed:
                self.changed = True
                for context in self.contexts.values():
                    grow(str(context.node_config["dphype-roster"]))
            return super().push_messages(messages)

    grid = Changing(client_app(scores_table(N)), N, node_config=PERMISSIVE)
    grid.changed = False
    with pytest.raises(Exception, match="roster"):
        DPHype(CANDS, sum_config()).start(grid, timeout=60)
    assert spent(grid) == [0] * N


@pytest.mark.parametrize("change", [False, True])
def test_a_roster_change_between_the_preflight_and_the_committee_vote_is_refused_before_the_ledger(tmp_path, change):
    grid, keys = argmax_grid(tmp_path)
    real = grid.push_messages

    def push(messages):
        messages = list(messages)
        if change and any(m.metadata.message_type == "train.dphype_committee" for m in messages):
            grow(str(grid.contexts[node_id(0)].node_config["dphype-roster"]))  # the roster all nodes share
        return real(messages)

    grid.push_messages = push
    if change:
        with pytest.raises(PreflightError, match="only 0 clients sent their shares"):
            DPHype(CANDS, argmax_config(), tallies=keys).start(grid, timeout=60)
        assert all("Refusal: roster: this node's roster changed" in r.error.reason for r in grid.replies
                   if r.has_error())
    else:
        DPHype(CANDS, argmax_config(), tallies=keys).start(grid, timeout=60)
    assert spent(grid, range(CLIENTS)) == [int(not change)] * CLIENTS


# ------------------------------------------------------------------------------------------ the tallies
def collect(grid) -> list[Message]:
    return [m for m in grid.sent if m.metadata.message_type == "query.dphype_tally"
            and m.content.config_records[TALLY_KEY].get("stage") == "collect"]


def replay(grid, change) -> list[str]:
    """The server's collect stages, changed by ``change(record, tally index)``, sent again (the tallies' own record
    refuses a request served: a fresh request digest is not needed, the checks run before it)."""
    out = []
    for j, m in enumerate(collect(grid)):
        record = dict(m.content.config_records[TALLY_KEY])
        change(record, j)
        (reply,) = grid.send_and_receive([Message(RecordDict({TALLY_KEY: ConfigRecord(record)}),
                                                  m.metadata.dst_node_id, "query.dphype_tally")])
        out.append(reply.error.reason if reply.has_error() else "opened")
    return out


def attacked_collect(tmp_path, change, grid_of=None, released=False):
    """An argmax selection whose collect stages the server rewrites with ``change(record, j)``: the grid and the
    error's message (``released``: the result; the shares that failed are left out and named, nothing else)."""
    grid, keys = argmax_grid(tmp_path) if grid_of is None else grid_of()
    real = grid.push_messages

    def push(messages):
        messages = list(messages)
        for m in messages:
            record = m.content.config_records.get(TALLY_KEY)
            if record is not None and record.get("stage") == "collect":
                new = dict(record)
                change(new, int(str(m.metadata.dst_node_id)) - node_id(CLIENTS))
                m.content.config_records[TALLY_KEY] = ConfigRecord(new)
        return real(messages)

    grid.push_messages = push
    if released:
        return grid, DPHype(CANDS, argmax_config(), tallies=keys).start(grid, timeout=60)
    with pytest.raises(TallyError, match="tally 0 failed the collect stage") as err:
        DPHype(CANDS, argmax_config(), tallies=keys).start(grid, timeout=60)
    assert not [m for m in grid.sent if m.metadata.message_type == "query.dphype_tally"
                and m.content.config_records[TALLY_KEY].get("stage") in ("compute", "result")]
    return grid, str(err.value)


def test_a_share_relabelled_and_re_signed_by_the_server_is_left_out(tmp_path):
    """The server takes client 0's shares, labels them as an invented member (or an existing one) and signs them with
    a key it made: no tally opens them, the committee leaves that entry out and names it, the other 5 ballots (the
    committee's minimum of 6 clients) are counted."""
    forged = IdentityKey.generate()

    def resign(record, j):
        context = Roster("x").context("committee-share", "00" * 32, 1)  # the server holds no voter's identity
        record["contributors"] = ["mallory", *record["contributors"][1:]]
        record["signatures"] = [sign(forged, context, share_payload(j, record["shares"][0])),
                                *record["signatures"][1:]]

    _, result = attacked_collect(tmp_path, resign, released=True)  # named by the driver's list: node-0's entry
    assert result.report.unattributed == ("node-0",) and result.report.survivors == CLIENTS - 1

    def resign_as_member(record, j):
        record["signatures"] = [sign(forged, Roster("x").context("committee-share", "00" * 32, 1),
                                     share_payload(j, record["shares"][0])), *record["signatures"][1:]]

    _, result = attacked_collect(tmp_path / "2", resign_as_member, released=True)
    assert result.report.unattributed == ("node-0",) and result.report.survivors == CLIENTS - 1


def test_a_member_twice_and_unsigned_shares_are_refused(tmp_path):
    def twice(record, j):
        record["contributors"] = [record["contributors"][0]] * len(record["contributors"])

    _, message = attacked_collect(tmp_path, twice)  # 5 of 6 signatures are not node-0's: too few valid ballots
    assert re.search(r"takes only 1 of 6 shares, under the committee's minimum 5; nothing released\nleft out "
                     r"first: node-0, its roster signature does not verify", message)

    def unsigned(record, j):
        del record["signatures"]

    _, message = attacked_collect(tmp_path / "2", unsigned)
    assert "roster: collect needs one roster signature per share" in message


def test_shares_of_another_federation_are_refused(tmp_path):
    """Node 0 is also a member of another federation (another roster, the same identity). An honest server stops at
    the pre-flight (its nodes name two federations); a server that relays node 0's shares signed under the other
    roster anyway gets nothing opened: no tally of this federation accepts that roster's digest."""
    grid, keys = argmax_grid(tmp_path)
    grid.federate()
    config = grid.contexts[node_id(0)].node_config
    original = config["dphype-roster"]
    roster = Roster.load(str(original))
    config["dphype-roster"] = str(Roster("elsewhere", roster.members).save(tmp_path / "other.json"))
    with pytest.raises(PreflightError, match="different federations"):
        DPHype(CANDS, argmax_config(), tallies=keys).start(grid, timeout=60)
    identity = IdentityKey.load(str(config["dphype-identity"]))
    config["dphype-roster"] = original
    elsewhere = Roster("elsewhere", roster.members)

    def other_federation(record, j):
        request = DPHype(CANDS, argmax_config(), tallies=keys).request.digest()
        record["signatures"] = [sign(identity, elsewhere.context("committee-share", request, 1),
                                     share_payload(j, record["shares"][0])), *record["signatures"][1:]]

    _, result = attacked_collect(tmp_path / "2", other_federation, grid_of=lambda: (grid, keys), released=True)
    assert result.report.unattributed == ("node-0",)  # signed under the other roster: left out, named


def test_a_tally_not_in_the_roster_gets_no_share(tmp_path):
    """The server names a committee with a tally outside the roster (one it runs): every voter refuses in the
    pre-flight (the roster's tallies pin the committee), and the roster's own tallies refuse a request naming it."""
    grid, keys = argmax_grid(tmp_path)
    rogue = load_tally_key(tmp_path / "rogue.key").public
    for i in range(CLIENTS):  # the voters' operators pin nothing but the roster
        grid.contexts[node_id(i)].node_config.pop("dphype-tallies")
    tallies = [node_id(CLIENTS + j) for j in range(3)]  # the server's own tally stands in for tally 2
    with pytest.raises(PreflightError, match="tally_committee .*unknown tallies"):
        DPHype(CANDS, argmax_config(), tallies=(keys[0], keys[1], rogue)).start(grid, timeout=60,
                                                                               committee_nodes=tallies)
    assert spent(grid, range(CLIENTS)) == [0] * CLIENTS
    request = DPHype(CANDS, argmax_config(), tallies=(keys[0], keys[1], rogue)).request
    record = {**request.to_record(), "stage": "collect", "contributors": [], "shares": [], "signatures": []}
    (reply,) = grid.send_and_receive([Message(RecordDict({TALLY_KEY: ConfigRecord(record)}), node_id(CLIENTS),
                                              "query.dphype_tally")])
    assert reply.error.reason.startswith("Refusal: roster: the request's committee names a tally that is not in")


def test_a_tally_whose_key_is_not_its_roster_entry_refuses(tmp_path):
    grid, keys = argmax_grid(tmp_path)
    grid.federate()
    tally = grid.contexts[node_id(CLIENTS)].node_config
    tally["dphype-identity"] = grid.contexts[node_id(0)].node_config["dphype-identity"]  # a voter's identity
    (reply,) = grid.send_and_receive([Message(RecordDict({TALLY_KEY: ConfigRecord({"stage": "hello"})}),
                                              node_id(CLIENTS), "query.dphype_tally")])
    assert reply.error.reason.startswith("Refusal: roster: tally 0's identity is not a tally of its roster")


def test_a_tally_without_a_roster_refuses_unless_allowed(tmp_path):
    grid, keys = argmax_grid(tmp_path, federation=False)
    tally = grid.contexts[node_id(CLIENTS)].node_config
    del tally["dphype-allow-unauthenticated"]
    (reply,) = grid.send_and_receive([Message(RecordDict({TALLY_KEY: ConfigRecord({"stage": "hello"})}),
                                              node_id(CLIENTS), "query.dphype_tally")])
    assert reply.error.reason.startswith("Refusal: no_roster")
    tally["dphype-allow-unauthenticated"] = True
    (reply,) = grid.send_and_receive([Message(RecordDict({TALLY_KEY: ConfigRecord({"stage": "hello"})}),
                                              node_id(CLIENTS), "query.dphype_tally")])
    assert not reply.has_error()


# ------------------------------------------------------------------------------------------ simulation
def test_a_simulated_federation_is_the_same_for_every_node_of_a_run_and_private(tmp_path):
    committee = [IdentityKey.generate().public for _ in range(3)]  # any 32-byte keys stand for X25519 ones
    first = simulated_federation(tmp_path, 7, "node-0", 4, committee)
    second = simulated_federation(tmp_path, 7, "tally-2", 4, committee)
    assert first["dphype-roster"] == second["dphype-roster"]
    roster = Roster.load(first["dphype-roster"])
    assert roster.federation == "simulation-run-7" and len(roster.members) == 7
    assert roster.membership(IdentityKey.load(second["dphype-identity"])).member.role == "tally"
    folder = tmp_path / "federation"
    assert folder.stat().st_mode & 0o777 == 0o700 and (folder / "secret").stat().st_mode & 0o777 == 0o600
    other_run = simulated_federation(tmp_path / "run-8", 8, "node-0", 4, committee)
    assert Roster.load(other_run["dphype-roster"]).digest() != roster.digest()
    with pytest.raises(ValueError, match="not a member"):
        simulated_federation(tmp_path, 7, "node-4", 4, committee)


def test_a_simulated_node_joins_the_runs_federation_without_set_up(monkeypatch):
    import dphype.flower.client.policy_client as client_policy

    monkeypatch.setattr(client_policy, "simulated", lambda: True)
    context = Context(run_id=5, node_id=1, node_config={"partition-id": 2, "num-partitions": 4}, state=RecordDict(),
                      run_config={})
    policy = client_policy.node_policy(context)
    membership = policy.membership()
    assert membership is not None and membership.name == "node-2" and len(membership.roster.members) == 4
    context.node_config["dphype-allow-unauthenticated"] = True  # the operator's own choice wins
    assert client_policy.node_policy(context).membership() is None


def test_the_rosters_tallies_pin_the_committee_and_a_direct_pin_only_narrows_it(tmp_path):
    """A voter with a roster seals only to the roster's tallies; ``dphype-tallies`` beside it keeps only those of its
    keys that are the roster's (a pinned key outside the roster does not count)."""
    committee = [os.urandom(32) for _ in range(3)]
    rogue = os.urandom(32)
    voter = IdentityKey.generate()
    members = [Member("v", "voter", voter.public)] + [Member(f"t{j}", "tally", IdentityKey.generate().public, key)
                                                      for j, key in enumerate(committee)]
    roster = str(Roster("acme", tuple(members)).save(tmp_path / "r.json"))
    identity = str(voter.save(tmp_path / "v.id"))
    assert NodePolicy(roster=roster, identity=identity).known_tallies() == tuple(committee)
    pinned = ",".join(k.hex() for k in (rogue, committee[0], committee[1]))
    assert NodePolicy(roster=roster, identity=identity, tallies=pinned).known_tallies() == tuple(committee[:2])
    assert NodePolicy(tallies=pinned).known_tallies() == (rogue, committee[0], committee[1])  # no roster: the pin


# ------------------------------------------------------------------------------------------ Sybils, end to end
@pytest.mark.parametrize("federation", [True, False])
def test_a_server_that_invents_members_gets_no_share_from_a_federation_with_a_roster(federation):
    """Sybils: 6 real clients approve a request for 10; the server invents 4 peers (fresh keys, names of
    its own, signatures by keys it made) to fill the key list. With a roster every client refuses the key list
    (``roster``) and no share of any secret leaves it; without one (its operators' explicit opt-in) nothing on the
    clients can tell, and they send their shares: the reason the default refuses to run without a roster."""

    sybils = [9000 + i for i in range(4)]
    stranger = IdentityKey.generate()

    class Inventing(LocalGrid):
        def push_messages(self, messages):
            messages = list(messages)
            for m in messages:
                record = m.content.config_records.get(STAGE_KEY)
                if record is not None and record.get("stage") == "share_keys":
                    content = dict(record)
                    fake = {kind: [relay.KeyPair.generate().public for _ in sybils] for kind in ("c", "s")}
                    fake["g"] = [relay.SigningKey.generate().public for _ in sybils]
                    nodes = list(content["nodes"]) + sybils
                    order = sorted(range(len(nodes)), key=lambda i: nodes[i])
                    for kind in ("c", "s", "g"):
                        keys = [content[f"{kind}_keys"][32 * i:32 * i + 32] for i in range(len(content["nodes"]))]
                        keys += fake[kind]
                        content[f"{kind}_keys"] = b"".join(keys[i] for i in order)
                    if federation:
                        names = list(content["members"]) + [f"mallory-{i}" for i in range(len(sybils))]
                        signatures = list(content["identity_signatures"]) + [stranger.sign(b"x") for _ in sybils]
                        content["members"] = [names[i] for i in order]
                        content["identity_signatures"] = [signatures[i] for i in order]
                    content["nodes"] = [nodes[i] for i in order]
                    m.content.config_records[STAGE_KEY] = ConfigRecord(content)
            return super().push_messages(messages)

    grid = Inventing(client_app(scores_table(N)), N, node_config={**PERMISSIVE, **({} if federation else
                                                                                   UNAUTHENTICATED)},
                     federation=federation)
    selection = DPHype(CANDS, sum_config(clients=10))
    round_id, advertise = advertise_record(selection.request.digest())
    content = RecordDict({RECORD_KEY: ConfigRecord(selection.request.to_record()), STAGE_KEY: advertise})
    replies = grid.send_and_receive([Message(content, nid, PREFLIGHT_TYPE) for nid in grid.get_node_ids()])
    ready = {r.metadata.src_node_id: dict(r.content.config_records[STAGE_KEY]) for r in replies}
    assert len(ready) == N  # the request alone cannot tell
    with pytest.raises(SecureSumError):  # either way the server gets no sum here (no Sybil answers)
        run_secure_sum(grid, sorted(ready), selection.request.digest(), size=len(CANDS), noise="skellam",
                       min_survivors=N, advertised=Advertised(round_id, ready), timeout=60)
    shared = [r for r in grid.replies if not r.has_error() and STAGE_KEY in r.content.config_records
              and r.content.config_records[STAGE_KEY].get("ciphertexts")]
    refused = [r.error.reason for r in grid.replies if r.has_error()]
    if federation:
        assert shared == [] and len(refused) == N
        assert all(reason.startswith("Refusal: roster: the key list is not signed by distinct roster voters")
                   for reason in refused)
    else:
        assert len(shared) == N  # every client sent its secret shares to a round of invented peers


# ------------------------------------------------------------------------------------------ a request naming a roster
@pytest.mark.parametrize("named", ["own", "other", "unauthenticated_node"])
def test_a_request_may_name_the_roster_and_a_node_of_another_refuses_before_scoring(named, flower_log):
    grid = sum_grid(**(UNAUTHENTICATED if named == "unauthenticated_node" else {}))
    grid.federate()
    own = ("00" * 32 if named == "unauthenticated_node" else
           Roster.load(str(grid.contexts[node_id(0)].node_config["dphype-roster"])).digest())
    digest = own if named != "other" else "ab" * 32
    selection = DPHype(CANDS, sum_config(), roster=digest)
    assert selection.request.roster == digest and selection.request.to_record()["dphype.roster"] == digest
    if named == "own":
        assert selection.start(grid, timeout=60).federation.startswith("roster ")
        assert "scoring 8 candidates" in flower_log.getvalue()
    else:
        with pytest.raises(PreflightError, match=f"{N} x refused: roster .*another federation's roster"):
            selection.start(grid, timeout=60)
        assert spent(grid) == [0] * N
        assert "scoring" not in flower_log.getvalue()


def test_a_request_names_a_roster_digest_or_none():
    roster = Roster("acme")
    assert DPHype(CANDS, sum_config(), roster=roster).request.roster == roster.digest()
    assert DPHype(CANDS, sum_config()).request.roster == "" and "dphype.roster" not in DPHype(
        CANDS, sum_config()).request.to_record()
    with pytest.raises(ValueError, match="roster must be a roster's digest"):
        DPHype(CANDS, sum_config(), roster="fingerprint-1234")


def test_a_tally_refuses_a_request_naming_another_roster(tmp_path):
    grid, keys = argmax_grid(tmp_path)
    request = DPHype(CANDS, argmax_config(), tallies=keys, roster="ab" * 32).request
    record = {**request.to_record(), "stage": "collect", "contributors": [], "shares": [], "signatures": []}
    (reply,) = grid.send_and_receive([Message(RecordDict({TALLY_KEY: ConfigRecord(record)}), node_id(CLIENTS),
                                              "query.dphype_tally")])
    assert reply.error.reason.startswith("Refusal: roster: the request names another federation's roster")
