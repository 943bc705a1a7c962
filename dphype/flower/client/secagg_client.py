"""A node's answers in DP-Hype's SecAgg+ round, the client half of the Message-API adapter of the secure sum.

The protocol is `dphype.secure.secagg`; the server half of the adapter is `dphype.flower.server.secagg_server`.

`secure_vote_reply` answers one stage message (`dphype.flower.wire.VOTE_TYPE`, its content under
`dphype.flower.wire.STAGE_KEY`) with `dphype.secure.secagg.node_step`, keeping the node's round (its
secrets included) in its own ``context.state`` under `dphype.flower.wire.SECAGG_STATE`; any refusal discards
the round (`abort_round`). The round's first ``advertise`` rides on the pre-flight (message format version 3,
`dphype.secure.secagg.Advertised`): a node that approves the request answers it with `stage_reply`
beside its ``ready``.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict

from dphype.flower.wire import SECAGG_STATE, STAGE_KEY
from dphype.refusal import Refusal
from dphype.secure import secagg as protocol


def abort_round(context: Context) -> None:
    """Discard this node's round (its secrets included): any later stage of it is refused.

    Args:
        context: The node's Flower context (its round lives in ``context.state``).
    """
    context.state.config_records.pop(SECAGG_STATE, None)


def round_in_progress(context: Context) -> bool:
    """Whether this node is inside a round past its ``advertise`` stage (its secret shares sent) that has not ended.

    A round still at ``advertise`` has sent public keys only.

    Args:
        context: The node's Flower context (its round lives in ``context.state``).

    Returns:
        ``True`` while a round is past ``advertise`` and not yet ended.
    """
    record = context.state.config_records.get(SECAGG_STATE)
    return record is not None and record.get("stage") not in (protocol.STAGES[0], protocol.STAGES[-1])


def secure_vote_reply(msg: Message, context: Context, approval: protocol.Approval,
                      vote: protocol.VoteFunction) -> Message:
    """Answer one stage message of the vote round (`dphype.secure.secagg.node_step`).

    For the request this node ``approval``-ed; ``vote(clipping_range)`` returns the encoded vote and charges the
    ledger, and is called only in the masked-input stage after every check. A refusal (raised) discards the
    round, so nothing of the stage leaves the node; a message that is not a stage of the round is refused:
    answering it could send the vote in plaintext.

    Args:
        msg: The stage message (`dphype.flower.wire.VOTE_TYPE`), its content under `dphype.flower.wire.STAGE_KEY`.
        context: The node's Flower context (its round lives in ``context.state``).
        approval: What the node approved in its pre-flight.
        vote: ``vote(clipping_range)``: the encoded vote; charges the ledger.

    Returns:
        The reply carrying the node's answer to the stage.

    Raises:
        Refusal: ``secagg_round`` if ``msg`` carries no stage, or any refusal of the stage's checks (the round is
            discarded).
    """
    record = msg.content.config_records.get(STAGE_KEY)
    if record is None:
        abort_round(context)
        raise Refusal("secagg_round", "refusing a DP-Hype vote request outside the secure sum: the votes "
                      "would reach the server in plaintext")
    return Message(RecordDict({STAGE_KEY: stage_reply(record, context, approval, vote)}), reply_to=msg)


def stage_reply(record: ConfigRecord, context: Context, approval: protocol.Approval,
                vote: protocol.VoteFunction) -> ConfigRecord:
    """This node's answer to one stage's content ``record`` (`dphype.secure.secagg.node_step`).

    Its round is kept in ``context.state``; a refusal (raised) discards the round.

    Args:
        record: The stage's content.
        context: The node's Flower context (its round lives in ``context.state``).
        approval: What the node approved in its pre-flight.
        vote: ``vote(clipping_range)``: the encoded vote; charges the ledger.

    Returns:
        The node's answer to the stage.

    Raises:
        Refusal: If the stage is out of order, repeated, for another request, malformed or fails a check (the
            round is discarded); any other exception of the step discards it too and propagates.
    """  # noqa: DOC502, DOC503
    try:
        stored = context.state.config_records.get(SECAGG_STATE)
        state = None if stored is None else protocol.NodeRound.from_record(stored)
        state, reply = protocol.node_step(state, dict(record), node=context.node_id, approval=approval, vote=vote)
    except BaseException:
        abort_round(context)
        raise
    context.state.config_records[SECAGG_STATE] = ConfigRecord(state.to_record())
    return ConfigRecord(reply)
