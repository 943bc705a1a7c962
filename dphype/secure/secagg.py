"""DP-Hype's own SecAgg+ (Bell et al., CCS 2020) with the consistency round of Bonawitz et al. (CCS 2017).

Framework-free: message contents are plain dicts of ints, bytes and lists, the node keeps its round in a
`NodeRound` it can store as such a dict, and the Flower adapter (`dphype.flower.server.secagg_server`) only
carries them. Primitives come from `dphype.secure.relay` (X25519, HKDF-SHA256, ChaCha20-Poly1305,
Ed25519, the ChaCha20 mask generator), secret sharing from `dphype.secure.shamir`, the graph's degree
and threshold from `dphype.secure.secagg_params`, the encoding from `dphype.secure.secure_sum`.

The protocol -- its rounds and messages, what each node checks, and the noise-share bound (every sum the server
can unmask holds at least ``ceil((1 - xi) n)`` noise shares) -- is specified in docs/design/secagg.md.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dphype.checks import MAX_CLIENTS
from dphype.refusal import Refusal
from dphype.secure import relay
from dphype.secure.roster import Membership, RosterError
from dphype.secure.secagg_params import check_share_threshold
from dphype.secure.secure_sum import (
    MODULUS_RANGE,
    SecureSumError,
    TooFewSurvivorsError,
    clipping_range_for,
)
from dphype.secure.shamir import combine_shares_of, create_shares_of

#: Version of the message formats and of every hashed or signed label.
VERSION: int = 3
#: The stages in order.
STAGES: tuple[str, ...] = ("advertise", "share_keys", "masked_input", "consistency", "unmask")
_LABEL = f"dphype-secagg-v{VERSION}/".encode()
_ROUND_BYTES = 16
_SECRET_BYTES = 32
_ID_BYTES = 8


def _id(node: int) -> bytes:
    return int(node).to_bytes(_ID_BYTES, "big")


def set_digest(nodes: Sequence[int]) -> bytes:
    """``H(S)``: SHA-256 of the sorted ids, 8 bytes each, big-endian."""
    return hashlib.sha256(b"".join(_id(n) for n in sorted(nodes))).digest()


def round_digest(round_id: bytes, request: str, size: int, neighbours: int, threshold: int,
                 keys: Mapping[int, tuple[bytes, bytes, bytes]]) -> bytes:
    """``D``: SHA-256 over the round, the request digest, ``p``, ``k``, ``t`` and every node's keys in id order.

    Args:
        round_id: The round's id.
        request: The request's digest.
        size: The vector length ``p``.
        neighbours: The graph degree ``k``.
        threshold: The Shamir threshold ``t``.
        keys: Node id -> its three public keys (share encryption, mask agreement, signing).

    Returns:
        The 32-byte round digest.
    """
    h = hashlib.sha256(_LABEL + b"round")
    h.update(round_id + request.encode("utf-8") + b"".join(int(v).to_bytes(4, "big")
                                                           for v in (size, neighbours, threshold)))
    for node in sorted(keys):
        h.update(_id(node) + b"".join(keys[node]))
    return h.digest()


@dataclass(frozen=True, eq=False)
class PublicGraph:
    """The round's Harary ring ``H(m, k)`` over ``nodes`` (sorted ids), placed by a permutation from ``D``.

    Every node is joined to the ``k / 2`` positions on either side (everyone, when ``k >= m - 1``).

    Attributes:
        nodes: The ``(m,)`` sorted node ids.
        neighbours: The degree ``k``.
        ring: ``(m,)``: ``ring[p]`` is the index (into ``nodes``) of the node at ring position ``p``.
        place: ``(m,)``: the inverse permutation of ``ring``.
    """

    nodes: np.ndarray
    neighbours: int
    ring: np.ndarray = field(repr=False)
    place: np.ndarray = field(repr=False)

    @property
    def complete(self) -> bool:
        """Whether every node is joined to every other (``k >= m - 1``)."""
        return self.neighbours >= self.nodes.size - 1

    @property
    def order(self) -> tuple[int, ...]:
        """The node ids in ring order."""
        return tuple(int(v) for v in self.nodes[self.ring])

    def positions(self, members: Sequence[int]) -> np.ndarray:
        """Ring positions of ``members``, in their order; `ValueError` if one is not a node of the round."""
        ids = np.asarray(members, dtype=np.uint64)
        index = np.minimum(np.searchsorted(self.nodes, ids), self.nodes.size - 1)
        if not np.array_equal(self.nodes[index], ids):
            raise ValueError("members must be nodes of the round")
        return self.place[index]

    def neighbourhood(self, node: int) -> tuple[int, ...]:
        """``N(node)``: the ids of its graph neighbours, sorted."""
        if self.complete:
            return tuple(int(n) for n in self.nodes if n != node)
        half, m = self.neighbours // 2, self.nodes.size
        offsets = np.concatenate([np.arange(-half, 0), np.arange(1, half + 1)])
        ring = self.ring[(self.positions([node])[0] + offsets) % m]
        return tuple(int(n) for n in np.sort(self.nodes[ring]))


def public_graph(digest: bytes, nodes: Sequence[int], neighbours: int) -> PublicGraph:
    """The public graph of ``D``: positions sorted by 62-bit words of the ChaCha20 stream under ``D``, ties by id.

    A pure function of its arguments, computed once per process for each (nodes of a simulation that share a process,
    or one node's stages); its arrays are read-only.
    """
    ids = np.sort(np.asarray(nodes, dtype=np.uint64))
    return _public_graph(bytes(digest), ids.tobytes(), int(neighbours))


@functools.lru_cache(maxsize=64)
def _public_graph(digest: bytes, ids: bytes, neighbours: int) -> PublicGraph:
    nodes = np.frombuffer(ids, dtype=np.uint64)
    keys = relay.expand_mask(digest, nodes.size, relay.MAX_MODULUS, context=_LABEL + b"graph")
    ring = np.lexsort((np.arange(nodes.size), keys))
    place = np.empty_like(ring)
    place[ring] = np.arange(nodes.size)
    ring.flags.writeable = place.flags.writeable = False
    return PublicGraph(nodes, neighbours, ring, place)


def component_size(graph: PublicGraph, survivors: Sequence[int], node: int) -> int:
    """Size of ``node``'s connected component in the public graph restricted to ``survivors``.

    On the ring a component is a maximal arc of survivors without a gap of more than ``k / 2`` positions.

    Args:
        graph: The round's public graph.
        survivors: The surviving node ids.
        node: One of the survivors.

    Returns:
        The number of nodes in its component.

    Raises:
        ValueError: ``node`` is not a survivor.
    """
    members = set(survivors)
    if node not in members:
        raise ValueError("node must be one of the survivors")
    if graph.complete:
        return len(members)
    m, half = graph.nodes.size, graph.neighbours // 2
    positions = np.sort(graph.positions(sorted(members)))
    gaps = (np.roll(positions, -1) - positions) % m  # from each survivor to the next one on the ring
    if positions.size == 1:
        return 1
    breaks = np.flatnonzero(gaps > half)  # no edge from positions[i] to positions[i + 1]
    if breaks.size <= 1:
        return int(positions.size)
    mine = int(np.searchsorted(positions, graph.positions([node])[0]))
    # the arcs run from positions[breaks[j] + 1] to positions[breaks[j + 1]] (cyclically)
    after = breaks[np.searchsorted(breaks, mine) % breaks.size]  # the first break at or after mine
    before = breaks[np.searchsorted(breaks, mine) - 1]  # the last break before mine (cyclic)
    return int((after - before) % positions.size) or int(positions.size)


def _pair_key(private: relay.KeyPair, peer_public: bytes, digest: bytes, a: int, b: int, purpose: bytes) -> bytes:
    low, high = sorted((a, b))
    return private.agree(peer_public, info=_LABEL + purpose + digest + _id(low) + _id(high))


def _pair_masks(keys: Sequence[bytes], size: int, digest: bytes) -> np.ndarray:
    return relay.expand_masks(keys, size, MODULUS_RANGE, context=_LABEL + b"pair-mask" + digest)


def _self_mask(seed: bytes, size: int, digest: bytes, node: int) -> np.ndarray:
    return relay.expand_mask(seed, size, MODULUS_RANGE, context=_LABEL + b"self-mask" + digest + _id(node))


def _share_context(digest: bytes, sender: int, receiver: int) -> bytes:
    return _LABEL + b"share" + digest + _id(sender) + _id(receiver)


def participation_statement(digest: bytes) -> bytes:
    """What a node signs with its masked vector (stage 2), its receipt: ``("participation", D)``."""
    return _LABEL + b"participation" + digest


def consistency_statement(digest: bytes, survivors: Sequence[int]) -> bytes:
    """What a node signs in the consistency round (stage 3): ``("consistency", D, H(U3))``."""
    return _LABEL + b"consistency" + digest + set_digest(survivors)


#: Size of the consistency round's committee (all nodes in rounds up to this size).
COMMITTEE_SIZE: int = 64


def consistency_committee(graph: PublicGraph) -> tuple[int, ...]:
    """The nodes whose majority must sign the survivor set: the first `COMMITTEE_SIZE` in the graph's order."""
    return tuple(int(v) for v in graph.nodes[graph.ring[:COMMITTEE_SIZE]])


def consistency_quorum(committee: Sequence[int]) -> int:
    """Committee signatures a node needs before unmasking: more than half the committee."""
    return len(committee) // 2 + 1


# ------------------------------------------------------------------------------------------ messages
def _refuse(code: str, detail: str) -> Refusal:
    return Refusal(code, detail)


def _get(message: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = message.get(key)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise _refuse("secagg_round", f"the message has no valid {key!r}")
    return value


def _ids(message: Mapping[str, Any], key: str) -> list[int]:
    value = _get(message, key, list)
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**64 for v in value):
        raise _refuse("secagg_round", f"{key!r} must list node ids")
    if len(set(value)) != len(value):
        raise _refuse("secagg_round", f"{key!r} repeats a node")
    return [int(v) for v in value]


def _blobs(message: Mapping[str, Any], key: str, count: int) -> list[bytes]:
    value = _get(message, key, list)
    if len(value) != count or not all(isinstance(v, bytes) for v in value):
        raise _refuse("secagg_round", f"{key!r} must hold {count} byte strings")
    return list(value)


def _key_list(message: Mapping[str, Any], key: str, count: int) -> list[bytes]:
    """``count`` 32-byte keys sent concatenated under ``key``."""
    blob = _get(message, key, bytes)
    size = relay.KEY_BYTES
    if len(blob) != count * size:
        raise _refuse("secagg_round", f"{key!r} must hold {count} keys of {size} bytes")
    return [blob[i * size:(i + 1) * size] for i in range(count)]


def message(stage: str, **content: Any) -> dict[str, Any]:
    """A message of ``stage`` in the current format, with ``content``'s fields."""
    return {"version": VERSION, "stage": stage, **content}


def new_round_id() -> bytes:
    """A fresh random 16-byte round id (the ``round`` of ``advertise``)."""
    return os.urandom(_ROUND_BYTES)


@dataclass(frozen=True)
class Advertised:
    """A round's first ``advertise`` stage, carried by the pre-flight.

    Attributes:
        round_id: The ``round`` id the server sent with the request.
        replies: The replies of the nodes that approved it (node id -> message).
    """

    round_id: bytes
    replies: Mapping[int, Mapping[str, Any]]


# ------------------------------------------------------------------------------------------ the node
@dataclass(frozen=True)
class Approval:
    """What the node approved in its pre-flight and its own policy's limits for the round.

    Attributes:
        request: The request's digest.
        clients: The announced ``n``.
        survivors: ``ceil((1 - xi) n)``, the contributors its ledger entry assumes.
        size: The vector length ``p``.
        min_neighbours: The policy's fewest graph neighbours.
        run: The run id (bound into the node's roster signature).
        membership: The node's place in its federation (`dphype.secure.roster.Membership`), or ``None`` when its
            operator allowed an unauthenticated federation: then the key list is not checked against a roster.
    """

    request: str
    clients: int
    survivors: int
    size: int
    min_neighbours: int
    run: int = 0
    membership: Membership | None = None


#: The node's vote: called once, in stage 2 after every check, with the round's clipping range ``C``; it
#: returns the encoded noisy vote (integers in ``[-C, C]``) and charges the node's ledger.
VoteFunction = Callable[[int], np.ndarray]


@dataclass
class NodeRound:
    """A node's state in one round (its secrets included).

    `to_record` / `from_record` store it as a flat dict of ints, bytes and lists (a Flower ``ConfigRecord``).

    Attributes:
        node: This node's id.
        stage: The stage it answered last.
        round_id: The round's id.
        request: The approved request's digest.
        c_private: The share-encryption private key.
        s_private: The mask-agreement private key.
        g_private: The signing private key.
        seed: The self-mask seed.
        digest: The round digest ``D``.
        nodes: The round's node ids.
        peers: This node's graph neighbours ``N(u)``, sorted (the only keys kept, see below).
        box_keys: The share-encryption keys agreed with the neighbours in ``share_keys`` (``HKDF(X25519(c_u, c_v))``,
            the same both ways), 32 bytes each in the order of ``peers``: their shares to this node are opened with
            them in ``masked_input``, which then drops them.
        s_keys: The neighbours' mask-agreement public keys, 32 bytes each in the order of ``peers``.
        g_keys: Every node's signing key, in the order of ``nodes`` (any survivor may sign stage 3).
        neighbours: The degree ``k``.
        threshold: The Shamir threshold ``t``.
        survivors: The survivor set ``U3``.
        share_owners: The nodes whose shares this node holds.
        b_shares: Its shares of their self-mask seeds.
        s_shares: Its shares of their mask-agreement keys.
    """

    node: int
    stage: str
    round_id: bytes
    request: str
    c_private: bytes
    s_private: bytes
    g_private: bytes
    seed: bytes = b""
    digest: bytes = b""
    nodes: list[int] = field(default_factory=list)
    #: Only the neighbours' keys are kept: the state travels with the node's Context.
    peers: list[int] = field(default_factory=list)
    box_keys: bytes = b""
    s_keys: bytes = b""
    g_keys: bytes = b""  # every node's signing key, in the order of ``nodes`` (any survivor may sign stage 3)
    neighbours: int = 0
    threshold: int = 0
    survivors: list[int] = field(default_factory=list)
    share_owners: list[int] = field(default_factory=list)
    b_shares: list[bytes] = field(default_factory=list)
    s_shares: list[bytes] = field(default_factory=list)

    def to_record(self) -> dict[str, Any]:
        """The state as a flat dict, field name -> value (lists copied)."""
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> NodeRound:
        """Inverse of `to_record`; an unreadable record is refused (``secagg_round``), aborting the round."""
        values: dict[str, Any] = {k: (list(v) if isinstance(v, list) else v) for k, v in record.items()}
        try:
            return cls(**values)
        except TypeError:
            raise _refuse("secagg_round", "this node's round state is unreadable") from None

    def graph(self) -> PublicGraph:
        """The round's public graph (`public_graph`)."""
        return public_graph(self.digest, self.nodes, self.neighbours)

    def peer_keys(self, blob: bytes) -> dict[int, bytes]:
        """Neighbour id -> key from ``box_keys`` or ``s_keys``; refused (``secagg_round``) if it does not split."""
        return _split_keys(blob, self.peers)

    def signing_keys(self) -> dict[int, bytes]:
        """Node id -> signing key for every node; refused (``secagg_round``) if ``g_keys`` does not split."""
        return _split_keys(self.g_keys, self.nodes)


def _split_keys(blob: bytes, ids: Sequence[int]) -> dict[int, bytes]:
    size = relay.KEY_BYTES
    if len(blob) != size * len(ids):
        raise _refuse("secagg_round", "this node's round state is unreadable")
    return {node: blob[i * size:(i + 1) * size] for i, node in enumerate(ids)}


def node_step(state: NodeRound | None, msg: Mapping[str, Any], *, node: int, approval: Approval,
              vote: VoteFunction) -> tuple[NodeRound, dict[str, Any]]:
    """Answer one stage message: check it against ``state`` and the ``approval``.

    Args:
        state: The node's round state (``None`` before ``advertise``).
        msg: The stage's message.
        node: This node's id.
        approval: What the node approved in its pre-flight.
        vote: ``vote(C)`` returns this node's ``(p,)`` encoded noisy vote vector within the round's range ``C``
            (`dphype.secure.secure_sum.encode`); called in ``masked_input`` once its checks pass (it charges the
            ledger).

    Returns:
        The new state and the reply.

    Raises:
        dphype.refusal.Refusal: The message fails a check (the caller must then discard the round), before
            anything of the stage is computed or sent.
    """  # noqa: DOC503
    if msg.get("version") != VERSION:
        raise _refuse("secagg_round", f"message format version {msg.get('version')!r} is not {VERSION}")
    stage = msg.get("stage")
    if stage not in STAGES:
        raise _refuse("secagg_round", "unknown stage")
    expected = "advertise" if state is None else _next(state.stage)
    if stage == "advertise" and state is not None and state.stage in ("advertise", "share_keys"):
        expected = "advertise"  # a restart before any masked input: the old secrets are discarded unused
    if stage != expected:
        raise _refuse("secagg_round", f"stage {stage!r} arrived where {expected!r} was due; round aborted")
    if state is not None and state.node != node:
        raise _refuse("secagg_round", "the round state belongs to another node")
    if stage == "advertise":
        return _advertise(msg, node, approval)
    assert state is not None
    if state.request != approval.request:
        raise _refuse("secagg_round", "the approved request changed during the round; round aborted")
    step = {"share_keys": _share_keys, "masked_input": _masked_input, "consistency": _consistency,
            "unmask": _unmask}[stage]
    return step(state, msg, approval, vote)


def _next(stage: str) -> str:
    i = STAGES.index(stage) if stage in STAGES else len(STAGES)
    if i + 1 >= len(STAGES):
        return "(none: the round is over)"
    return STAGES[i + 1]


def advertised_keys(node: int, round_id: bytes, keys: Sequence[bytes]) -> bytes:
    """What a node's identity signs (stage ``secagg-advertise``) of its ``advertise`` answer: id, round, 3 keys."""
    return _LABEL + b"advertised" + _id(node) + round_id + b"".join(keys)


def _check_members(msg: Mapping[str, Any], state: NodeRound, nodes: Sequence[int],
                   keys: Mapping[int, tuple[bytes, bytes, bytes]], approval: Approval) -> None:
    """Refuse (``roster``) unless every entry of the key list is signed by a distinct voter of the node's roster."""
    membership = approval.membership
    if membership is None:
        return
    names = _get(msg, "members", list)
    signatures = _blobs(msg, "identity_signatures", len(nodes))
    if len(names) != len(nodes) or not all(isinstance(name, str) for name in names):
        raise _refuse("roster", "the key list must name the roster member of every node (members)")
    roster = membership.roster
    context = roster.context("secagg-advertise", state.request, approval.run)
    try:
        roster.check_distinct_signers(((name, advertised_keys(n, state.round_id, keys[n]), signature)
                                       for n, name, signature in zip(nodes, names, signatures)), "voter", context)
    except RosterError as err:
        raise _refuse("roster", f"the key list is not signed by distinct roster voters: {err}") from None


def _advertise(msg: Mapping[str, Any], node: int, approval: Approval) -> tuple[NodeRound, dict[str, Any]]:
    round_id = _get(msg, "round", bytes)
    if len(round_id) != _ROUND_BYTES:
        raise _refuse("secagg_round", f"round must be {_ROUND_BYTES} bytes")
    if _get(msg, "request", str) != approval.request:
        raise _refuse("secagg_round", "the round is for another request than the one approved in the pre-flight")
    c, s, g = relay.KeyPair.generate(), relay.KeyPair.generate(), relay.SigningKey.generate()
    state = NodeRound(node=node, stage="advertise", round_id=round_id, request=approval.request,
                      c_private=c.private_bytes(), s_private=s.private_bytes(), g_private=g.private_bytes())
    reply = message("advertise", c_key=c.public, s_key=s.public, g_key=g.public)
    if approval.membership is not None:  # the identity vouches for these keys (roster stage secagg-advertise)
        reply.update(member=approval.membership.name, identity_signature=approval.membership.sign(
            "secagg-advertise", approval.request, approval.run,
            advertised_keys(node, round_id, (c.public, s.public, g.public))))
    return state, reply


def _share_keys(state: NodeRound, msg: Mapping[str, Any], approval: Approval,
                vote: VoteFunction) -> tuple[NodeRound, dict[str, Any]]:
    nodes = _ids(msg, "nodes")
    m = len(nodes)
    c_keys, s_keys, g_keys = (_key_list(msg, name, m) for name in ("c_keys", "s_keys", "g_keys"))
    k, t = _get(msg, "neighbours", int), _get(msg, "threshold", int)
    if len(set(c_keys + s_keys + g_keys)) != 3 * m:
        raise _refuse("secagg_neighbours", "public keys repeat")
    keys = {n: (c, s, g) for n, c, s, g in zip(nodes, c_keys, s_keys, g_keys)}
    c, s, g = (relay.KeyPair.from_private(state.c_private), relay.KeyPair.from_private(state.s_private),
               relay.SigningKey.from_private(state.g_private))
    if keys.get(state.node) != (c.public, s.public, g.public):
        raise _refuse("secagg_neighbours", "this node's own keys are missing from the key list")
    if not approval.survivors <= m <= min(approval.clients, MAX_CLIENTS):
        raise _refuse("secagg_neighbours", f"{m} nodes in the round, outside [{approval.survivors}, "
                      f"{approval.clients}] for the announced request")
    if not (2 <= k <= m - 1 and (k % 2 == 0 or k == m - 1)):
        raise _refuse("secagg_setup", f"neighbours={k} is not an even degree in [2, {m - 2}] or {m - 1}")
    if k < approval.min_neighbours:
        raise _refuse("secagg_setup", "fewer neighbours than this node requires")
    try:
        check_share_threshold(m, k + 1, t)
    except ValueError as err:
        raise _refuse("secagg_setup", str(err)) from None
    _check_members(msg, state, nodes, keys, approval)  # every entry a distinct roster voter's, before any share
    ordered = sorted(nodes)
    digest = round_digest(state.round_id, state.request, approval.size, k, t, keys)
    graph = public_graph(digest, ordered, k)
    peers = sorted(graph.neighbourhood(state.node))
    holders = sorted({state.node, *peers})
    seed = os.urandom(_SECRET_BYTES)
    b_shares, s_shares = create_shares_of([seed, state.s_private], t, len(holders))
    receivers, ciphertexts, box_keys = [], [], []
    own = holders.index(state.node)
    for j, holder in enumerate(holders):
        if holder == state.node:
            continue
        key = _pair_key(c, keys[holder][0], digest, state.node, holder, b"share-key")
        plain = _id(state.node) + _id(holder) + b_shares[j] + s_shares[j]
        receivers.append(holder)
        box_keys.append(key)
        ciphertexts.append(relay.encrypt(key, plain, context=_share_context(digest, state.node, holder)))
    new = NodeRound(
        node=state.node, stage="share_keys", round_id=state.round_id, request=state.request,
        c_private=state.c_private, s_private=state.s_private, g_private=state.g_private, seed=seed, digest=digest,
        nodes=ordered, peers=peers, box_keys=b"".join(box_keys),
        s_keys=b"".join(keys[n][1] for n in peers), g_keys=b"".join(keys[n][2] for n in ordered), neighbours=k,
        threshold=t, share_owners=[state.node],
        b_shares=[b_shares[own]], s_shares=[s_shares[own]])
    return new, message("share_keys", receivers=receivers, ciphertexts=ciphertexts)


def _masked_input(state: NodeRound, msg: Mapping[str, Any], approval: Approval,
                  vote: VoteFunction) -> tuple[NodeRound, dict[str, Any]]:
    neighbourhood = state.graph().neighbourhood(state.node)
    senders = _ids(msg, "senders")
    if not set(senders) <= set(neighbourhood):
        raise _refuse("secagg_neighbours", "a share sender is not this node's graph neighbour")
    if len(senders) + 1 < state.threshold:
        raise _refuse("secagg_neighbours", "too few neighbours shared their keys to reconstruct this node's secrets")
    ciphertexts = _blobs(msg, "ciphertexts", len(senders))
    box_of = state.peer_keys(state.box_keys)
    owners, b_shares, s_shares = [state.node], [state.b_shares[0]], [state.s_shares[0]]
    share_bytes = len(state.b_shares[0])
    for sender, ciphertext in zip(senders, ciphertexts):
        try:
            plain = relay.decrypt(box_of[sender], ciphertext, context=_share_context(state.digest, sender, state.node))
        except relay.RelayError:
            raise _refuse("secagg_neighbours", "a share ciphertext failed to authenticate") from None
        if len(plain) != 2 * _ID_BYTES + 2 * share_bytes or plain[:2 * _ID_BYTES] != _id(sender) + _id(state.node):
            raise _refuse("secagg_neighbours", "a share ciphertext has the wrong length or addresses")
        owners.append(sender)
        b_shares.append(plain[2 * _ID_BYTES:2 * _ID_BYTES + share_bytes])
        s_shares.append(plain[2 * _ID_BYTES + share_bytes:])
    # everything this node will send is verified: now the vote, which charges the ledger
    clipping = clipping_range_for(len(state.nodes))
    encoded = np.asarray(vote(clipping))
    if encoded.shape != (approval.size,) or not np.all(np.abs(encoded) <= clipping):
        raise _refuse("client_error", "the encoded vote has the wrong shape or range")
    masked = (np.rint(encoded).astype(np.int64) + clipping
              + _self_mask(state.seed, approval.size, state.digest, state.node)) % MODULUS_RANGE
    s = relay.KeyPair.from_private(state.s_private)
    s_of = state.peer_keys(state.s_keys)
    keys = [_pair_key(s, s_of[v], state.digest, state.node, v, b"pair") for v in neighbourhood]
    signs = np.array([1 if state.node < v else -1 for v in neighbourhood], dtype=np.int64)  # + towards larger ids
    masked = (masked + signs @ _pair_masks(keys, approval.size, state.digest)) % MODULUS_RANGE
    new = dataclasses.replace(state, stage="masked_input", box_keys=b"", share_owners=owners, b_shares=b_shares,
                              s_shares=s_shares)
    receipt = relay.SigningKey.from_private(state.g_private).sign(participation_statement(state.digest))
    return new, message("masked_input", masked=masked.astype("<u4").tobytes(), receipt=receipt)


def _consistency(state: NodeRound, msg: Mapping[str, Any], approval: Approval,
                 vote: VoteFunction) -> tuple[NodeRound, dict[str, Any]]:
    survivors = _ids(msg, "survivors")
    if not set(survivors) <= set(state.nodes) or state.node not in survivors:
        raise _refuse("secagg_unmask", "the survivors are not nodes of the round, or leave this node out")
    receipts = _blobs(msg, "receipts", len(survivors))
    if state.node in consistency_committee(state.graph()):  # a committee member signs only proven survivors
        g_of, proof = state.signing_keys(), participation_statement(state.digest)
        if not all(relay.verify(g_of[v], receipt, proof) for v, receipt in zip(survivors, receipts)):
            raise _refuse("secagg_unmask", "a survivor's receipt does not verify: a node that did not send its "
                          "masked vector in this round was listed as a survivor")
    bound = noise_share_bound(state.graph(), survivors, state.node)
    if bound < approval.survivors:
        raise _refuse("secagg_unmask", f"a sum the server could unmask with this node's vector may hold only "
                      f"{bound} noise shares, fewer than {approval.survivors}")
    signature = relay.SigningKey.from_private(state.g_private).sign(consistency_statement(state.digest, survivors))
    new = dataclasses.replace(state, stage="consistency", survivors=sorted(survivors))
    return new, message("consistency", signature=signature)


def _unmask(state: NodeRound, msg: Mapping[str, Any], approval: Approval,
            vote: VoteFunction) -> tuple[NodeRound, dict[str, Any]]:
    signers = _ids(msg, "signers")
    signatures = _blobs(msg, "signatures", len(signers))
    survivors = set(state.survivors)
    if not set(signers) <= survivors:
        raise _refuse("secagg_unmask", "a consistency signer is not a survivor")
    committee = consistency_committee(state.graph())
    quorum = consistency_quorum(committee)
    from_committee = len(set(signers) & set(committee))
    if from_committee < quorum or len(signers) < state.threshold:
        raise _refuse("secagg_unmask", f"{len(signers)} consistency signatures, {from_committee} of them from the "
                      f"committee: fewer than {state.threshold}, or fewer than {quorum} of the committee")
    g_of = state.signing_keys()
    agreed = consistency_statement(state.digest, state.survivors)
    for signer, signature in zip(signers, signatures):
        if not relay.verify(g_of[signer], signature, agreed):
            raise _refuse("secagg_unmask", "a consistency signature does not verify: nodes were shown different "
                          "rounds or survivors")
    b_owners, b_out, s_owners, s_out = [], [], [], []
    for owner, b_share, s_share in zip(state.share_owners, state.b_shares, state.s_shares):
        if owner in survivors:
            b_owners.append(owner)
            b_out.append(b_share)
        else:
            s_owners.append(owner)
            s_out.append(s_share)
    new = dataclasses.replace(state, stage="unmask", seed=b"", s_private=b"", b_shares=[], s_shares=[],
                              share_owners=[])
    return new, message("unmask", b_owners=b_owners, b_shares=b_out, s_owners=s_owners, s_shares=s_out)


def noise_share_bound(graph: PublicGraph, survivors: Sequence[int], node: int) -> int:
    """The fewest noise shares in any unmaskable sum holding ``node``'s vector: its component (`component_size`)."""
    return component_size(graph, survivors, node)


# ---------------------------------------------------------------------------------------- the server
@dataclass
class SumResult:
    """The exact sum of the survivors' encoded vectors and the survivors.

    Attributes:
        total: The ``(p,)`` int64 sum, on the fixed-point grid of `dphype.secure.secure_sum.fixed_point_scale`.
        survivors: The survivors ``U3``.
    """

    total: np.ndarray
    survivors: list[int]


@dataclass
class ServerRound:
    """The server's side of one round over ``nodes``.

    Each method takes the replies to the last stage (node id -> message; a node whose reply is missing or
    malformed counts as dropped) and returns the next stage's messages. A stage raises
    `dphype.secure.secure_sum.TooFewSurvivorsError` as soon as fewer than ``min_survivors`` nodes remain
    (nothing is unmasked then).

    Attributes:
        nodes: The round's node ids.
        request: The request's digest.
        size: The vector length ``p``.
        min_survivors: The fewest nodes that may remain.
        graph_for: ``graph_for(m)`` gives the degree ``k`` and threshold ``t`` for the ``m`` nodes that advertised
            keys.
        round_id: The round's id.
        keys: Node id -> its three public keys, from ``advertise``.
        neighbours: The degree ``k``.
        threshold: The Shamir threshold ``t``.
        digest: The round digest ``D``.
        graph: The round's public graph, once the keys are known.
        masked: Node id -> its masked vector.
        receipts: Node id -> its participation receipt (`participation_statement`), sent with its vector.
        survivors: The survivor set ``U3``.
        members: Node id -> its roster member name and identity signature of its keys (`advertised_keys`), from
            ``advertise``, relayed in ``share_keys`` (nodes of an unauthenticated federation send none).
    """

    nodes: list[int]
    request: str
    size: int
    min_survivors: int
    graph_for: Callable[[int], tuple[int, int]]
    round_id: bytes = field(default_factory=new_round_id)
    keys: dict[int, tuple[bytes, bytes, bytes]] = field(default_factory=dict)
    neighbours: int = 0
    threshold: int = 0
    digest: bytes = b""
    graph: PublicGraph | None = None
    masked: dict[int, np.ndarray] = field(default_factory=dict)
    receipts: dict[int, bytes] = field(default_factory=dict)
    survivors: list[int] = field(default_factory=list)
    members: dict[int, tuple[str, bytes]] = field(default_factory=dict)

    def _enough(self, count: int, stage: str) -> None:
        if count < self.min_survivors:
            raise TooFewSurvivorsError(
                f"only {count} of {len(self.nodes)} clients completed the {stage} stage, fewer than the "
                f"{self.min_survivors} required: run again\nthe dropout tolerance requires them; nothing was "
                "unmasked or released")

    def advertise(self) -> dict[int, dict[str, Any]]:
        """Stage 0's messages: node id -> its ``advertise`` message."""
        return {n: message("advertise", round=self.round_id, request=self.request) for n in self.nodes}

    def share_keys(self, replies: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
        """The key list (one message for all), the degree and the threshold.

        Args:
            replies: The ``advertise`` replies.

        Returns:
            Node id -> its ``share_keys`` message.

        Raises:
            TooFewSurvivorsError: Fewer than ``min_survivors`` nodes advertised valid keys.
        """  # noqa: DOC502
        for n, reply in replies.items():
            keys = tuple(reply.get(k) for k in ("c_key", "s_key", "g_key"))
            if n in self.nodes and all(isinstance(k, bytes) and len(k) == relay.KEY_BYTES for k in keys):
                self.keys[n] = keys  # type: ignore[assignment]
                member, signature = reply.get("member"), reply.get("identity_signature")
                if isinstance(member, str) and isinstance(signature, bytes):
                    self.members[n] = (member, signature)
        self._enough(len(self.keys), "advertise")
        self.neighbours, self.threshold = self.graph_for(len(self.keys))
        ordered = sorted(self.keys)
        self.digest = round_digest(self.round_id, self.request, self.size, self.neighbours, self.threshold,
                                   self.keys)
        self.graph = public_graph(self.digest, ordered, self.neighbours)
        content = message("share_keys", nodes=ordered, **{name: b"".join(self.keys[n][i] for n in ordered)
                                                          for i, name in enumerate(("c_keys", "s_keys", "g_keys"))},
                          neighbours=self.neighbours, threshold=self.threshold)
        if self.members:  # the nodes check every entry against their roster (a node without a signature: "")
            content.update(members=[self.members.get(n, ("", b""))[0] for n in ordered],
                           identity_signatures=[self.members.get(n, ("", b""))[1] for n in ordered])
        return dict.fromkeys(ordered, content)

    def masked_input(self, replies: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]] | list[int]:
        """Forward every share ciphertext to its receiver, or name the nodes to restart with if some did not share.

        Args:
            replies: The ``share_keys`` replies.

        Returns:
            Node id -> its ``masked_input`` message, or the ids of the nodes to restart with.

        Raises:
            TooFewSurvivorsError: Fewer than ``min_survivors`` nodes shared their keys.
        """  # noqa: DOC502
        assert self.graph is not None
        boxes: dict[int, dict[int, bytes]] = {}
        shared = []
        for n, reply in replies.items():
            receivers, ciphertexts = reply.get("receivers"), reply.get("ciphertexts")
            if (n in self.keys and isinstance(receivers, list) and isinstance(ciphertexts, list)
                    and receivers == list(self.graph.neighbourhood(n)) and len(ciphertexts) == len(receivers)
                    and all(isinstance(c, bytes) for c in ciphertexts)):
                shared.append(n)
                for receiver, ciphertext in zip(receivers, ciphertexts):
                    boxes.setdefault(receiver, {})[n] = ciphertext
        self._enough(len(shared), "share-keys")
        if len(shared) < len(self.keys):
            return sorted(shared)
        out = {}
        for n in sorted(shared):
            box = boxes.get(n, {})
            out[n] = message("masked_input", senders=sorted(box), ciphertexts=[box[s] for s in sorted(box)])
        return out

    def consistency(self, replies: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
        """Collect the masked vectors; announce the survivors ``U3``.

        Args:
            replies: The ``masked_input`` replies.

        Returns:
            Node id -> its ``consistency`` message.

        Raises:
            TooFewSurvivorsError: Fewer than ``min_survivors`` nodes sent a valid masked vector.
        """  # noqa: DOC502
        for n, reply in replies.items():
            masked, receipt = reply.get("masked"), reply.get("receipt")
            if (n in self.keys and isinstance(masked, bytes) and len(masked) == 4 * self.size
                    and isinstance(receipt, bytes)):
                self.masked[n] = np.frombuffer(masked, dtype="<u4").astype(np.int64)
                self.receipts[n] = receipt
        self.survivors = sorted(self.masked)
        self._enough(len(self.survivors), "masked-input")
        return dict.fromkeys(self.survivors, message("consistency", survivors=self.survivors,
                                                     receipts=[self.receipts[n] for n in self.survivors]))

    def unmask(self, replies: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
        """Forward a quorum of consistency signatures to every signer: a committee majority, topped up to ``t``.

        Args:
            replies: The ``consistency`` replies (the signatures).

        Returns:
            Node id -> its ``unmask`` message.

        Raises:
            SecureSumError: Too few nodes, or too few of the committee, signed the survivor set.
        """
        assert self.graph is not None
        signed = {n: r["signature"] for n, r in replies.items()
                  if n in self.masked and isinstance(r.get("signature"), bytes)}
        committee = consistency_committee(self.graph)
        quorum = consistency_quorum(committee)
        signers = [n for n in committee if n in signed][:quorum]
        signers += [n for n in sorted(signed) if n not in signers][:max(0, self.threshold - len(signers))]
        if len(signers) < quorum or len(signers) < self.threshold or len(set(signers) & set(committee)) < quorum:
            raise SecureSumError(f"only {len(signed)} clients signed the survivor set, "
                                 f"{len(set(signed) & set(committee))} of the committee of {len(committee)}: fewer "
                                 "than the quorum\nnothing was unmasked or released")
        signers.sort()
        content = message("unmask", signers=signers, signatures=[signed[n] for n in signers])
        return dict.fromkeys(sorted(signed), content)

    def finish(self, replies: Mapping[int, Mapping[str, Any]]) -> SumResult:
        """Reconstruct the secrets from the unmask replies and return the exact sum over ``U3``.

        Args:
            replies: The ``unmask`` replies (the shares).

        Returns:
            The exact sum and the survivors.

        Raises:
            SecureSumError: The sum could not be unmasked; nothing was released.
        """
        assert self.graph is not None
        shares: dict[str, dict[int, list[bytes]]] = {"b": {}, "s": {}}
        for reply in replies.values():
            for kind in ("b", "s"):
                owners, values = reply.get(f"{kind}_owners"), reply.get(f"{kind}_shares")
                if not (isinstance(owners, list) and isinstance(values, list) and len(owners) == len(values)):
                    continue
                for owner, value in zip(owners, values):
                    if isinstance(owner, int) and isinstance(value, bytes):
                        shares[kind].setdefault(owner, []).append(value)
        t, size, survivors = self.threshold, self.size, set(self.survivors)
        try:
            seeds = combine_shares_of([shares["b"].get(n, []) for n in self.survivors], t)
            # entries below 2^32: int64 sums of fewer than 2^31 vectors are exact
            total = (np.sum([self.masked[n] for n in self.survivors], axis=0)
                     - np.sum([_self_mask(seed, size, self.digest, n) for seed, n in zip(seeds, self.survivors)],
                              axis=0)) % MODULUS_RANGE
            dropped = {w: live for w in sorted(set(self.keys) - survivors)
                       if (live := [x for x in self.graph.neighbourhood(w) if x in survivors])}
            secrets = combine_shares_of([shares["s"].get(w, []) for w in dropped], t)
            for (w, live), secret in zip(dropped.items(), secrets, strict=True):
                s_w = relay.KeyPair.from_private(secret)
                masks = _pair_masks([_pair_key(s_w, self.keys[x][1], self.digest, w, x, b"pair") for x in live], size,
                                    self.digest)
                signs = np.array([-1 if x < w else 1 for x in live], dtype=np.int64)  # undo x's +-mask
                total = (total + signs @ masks) % MODULUS_RANGE
        except (ValueError, relay.RelayError) as err:
            raise SecureSumError(f"the sum could not be unmasked ({err}); nothing was released") from None
        # every encoded entry was shifted by C into [0, 2C], and |U1| 2C < M: the residue is the exact sum
        return SumResult(total - len(self.survivors) * clipping_range_for(len(self.keys)), list(self.survivors))


#: Restarts after nodes fail between ``advertise`` and ``share_keys`` (`ServerRound.masked_input`).
MAX_RESTARTS: int = 3

#: The transport: deliver each node its message of one stage and return the replies that came back
#: (node id -> message); a node that fails or does not answer is simply missing.
Send = Callable[[str, dict[int, dict[str, Any]]], dict[int, dict[str, Any]]]


def run_round(nodes: Sequence[int], send: Send, *, request: str, size: int, min_survivors: int,
              graph_for: Callable[[int], tuple[int, int]], timings: dict[str, float] | None = None,
              advertised: Advertised | None = None) -> tuple[SumResult, ServerRound]:
    """The server's whole round over ``nodes`` through ``send``.

    Restarts at most `MAX_RESTARTS` times when nodes fail before sharing their keys.

    Args:
        nodes: The round's node ids.
        send: Sends one stage's messages (stage name, node id -> message) and returns the replies.
        request: The request's digest.
        size: The vector length ``p``.
        min_survivors: The fewest nodes that may remain.
        graph_for: The degree ``k`` and threshold ``t`` for ``m`` nodes.
        timings: If given, receives the seconds each stage took (nodes' work and transport included).
        advertised: The first ``advertise`` stage, when it already ran inside the pre-flight: the round starts
            with ``share_keys`` over its replies (a restart sends ``advertise`` as usual).

    Returns:
        The exact sum and the final round.

    Raises:
        TooFewSurvivorsError: Too few nodes remain, or they kept failing before sharing their keys.
        SecureSumError: Too few signatures, or the sum could not be unmasked.
    """  # noqa: DOC502, DOC503
    participants = sorted(nodes)
    clock = timings if timings is not None else {}

    def stage(name: str, messages: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        start = time.perf_counter()
        replies = send(name, messages)
        clock[name] = clock.get(name, 0.0) + time.perf_counter() - start
        return replies

    for attempt in range(MAX_RESTARTS + 1):
        if attempt == 0 and advertised is not None:
            server = ServerRound(participants, request, size, min_survivors, graph_for, advertised.round_id)
            keys: Mapping[int, Mapping[str, Any]] = advertised.replies
        else:
            server = ServerRound(participants, request, size, min_survivors, graph_for)
            keys = stage("advertise", server.advertise())
        replies = stage("share_keys", server.share_keys(keys))
        forward = server.masked_input(replies)
        if isinstance(forward, list):
            participants = forward
            continue
        signed = stage("consistency", server.consistency(stage("masked_input", forward)))
        replies = stage("unmask", server.unmask(signed))
        start = time.perf_counter()
        result = server.finish(replies)
        clock["finish"] = time.perf_counter() - start
        return result, server
    raise TooFewSurvivorsError(f"clients kept failing before sharing their keys ({MAX_RESTARTS} restarts); "
                               "nothing was unmasked or released")
