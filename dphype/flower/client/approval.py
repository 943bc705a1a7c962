"""The one approval path of every vote, for both releases: what a node checks before it casts a ballot.

`approved_vote` is the preamble of the sum release's vote (``train.dphype``, `dphype.flower.client.register_dphype`)
and of the committee vote (``train.dphype_committee``, `dphype.flower.client.committee_client`): the node's policy
now, a request approved in this node's pre-flight (its scores, its guarantee and its approval in the context
state), the stored request being the approved one, the request the vote message carries (where it carries one)
being it too, the request's release sending to the handler's aggregator (``release_mode``), and the roster
unchanged since the pre-flight (``roster``). The ballot is then cast once per request and run
(`dphype.flower.client.policy_client.cast_approved_ballot`).
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import ConfigRecord, Context

from dphype.flower.client.policy_client import PolicySource, approved_membership, resolve_policy
from dphype.flower.wire import APPROVAL_STATE, GUARANTEE_STATE, REQUEST_STATE
from dphype.node.policy import NodePolicy
from dphype.protocol import VoteRequest
from dphype.refusal import Refusal
from dphype.release import Aggregator
from dphype.secure.roster import Membership


@dataclass(frozen=True)
class ApprovedVote:
    """A vote the node's pre-flight approved, checked again for the message that asks for it.

    Attributes:
        request: The approved request.
        limits: The node's policy now.
        checked: What the pre-flight stored of the guarantee (`dphype.flower.client.policy_client.approved_guarantee`).
        membership: The node's roster membership (unchanged since the pre-flight), or ``None`` (unauthenticated).
        maximize: Whether the task's scores are better when larger.
    """

    request: VoteRequest
    limits: NodePolicy
    checked: ConfigRecord
    membership: Membership | None
    maximize: bool


def check_aggregator(request: VoteRequest, aggregator: Aggregator) -> None:
    """Refuse (``release_mode``) a message of ``aggregator``'s for a request whose release sends elsewhere."""
    if request.mode.aggregator is not aggregator:
        raise Refusal("release_mode", f"a {aggregator.value} message for a request whose release is not the "
                      f"{aggregator.value}'s")


def approved_vote(policy: PolicySource, context: Context, aggregator: Aggregator,
                  sent: ConfigRecord | None = None) -> ApprovedVote:
    """Every check a vote passes before its ballot is cast, for the handler of ``aggregator`` (module docstring).

    Args:
        policy: The node's policy source (`dphype.flower.client.register_dphype`'s ``policy``).
        context: The node's context, holding what its pre-flight approved.
        aggregator: Where the handler sends the ballot.
        sent: The request the vote message carries (the committee vote's); ``None`` when it carries none (the
            SecAgg+ stages, bound to the approved request's digest by their round).

    Returns:
        The approved vote.

    Raises:
        Refusal: ``malformed_request`` without an approved pre-flight or for another request than the approved
            one; ``release_mode`` for a request of another aggregator; ``roster`` if the roster changed.
        dphype.node.policy.PolicyError: The node's policy is invalid (`resolve_policy`).
    """  # noqa: DOC502, DOC503
    limits = resolve_policy(policy, context)
    approved = context.state.config_records.get(APPROVAL_STATE)
    stored = context.state.config_records.get(REQUEST_STATE)
    checked = context.state.config_records.get(GUARANTEE_STATE)
    if approved is None or stored is None or checked is None:
        raise Refusal("malformed_request", "no vote request was approved in a pre-flight")
    request = VoteRequest.from_record(stored)
    digest = str(approved["digest"])
    if request.digest() != digest:
        raise Refusal("malformed_request", "the stored request is not the one approved in the pre-flight")
    if sent is not None and VoteRequest.from_record(sent).digest() != digest:
        raise Refusal("malformed_request", "the vote's request is not the one approved in the pre-flight")
    check_aggregator(request, aggregator)
    membership = approved_membership(limits, approved)  # the roster the pre-flight approved, or refused
    return ApprovedVote(request, limits, checked, membership, bool(approved["maximize"]))
