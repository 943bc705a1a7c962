"""Dphype.secure.secagg without Flower: exact sums under dropout, the public graph, and an active server's
attacks failing closed before anything secret leaves a node."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dphype.privacy.noise import min_survivors
from dphype.refusal import Refusal
from dphype.secure import relay
from dphype.secure import secagg as sa
from dphype.secure.secagg_params import secure_parameters
from dphype.secure.secure_sum import SecureSumError, TooFewSurvivorsError

REQUEST = "ab" * 32
SIZE = 12


class Federation:
    """``n`` honest nodes in process, each with a known vote; ``votes_cast`` counts the ledger charges."""

    def __init__(self, n: int, *, dropout: float = 0.0, clients: int | None = None, seed: int = 0,
                 min_neighbours: int = 1, graph: tuple[int, int] | None = None) -> None:
        self.graph = graph
        rng = np.random.default_rng(seed)
        self.ids = [1000 + 13 * i for i in range(n)]
        self.votes = {i: rng.integers(-40, 41, SIZE) for i in self.ids}
        clients = n if clients is None else clients
        self.survivors = min_survivors(clients, dropout)
        self.approval = sa.Approval(request=REQUEST, clients=clients, survivors=self.survivors, size=SIZE,
                                    min_neighbours=min_neighbours)
        self.states: dict[int, sa.NodeRound | None] = dict.fromkeys(self.ids)
        self.votes_cast: list[int] = []
        self.refusals: dict[int, Refusal] = {}

    def graph_for(self, m: int) -> tuple[int, int]:
        if self.graph is not None:
            return self.graph
        params = secure_parameters(m, dropout=(m - min(self.survivors, m)) / m, majority=True)
        return params.neighbours, params.threshold

    def step(self, node: int, msg: dict[str, Any]) -> dict[str, Any]:
        """One node answers one message; a refusal discards its round (what the adapter does)."""

        def vote(clipping: int) -> np.ndarray:
            self.votes_cast.append(node)
            return self.votes[node]

        try:
            self.states[node], reply = sa.node_step(self.states[node], msg, node=node, approval=self.approval,
                                                    vote=vote)
        except Refusal as refusal:
            self.states[node] = None
            self.refusals[node] = refusal
            raise
        return reply

    def send(self, drop: dict[str, set[int]] | None = None) -> Callable[[str, dict], dict]:
        drop = drop or {}

        def send(stage: str, messages: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
            out = {}
            for node, msg in messages.items():
                if node in drop.get(stage, set()):
                    continue
                try:
                    out[node] = self.step(node, msg)
                except Refusal:
                    pass
            return out

        return send

    def run(self, drop: dict[str, set[int]] | None = None) -> sa.SumResult:
        result, _ = sa.run_round(self.ids, self.send(drop), request=REQUEST, size=SIZE,
                                 min_survivors=self.survivors, graph_for=self.graph_for)
        return result

    def server_until(self, stage: str, *, lying: bool = False) -> tuple[sa.ServerRound, dict[int, dict[str, Any]]]:
        """A server driven up to the messages of ``stage`` (not yet delivered): honest, or ``lying`` about
        how many contributors a release needs (it goes on with any number)."""
        server = sa.ServerRound(self.ids, REQUEST, SIZE, 2 if lying else self.survivors,
                                (lambda m: (m - 1, m // 2 + 1)) if lying else self.graph_for)
        send = self.send()
        messages = server.advertise()
        for name, nxt in (("advertise", server.share_keys), ("share_keys", server.masked_input),
                          ("masked_input", server.consistency), ("consistency", server.unmask)):
            if name == stage:
                return server, messages
            messages = nxt(send(name, messages))  # type: ignore[assignment]
        assert stage == "unmask"
        return server, messages


def listing(server: sa.ServerRound, survivors: list[int]) -> dict[str, Any]:
    """A ``consistency`` stage naming ``survivors``, with the receipts the server holds for them."""
    return sa.message("consistency", survivors=survivors, receipts=[server.receipts[n] for n in survivors])


def _exact(fed: Federation, result: sa.SumResult) -> None:
    assert np.array_equal(result.total, sum(fed.votes[i] for i in result.survivors))


def test_round_sums_exactly_without_dropouts() -> None:
    fed = Federation(12)
    result = fed.run()
    assert result.survivors == fed.ids
    _exact(fed, result)
    assert sorted(fed.votes_cast) == fed.ids


def test_node_state_keeps_only_its_neighbours_encryption_and_mask_keys() -> None:
    # the state travels with the node's Context on every message: after share_keys it holds the share-encryption
    # keys agreed with the node's graph neighbours (the same both ways: a neighbour's share opens with it), their
    # mask keys (those of the key list the server sent) and the signing keys of every node
    fed = Federation(40, graph=(6, 5))
    server, _ = fed.server_until("masked_input")
    assert server.graph is not None
    for node in fed.ids:
        state = fed.states[node]
        assert state is not None and state.stage == "share_keys"
        assert state.peers == sorted(server.graph.neighbourhood(node)) and len(state.peers) == 6
        for v, key in state.peer_keys(state.box_keys).items():
            peer = fed.states[v]
            assert peer is not None and peer.peer_keys(peer.box_keys)[node] == key
            assert key == sa._pair_key(relay.KeyPair.from_private(state.c_private), server.keys[v][0], state.digest,
                                       node, v, b"share-key")
        assert state.peer_keys(state.s_keys) == {v: server.keys[v][1] for v in state.peers}
        assert state.signing_keys() == {v: server.keys[v][2] for v in fed.ids}
        assert len(state.box_keys) + len(state.s_keys) + len(state.g_keys) == 32 * (2 * 6 + 40)
    with pytest.raises(Refusal, match="unreadable"):
        state.peer_keys(state.box_keys[:-1])


def test_round_sums_exactly_with_dropouts_at_every_stage() -> None:
    fed = Federation(30, dropout=0.2)
    ids = fed.ids
    drop = {"advertise": {ids[0]}, "share_keys": {ids[1]}, "masked_input": {ids[2]}, "consistency": {ids[3]},
            "unmask": {ids[4]}}
    result = fed.run(drop)
    # lost before the masked input: not in the sum; lost later: in the sum, unmasked by the others' shares
    assert set(result.survivors) == set(ids) - {ids[0], ids[1], ids[2]}
    _exact(fed, result)


@pytest.mark.slow
def test_round_sums_exactly_at_200_with_dropouts_at_every_stage() -> None:
    """The secure graph at a size where it is sparse (a node's neighbours are about a third of the others), 4 nodes
    lost at every stage."""
    fed = Federation(200, dropout=0.1, seed=5)
    rng = np.random.default_rng(1)
    lost = rng.choice(fed.ids, size=20, replace=False).tolist()
    drop = {stage: set(lost[4 * i:4 * i + 4]) for i, stage in enumerate(sa.STAGES)}
    result = fed.run(drop)
    assert set(result.survivors) == set(fed.ids) - set(lost[:12])
    _exact(fed, result)


def test_a_round_started_by_the_preflights_advertise_sums_exactly_and_restarts_with_its_own() -> None:
    fed = Federation(12, dropout=0.25)
    round_id = sa.new_round_id()
    carried = sa.message("advertise", round=round_id, request=REQUEST)
    keys = {node: fed.step(node, carried) for node in fed.ids}  # what the pre-flight's replies carry
    sent: list[str] = []
    send = fed.send({"share_keys": {fed.ids[5]}})  # a node lost before sharing its keys forces a restart

    def record(stage: str, messages: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        sent.append(stage)
        return send(stage, messages)

    result, server = sa.run_round(fed.ids, record, request=REQUEST, size=SIZE, min_survivors=fed.survivors,
                                  graph_for=fed.graph_for, advertised=sa.Advertised(round_id, keys))
    # the first attempt starts at share_keys under the pre-flight's round id; the restart advertises anew
    assert sent[:2] == ["share_keys", "advertise"] and sent.count("advertise") == 1
    assert server.round_id != round_id and set(result.survivors) == set(fed.ids) - {fed.ids[5]}
    _exact(fed, result)


def test_too_many_dropouts_release_nothing() -> None:
    fed = Federation(10, dropout=0.2)
    with pytest.raises(TooFewSurvivorsError):
        fed.run({"masked_input": set(fed.ids[:3])})


# ------------------------------------------------------------------------------------- public graph
def _keys(n: int) -> dict[int, tuple[bytes, bytes, bytes]]:
    return {i: (relay.KeyPair.generate().public, relay.KeyPair.generate().public,
                relay.SigningKey.generate().public) for i in range(n)}


def test_graph_changes_when_any_public_key_changes() -> None:
    keys = _keys(40)
    base = sa.round_digest(bytes(16), REQUEST, SIZE, 8, 6, keys)
    graph = sa.public_graph(base, sorted(keys), 8)
    assert all(len(graph.neighbourhood(i)) == 8 for i in keys)
    for node in (0, 17, 39):
        for which in range(3):
            changed = dict(keys)
            triple = list(changed[node])
            triple[which] = relay.KeyPair.generate().public
            changed[node] = tuple(triple)  # type: ignore[assignment]
            digest = sa.round_digest(bytes(16), REQUEST, SIZE, 8, 6, changed)
            assert digest != base
            assert sa.public_graph(digest, sorted(keys), 8).order != graph.order
    for other in (sa.round_digest(bytes(15) + b"\1", REQUEST, SIZE, 8, 6, keys),
                  sa.round_digest(bytes(16), "cd" * 32, SIZE, 8, 6, keys),
                  sa.round_digest(bytes(16), REQUEST, SIZE, 10, 6, keys)):
        assert other != base


def _component_by_search(graph: sa.PublicGraph, survivors: set[int], node: int) -> int:
    seen, todo = {node}, [node]
    while todo:
        for v in graph.neighbourhood(todo.pop()):
            if v in survivors and v not in seen:
                seen.add(v)
                todo.append(v)
    return len(seen)


@pytest.mark.parametrize("neighbours", [2, 4, 10, 39])
def test_component_size_matches_graph_search(neighbours: int) -> None:
    rng = np.random.default_rng(neighbours)
    nodes = list(range(40))
    graph = sa.public_graph(rng.bytes(32), nodes, neighbours)
    for _ in range(30):
        survivors = set(rng.choice(nodes, size=int(rng.integers(1, 41)), replace=False).tolist())
        node = int(rng.choice(sorted(survivors)))
        assert sa.component_size(graph, sorted(survivors), node) == _component_by_search(graph, survivors, node)


# ------------------------------------------------------------------------------------------ attacks
def test_over_claimed_clients_is_refused_before_any_share() -> None:
    # the request claims 1023 clients (xi = 0.1: at least 921 contributors); 5 take part
    fed = Federation(5, clients=1023, dropout=0.1)
    server, messages = fed.server_until("share_keys", lying=True)
    for node, msg in messages.items():
        with pytest.raises(Refusal, match="nodes in the round") as refused:
            fed.step(node, msg)
        assert refused.value.code == "secagg_neighbours"
    assert fed.votes_cast == [] and all(state is None for state in fed.states.values())


def test_partitioned_key_lists_are_refused_at_xi_zero() -> None:
    # the server shows each half of 20 nodes a key list of its own half only (its own graph)
    fed = Federation(20)
    server, messages = fed.server_until("share_keys")
    full = messages[fed.ids[0]]
    for half in (fed.ids[:10], fed.ids[10:]):
        keep = [i for i, n in enumerate(full["nodes"]) if n in half]
        view = {**full, "nodes": half, **{k: b"".join(full[k][32 * i:32 * i + 32] for i in keep)
                                          for k in ("c_keys", "s_keys", "g_keys")},
                "neighbours": 8, "threshold": 5}
        for node in half:
            with pytest.raises(Refusal, match="outside \\[20, 20\\]"):
                fed.step(node, view)
    assert fed.votes_cast == []


def test_survivor_set_that_splits_the_graph_is_refused() -> None:
    # xi = 0.5 admits 10 of 20 survivors; the server names a survivor set whose component around the
    # first nodes is small (it drops every node around them on the ring)
    fed = Federation(20, dropout=0.5, graph=(6, 4))
    server, messages = fed.server_until("consistency")
    graph = server.graph
    assert graph is not None and not graph.complete
    half = graph.neighbours // 2
    order = list(graph.order)
    # keep a short arc of 3 nodes, a gap of k/2 + 1, then every remaining node
    small = order[:3]
    rest = order[3 + half + 1: len(order) - half - 1]
    survivors = sorted(small + rest)
    assert len(survivors) >= fed.survivors
    assert sa.component_size(graph, survivors, small[0]) == 3
    for node in small:
        with pytest.raises(Refusal, match="may hold only 3 noise shares"):
            fed.step(node, listing(server, survivors))


def test_different_survivor_views_never_reach_unmasking() -> None:
    # the server tells two halves of the survivors different survivor sets; each half signs its own view,
    # so neither collects the quorum of more than half the committee (here the whole round), and mixing them
    # does not verify
    fed = Federation(16, dropout=0.5, graph=(15, 9))
    server, messages = fed.server_until("consistency")
    a, b = fed.ids[:8], fed.ids[8:]
    signatures: dict[int, bytes] = {}
    for view, members in ((sorted(a + b[:1]), a), (sorted(b + a[:1]), b)):
        for node in members:
            signatures[node] = fed.step(node, listing(server, view))["signature"]
    assert server.graph is not None and sa.consistency_quorum(sa.consistency_committee(server.graph)) == 9
    for node in (a[0], b[0]):
        own = a if node in a else b
        with pytest.raises(Refusal, match="8 consistency signatures, 8 of them from the committee: fewer than 9, or "
                                          "fewer than 9 of the committee"):
            fed.step(node, sa.message("unmask", signers=own, signatures=[signatures[s] for s in own]))
    mixed = sorted(a + b[:1])
    with pytest.raises(Refusal, match="does not verify"):
        fed.step(a[1], sa.message("unmask", signers=mixed, signatures=[signatures[s] for s in mixed]))
    assert not any(state is not None and state.stage == "unmask" for state in fed.states.values())


def test_forged_signatures_do_not_verify() -> None:
    fed = Federation(10, dropout=0.3)
    server, messages = fed.server_until("unmask")
    node = fed.ids[0]
    msg = messages[node]
    forged = list(msg["signatures"])
    forged[-1] = relay.SigningKey.generate().sign(b"anything")
    with pytest.raises(Refusal, match="does not verify") as refused:
        fed.step(node, {**msg, "signatures": forged})
    assert refused.value.code == "secagg_unmask"
    with pytest.raises(Refusal, match="fewer than"):
        fed.step(fed.ids[1], {**messages[fed.ids[1]], "signers": msg["signers"][:3],
                              "signatures": msg["signatures"][:3]})


def test_forged_share_ciphertext_is_refused_before_the_vote() -> None:
    fed = Federation(8, dropout=0.25)
    server, messages = fed.server_until("masked_input")
    node = fed.ids[0]
    msg = messages[node]
    tampered = bytearray(msg["ciphertexts"][0])
    tampered[-1] ^= 1
    with pytest.raises(Refusal, match="failed to authenticate") as refused:
        fed.step(node, {**msg, "ciphertexts": [bytes(tampered), *msg["ciphertexts"][1:]]})
    assert refused.value.code == "secagg_neighbours"
    # a ciphertext replayed from another sender fails too
    with pytest.raises(Refusal, match="failed to authenticate"):
        fed.step(fed.ids[1], {**messages[fed.ids[1]], "ciphertexts": messages[fed.ids[1]]["ciphertexts"][::-1]})
    assert fed.votes_cast == []  # no vote computed, no budget charged


@pytest.mark.parametrize("stage", ["share_keys", "masked_input", "consistency", "unmask"])
def test_skipped_or_repeated_stage_aborts_the_round(stage: str) -> None:
    fed = Federation(8, dropout=0.25)
    server, messages = fed.server_until(stage)
    node = fed.ids[0]
    skipped = sa.STAGES[sa.STAGES.index(stage) + 1] if stage != "unmask" else "masked_input"
    with pytest.raises(Refusal, match="arrived where") as refused:
        fed.step(node, {**messages[node], "stage": skipped})
    assert refused.value.code == "secagg_round" and fed.states[node] is None
    if stage in ("share_keys", "masked_input"):
        return
    fed2 = Federation(8, dropout=0.25)
    server, messages = fed2.server_until(stage)
    node = fed2.ids[0]
    fed2.step(node, messages[node])
    with pytest.raises(Refusal, match="arrived where"):
        fed2.step(node, messages[node])  # the same stage again


def test_round_for_another_request_or_version_is_refused() -> None:
    fed = Federation(4)
    node = fed.ids[0]
    with pytest.raises(Refusal, match="another request"):
        fed.step(node, sa.message("advertise", round=bytes(16), request="ff" * 32))
    with pytest.raises(Refusal, match="version"):
        fed.step(node, {**sa.message("advertise", round=bytes(16), request=REQUEST), "version": sa.VERSION - 1})
    fed.step(node, sa.message("advertise", round=bytes(16), request=REQUEST))
    changed = dataclasses.replace(fed.approval, request="ff" * 32)
    with pytest.raises(Refusal, match="changed during the round"):
        sa.node_step(fed.states[node], sa.message("share_keys"), node=node, approval=changed, vote=lambda c: None)


def test_dropped_vector_keeps_its_self_mask() -> None:
    # the server holds a node's masked vector but declares it dropped: it gets the node's mask key, never
    # its self-mask seed (every honest holder reveals one kind of share per node)
    fed = Federation(12, dropout=0.25)
    server, messages = fed.server_until("consistency")
    victim = fed.ids[0]
    survivors = [n for n in server.survivors if n != victim]
    replies = {}
    for node in survivors:
        replies[node] = fed.step(node, listing(server, survivors))
    server.survivors = survivors
    unmask = server.unmask(replies)
    revealed = [fed.step(node, msg) for node, msg in unmask.items()]
    b_of_victim = sum(victim in r["b_owners"] for r in revealed)
    s_of_victim = sum(victim in r["s_owners"] for r in revealed)
    assert b_of_victim == 0 and s_of_victim >= server.threshold
    with pytest.raises(SecureSumError):
        server.survivors = sorted(server.survivors + [victim])
        server.finish(dict(zip(unmask, revealed)))


def test_in_a_large_round_the_committee_majority_decides() -> None:
    # 80 nodes: the committee is the first 64 of the public order; 60 signatures from outside it and a
    # committee minority do not unlock anything, a committee majority does
    fed = Federation(80, dropout=0.1, graph=(10, 7))
    server, messages = fed.server_until("consistency")
    assert server.graph is not None
    committee = sa.consistency_committee(server.graph)
    assert len(committee) == sa.COMMITTEE_SIZE == 64 and sa.consistency_quorum(committee) == 33
    signatures = {node: fed.step(node, msg)["signature"] for node, msg in messages.items()}
    outside = [n for n in sorted(signatures) if n not in committee]
    weak = sorted(outside + list(committee[:32]))
    node = committee[40]
    with pytest.raises(Refusal, match="32 of them from the committee"):
        fed.step(node, sa.message("unmask", signers=weak, signatures=[signatures[s] for s in weak]))
    strong = sorted(committee[:33])
    reply = fed.step(committee[41], sa.message("unmask", signers=strong, signatures=[signatures[s] for s in strong]))
    assert committee[41] in reply["b_owners"]


def test_an_unmask_reply_reveals_one_kind_of_share_per_peer_never_both() -> None:
    """A node whose unmask reply revealed both the self-mask share and the pairwise-key share of the same
    peer would hand the server that peer's vector exactly (and every other test passed). Each reply reveals the
    self-mask shares of survivors only and the mask-key shares of dropped nodes only: never both for one peer."""
    fed = Federation(12, dropout=0.25)
    dropped = fed.ids[1]  # its shares went out, its masked vector never arrives: the others reveal its mask key
    server = sa.ServerRound(fed.ids, REQUEST, SIZE, fed.survivors, fed.graph_for)
    send = fed.send({"masked_input": {dropped}})
    messages = server.advertise()
    for name, nxt in (("advertise", server.share_keys), ("share_keys", server.masked_input),
                      ("masked_input", server.consistency), ("consistency", server.unmask)):
        messages = nxt(send(name, messages))
    survivors = set(server.survivors)
    assert dropped not in survivors and len(survivors) == 11
    revealed = {node: fed.step(node, msg) for node, msg in messages.items()}
    assert any(dropped in reply["s_owners"] for reply in revealed.values())
    for reply in revealed.values():
        assert not set(reply["b_owners"]) & set(reply["s_owners"])
        assert set(reply["b_owners"]) <= survivors and not set(reply["s_owners"]) & survivors
    _exact(fed, server.finish(revealed))


def test_survivors_that_never_took_part_in_the_round_do_not_count_toward_the_bound() -> None:
    """Survivors that never signed (xi >= 1/2): the server runs the round with 11 of 20 nodes, in two
    arcs of the public ring (6 and 5 nodes, gaps wider than k / 2), and lists the other 9, whose keys are in the
    key list but who never took part in this round (in the attack they vote in another round built from the same
    advertised keys), as survivors. Every node's component among the claimed survivors is all 20 (>= L = 10) and
    the 11 are a committee majority: were they to sign and reveal their shares, the server could unmask a sum of
    6 noise shares where the ledgers assume 10. A survivor must prove it took part: the receipt it signed with its
    masked vector in this round (over D), which every committee member verifies before it signs; the 9 have none,
    no committee member signs, and nothing is revealed."""
    fed = Federation(20, dropout=0.5, graph=(4, 3))
    assert fed.survivors == 10
    server, messages = fed.server_until("share_keys")
    assert server.graph is not None
    order = sorted(fed.ids, key=lambda n: int(server.graph.positions([n])[0]))  # ring order
    taking_part = order[0:6] + order[9:14]  # two arcs; gaps of 3 and 6 positions > k / 2 = 2
    shared = {n: fed.step(n, messages[n]) for n in taking_part}
    boxes: dict[int, dict[int, bytes]] = {}
    for n, reply in shared.items():
        for receiver, ciphertext in zip(reply["receivers"], reply["ciphertexts"]):
            boxes.setdefault(receiver, {})[n] = ciphertext
    masked = {n: fed.step(n, sa.message("masked_input", senders=sorted(boxes[n]),
                                        ciphertexts=[boxes[n][s] for s in sorted(boxes[n])])) for n in taking_part}
    committee = sa.consistency_committee(server.graph)
    assert len(committee) == 20 and sa.consistency_quorum(committee) == 11 == len(taking_part)
    claimed = sorted(fed.ids)  # the 9 that never took part listed as survivors, with receipts it cannot have
    statement = sa.participation_statement(server.digest)
    assert all(relay.verify(server.keys[n][2], masked[n]["receipt"], statement) for n in taking_part)
    # the best the server has for the 9: a participant's receipt (another key) or bytes of its own
    receipts = [masked[n]["receipt"] if n in masked else masked[taking_part[i % 11]]["receipt"] if i % 2 else
                bytes(64) for i, n in enumerate(claimed)]
    for n in taking_part:  # every one is a committee member: each refuses before it signs
        with pytest.raises(Refusal, match="secagg_unmask: a survivor's receipt does not verify"):
            fed.step(n, sa.message("consistency", survivors=claimed, receipts=receipts))
    assert all(fed.states[n] is None for n in taking_part)  # rounds discarded: no signature, no share left


def test_a_threshold_above_the_quorum_needs_t_consistency_signatures_not_t_minus_one() -> None:
    """10 nodes, 9 neighbours each, threshold t = 7 (2 t > k + 1): the committee is the whole round and its quorum 6,
    so t exceeds it. t - 1 = 6 signatures, all of the committee, are a quorum but fewer than t: the node refuses
    before it reveals a share. Exactly t unlock it (the boundary's other side)."""
    fed = Federation(10, graph=(9, 7))
    server, messages = fed.server_until("consistency")
    assert server.graph is not None and server.threshold == 7
    committee = sa.consistency_committee(server.graph)
    assert sa.consistency_quorum(committee) == 6 < server.threshold
    signatures = {node: fed.step(node, msg)["signature"] for node, msg in messages.items()}
    short = sorted(committee[:6])
    node = next(n for n in fed.ids if n not in short)
    with pytest.raises(Refusal, match="6 consistency signatures, 6 of them from the committee: fewer than 7"):
        reply = fed.step(node, sa.message("unmask", signers=short, signatures=[signatures[s] for s in short]))
        pytest.fail(f"t - 1 = 6 consistency signatures unlocked node {node}'s shares of {reply['b_owners']}")
    assert fed.states[node] is None  # its round is discarded: nothing of it can be revealed later
    enough = sorted(committee[:7])
    other = next(n for n in fed.ids if n not in enough and n != node)
    assert fed.step(other, sa.message("unmask", signers=enough, signatures=[signatures[s] for s in enough]))["b_owners"]


@pytest.mark.parametrize(("taking_part", "graph"), [(9, None), (16, (15, 9))])
def test_a_round_with_more_nodes_than_the_announced_n_is_refused_before_any_share(
        taking_part: int, graph: tuple[int, int] | None) -> None:
    """The request announces n = 8 clients; the server runs the round with one more node, or twice as many: every
    node refuses the key list before it shares a secret or casts its vote (the round's size must lie in [L, n])."""
    fed = Federation(taking_part, clients=8, graph=graph)
    server, messages = fed.server_until("share_keys")
    accepted = []
    for node, msg in messages.items():
        try:
            fed.step(node, msg)
        except Refusal as refused:
            assert refused.code == "secagg_neighbours"
            assert f"{taking_part} nodes in the round, outside [8, 8] for the announced request" in refused.detail
        else:
            accepted.append(node)
    assert not accepted, f"nodes {accepted} shared their secrets in a round of {taking_part} nodes announced as 8"
    assert fed.votes_cast == [] and all(state is None for state in fed.states.values())


def test_a_round_of_exactly_the_announced_n_shares_its_keys() -> None:
    """The other side of the boundary: 8 nodes for the announced 8 pass the size check and share their secrets."""
    fed = Federation(8, clients=8)
    server, messages = fed.server_until("share_keys")
    assert all(fed.step(node, msg)["ciphertexts"] for node, msg in messages.items())
