"""A client's argmax vote (``release="argmax"``): its sealed shares to the tally committee.

After the usual pre-flight (``query.dphype``: the node policy checks the committee and the pure epsilon,
`dphype.node.policy.check_vote_request`), ``train.dphype_argmax`` must carry the approved request; the node
records the vote in its ledger, then answers with one sealed share per tally (the committee mode's ballot,
`dphype.modes.ArgmaxRelease.ballot`).
The server cannot open them; it forwards them to the tallies (`dphype.flower.server.committee`,
`dphype.flower.tally`).
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from dphype.flower.client.policy import PolicySource, cast_approved_ballot, resolve_policy, sanitized
from dphype.flower.wire import APPROVAL_STATE, ARGMAX_ACTION, GUARANTEE_STATE, RECORD_KEY
from dphype.modes import Aggregator
from dphype.protocol import VoteRequest
from dphype.refusal import Refusal
from dphype.secure.tally import voter_id


def register_winner_vote(app: ClientApp, *, policy: PolicySource = None) -> ClientApp:
    """Add ``train.dphype_argmax`` to ``app`` (a client's sealed shares after an approved pre-flight).

    The handler votes only for the request its pre-flight approved (same digest, scores kept) and only when
    that request's release mode sends to the tally committee (``release_mode`` otherwise: a request approved for
    another mode is never answered here), charges the node's ledger, and answers the ballot sealed to the tally
    committee and bound to this node's identity in this run (`dphype.secure.tally.voter_id`: its node id and the
    run id); any failure reaches the server as a sanitized refusal.

    Args:
        app: The ClientApp.
        policy: This node's policy, as for `dphype.flower.client.register_dphype`.

    Returns:
        ``app``.
    """

    @app.train(ARGMAX_ACTION)
    def argmax_vote(msg: Message, context: Context) -> Message:
        try:
            limits = resolve_policy(policy, context)
            approved = context.state.config_records.get(APPROVAL_STATE)
            checked = context.state.config_records.get(GUARANTEE_STATE)
            request = VoteRequest.from_record(msg.content.config_records.get(RECORD_KEY, {}))
            if request.mode.aggregator is not Aggregator.COMMITTEE:
                raise Refusal("release_mode", "an argmax vote for a request whose release is not the tally "
                              "committee's")
            if approved is None or checked is None or approved["digest"] != request.digest():
                raise Refusal("malformed_request", "the argmax vote request is not the one approved in the pre-flight")
            sealed = cast_approved_ballot(context, request, limits, checked, maximize=bool(approved["maximize"]),
                                          what="argmax vote", voter=voter_id(context.run_id, context.node_id))
        except Exception as err:  # noqa: BLE001 - the server sees the sanitized reason only
            raise sanitized("argmax vote", err) from None
        return Message(RecordDict({RECORD_KEY: ConfigRecord({"shares": sealed})}), reply_to=msg)

    return app
