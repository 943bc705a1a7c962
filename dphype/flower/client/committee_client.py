"""A client's committee vote (``release="argmax"``): its sealed shares to the tally committee.

After the usual pre-flight (``query.dphype``: the node policy checks the committee and the epsilon,
`dphype.node.policy.check_vote_request`), ``train.dphype_committee`` must carry the approved request; the node
records the vote in its ledger, then answers with one sealed share per tally (the committee mode's ballot,
`dphype.release.ArgmaxRelease.ballot`).
The server cannot open them; it forwards them to the tallies (`dphype.flower.server.committee_server`,
`dphype.flower.tally_node`).
"""

from __future__ import annotations

from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from dphype.flower.client.policy_client import (
    PolicySource,
    approved_membership,
    cast_approved_ballot,
    resolve_policy,
    sanitized,
)
from dphype.flower.wire import APPROVAL_STATE, COMMITTEE_ACTION, GUARANTEE_STATE, RECORD_KEY
from dphype.protocol import VoteRequest
from dphype.refusal import Refusal
from dphype.secure.committee import voter_id
from dphype.secure.roster import share_payload


def register_committee_vote(app: ClientApp, *, policy: PolicySource = None) -> ClientApp:
    """Add ``train.dphype_committee`` to ``app`` (a client's sealed shares after an approved pre-flight).

    The handler votes only for the request its pre-flight approved (same digest, scores kept) and only when
    that request's release mode sends to the tally committee (``release_mode`` otherwise: a request approved for
    another mode is never answered here), charges the node's ledger, and answers the ballot sealed to the tally
    committee and bound to this node's identity in this run (`dphype.secure.committee.voter_id`: the run id and its
    roster member name, or its node id in an unauthenticated federation), each share signed by the member's identity
    (`dphype.secure.roster.share_payload`, stage ``committee-share``); a roster that changed since the pre-flight is
    refused (``roster``) before the ledger is charged. Any failure reaches the server as a sanitized refusal.

    Args:
        app: The ClientApp.
        policy: This node's policy, as for `dphype.flower.client.register_dphype`.

    Returns:
        ``app``.
    """

    @app.train(COMMITTEE_ACTION)
    def committee_vote(msg: Message, context: Context) -> Message:
        try:
            limits = resolve_policy(policy, context)
            approved = context.state.config_records.get(APPROVAL_STATE)
            checked = context.state.config_records.get(GUARANTEE_STATE)
            request = VoteRequest.from_record(msg.content.config_records.get(RECORD_KEY, {}))
            if not request.mode.uses_committee:
                raise Refusal("release_mode", "a committee vote for a request whose release is not the tally "
                              "committee's")
            if approved is None or checked is None or approved["digest"] != request.digest():
                raise Refusal("malformed_request",
                              "the committee vote request is not the one approved in the pre-flight")
            membership = approved_membership(limits, approved)  # the roster the pre-flight approved, or refused
            contributor = context.node_id if membership is None else membership.name
            sealed = cast_approved_ballot(context, request, limits, checked, maximize=bool(approved["maximize"]),
                                          what="committee vote", voter=voter_id(context.run_id, contributor))
            answer: dict[str, Any] = {"shares": sealed}
            if membership is not None:  # each share signed by this member's identity, for its tally
                answer.update(member=membership.name, signatures=[
                    membership.sign("committee-share", request.digest(), int(context.run_id), share_payload(j, share))
                    for j, share in enumerate(sealed)])
        except Exception as err:  # noqa: BLE001 - the server sees the sanitized reason only
            raise sanitized("committee vote", err) from None
        return Message(RecordDict({RECORD_KEY: ConfigRecord(answer)}), reply_to=msg)

    return app
