"""DP-Hype on a client: the handlers that answer DP-Hype's messages in a user's own ``ClientApp``.

The client side, in the package: this module (`register_dphype`, the pre-flight and the secure vote),
`dphype.flower.client.policy_client` (the node's policy, refusals), `dphype.flower.client.secagg_client` (the node's
SecAgg+ answers) and `dphype.flower.client.committee_client` (the committee vote); the tally node is
`dphype.flower.tally_node`. The message types and keys are `dphype.flower.wire`'s.

`register_dphype` adds two handlers to a Message-API ``ClientApp``, under DP-Hype's own action
name, so they never see the user's ``@app.train()``, ``@app.evaluate()`` or ``@app.query()`` messages
and those never see DP-Hype's. Both enforce this node's own privacy policy (`dphype.node.policy.NodePolicy`,
set by whoever runs the node, never by the server; `node_policy`) against an active server
(threat model: `dphype.node.policy`):

* ``query.dphype`` (pre-flight): parse the `dphype.protocol.VoteRequest`, check it against the policy
  (`dphype.node.policy.check_vote_request`) and the lifetime budget (`dphype.node.ledger.Ledger.check`), score
  every candidate with the user's task and keep the scores in the context state; answer ``ready`` or a refusal.
  A pre-flight carrying the vote's first stage (``advertise``) gets this node's fresh round keys beside
  ``ready``, bound to the request just approved (only for a SecAgg+ release; else ``release_mode``);
* ``train.dphype`` (the secure vote): the SecAgg+ stages (`dphype.flower.client.secagg_client.secure_vote_reply`),
  bound at the first stage to the approved request, its ``n`` and ``xi`` and the policy's
  ``dphype-min-neighbours``; a stage out of order, repeated or for another request aborts the round. In the
  masked-input stage, once the neighbours' shares are checked, the ballot is cast with a fresh noise share, its
  guarantee (the pre-flight's, or checked again if the policy changed) recorded in the ledger
  (`dphype.node.ledger.Ledger.spend`) and only then masked and sent. A pre-flight during a round past
  ``advertise`` is refused and aborts it.

Any refusal makes the node drop out; the server sees only the sanitized reason
(`dphype.flower.client.policy_client.sanitized`: limits and budget read as the single code ``policy``).

It also adds the argmax mode's handlers: ``train.dphype_committee`` (sealed shares to the tally committee,
`dphype.flower.client.committee_client`) and, on nodes configured as tallies, ``query.dphype_tally``
(`dphype.flower.tally_node`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import log

from dphype.flower.client.approval import approved_vote, check_aggregator
from dphype.flower.client.committee_client import register_committee_vote
from dphype.flower.client.policy_client import (
    PolicySource,
    announce_simulated,
    cast_approved_ballot,
    check_registration,
    describe_federation,
    node_policy,
    policy_fingerprint,
    refused,
    resolve_policy,
    roster_digest,
    sanitized,
    simulated,
    voted_before,
)
from dphype.flower.client.secagg_client import abort_round, round_in_progress, secure_vote_reply, stage_reply
from dphype.flower.tally_node import register_tally
from dphype.flower.wire import (
    ACTION,
    APPROVAL_STATE,
    GUARANTEE_STATE,
    RECORD_KEY,
    REQUEST_STATE,
    SCORES_STATE,
    STAGE_KEY,
)
from dphype.node.ledger import Ledger
from dphype.node.policy import NodePolicy, check_vote_request
from dphype.protocol import VoteRequest, score_candidates
from dphype.refusal import Refusal
from dphype.release import Aggregator
from dphype.secure.roster import Membership
from dphype.secure.secagg import Approval
from dphype.task import Task

__all__ = ["PolicySource", "node_policy", "register_dphype", "simulated"]


def register_dphype(app: ClientApp, task_fn: Callable[[Context], Task], *, policy: PolicySource = None) -> ClientApp:
    """Let ``app`` take part in DP-Hype: answer its pre-flight and secure vote with ``task_fn(context)``.

    The node answers within its privacy policy.

    ``task_fn`` builds this node's task (anything with ``maximize`` and ``score(candidates)``, e.g.
    `dphype.ml.torch_task.TorchTask`) from the node's context. ``policy`` is this node's
    `dphype.node.policy.NodePolicy`:

    * ``None`` (the default, and what a deployed app should use): read it where the node's operator sets
      it, `node_policy` (``--node-config`` keys, else the ``DPHYPE_NODE_POLICY`` environment
      variable, else the safe defaults of `dphype.node.policy.POLICY_KEYS`);
    * a function of the node's ``Context`` that returns one (e.g. one policy per simulated node);
    * a ``NodePolicy``, for a process that runs a single node (its ledger file is the node's).

    The candidate list always arrives in the request; the policy's ``candidates`` key is the node's own
    copy, which a request must match.

    Args:
        app: The ClientApp.
        task_fn: Builds this node's task from its context.
        policy: This node's policy: ``None``, a function of the context, or a ``NodePolicy`` (above).

    Returns:
        ``app``, with the pre-flight, the secure vote (SecAgg+ stages), the committee vote and the tally handlers
            added.

    Raises:
        ValueError: If ``app`` is not a ClientApp, ``task_fn`` is not callable, or ``policy`` is none of the
            above.
    """
    check_registration(app, policy)
    if not callable(task_fn):
        raise ValueError(f"task_fn must be a function of the node's Context, got {type(task_fn).__name__}")

    @app.query(ACTION)
    def preflight(msg: Message, context: Context) -> Message:
        try:
            if round_in_progress(context):
                raise Refusal("secagg_round", "a pre-flight arrived during a vote round; the round was aborted")
            limits = resolve_policy(policy, context)
            announce_simulated(limits, context.run_id)
            request = VoteRequest.from_record(msg.content.config_records.get(RECORD_KEY, {}))
            membership = limits.membership()  # no roster: refused unless the operator allowed it
            if request.roster and request.roster != roster_digest(membership):
                raise Refusal("roster", "the request names another federation's roster than this node's (or this "
                              "node has none)")
            guarantee = check_vote_request(request, limits)
            scores, maximize = None, False  # a re-run of a request voted in this run: its vote is answered again
            if not voted_before(context, request, limits):
                Ledger(cast(Path, limits.ledger)).check(guarantee, limits)
                task = task_fn(context)
                log(logging.INFO, "DP-Hype: scoring %d candidates on local data", len(request.candidates))
                scores = score_candidates(task, request.candidates, progress=_log_progress)
                maximize = bool(task.maximize)
        except Exception as err:  # noqa: BLE001 - every failure is answered as a sanitized refusal
            _forget(context)
            return refused(msg, sanitized("request", err))
        _forget(context)
        if scores is not None:
            context.state.array_records[SCORES_STATE] = ArrayRecord({"scores": Array(scores)})
        context.state.config_records[REQUEST_STATE] = ConfigRecord(request.to_record())
        context.state.config_records[GUARANTEE_STATE] = ConfigRecord(
            {**dataclasses.asdict(guarantee), "policy": policy_fingerprint(limits)})
        context.state.config_records[APPROVAL_STATE] = ConfigRecord(
            {"digest": request.digest(), "maximize": maximize, "clients": request.config.clients,
             "dropout": request.config.dropout, "roster": roster_digest(membership)})
        answer = RecordDict({RECORD_KEY: ConfigRecord({"status": "ready", "ledger": limits.ledger_scope,
                                                       "federation": describe_federation(membership)})})
        advertise = msg.content.config_records.get(STAGE_KEY)
        if advertise is not None:  # the secure vote's first stage rides on the pre-flight
            try:
                answer[STAGE_KEY] = stage_reply(advertise, context, _approval(request, limits, context, membership),
                                                _no_vote)
            except Exception as err:  # noqa: BLE001 - answered as a sanitized refusal
                _forget(context)
                return refused(msg, sanitized("request", err))
        return Message(answer, reply_to=msg)

    @app.train(ACTION)
    def vote(msg: Message, context: Context) -> Message:
        try:
            approved = approved_vote(policy, context, Aggregator.SECAGG)
            request, limits = approved.request, approved.limits
            approval = _approval(request, limits, context, approved.membership)

            def cast_vote(clipping_range: int) -> np.ndarray:
                return cast(np.ndarray, cast_approved_ballot(context, request, limits, approved.checked,
                                                             maximize=approved.maximize, what="vote",
                                                             clipping_range=clipping_range))

            return secure_vote_reply(msg, context, approval, cast_vote)
        except Exception as err:  # noqa: BLE001 - the server sees the sanitized reason only
            raise sanitized("vote", err) from None

    register_committee_vote(app, policy=policy)  # release="argmax": sealed shares to the tallies
    register_tally(app)  # answered only on nodes configured as tallies
    return app


def _forget(context: Context) -> None:
    """Drop any earlier approval, its scores and any round: a pre-flight starts afresh."""
    abort_round(context)
    context.state.array_records.pop(SCORES_STATE, None)
    for key in (APPROVAL_STATE, REQUEST_STATE, GUARANTEE_STATE):
        context.state.config_records.pop(key, None)


def _approval(request: VoteRequest, limits: NodePolicy, context: Context, membership: Membership | None) -> Approval:
    """What this node approved for its SecAgg+ round; another aggregator's request is refused (``release_mode``)."""
    check_aggregator(request, Aggregator.SECAGG)
    return Approval(request=request.digest(), clients=request.config.clients, survivors=request.min_survivors,
                    size=len(request.candidates), min_neighbours=limits.min_neighbours, run=int(context.run_id),
                    membership=membership)


def _no_vote(clipping_range: int) -> np.ndarray:
    """The vote callback of the pre-flight's ``advertise`` stage, which casts no vote."""
    raise Refusal("secagg_round", "no vote is cast in the pre-flight")


def _log_progress(done: int, total: int) -> None:
    log(logging.INFO, "DP-Hype: scoring progress %d/%d", done, total)
