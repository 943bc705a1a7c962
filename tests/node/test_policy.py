"""Node policy: read from the node config only, safe defaults, and the request check that recomputes the
guarantee of the noise a client is asked to add (attacks fail closed)."""

import json
import math

import pytest
from helpers import make_request

from dphype.node.policy import (
    POLICY_KEYS,
    NodePolicy,
    PolicyError,
    check_vote_request,
    default_ledger_path,
)
from dphype.privacy.accounting import calibrate, mechanism_epsilon, rdp_epsilon, vote_rdp, vote_sensitivity
from dphype.privacy.noise import client_noise_std
from dphype.privacy.noise_kinds import skellam_rdp_epsilon
from dphype.refusal import Refusal
from dphype.selection.candidates import candidate_grid, table_iii_grid


def refused(request, policy):
    with pytest.raises(Refusal) as info:
        check_vote_request(request, policy)
    return info.value


# --------------------------------------------------------------------------------------- the policy
def test_defaults_are_the_documented_safe_ones(monkeypatch, tmp_path):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    policy = NodePolicy.from_node_config({})
    assert policy == NodePolicy()
    documented = {key: default for key, (default, _) in POLICY_KEYS.items()}
    documented["dphype-ledger"] = str(tmp_path / "dphype" / "ledger.json")
    assert policy.to_dict() == documented
    assert (policy.max_epsilon, policy.max_delta, policy.min_clients, policy.lifetime_epsilon) == (1.0, 1e-5, 10, 4.0)


def test_default_ledger_lives_under_flwr_home_or_home(monkeypatch, tmp_path):
    monkeypatch.delenv("FLWR_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_ledger_path() == tmp_path / ".flwr" / "dphype" / "ledger.json"


def test_reads_node_config_keys_and_leaves_other_keys_alone(tmp_path):
    # values as Flower's --node-config parses them (TOML: ints, floats, quoted strings)
    config = {
        "partition-id": 3,
        "num-partitions": 10,
        "dphype-max-epsilon": 2,
        "dphype-max-delta": 1e-6,
        "dphype-min-clients": 20,
        "dphype-min-neighbours": 6,
        "dphype-lifetime-epsilon": 8,
        "dphype-ledger": str(tmp_path / "l.json"),
        "dphype-candidates": "table3",
        "dphype-accountant": "rdp",
        "dphype-neighbouring": "add-remove",
    }
    policy = NodePolicy.from_node_config(config)
    assert policy.max_epsilon == 2.0 and isinstance(policy.max_epsilon, float)
    assert (policy.max_delta, policy.min_clients, policy.min_neighbours) == (1e-6, 20, 6)
    assert policy.lifetime_epsilon == 8.0 and policy.ledger == tmp_path / "l.json"
    assert policy.own_candidates() == table_iii_grid()
    assert (policy.accountant, policy.neighbouring) == ("rdp", "add-remove")
    assert NodePolicy.from_node_config({"dphype-max-epsilon": "0.5"}).max_epsilon == 0.5  # strings parse


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("dphype-max-epsilon", 0, r"dphype-max-epsilon must be a number in \(0, inf\), got 0"),
        ("dphype-max-epsilon", "inf", r"dphype-max-epsilon must be a number in \(0, inf\)"),
        ("dphype-max-delta", 1.0, r"dphype-max-delta must be a number in \(0, 1\), got 1.0"),
        ("dphype-max-delta", True, r"dphype-max-delta must be a number in \(0, 1\), got True"),
        ("dphype-min-clients", 1, "dphype-min-clients must be an integer >= 2, got 1"),
        ("dphype-min-clients", 10.5, "dphype-min-clients must be an integer >= 2, got 10.5"),
        ("dphype-min-neighbours", 0, "dphype-min-neighbours must be an integer >= 1, got 0"),
        ("dphype-lifetime-epsilon", -1, r"dphype-lifetime-epsilon must be a number in \(0, inf\)"),
        ("dphype-ledger", 7, "dphype-ledger must be a non-empty path"),
        ("dphype-candidates", "", "dphype-candidates must be a non-empty path"),
        ("dphype-accountant", "analytic", "dphype-accountant must be one of auto, rdp"),
        ("dphype-neighbouring", "replace", "dphype-neighbouring must be one of replace-one, add-remove"),
        ("dphype-max-epsilion", 1, "unknown node config key.*dphype-max-epsilion"),
    ],
)
def test_bad_node_config_names_the_key_and_range(key, value, match):
    with pytest.raises(PolicyError, match=match):
        NodePolicy.from_node_config({key: value})


def test_own_candidates_that_cannot_be_loaded_are_a_policy_error(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps([{"patient": "alice", "hiv": "positive"}] * 2))
    with pytest.raises(PolicyError, match="dphype-candidates"):
        NodePolicy(ledger=tmp_path / "l", candidates=str(path)).own_candidates()


# ------------------------------------------------------------------------------- the request check
@pytest.fixture
def policy(tmp_path):
    return NodePolicy(ledger=tmp_path / "ledger.json")


@pytest.mark.parametrize("noise", ["skellam", "gaussian"])
def test_an_honest_request_passes_and_its_guarantee_is_recomputed(policy, noise):
    request = make_request(noise=noise, clients=50, dropout=0.1)
    guarantee = check_vote_request(request, policy)
    survivors = math.ceil(0.9 * 50)
    assert guarantee.survivors == survivors == 45
    assert guarantee.total_std == pytest.approx(client_noise_std(request.sigma, 50, 0.1) * math.sqrt(45))
    assert guarantee.total_std >= request.sigma  # the worst case still carries sigma
    assert guarantee.epsilon <= 1.0 + 1e-6
    assert (guarantee.delta, guarantee.neighbouring, guarantee.k, guarantee.noise) == (1e-5, "replace-one", 5, noise)


@pytest.mark.parametrize("delta,noise,at_least", [(0.5, "gaussian", 9.8), (0.9, "gaussian", 22.1),
                                                   (0.5, "skellam", 6.0), (0.9, "skellam", 7.1)])
def test_delta_attack_is_refused(policy, delta, noise, at_least):
    # epsilon 1 announced with delta 0.5 or 0.9: sigma is calibrated for that delta ...
    request = make_request(epsilon=1.0, delta=delta, k=3, noise=noise)
    assert refused(request, policy).code == "policy_delta"
    # ... which at delta 1e-5 is worth epsilon 9.8 / 22.2 (Gaussian) or 6 / 7 (Skellam)
    l2, l1 = vote_sensitivity(3)
    accountant = "analytic" if noise == "gaussian" else "rdp"
    assert mechanism_epsilon(l2, l1, request.sigma, noise, 1e-5, accountant) >= at_least
    # a server that announces delta 1e-5 but sends that sigma is caught too
    hidden = make_request(epsilon=1.0, delta=1e-5, k=3, noise=noise, sigma=request.sigma)
    assert refused(hidden, policy).code == "noise_too_small"


def test_epsilon_above_the_node_limit_is_refused(policy):
    assert refused(make_request(epsilon=2.0), policy).code == "policy_epsilon"
    # announcing epsilon 1 with the sigma of epsilon 2: the announcement is inconsistent
    assert refused(make_request(epsilon=1.0, sigma=calibrate(2.0, 1e-5, 5, noise="skellam").sigma), policy).code \
        == "noise_too_small"


def test_overclaimed_clients_cannot_shrink_the_noise_below_the_guarantee(policy):
    # the share std is sigma / sqrt((1 - xi) n); whatever n is claimed, ceil((1 - xi) n) shares carry sigma
    honest = check_vote_request(make_request(clients=1023), policy)
    assert honest.total_std == pytest.approx(make_request(clients=1023).sigma)
    # a huge dropout with few clients leaves too few contributors
    assert refused(make_request(clients=20, dropout=0.6), policy).code == "policy_clients"
    assert refused(make_request(clients=9), policy).code == "policy_clients"
    assert check_vote_request(make_request(clients=10), policy).survivors == 10


def test_node_neighbouring_relation_and_accountant_are_its_own(tmp_path):
    request = make_request(noise="gaussian")  # the server calibrated with the analytic accountant
    auto = check_vote_request(request, NodePolicy(ledger=tmp_path / "l"))
    assert auto.epsilon == pytest.approx(1.0, rel=1e-6)
    with pytest.raises(Refusal, match="policy_epsilon"):  # RDP is looser than analytic for one release
        check_vote_request(request, NodePolicy(ledger=tmp_path / "l", accountant="rdp"))
    add_remove = check_vote_request(request, NodePolicy(ledger=tmp_path / "l", neighbouring="add-remove"))
    assert add_remove.epsilon < auto.epsilon and add_remove.neighbouring == "add-remove"
    skellam = check_vote_request(make_request(noise="skellam"), NodePolicy(ledger=tmp_path / "l"))
    l2, l1 = vote_sensitivity(5)
    assert skellam.epsilon == pytest.approx(skellam_rdp_epsilon(l2, l1, skellam.total_std**2, 1e-5)[0])


def test_candidate_list_is_checked_against_the_nodes_own_copy(tmp_path):
    own = tmp_path / "own.json"
    own.write_text(table_iii_grid().to_json())
    policy = NodePolicy(ledger=tmp_path / "l", candidates=str(own))
    check_vote_request(make_request(), policy)
    other = candidate_grid(lr=[0.1, 0.01], momentum=[0.0, 0.9])
    assert refused(make_request(candidates=other, k=2), policy).code == "candidate_mismatch"


def test_refusal_details_name_no_node_limit(tmp_path):
    policy = NodePolicy(ledger=tmp_path / "l", max_epsilon=0.37, max_delta=3.3e-6, min_clients=17)
    for request in (make_request(epsilon=0.5), make_request(delta=1e-5), make_request(clients=12)):
        detail = refused(request, policy).detail
        assert "0.37" not in detail and "3.3e-06" not in detail and "17" not in detail


def test_guarantee_epsilon_is_the_rdp_epsilon_of_the_worst_case_vote(policy):
    g = check_vote_request(make_request(clients=50, dropout=0.1), policy)
    # the ledger composes this release's curve; alone it gives the same epsilon (integer optimum on the grid)
    assert rdp_epsilon(vote_rdp(5, g.total_std, "skellam"), 1e-5)[0] == pytest.approx(g.epsilon, rel=1e-12)


def test_the_default_ledger_is_per_partition_id(monkeypatch, tmp_path):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    assert NodePolicy.from_node_config({"partition-id": 3, "num-partitions": 10}).ledger == \
        tmp_path / "dphype" / "ledger-partition-3.json" == default_ledger_path(3)
    assert NodePolicy.from_node_config({"partition-id": 3, "dphype-ledger": str(tmp_path / "own.json")}).ledger == \
        tmp_path / "own.json"  # an explicit ledger wins
    with pytest.raises(PolicyError, match="node config partition-id must be an integer >= 0"):
        NodePolicy.from_node_config({"partition-id": "../x"})


@pytest.mark.parametrize(("sigma", "code"), [(1e300, "malformed_request"), (1e20, "malformed_request"),
                                             (1e-300, "noise_too_small"), (5e-324, "noise_too_small")])
def test_absurd_sigmas_are_refused_with_a_code_not_an_arithmetic_error(tmp_path, sigma, code):
    """``sigma = 1e300`` came back as a raw OverflowError (and 1e-300 as a ZeroDivisionError) instead of a
    refusal code: the calibrated sigma is compared first, and an accountant that breaks down counts as infinite
    epsilon."""
    with pytest.raises(Refusal) as refused:
        check_vote_request(make_request(clients=10, sigma=sigma), NodePolicy(ledger=tmp_path / "l.json"))
    assert refused.value.code == code
