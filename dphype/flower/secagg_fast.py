"""Flower 1.41's SecAgg+ with the costs that grew faster than the protocol removed (same messages, same crypto).

Profiling a voting round in process (``simulations/secagg_profile.py``; README "Where a secure vote's
time goes") showed that Shamir sharing and reconstruction took most of it: PyCryptodome's pure-Python
GF(2^128) arithmetic, and Flower's server interpolating every share it received instead of ``t``. This
module keeps Flower's protocol, message layout, key agreement (ECDH on P-384 + HKDF), Fernet
encryption and mask generator, and changes only how the work is done:

* :func:`scalable_secaggplus_mod` (client, replaces ``secaggplus_mod``): shares its two secrets with
  :func:`dphype.secure.shamir.create_shares_of` (byte-compatible with Flower's shares), parses each of its
  own private keys once per stage instead of once per neighbour, and **refuses** (raises, so the
  client counts as dropped out) a value outside the clipping range instead of letting Flower's
  quantizer clip it silently.
* :class:`ScalableSecAggPlusWorkflow` (server, replaces ``SecAggPlusWorkflow.unmask_stage``):
  reconstructs each secret from exactly ``t`` shares, lowest share indices first so that clients
  share Lagrange coefficients (:func:`dphype.secure.shamir.combine_shares`), and removes a dropped client's
  pairwise masks only with the neighbours whose masked vectors are in the sum -- the masks that are
  actually there. (Flower also cancels masks with neighbours that dropped, which takes extra key
  agreements and fails with a ``KeyError`` for a neighbour lost before sending its keys.)

Either side works with Flower's stock other side. Messages, state records and the other three server
stages are Flower's own (``SecAggPlusState``, ``check_stage``, ``check_configs``, ``_setup``,
``_unmask`` are reused from ``flwr.client.mod.secure_aggregation.secaggplus_mod``, pinned to flwr 1.41).
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import cast

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import (
    NDArrays,
    Parameters,
    log,
    ndarray_to_bytes,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.crypto.symmetric_encryption import (
    decrypt,
    encrypt,
    generate_shared_key,
)
from flwr.common.secure_aggregation.ndarrays_arithmetic import (
    factor_combine,
    factor_extract,
    get_parameters_shape,
    parameters_addition,
    parameters_mod,
    parameters_multiply,
    parameters_subtraction,
)
from flwr.common.secure_aggregation.quantization import dequantize, quantize
from flwr.common.secure_aggregation.secaggplus_constants import (
    RECORD_KEY_CONFIGS,
    RECORD_KEY_STATE,
    Key,
    Stage,
)
from flwr.common.secure_aggregation.secaggplus_utils import (
    pseudo_rand_gen,
    share_keys_plaintext_concat,
    share_keys_plaintext_separate,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import (
    SecAggPlusWorkflow,
    WorkflowState,
)
from flwr.serverapp.grid import Grid
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
)

from dphype.secure.shamir import combine_shares, create_shares_of

# ``flwr.client.mod.secure_aggregation`` re-exports a function under the module's own name, so the
# module's other helpers are reached through ``sys.modules``.
_flower_mod = importlib.import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")


def _share_keys(state: SecAggPlusState, configs: ConfigRecord) -> dict:
    """Stage 1: Flower's checks, then both secrets shared in one pass and one parse of ``sk2``."""
    state.public_keys_dict = {
        int(nid): (cast(list[bytes], keys)[0], cast(list[bytes], keys)[1]) for nid, keys in configs.items()
    }
    if len(state.public_keys_dict) < state.threshold:
        raise ValueError("Available neighbours number smaller than threshold")
    public_keys = [key for pair in state.public_keys_dict.values() for key in pair]
    if len(set(public_keys)) != len(public_keys):
        raise ValueError("Some public keys are identical")
    if state.public_keys_dict.get(state.nid) != (state.pk1, state.pk2):
        raise ValueError("Own public keys are displayed in dict incorrectly, should not happen!")
    state.rd_seed = os.urandom(32)
    seed_shares, sk1_shares = create_shares_of([state.rd_seed, state.sk1], state.threshold, state.share_num)
    sk2 = bytes_to_private_key(state.sk2)
    destinations, ciphertexts = [], []
    for idx, (nid, (_, pk2)) in enumerate(state.public_keys_dict.items()):
        if nid == state.nid:
            state.rd_seed_share_dict[nid] = seed_shares[idx]
            state.sk1_share_dict[nid] = sk1_shares[idx]
            continue
        key = generate_shared_key(sk2, bytes_to_public_key(pk2))
        state.ss2_dict[nid] = key
        destinations.append(nid)
        ciphertexts.append(encrypt(key, share_keys_plaintext_concat(state.nid, nid, seed_shares[idx], sk1_shares[idx])))
    return {Key.DESTINATION_LIST: destinations, Key.CIPHERTEXT_LIST: ciphertexts}


def _collect_masked_vectors(
    state: SecAggPlusState, configs: ConfigRecord, num_examples: int, parameters: Parameters
) -> dict:
    """Stage 2: store the neighbours' shares, quantize (refusing what would be clipped) and mask."""
    ciphertexts = cast(list[bytes], configs[Key.CIPHERTEXT_LIST])
    sources = cast(list[int], configs[Key.SOURCE_LIST])
    if len(ciphertexts) + 1 < state.threshold:
        raise ValueError("Not enough available neighbour clients.")
    for src, ciphertext in zip(sources, ciphertexts, strict=True):
        actual_src, dst, seed_share, sk1_share = share_keys_plaintext_separate(decrypt(state.ss2_dict[src], ciphertext))
        if actual_src != src or dst != state.nid:
            raise ValueError(f"Node {state.nid}: received a key share from {actual_src} for {dst} sent as from {src}")
        state.rd_seed_share_dict[src] = seed_share
        state.sk1_share_dict[src] = sk1_share
    q_ratio = round(num_examples / state.max_weight * state.target_range)
    arrays = parameters_multiply(parameters_to_ndarrays(parameters), q_ratio / state.target_range)
    if any(np.any(np.abs(a) > state.clipping_range) for a in arrays):
        raise ValueError(
            f"a value lies outside the SecAgg+ clipping range +-{state.clipping_range:g}; refusing to send it "
            "(Flower would clip it silently)"
        )
    vector = factor_combine(q_ratio, quantize(arrays, state.clipping_range, state.target_range))
    shapes = [a.shape for a in vector]
    vector = parameters_addition(vector, pseudo_rand_gen(state.rd_seed, state.mod_range, shapes))
    sk1 = bytes_to_private_key(state.sk1)
    for nid in sources:
        mask = pseudo_rand_gen(
            generate_shared_key(sk1, bytes_to_public_key(state.public_keys_dict[nid][0])), state.mod_range, shapes
        )
        vector = parameters_addition(vector, mask) if state.nid > nid else parameters_subtraction(vector, mask)
    return {Key.MASKED_PARAMETERS: [ndarray_to_bytes(a) for a in parameters_mod(vector, state.mod_range)]}


def scalable_secaggplus_mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
    """Client side of SecAgg+: Flower's ``secaggplus_mod`` with stages 1 and 2 done by the functions above."""
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, ctxt)
    if RECORD_KEY_STATE not in ctxt.state.config_records:
        ctxt.state.config_records[RECORD_KEY_STATE] = ConfigRecord({})
    state = SecAggPlusState(**ctxt.state.config_records[RECORD_KEY_STATE])
    configs = msg.content.config_records[RECORD_KEY_CONFIGS]
    _flower_mod.check_stage(state.current_stage, configs)
    state.current_stage = cast(str, configs.pop(Key.STAGE))
    _flower_mod.check_configs(state.current_stage, configs)
    content = RecordDict()
    if state.current_stage == Stage.SETUP:
        state.nid = msg.metadata.dst_node_id
        result = _flower_mod._setup(state, configs)
    elif state.current_stage == Stage.SHARE_KEYS:
        result = _share_keys(state, configs)
    elif state.current_stage == Stage.COLLECT_MASKED_VECTORS:
        content = call_next(msg, ctxt).content
        fitres = compat.recorddict_to_fitres(content, keep_input=True)
        result = _collect_masked_vectors(state, configs, fitres.num_examples, fitres.parameters)
        for record in content.array_records.values():
            record.clear()
    else:
        result = _flower_mod._unmask(state, configs)
    ctxt.state.config_records[RECORD_KEY_STATE] = ConfigRecord(state.to_dict())
    content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord(result, False)
    return Message(content, reply_to=msg)


def _lowest_indices_first(shares: list[bytes]) -> list[bytes]:
    """Shares sorted by their index (first 4 bytes, little-endian): equal index sets reuse Lagrange coefficients."""
    return sorted(shares, key=lambda share: int.from_bytes(share[:4], "little"))


class ScalableSecAggPlusWorkflow(SecAggPlusWorkflow):
    """Flower's ``SecAggPlusWorkflow`` with a reconstruction from ``t`` shares and pruned mask removal."""

    def unmask_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        """Stage 3: ask the survivors for key shares, rebuild the secrets, remove the masks, aggregate."""
        cfg = context.state.config_records[MAIN_CONFIGS_RECORD]
        current_round = cast(int, cfg[WorkflowKey.CURRENT_ROUND])
        summed = set(state.active_node_ids)  # clients whose masked vectors are in the sum
        dropped = state.sampled_node_ids - summed

        def request(nid: int) -> Message:
            neighbours = state.nid_to_neighbours[nid]
            config = ConfigRecord({
                Key.STAGE: Stage.UNMASK,
                Key.ACTIVE_NODE_ID_LIST: list(neighbours & summed),
                Key.DEAD_NODE_ID_LIST: list(neighbours & dropped),
            })
            return Message(RecordDict({RECORD_KEY_CONFIGS: config}), dst_node_id=nid,
                           message_type=MessageType.TRAIN, group_id=str(current_round))

        replies = grid.send_and_receive([request(nid) for nid in summed], timeout=self.timeout)
        state.active_node_ids = {m.metadata.src_node_id for m in replies if not m.has_error()}
        shares: dict[int, list[bytes]] = {nid: [] for nid in state.sampled_node_ids}
        for reply in replies:
            if reply.has_error():
                state.failures.append(Exception(reply.error))
                continue
            record = reply.content.config_records[RECORD_KEY_CONFIGS]
            for owner, share in zip(cast(list[int], record[Key.NODE_ID_LIST]),
                                    cast(list[bytes], record[Key.SHARE_LIST]), strict=True):
                shares[owner].append(share)

        vector = state.aggregate_ndarrays
        shapes = get_parameters_shape(vector)
        for nid, owned in shares.items():
            if len(owned) < state.threshold:
                log(logging.ERROR, "Not enough shares to recover secret in unmask vectors stage")
                return False
            secret = combine_shares(_lowest_indices_first(owned), state.threshold)
            if nid in summed:
                vector = parameters_subtraction(vector, pseudo_rand_gen(secret, state.mod_range, shapes))
                continue
            sk1 = bytes_to_private_key(secret)
            for neighbour in state.nid_to_neighbours[nid] & summed:
                key = generate_shared_key(sk1, bytes_to_public_key(state.nid_to_publickeys[neighbour][0]))
                mask = pseudo_rand_gen(key, state.mod_range, shapes)
                # the surviving neighbour added the mask if its ID is larger, subtracted it otherwise
                vector = parameters_addition(vector, mask) if nid > neighbour else parameters_subtraction(vector, mask)
        self._aggregate(context, state, current_round, parameters_mod(vector, state.mod_range), len(summed))
        return True

    @staticmethod
    def _aggregate(context: LegacyContext, state: WorkflowState, current_round: int, vector: NDArrays,
                   summed: int) -> None:
        """Flower's tail of stage 3: dequantize the weighted sum into the mean and call ``aggregate_fit``."""
        total_weight, quantized = factor_extract(vector)
        mean = dequantize(quantized, state.clipping_range, state.quantization_range)
        for array in mean:
            array += -(summed - 1) * state.clipping_range
            array *= state.quantization_range / total_weight
        parameters = ndarrays_to_parameters(mean)
        for _, fitres in state.legacy_results:
            fitres.parameters = parameters
        log(logging.INFO, "aggregate_fit: received %s results and %s failures",
            len(state.legacy_results), len(state.failures))
        aggregated, metrics = context.strategy.aggregate_fit(current_round, state.legacy_results,
                                                             state.failures)  # type: ignore[arg-type]
        if aggregated:
            context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(aggregated, True)
            context.history.add_metrics_distributed_fit(server_round=current_round, metrics=metrics)
