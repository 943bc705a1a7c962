"""Refusals: a fixed set of reason codes, and any client-side exception turned into a code and a short
message without data values (a duplicate candidate echoed a patient record to the server)."""

import json

import pytest

from dphype.node.ledger import LedgerError
from dphype.node.policy import NodePolicy, PolicyError
from dphype.refusal import MAX_DETAIL, REFUSAL_CODES, Refusal, as_refusal
from dphype.selection.candidates import CandidateList, table_iii_grid

RECORD = {"patient": "alice", "hiv": "positive"}


def test_an_exception_carrying_data_is_sanitized():
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


# ------------------------------------------------------------- every refusal names its key and remedy
def preflight_failure(caplog, app_scores, node_config: dict, **request) -> tuple[str, str]:
    """Run a selection of 4 nodes that refuse; return (the server's error, the nodes' log)."""
    import logging

    from helpers import CANDS, client_app

    from dphype.config import DPHypeConfig
    from dphype.flower import DPHype, PreflightError
    from dphype.flower.local import LocalGrid

    grid = LocalGrid(client_app(app_scores), 4, node_config=node_config)
    with caplog.at_level(logging.INFO, logger="flwr"), pytest.raises(PreflightError) as info:
        DPHype(CANDS, DPHypeConfig(**{"epsilon": 1.0, "delta": 1e-5, "k": 2, "clients": 4, **request})).start(grid)
    return str(info.value), caplog.text


POLICY = {"dphype-max-epsilon": 1.0, "dphype-min-clients": 2, "dphype-min-neighbours": 1, "dphype-lifetime-epsilon": 10}


def scores(n: int = 4):
    import numpy as np

    return np.random.default_rng(0).uniform(size=(n, 8))


@pytest.mark.parametrize(("request_", "policy", "code", "key", "local", "remedy"), [
    ({"epsilon": 2.0}, {}, "policy_epsilon", "dphype-max-epsilon", "announced epsilon 2 > dphype-max-epsilon=1",
     "lower the run's epsilon"),
    ({}, {"dphype-min-clients": 10}, "policy_clients", "dphype-min-clients",
     "4 contributors < dphype-min-clients=10", "run with more clients or a smaller dropout"),
    ({"delta": 1e-4}, {}, "policy_delta", "dphype-max-delta", "announced delta 0.0001 > dphype-max-delta=1e-05",
     "lower the run's delta"),
    ({}, {"dphype-lifetime-epsilon": 0.5}, "lifetime_budget", "dphype-lifetime-epsilon",
     "> dphype-lifetime-epsilon=0.5 at delta 1e-05 after 0 recorded votes", "only its operator can raise it"),
])
def test_each_policy_refusal_names_its_key_on_the_node_and_the_remedy_on_the_server(
        caplog, request_, policy, code, key, local, remedy):
    server, node = preflight_failure(caplog, scores(), {**POLICY, **policy}, **request_)
    # the server learns that a node's policy refused and the keys that could be changed, not which limit or value
    assert "4 x refused: policy (" in server and code not in server and key in server and "to resolve" in server
    assert f"{key}=" not in server  # the node's limit stays on the node: a server cannot binary-search it
    assert local in node and key in node and remedy in node  # the operator sees the value, limit, key, remedy
    if code == "lifetime_budget":
        assert "--archive" in node and "would be" not in server


def test_a_task_error_is_logged_in_full_on_the_node_and_sanitized_for_the_server(caplog):
    server, node = preflight_failure(caplog, [KeyError("patient alice")] * 4, POLICY)
    assert "4 x refused: task_error (task.score raised KeyError; to resolve: the ClientApp's task raised" in server
    assert "alice" not in server
    assert "Traceback (most recent call last)" in node and "KeyError: 'patient alice'" in node
