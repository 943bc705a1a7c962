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

from dphype.flower.client.approval import approved_vote
from dphype.flower.client.policy_client import PolicySource, cast_approved_ballot, sanitized
from dphype.flower.wire import COMMITTEE_ACTION, RECORD_KEY
from dphype.release import Aggregator
from dphype.secure.committee import voter_id
from dphype.secure.roster import share_payload


def register_committee_vote(app: ClientApp, *, policy: PolicySource = None) -> ClientApp:
    """Add ``train.dphype_committee`` to ``app`` (a client's sealed shares after an approved pre-flight).

    The handler votes only for the request its pre-flight approved and only when that request's release mode sends
    to the tally committee (`dphype.flower.client.approval.approved_vote`, the sum release's checks too), charges the
    node's ledger once per request and run (a re-run of the request gets the same answer, at no new charge), and
    answers the ballot sealed to the tally
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
            vote = approved_vote(policy, context, Aggregator.COMMITTEE,
                                 msg.content.config_records.get(RECORD_KEY, ConfigRecord()))
            request, membership = vote.request, vote.membership
            contributor = context.node_id if membership is None else membership.name

            def signed(sealed: list[bytes]) -> dict[str, Any]:
                answer: dict[str, Any] = {"shares": sealed}
                if membership is not None:  # each share signed by this member's identity, for its tally
                    answer.update(member=membership.name, signatures=[
                        membership.sign("committee-share", request.digest(), int(context.run_id),
                                        share_payload(j, share)) for j, share in enumerate(sealed)])
                return answer

            answer = cast_approved_ballot(context, request, vote.limits, vote.checked, maximize=vote.maximize,
                                          what="committee vote", reply=signed,
                                          voter=voter_id(context.run_id, contributor))
        except Exception as err:  # noqa: BLE001 - the server sees the sanitized reason only
            raise sanitized("committee vote", err) from None
        return Message(RecordDict({RECORD_KEY: ConfigRecord(answer)}), reply_to=msg)

    return app
