"""One approval path for both releases: every check before a ballot is cast, made alike by the sum release's vote
(``train.dphype``, SecAgg+) and the committee vote (``train.dphype_committee``), with the same refusal.

Each case breaks one precondition after an honest pre-flight and sends each release's vote: both refuse with the
same code, nothing is charged and no ballot leaves. A path that skipped a check the other makes fails its case.
"""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from helpers import CANDS, CLIENTS, argmax_config, argmax_grid, sum_config

from dphype.flower import DPHype
from dphype.flower.local import node_id
from dphype.flower.server.secagg_server import advertise_record
from dphype.flower.wire import (
    APPROVAL_STATE,
    COMMITTEE_VOTE_TYPE,
    PREFLIGHT_TYPE,
    RECORD_KEY,
    REQUEST_STATE,
    STAGE_KEY,
    VOTE_TYPE,
)
from dphype.node.ledger import Ledger
from dphype.node.policy import NodePolicy


def _requests(keys):
    return {"sum": DPHype(CANDS, sum_config(rule="max-votes", clients=CLIENTS, epsilon=4.0)).request,
            "committee": DPHype(CANDS, argmax_config(), tallies=keys).request}


def _approve(grid, request, node):
    """One node's pre-flight of ``request``: it must answer ready."""
    (reply,) = grid.send_and_receive([Message(RecordDict({RECORD_KEY: ConfigRecord(request.to_record())}), node,
                                              PREFLIGHT_TYPE)])
    assert reply.content.config_records[RECORD_KEY]["status"] == "ready"


def _vote(release, request, node):
    """The release's vote message for ``request``: the SecAgg+ round's first stage, or the committee vote."""
    if release == "sum":
        _, advertise = advertise_record(request.digest())
        return Message(RecordDict({STAGE_KEY: advertise}), node, VOTE_TYPE)
    return Message(RecordDict({RECORD_KEY: ConfigRecord(request.to_record())}), node, COMMITTEE_VOTE_TYPE)


def _no_approval(grid, node, requests, release):
    grid.contexts[node].state = RecordDict()


def _stored_request_swapped(grid, node, requests, release):
    other = DPHype(CANDS, (sum_config(rule="max-votes", clients=CLIENTS, epsilon=4.0, k=2) if release == "sum"
                           else argmax_config(k=3)), tallies=() if release == "sum" else requests["committee"].tallies)
    grid.contexts[node].state.config_records[REQUEST_STATE] = ConfigRecord(other.request.to_record())


def _other_release_approved(grid, node, requests, release):
    other = requests["committee" if release == "sum" else "sum"]
    _approve(grid, other, node)
    return other  # the vote is for the approved request


def _roster_changed(grid, node, requests, release):
    grid.contexts[node].state.config_records[APPROVAL_STATE]["roster"] = "00" * 32


def _policy_broken(grid, node, requests, release):
    grid.contexts[node].node_config["dphype-max-epsilon"] = -1.0


def _vote_names_another_request(grid, node, requests, release):
    return requests["committee" if release == "sum" else "sum"]


CASES = {  # the broken precondition -> the refusal both releases answer (the sum's, the committee's where they differ)
    "no pre-flight approved": (_no_approval, "malformed_request: no vote request was approved"),
    "stored request is not the approved one": (_stored_request_swapped, "malformed_request: the stored request"),
    "the approved request is another release's": (_other_release_approved, "release_mode"),
    "roster changed since the pre-flight": (_roster_changed, "roster: this node's roster changed"),
    "the node's policy is broken now": (_policy_broken, "node_policy"),
    # the committee vote carries its request; the SecAgg+ stages carry its digest, bound by the round
    "the vote names another request": (_vote_names_another_request,
                                       ("secagg_round", "malformed_request: the vote's request is not the one")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_both_releases_refuse_a_vote_whose_approval_does_not_hold_with_the_same_code_and_charge_nothing(tmp_path,
                                                                                                        case):
    grid, keys = argmax_grid(tmp_path)
    requests = _requests(keys)
    breaks, code = CASES[case]
    for i, release in enumerate(("sum", "committee")):
        node = node_id(i)
        _approve(grid, requests[release], node)
        sent = breaks(grid, node, requests, release) or requests[release]
        expected = code if isinstance(code, str) else code[i]
        (reply,) = grid.send_and_receive([_vote(release, sent, node)])
        assert reply.has_error() and reply.error.reason.startswith(f"Refusal: {expected}"), (release,
                                                                                              reply.error.reason)
        policy = NodePolicy.from_node_config({**grid.contexts[node].node_config, "dphype-max-epsilon": 1000.0})
        assert not Ledger(policy.ledger).entries(), release
