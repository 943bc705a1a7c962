"""dphype.secure.roster without Flower: identity keys, the roster's checks and digest, domain-separated signatures,
and SecAgg+'s key list checked against the roster before any share leaves a node (Sybils fail closed)."""

from __future__ import annotations

import base64
import os
from typing import Any

import numpy as np
import pytest

from dphype.refusal import Refusal
from dphype.secure import secagg as sa
from dphype.secure.roster import (
    IdentityKey,
    Member,
    Roster,
    RosterError,
    SigningContext,
    check_name,
    public_key_bytes,
    share_payload,
    sign,
    verify,
)
from dphype.secure.secagg_params import secure_parameters

REQUEST = "cd" * 32


def members(n: int, *, tallies: int = 0) -> tuple[Roster, dict[str, IdentityKey]]:
    keys = {f"node-{i}": IdentityKey.generate() for i in range(n)}
    keys.update({f"tally-{j}": IdentityKey.generate() for j in range(tallies)})
    entries = [Member(name, "tally" if name.startswith("tally") else "voter", key.public,
                      os.urandom(32) if name.startswith("tally") else None) for name, key in keys.items()]
    return Roster("acme", tuple(entries)), keys


# ------------------------------------------------------------------------------------------ identity keys
def test_an_identity_key_is_written_private_never_overwritten_and_read_back(tmp_path):
    key = IdentityKey.generate()
    path = key.save(tmp_path / "keys" / "alice.key")
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert IdentityKey.load(path).public == key.public
    with pytest.raises(RosterError, match="exists; a key is never overwritten"):
        IdentityKey.generate().save(path)
    assert IdentityKey.load(path).public == key.public


def test_an_identity_key_is_read_anew_when_its_file_changes_and_refused_when_it_opens_up(tmp_path):
    path = IdentityKey.generate().save(tmp_path / "id.key")
    first = IdentityKey.load(path)
    assert IdentityKey.load(path).public == first.public
    path.unlink()
    second = IdentityKey.generate().save(path)
    assert IdentityKey.load(path).public != first.public
    os.chmod(second, 0o644)
    with pytest.raises(RosterError, match="readable by others"):
        IdentityKey.load(second)


def test_an_identity_key_file_may_hold_the_raw_key_in_base64(tmp_path):
    key = IdentityKey.generate()
    raw = tmp_path / "raw.key"
    raw.write_text(base64.b64encode(_raw(key)).decode())
    raw.chmod(0o600)
    assert IdentityKey.load(raw).public == key.public


def _raw(key: IdentityKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key._private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                      serialization.NoEncryption())


@pytest.mark.parametrize(("mode", "ok"), [(0o600, True), (0o400, True), (0o640, False), (0o604, False)])
def test_an_identity_key_readable_by_others_is_refused(tmp_path, mode, ok):
    path = IdentityKey.generate().save(tmp_path / "k")
    path.chmod(mode)
    if ok:
        IdentityKey.load(path)
    else:
        with pytest.raises(RosterError, match="readable by others .* chmod 600"):
            IdentityKey.load(path)


def test_an_identity_key_file_that_is_missing_or_holds_no_ed25519_key_names_the_file_and_the_fix(tmp_path):
    with pytest.raises(RosterError, match="missing.key.*dphype roster keygen"):
        IdentityKey.load(tmp_path / "missing.key")
    bad = tmp_path / "bad.key"
    bad.write_text("not a key")
    bad.chmod(0o600)
    with pytest.raises(RosterError, match="must hold an Ed25519 private key"):
        IdentityKey.load(bad)


# ------------------------------------------------------------------------------------------ the roster
@pytest.mark.parametrize(("name", "ok"), [("a", True), ("a" * 64, True), ("a" * 65, False), ("", False),
                                          ("node;1", False), ("node|1", False), ("-node", False), ("no de", False)])
def test_member_names_boundary(name, ok):
    if ok:
        assert check_name(name) == name
    else:
        with pytest.raises(RosterError, match="1-64 letters"):
            check_name(name)


def test_members_roles_and_tally_keys_are_checked():
    identity = IdentityKey.generate().public
    with pytest.raises(RosterError, match="role must be one of voter, tally"):
        Member("a", "admin", identity)
    with pytest.raises(RosterError, match="needs its 32-byte X25519 committee key"):
        Member("t", "tally", identity)
    with pytest.raises(RosterError, match="has a tally key"):
        Member("v", "voter", identity, os.urandom(32))
    with pytest.raises(RosterError, match="32-byte Ed25519"):
        Member("v", "voter", identity[:31])
    assert Member("t", "tally", identity, os.urandom(32)).role == "tally"


@pytest.mark.parametrize("what", ["name", "identity key", "tally key"])
def test_a_roster_refuses_a_repeated_name_or_key(what):
    a, b = IdentityKey.generate().public, IdentityKey.generate().public
    tally = os.urandom(32)
    first = Member("t0", "tally", a, tally)
    second = {"name": Member("t0", "tally", b, os.urandom(32)),
              "identity key": Member("t1", "tally", a, os.urandom(32)),
              "tally key": Member("t1", "tally", b, tally)}[what]
    with pytest.raises(RosterError, match=f"same {what} twice"):
        Roster("acme", (first, second))


def test_the_digest_is_canonical_and_names_exactly_this_roster(tmp_path):
    roster, _ = members(3, tallies=1)
    assert Roster("acme", tuple(reversed(roster.members))).digest() == roster.digest()
    assert Roster.from_json(roster.to_json()) == roster
    assert Roster.load(roster.save(tmp_path / "r.json")).digest() == roster.digest()
    grown = roster.with_member(Member("node-9", "voter", IdentityKey.generate().public))
    assert grown.digest() != roster.digest()
    assert Roster("acme2", roster.members).digest() != roster.digest()
    fingerprint = roster.fingerprint
    assert len(fingerprint) == 19 and fingerprint.replace("-", "") == roster.digest()[:16]
    assert roster.describe() == f"roster {fingerprint} (4 members)"


def test_a_roster_file_that_does_not_parse_names_the_file(tmp_path):
    bad = tmp_path / "r.json"
    bad.write_text('{"version": 1, "federation": "x", "members": [{"name": "a", "role": "voter"}]}')
    with pytest.raises(RosterError, match="r.json.* has no identity"):
        Roster.load(bad)
    bad.write_text("[]")
    with pytest.raises(RosterError, match="r.json.*version 1"):
        Roster.load(bad)


def test_public_keys_are_read_as_hex_or_base64():
    raw = os.urandom(32)
    assert public_key_bytes(raw.hex()) == raw == public_key_bytes(base64.b64encode(raw).decode())
    with pytest.raises(RosterError, match="--identity must be a 32-byte public key"):
        public_key_bytes(raw.hex()[:-2], "--identity")


def test_membership_finds_this_nodes_entry_or_says_it_is_not_a_member():
    roster, keys = members(3)
    assert roster.membership(keys["node-1"]).name == "node-1"
    with pytest.raises(RosterError, match="not a member of roster acme"):
        roster.membership(IdentityKey.generate())


# ------------------------------------------------------------------------------------------ signatures
def test_a_signature_verifies_only_in_its_own_context_and_payload():
    roster, keys = members(2)
    context = roster.context("committee-share", REQUEST, 7)
    signature = sign(keys["node-0"], context, b"payload")
    member = roster.member("node-0")
    verify(member, context, b"payload", signature)
    assert roster.check_signed("node-0", "voter", context, b"payload", signature) == member
    others = [SigningContext(context.roster, "secagg-advertise", REQUEST, 7),  # another stage
              SigningContext(context.roster, "committee-share", "ef" * 32, 7),  # another request
              SigningContext(context.roster, "committee-share", REQUEST, 8),  # another run
              SigningContext("00" * 32, "committee-share", REQUEST, 7)]  # another roster
    for other in others:
        with pytest.raises(RosterError, match="does not verify"):
            verify(member, other, b"payload", signature)
    with pytest.raises(RosterError, match="does not verify"):
        verify(member, context, b"payloaD", signature)
    with pytest.raises(RosterError, match="does not verify"):  # another member's key
        verify(roster.member("node-1"), context, b"payload", signature)
    with pytest.raises(RosterError, match="missing or malformed"):
        verify(member, context, b"payload", signature[:63])
    with pytest.raises(RosterError, match="unknown signed stage"):
        SigningContext(context.roster, "consistency", REQUEST, 7)


def test_a_signature_under_another_federations_roster_is_refused():
    roster, keys = members(2)
    other = Roster("other", roster.members)  # the same keys, another federation
    context = other.context("committee-share", REQUEST, 1)
    signature = sign(keys["node-0"], context, b"x")
    with pytest.raises(RosterError, match="another federation, or the roster changed"):
        roster.check_signed("node-0", "voter", context, b"x", signature)
    with pytest.raises(RosterError, match="does not verify"):  # re-labelled with this roster's digest
        roster.check_signed("node-0", "voter", roster.context("committee-share", REQUEST, 1), b"x", signature)


def test_unknown_members_other_roles_and_a_member_twice_are_refused():
    roster, keys = members(2, tallies=1)
    context = roster.context("committee-share", REQUEST, 1)
    stranger = IdentityKey.generate()
    with pytest.raises(RosterError, match="'mallory' is not a member"):
        roster.check_signed("mallory", "voter", context, b"x", sign(stranger, context, b"x"))
    with pytest.raises(RosterError, match="is a tally, not a voter"):
        roster.check_signed("tally-0", "voter", context, b"x", sign(keys["tally-0"], context, b"x"))
    entry = ("node-0", b"x", sign(keys["node-0"], context, b"x"))
    assert [m.name for m in roster.check_distinct_signers([entry], "voter", context)] == ["node-0"]
    with pytest.raises(RosterError, match="node-0 appears twice"):
        roster.check_distinct_signers([entry, entry], "voter", context)


def test_a_signed_list_checked_before_is_remembered_only_for_exactly_that_list():
    roster, keys = members(3)
    context = roster.context("secagg-advertise", REQUEST, 1)
    entries = [(name, name.encode(), sign(keys[name], context, name.encode())) for name in sorted(keys)]
    assert [m.name for m in roster.check_distinct_signers(entries, "voter", context)] == sorted(keys)
    assert [m.name for m in roster.check_distinct_signers(entries, "voter", context)] == sorted(keys)  # remembered
    forged = [*entries[:2], (entries[2][0], b"other", entries[2][2])]
    changed = {"another payload": (forged, "voter", context), "another role": (entries, "tally", context),
               "another run": (entries, "voter", roster.context("secagg-advertise", REQUEST, 2))}
    for listed, role, where in changed.values():
        with pytest.raises(RosterError):
            roster.check_distinct_signers(listed, role, where)


def test_a_share_payload_binds_the_tally_and_the_ciphertext():
    assert share_payload(0, b"c") != share_payload(1, b"c") != share_payload(1, b"d")


# ------------------------------------------------------------------------------------------ SecAgg+ and Sybils
class Members:
    """``n`` roster voters running SecAgg+ in process, each with its own membership; the server may add ``sybils``
    nodes of its own (fresh keys, signed by identities it made) to reach the round's size."""

    def __init__(self, n: int, *, clients: int, run: int = 3, authenticated: bool = True) -> None:
        self.roster, keys = members(n)
        self.keys = keys
        self.ids = [2000 + 7 * i for i in range(n)]
        self.approvals = {node: sa.Approval(request=REQUEST, clients=clients, survivors=clients, size=4,
                                            min_neighbours=1, run=run,
                                            membership=self.roster.membership(keys[f"node-{i}"])
                                            if authenticated else None)
                          for i, node in enumerate(self.ids)}
        self.states: dict[int, Any] = dict.fromkeys(self.ids)
        self.refusals: dict[int, Refusal] = {}
        self.shared: list[int] = []  # nodes whose share ciphertexts left them
        self.voted: list[int] = []

    def send(self, stage: str, messages: dict[int, dict]) -> dict[int, dict]:
        out = {}
        for node, msg in messages.items():
            if node not in self.approvals:  # a Sybil: the server answers for it
                continue
            try:
                self.states[node], reply = sa.node_step(self.states[node], msg, node=node,
                                                        approval=self.approvals[node], vote=self._vote(node))
            except Refusal as refusal:
                self.refusals[node] = refusal
                continue
            if stage == "share_keys":
                self.shared.append(node)
            out[node] = reply
        return out

    def _vote(self, node: int):
        def vote(clipping: int) -> np.ndarray:
            self.voted.append(node)
            return np.ones(4, dtype=np.int64)
        return vote


def graph_for(m: int) -> tuple[int, int]:
    params = secure_parameters(m, dropout=0.0, majority=True)
    return params.neighbours, params.threshold


def advertised(fed: Members, server: sa.ServerRound, sybils: dict[int, Any]) -> dict[int, dict]:
    """The honest nodes' advertise replies and the Sybils' (``sybils``: node id -> (name, identity key or None))."""
    replies = fed.send("advertise", {n: m for n, m in server.advertise().items() if n in fed.approvals})
    for node, (name, identity) in sybils.items():
        keys = [os.urandom(32) for _ in range(2)] + [sa.relay.SigningKey.generate().public]
        reply = sa.message("advertise", c_key=sa.relay.KeyPair.generate().public,
                           s_key=sa.relay.KeyPair.generate().public, g_key=keys[2])
        if identity is not None:
            payload = sa.advertised_keys(node, server.round_id, (reply["c_key"], reply["s_key"], reply["g_key"]))
            reply.update(member=name, identity_signature=sign(identity, fed.roster.context(
                "secagg-advertise", REQUEST, 3), payload))
        replies[node] = reply
    return replies


def test_an_honest_round_of_roster_members_sums_exactly():
    fed = Members(6, clients=6)
    result, _ = sa.run_round(fed.ids, fed.send, request=REQUEST, size=4, min_survivors=6, graph_for=graph_for)
    assert result.total.tolist() == [6] * 4 and fed.refusals == {}


@pytest.mark.parametrize("sybil", ["stranger", "no_signature", "a_member_twice", "moved_entry"])
def test_invented_members_in_the_key_list_are_refused_before_any_share_leaves(sybil):
    """Sybils: 6 members, a request for 10 clients; the server invents 4 more nodes to reach 10. With a roster no
    node sends a share: every entry of the key list must be signed by a distinct roster voter."""
    fed = Members(6, clients=10)
    sybils = [9000 + i for i in range(4)]
    server = sa.ServerRound(sorted(fed.ids + sybils), REQUEST, 4, 10, graph_for)
    stranger = IdentityKey.generate()
    identity_of = {"stranger": lambda i: (f"mallory-{i}", stranger),
                   "no_signature": lambda i: ("", None),
                   "a_member_twice": lambda i: ("node-0", stranger)}
    if sybil in identity_of:
        replies = advertised(fed, server, {node: identity_of[sybil](i) for i, node in enumerate(sybils)})
        if sybil == "a_member_twice":  # the server reuses node 0's own signed entry under the Sybils' ids
            for node in sybils:
                replies[node] = {**replies[node], "member": "node-0",
                                 "identity_signature": replies[fed.ids[0]]["identity_signature"]}
    else:  # moved_entry: members' names and signatures presented with the Sybils' fresh keys
        replies = advertised(fed, server, {node: ("", None) for node in sybils})
        for i, node in enumerate(sybils):
            replies[node].update(member=f"node-{i}", identity_signature=replies[fed.ids[i]]["identity_signature"])
    messages = server.share_keys(replies)
    fed.send("share_keys", {n: m for n, m in messages.items() if n in fed.approvals})
    assert fed.shared == [] and fed.voted == []  # no share of any secret left a member
    assert {r.code for r in fed.refusals.values()} == {"roster"} and len(fed.refusals) == 6


@pytest.mark.parametrize(("run", "refused"), [(3, False), (4, True)])
def test_a_members_keys_signed_for_another_run_are_refused(run, refused):
    """No Sybil: node 0's own identity signed its keys, for run ``run``; the round is run 3."""
    fed = Members(6, clients=6)
    server = sa.ServerRound(fed.ids, REQUEST, 4, 6, graph_for)
    replies = fed.send("advertise", server.advertise())
    mine = replies[fed.ids[0]]
    payload = sa.advertised_keys(fed.ids[0], server.round_id, (mine["c_key"], mine["s_key"], mine["g_key"]))
    mine["identity_signature"] = sign(fed.keys["node-0"], fed.roster.context("secagg-advertise", REQUEST, run),
                                      payload)
    fed.send("share_keys", server.share_keys(replies))
    assert (fed.shared == [], len(fed.refusals)) == ((True, 6) if refused else (False, 0))


def test_without_a_roster_the_same_sybils_are_not_caught_by_the_key_list():
    """The boundary of the check: a node whose operator allowed an unauthenticated federation has no roster to
    check the key list against (the reason the default refuses to take part without one)."""
    fed = Members(6, clients=10, authenticated=False)
    sybils = [9000 + i for i in range(4)]
    server = sa.ServerRound(sorted(fed.ids + sybils), REQUEST, 4, 10, graph_for)
    messages = server.share_keys(advertised(fed, server, {node: ("", None) for node in sybils}))
    fed.send("share_keys", {n: m for n, m in messages.items() if n in fed.approvals})
    assert sorted(fed.shared) == sorted(fed.ids)


def test_a_key_list_whose_entries_are_relabelled_is_refused():
    fed = Members(6, clients=6)
    server = sa.ServerRound(fed.ids, REQUEST, 4, 6, graph_for)
    messages = server.share_keys(fed.send("advertise", server.advertise()))
    names = list(messages[fed.ids[0]]["members"])
    swapped = {**messages[fed.ids[0]], "members": [names[1], names[0], *names[2:]]}
    fed.send("share_keys", {fed.ids[0]: swapped})
    assert fed.refusals[fed.ids[0]].code == "roster" and fed.shared == []
