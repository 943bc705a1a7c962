"""The private evaluation on a client: its held-out accuracy and majority-class baseline, noisy, over SecAgg+.

`register_private_evaluation` adds two handlers to a Message-API ``ClientApp`` under DP-Hype's evaluation action
(`dphype.flower.wire.EVALUATION_ACTION`), so they never see the user's own messages:

* ``query.dphype_evaluation`` (pre-flight): parse the `dphype.node.evaluation_policy.EvaluationRequest`, check that
  the model it carries is the one the request names, check the request against this node's own policy
  (`dphype.node.evaluation_policy.check_evaluation_request`) and lifetime budget (`dphype.node.ledger.Ledger.check`),
  then evaluate the model with the user's function on the node's held-out rows and keep the two values on the grid
  (`dphype.privacy.evaluation.quantize`: refused, never clipped, outside ``[0, 1]``). It answers ``ready`` with its
  keys for the SecAgg+ round's first stage (bound to the approved request), or a sanitized refusal;
* ``train.dphype_evaluation`` (the SecAgg+ stages, `dphype.flower.client.secagg_client.secure_vote_reply`): in the
  masked-input stage, after every check of the round, the values get a fresh noise share from the secure generator,
  the guarantee (the pre-flight's, or checked again if the policy changed) is recorded in the ledger
  (`dphype.node.ledger.Ledger.spend`, an ``evaluation`` entry) and remembered beside it
  (`dphype.node.vote_memory.VoteMemory`), and only then are they masked and sent. One pre-flight, one sending, one
  evaluation per request and run: a request this node evaluated in this run is refused (``already_voted``), in the
  pre-flight before it evaluates anything, so a server cannot re-run it to average the noise away.

The approval helpers are the vote's (`dphype.flower.client.policy_client`): the same policy sources, the same
sanitized refusals, the roster bound to the approval.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from dphype.flower.client.policy_client import (
    PolicySource,
    announce_simulated,
    approved_membership,
    check_registration,
    describe_federation,
    policy_fingerprint,
    refused,
    released_once,
    resolve_policy,
    roster_digest,
    sanitized,
    voted_before,
)
from dphype.flower.client.secagg_client import abort_round, round_in_progress, secure_vote_reply, stage_reply
from dphype.flower.wire import EVALUATION_ACTION, EVALUATION_STATE, MODEL_KEY, RECORD_KEY, STAGE_KEY
from dphype.node.evaluation_policy import (
    EvaluationGuarantee,
    EvaluationRequest,
    check_evaluation_request,
    model_digest,
)
from dphype.node.ledger import Ledger
from dphype.node.policy import NodePolicy
from dphype.privacy.evaluation import EVALUATION_VALUES, quantize
from dphype.privacy.noise import client_noise_share
from dphype.refusal import Refusal
from dphype.secure.roster import Membership
from dphype.secure.secagg import Approval
from dphype.secure.secure_sum import encode

#: What the user gives: ``evaluate(context, arrays)`` -> ``(accuracy, majority_baseline)`` of the model in ``arrays``
#: on this node's held-out rows, each in ``[0, 1]``.
EvaluateFunction = Callable[[Context, ArrayRecord], Sequence[float]]


def register_private_evaluation(app: ClientApp, evaluate_fn: EvaluateFunction, *,
                                policy: PolicySource = None) -> ClientApp:
    """Let ``app`` take part in the private evaluation of the final model with ``evaluate_fn``.

    Args:
        app: The ClientApp (it may already have DP-Hype's vote handlers, `dphype.flower.register_dphype`).
        evaluate_fn: ``evaluate_fn(context, arrays)``: the accuracy of the model in ``arrays`` on this node's held-out
            rows and the majority-class baseline on the same rows (the share of their most frequent class), each in
            ``[0, 1]``.
        policy: This node's policy, as for `dphype.flower.register_dphype` (``None``: the operator's).

    Returns:
        ``app``, with the evaluation's pre-flight and SecAgg+ handlers added.

    Raises:
        ValueError: If ``app`` is not a ClientApp, ``evaluate_fn`` is not callable or ``policy`` is no policy source.
    """
    check_registration(app, policy)
    if not callable(evaluate_fn):
        raise ValueError(f"evaluate_fn must be a function (context, arrays) -> (accuracy, majority_baseline), got "
                         f"{type(evaluate_fn).__name__}")

    @app.query(EVALUATION_ACTION)
    def evaluation_preflight(msg: Message, context: Context) -> Message:
        try:
            if round_in_progress(context):
                raise Refusal("secagg_round", "an evaluation pre-flight arrived during a SecAgg+ round; the round was "
                              "aborted")
            limits = resolve_policy(policy, context)
            announce_simulated(limits, context.run_id)
            request = EvaluationRequest.from_record(msg.content.config_records.get(RECORD_KEY, {}))
            model = msg.content.array_records.get(MODEL_KEY)
            if model is None or model_digest(model.to_numpy_ndarrays()) != request.model:
                raise Refusal("malformed_request", "the evaluation request names another model than the one sent")
            advertise = msg.content.config_records.get(STAGE_KEY)
            if advertise is None:
                raise Refusal("secagg_round", "refusing an evaluation outside the secure sum: the values would reach "
                              "the server in plaintext")
            voted_before(context, request, limits)  # evaluated in this run already: refused (already_voted)
            membership = limits.membership()
            guarantee = check_evaluation_request(request, limits)
            Ledger(cast(Path, limits.ledger)).check(guarantee, limits)
            try:
                values = quantize(evaluate_fn(context, model), request.config.noise)
            except Exception as err:  # noqa: BLE001 - the user's function failed or returned values out of range
                raise Refusal("task_error", "the node's evaluation failed or returned values outside [0, 1]",
                              local=f"{type(err).__name__}: {err}") from err
            abort_round(context)
            context.state.config_records[EVALUATION_STATE] = ConfigRecord({
                "request": json.dumps(request.to_record()), "values": [float(v) for v in values],
                "guarantee": json.dumps(dataclasses.asdict(guarantee)), "policy": policy_fingerprint(limits),
                "roster": roster_digest(membership)})
            stage = stage_reply(advertise, context, _approval(request, limits, context, membership), _no_values)
        except Exception as err:  # noqa: BLE001 - every failure is answered as a sanitized refusal
            _forget(context)
            return refused(msg, sanitized("evaluation", err))
        answer = RecordDict({RECORD_KEY: ConfigRecord({"status": "ready", "ledger": limits.ledger_scope,
                                                       "federation": describe_federation(membership)}),
                             STAGE_KEY: stage})
        return Message(answer, reply_to=msg)

    @app.train(EVALUATION_ACTION)
    def evaluation_stage(msg: Message, context: Context) -> Message:
        try:
            limits = resolve_policy(policy, context)
            stored = context.state.config_records.get(EVALUATION_STATE)
            if stored is None:
                raise Refusal("malformed_request", "no evaluation request was approved in a pre-flight")
            request = EvaluationRequest.from_record(json.loads(str(stored["request"])))
            approval = _approval(request, limits, context, approved_membership(limits, stored))
            return secure_vote_reply(msg, context, approval,
                                     lambda clipping_range: _send_values(context, request, limits, clipping_range))
        except Exception as err:  # noqa: BLE001 - the server sees the sanitized reason only
            raise sanitized("evaluation", err) from None

    return app


def _forget(context: Context) -> None:
    """Drop any approved evaluation and any round: a pre-flight starts afresh."""
    abort_round(context)
    context.state.config_records.pop(EVALUATION_STATE, None)


def _approval(request: EvaluationRequest, limits: NodePolicy, context: Context,
              membership: Membership | None) -> Approval:
    """What this node approved for the evaluation's SecAgg+ round."""
    return Approval(request=request.digest(), clients=request.config.clients, survivors=request.min_survivors,
                    size=len(EVALUATION_VALUES), min_neighbours=limits.min_neighbours, run=int(context.run_id),
                    membership=membership)


def _no_values(clipping_range: int) -> np.ndarray:
    """The send callback of the pre-flight's ``advertise`` stage, which sends nothing."""
    raise Refusal("secagg_round", "no values are sent in the pre-flight")


def _guarantee(stored: ConfigRecord, request: EvaluationRequest, limits: NodePolicy) -> EvaluationGuarantee:
    """The pre-flight's guarantee while the policy is unchanged, else `check_evaluation_request` anew."""
    if stored.get("policy") != policy_fingerprint(limits):
        return check_evaluation_request(request, limits)
    fields: dict[str, Any] = json.loads(str(stored["guarantee"]))  # written by this node
    return EvaluationGuarantee(**fields)


def _send_values(context: Context, request: EvaluationRequest, limits: NodePolicy, clipping_range: int) -> np.ndarray:
    """The node's values plus a fresh noise share, encoded; the ledger records the release before they are sent.

    Raises:
        Refusal: If the node already sent its values for the approved request, evaluated this request in this run
            (``already_voted``), or its policy or budget no longer admits them.
    """  # noqa: DOC502
    stored = context.state.config_records[EVALUATION_STATE]
    cfg = request.config

    def noised() -> tuple[EvaluationGuarantee, np.ndarray]:
        if "values" not in stored:
            raise Refusal("malformed_request", "this node already sent its evaluation for the approved request")
        guarantee = _guarantee(stored, request, limits)
        values = np.asarray(stored["values"], dtype=np.float64)
        share = client_noise_share(values.size, sigma=request.sigma, clients=cfg.clients, dropout=cfg.dropout,
                                   kind=cfg.noise)
        encoded = encode(values + share, cfg.noise, clipping_range)
        del stored["values"]  # one pre-flight, one sending
        return guarantee, encoded

    return cast(np.ndarray, released_once(context, request.digest(), limits, noised, what="private evaluation"))
