"""A client's checks of the SecAgg+ parameters a server sends, before anything secret leaves the client.

Flower 1.41's ``secaggplus_mod`` (``flwr/client/mod/secure_aggregation/secaggplus_mod.py``) runs four
stages and checks little of what the server sends; these pure functions check it, one per stage, and
raise :class:`~dphype.protocol.Refusal` (:func:`dphype.flower.secagg.check_stage` calls them on every stage
message before the SecAgg+ client answers it, so a refusal sends nothing of that stage):

* stage 0, ``setup`` (:func:`check_setup`): ``sample_num``, ``share_num``, ``threshold`` and the encoding
  (``clipping_range``, ``target_range``, ``mod_range``, ``max_weight``). The client answers with public
  keys only.
* stage 1, ``share_keys`` (:func:`check_neighbours`): the neighbours' public keys. The client answers with
  Shamir shares of its self-mask seed ``b_u`` and its mask key ``sk1_u``, encrypted to each neighbour.
* stage 2, ``collect_masked_vectors`` (:func:`check_share_sources`): who sent this client shares. The
  client answers with its masked noisy vote ``y_u = x_u + PRG(b_u) + sum_v +-PRG(s_uv)``.
* stage 3, ``unmask`` (:func:`check_unmask`): the active and dead lists. The client answers with its
  share of ``b_v`` for every active ``v`` and of ``sk1_v`` for every dead ``v``.

**Why ``2 t > s``.** Each of a client's two secrets is split ``t``-out-of-``s`` (Shamir 1979) among its
``s`` share holders (its neighbours and itself). ``b_u`` removes the self-mask, ``sk1_u`` all pairwise
masks of ``u``; with both the server unmasks ``y_u`` alone. An honest holder reveals, per client, the
share of ``b_u`` if told ``u`` is active and of ``sk1_u`` if told it is dead, never both (the lists must
not overlap; Flower refuses a second unmask request without a new setup, which draws new secrets). A
server that tells ``a`` holders "active" and ``s - a`` holders "dead" needs ``a >= t`` and
``s - a >= t``, possible iff ``2 t <= s``. So a client requires ``2 <= t`` and ``2 t > s``. (One kind of
share per client is the rule of Bonawitz et al., CCS 2017, and of Bell et al., CCS 2020; with ``c``
holders colluding with the server, who reveal both kinds, the condition becomes ``2 t > s + c``, see
:mod:`dphype.secure.secagg_params`.) A threshold of 1, or a single holder, hands the server ``b_u`` and
``sk1_u`` at once: the attack of issue 8.

**What the active count buys.** If every honest holder's active list has at least ``L`` entries and all
of a client's ``s`` holders also hold the secrets of its neighbours (the complete graph), any sum the
server can unmask that contains ``y_u`` contains ``|A| >= s (L - s + t) / t`` vectors: each of the ``s``
lists has ``>= L`` active entries, a vector in the sum is active in any number of them, one outside it
in at most ``s - t`` (its key must come from ``t`` "dead" answers), so ``s L <= |A| s + (s - |A|)(s - t)``.
With ``L = s`` (``xi = 0``: :func:`check_unmask` then requires every holder active) that is all ``s``.
In a sparse graph the holders differ and no such bound holds locally; see the threat model in
:mod:`dphype.node.policy`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields
from numbers import Integral, Real
from typing import Any

from dphype.checks import MAX_CLIENTS
from dphype.privacy.noise import min_survivors
from dphype.protocol import Refusal
from dphype.secure.secagg_params import check_share_threshold
from dphype.secure.secure_sum import MAX_WEIGHT, MODULUS_RANGE, check_ranges, clipping_range_for


@dataclass(frozen=True)
class SecAggSetup:
    """The stage-0 values, under Flower's config keys (``flwr.common.secure_aggregation.secaggplus_constants.Key``).

    ``sample_num``: clients sampled; ``share_num``: share holders ``s`` of each secret (neighbours plus the
    client itself); ``threshold``: ``t``; the rest is the encoding of the vector.
    """

    sample_num: int
    share_num: int
    threshold: int
    clipping_range: float
    target_range: int
    mod_range: int
    max_weight: float

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> SecAggSetup:
        """Pick the fields from a stage-0 config record; a missing or non-numeric value is refused."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = config.get(f.name)
            kind = Integral if f.type == "int" else Real
            if isinstance(value, bool) or not isinstance(value, kind):
                raise Refusal("secagg_setup", f"stage 0 has no valid {f.name}")
            values[f.name] = value
        return cls(**values)


def dphype_encoding(clients: int) -> dict[str, float]:
    """The stage-0 ranges DP-Hype's exact integer sum uses for ``clients`` (quantizer exactly 1, no wrap;
    :func:`dphype.secure.secure_sum.clipping_range_for`)."""
    c = clipping_range_for(clients)
    return {"clipping_range": float(c), "target_range": 2 * c, "mod_range": MODULUS_RANGE, "max_weight": MAX_WEIGHT}


def check_setup(setup: SecAggSetup, *, clients: int | None = None, dropout: float = 0.0) -> None:
    """Stage 0: DP-Hype's exact-sum encoding for ``sample_num`` clients, the round's size and the threshold.

    The round runs over the clients that answered ready in the pre-flight, so with the announced ``n``
    (``clients``, when known) and ``xi`` its ``sample_num`` lies in ``[ceil((1 - xi) n), n]``: more clients
    than announced, or fewer than a release needs, are refused. The ranges must be the exact-sum ones
    for ``sample_num`` (:func:`dphype.secure.secure_sum.check_ranges`), and ``share_num`` and ``threshold`` must
    keep ``2 t > s`` (:func:`dphype.secure.secagg_params.check_share_threshold`, module docstring).
    """
    m, s, t = setup.sample_num, setup.share_num, setup.threshold
    if not 2 <= m <= MAX_CLIENTS:
        raise Refusal("secagg_setup", f"sample_num={m} is outside [2, {MAX_CLIENTS}]")
    if clients is not None:
        _check_round_size(m, clients, dropout, "secagg_setup")
    try:
        check_ranges(clients=m, clipping_range=setup.clipping_range, quantization_range=setup.target_range,
                     modulus_range=setup.mod_range)
    except ValueError as err:
        raise Refusal("secagg_setup", f"not DP-Hype's exact-sum encoding: {err}") from None
    if setup.max_weight != MAX_WEIGHT:
        raise Refusal("secagg_setup", "max_weight is not DP-Hype's exact-sum encoding")
    try:
        check_share_threshold(m, s, t)
    except ValueError as err:
        raise Refusal("secagg_setup", str(err)) from None


def _check_round_size(sample_num: int, clients: int, dropout: float, code: str) -> None:
    """Refuse a round of ``sample_num`` clients outside ``[ceil((1 - xi) n), n]``."""
    low = min_survivors(clients, dropout)
    if not low <= sample_num <= clients:
        raise Refusal(code, f"sample_num={sample_num} is outside [{low}, {clients}] for the announced {clients} "
                      f"clients (dropout {dropout:g})")


def check_neighbours(
    setup: SecAggSetup,
    node_id: int,
    public_keys: Mapping[int, tuple[bytes, bytes]],
    *,
    clients: int,
    dropout: float,
    min_neighbours: int,
) -> None:
    """Stage 1: the neighbour keys (node id -> ``(pk1, pk2)``, this node included) before shares are sent.

    Refuses keys that repeat or are empty, a list without this node, more holders than ``share_num`` or
    fewer than ``threshold``, fewer than ``min_neighbours`` other nodes, a ``sample_num`` outside
    ``[ceil((1 - xi) n), n]`` for the announced ``clients``, and fewer holders than the round implies:
    Flower's graph gives each of the ``m = sample_num`` clients ``min(share_num, m)`` holders, of which at
    most ``m - ceil((1 - xi) n)`` may have dropped (more and the vote could not be released anyway). A
    claim of many clients next to a handful of keys fails here; a server that forges keys (Sybils) does
    not (threat model, :mod:`dphype.node.policy`).
    """
    holders = len(public_keys)
    if node_id not in public_keys:
        raise Refusal("secagg_neighbours", "this node's own keys are missing from the neighbour list")
    keys = [key for pair in public_keys.values() for key in pair]
    if any(not isinstance(key, bytes) or not key for key in keys) or len(set(keys)) != len(keys):
        raise Refusal("secagg_neighbours", "neighbour public keys are empty or repeated")
    m = setup.sample_num
    _check_round_size(m, clients, dropout, "secagg_neighbours")
    tolerated_losses = m - min_survivors(clients, dropout)
    lowest = max(setup.threshold, min_neighbours + 1, min(setup.share_num, m) - tolerated_losses)
    if not lowest <= holders <= setup.share_num:
        raise Refusal("secagg_neighbours", f"{holders - 1} neighbours in a round of {m} for {clients} announced "
                      f"clients (dropout {dropout:g}, share_num={setup.share_num}, threshold={setup.threshold})")


def check_share_sources(node_id: int, sources: Collection[int], neighbours: Collection[int], *, threshold: int) -> None:
    """Stage 2: the nodes whose encrypted shares reached this node must be distinct neighbours other than
    itself, and with its own share at least ``threshold`` (else no secret could be reconstructed)."""
    listed = list(sources)
    if len(set(listed)) != len(listed) or node_id in listed or not set(listed) <= set(neighbours):
        raise Refusal("secagg_neighbours", "share sources repeat, include this node or are not its neighbours")
    if len(listed) + 1 < threshold:
        raise Refusal("secagg_neighbours", f"{len(listed)} share sources, fewer than threshold - 1 = {threshold - 1}")


def check_unmask(
    node_id: int,
    active: Collection[int],
    dead: Collection[int],
    share_owners: Collection[int],
    *,
    threshold: int,
    clients: int,
    dropout: float,
    sample_num: int | None = None,
) -> None:
    """Stage 3: what the server may learn from this node's shares.

    ``share_owners`` are the nodes whose shares this node holds (itself and its stage-2 sources). Refuses
    repeated ids, active and dead lists that overlap (that would hand out both kinds of shares of one
    node), ids this node holds no share of, this node called dead (it sent its masked vector), fewer than
    ``threshold`` active, and fewer active than the survivor rule leaves here: at least
    ``ceil((1 - xi) n)`` clients must survive for a release, and at most ``m - |share_owners|`` of them
    are outside this node's holders, ``m`` the round's ``sample_num`` (default: the announced ``n``).
    """
    active_ids, dead_ids, owners = list(active), list(dead), set(share_owners)
    if len(set(active_ids)) != len(active_ids) or len(set(dead_ids)) != len(dead_ids):
        raise Refusal("secagg_unmask", "the active or dead list repeats a node")
    if set(active_ids) & set(dead_ids):
        raise Refusal("secagg_unmask", "a node is listed both active and dead")
    if not set(active_ids) | set(dead_ids) <= owners:
        raise Refusal("secagg_unmask", "the lists name nodes this node holds no shares of")
    if node_id in dead_ids:
        raise Refusal("secagg_unmask", "this node is listed dead although it sent its masked vector")
    round_size = clients if sample_num is None else sample_num
    needed = max(threshold, min_survivors(clients, dropout) - (round_size - len(owners)))
    if len(active_ids) < needed:
        raise Refusal("secagg_unmask", f"{len(active_ids)} active nodes listed, fewer than {needed}")
