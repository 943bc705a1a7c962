"""Refusals: a fixed set of reason codes, and any client-side exception turned into a code and a short
message without data values (issue 8: a duplicate candidate echoed a patient record to the server)."""

import json

import pytest

from dphype.node.ledger import LedgerError
from dphype.node.policy import NodePolicy, PolicyError
from dphype.protocol import MAX_DETAIL, REFUSAL_CODES, Refusal, as_refusal
from dphype.selection.candidates import CandidateList, table_iii_grid

RECORD = {"patient": "alice", "hiv": "positive"}


def test_issue_8_an_exception_carrying_data_is_sanitized():
    with pytest.raises(ValueError) as info:
        CandidateList([RECORD, RECORD])
    assert "alice" in str(info.value)  # the local error names the entry (useful on the node)
    refusal = as_refusal(info.value)
    assert (refusal.code, refusal.detail) == ("client_error", "ValueError on the client")
    assert "alice" not in str(refusal) and "positive" not in str(refusal)


def test_a_nodes_own_candidate_file_with_data_is_sanitized(tmp_path):
    path = tmp_path / "private" / "candidates.json"
    path.parent.mkdir()
    path.write_text(json.dumps([RECORD, RECORD]))
    with pytest.raises(PolicyError) as info:
        NodePolicy(ledger=tmp_path / "l", candidates=str(path)).own_candidates()
    assert "alice" in str(info.value)
    refusal = as_refusal(info.value)
    assert refusal.code == "node_policy" and refusal.detail == REFUSAL_CODES["node_policy"]
    assert "alice" not in str(refusal) and str(path) not in str(refusal)


def test_known_errors_map_to_their_codes_without_their_message():
    with pytest.raises(ValueError) as info:
        table_iii_grid().check_fingerprint("0" * 64)
    assert as_refusal(info.value).code == "candidate_mismatch"
    ledger = as_refusal(LedgerError("ledger /home/alice/.flwr/dphype/ledger.json is corrupt"))
    assert ledger.code == "ledger_error" and "alice" not in str(ledger)
    own = Refusal("policy_delta", "announced delta 0.5 is above this node's limit")
    assert as_refusal(own) is own
    assert as_refusal(KeyError("alice")).detail == "KeyError on the client"


def test_codes_are_a_fixed_set_and_details_are_short():
    with pytest.raises(ValueError, match="code must be one of"):
        Refusal("because", "")
    assert len(Refusal("client_error", "x" * 1000).detail) == MAX_DETAIL
