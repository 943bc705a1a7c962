"""Every slack of the request checks at its boundary: just inside passes, just outside (and a few percent outside)
is refused. The slacks are ``EPSILON_RTOL`` (the announced epsilon against the one recomputed from sigma, the
node's epsilon limit on the announced and on the recomputed epsilon, the lifetime budget) and the rounding of
``(1 - xi) n`` in the survivor rule."""

from __future__ import annotations

import pytest
from helpers import make_request

from dphype.node.ledger import Ledger
from dphype.node.policy import NodePolicy, check_vote_request
from dphype.privacy.accounting import calibrate, mechanism_epsilon, vote_sensitivity
from dphype.privacy.accounting import epsilon as release_epsilon
from dphype.privacy.noise import client_noise_variance, min_survivors
from dphype.protocol import EPSILON_RTOL, check_request
from dphype.refusal import Refusal

INSIDE = 1 + EPSILON_RTOL / 2
#: Just outside, and 3% outside (a 5% slack, or any slack above 3%, lets the latter through).
OUTSIDE = (1 + 2 * EPSILON_RTOL, 1.03)


def refusal(check, *args) -> str:
    with pytest.raises(Refusal) as info:
        check(*args)
    return info.value.code


@pytest.mark.parametrize("noise", ["skellam", "gaussian"])
def test_announced_epsilon_against_the_one_sigma_gives(noise):
    sigma = calibrate(1.0, 1e-5, 5, noise=noise).sigma
    request = make_request(noise=noise)
    promised = release_epsilon(request.mode.accounting(request), 1e-5)  # what sigma gives, recomputed
    check_request(make_request(epsilon=promised / INSIDE, noise=noise, sigma=sigma))
    for factor in OUTSIDE:
        request = make_request(epsilon=promised / factor, noise=noise, sigma=sigma)
        assert refusal(check_request, request) == "noise_too_small"


def test_node_limit_on_the_announced_epsilon(tmp_path):
    # announced 1.02 at delta 1e-6 with its calibrated noise, at a node whose delta is 1e-5: at the node's delta
    # the recomputed epsilon is below 1.02, so only the announced epsilon meets the node's limit
    request = make_request(epsilon=1.02, delta=1e-6)
    assert check_vote_request(request, NodePolicy(max_epsilon=10.0, ledger=tmp_path / "l")).epsilon < 1.02 / 1.03
    check_vote_request(request, NodePolicy(max_epsilon=1.02 / INSIDE, ledger=tmp_path / "l"))
    for factor in OUTSIDE:
        policy = NodePolicy(max_epsilon=1.02 / factor, ledger=tmp_path / "l")
        assert refusal(check_vote_request, request, policy) == "policy_epsilon"


def test_node_limit_on_the_recomputed_epsilon(tmp_path):
    # a Gaussian request calibrated with the analytic accountant, at a node that accounts in RDP: the node's
    # epsilon of the worst-case noise is above the announced 1, so only the recomputed epsilon meets the limit
    request = make_request(noise="gaussian", clients=20, dropout=0.1)
    survivors = min_survivors(20, 0.1)
    total_std = (survivors * client_noise_variance(request.sigma, 20, 0.1)) ** 0.5
    l2, l1 = vote_sensitivity(5)
    node_epsilon = mechanism_epsilon(l2, l1, total_std, "gaussian", 1e-5, "rdp")
    assert node_epsilon > 1.03 * 1.02  # the announced epsilon (1) stays below every limit tried here
    inside = NodePolicy(max_epsilon=node_epsilon / INSIDE, accountant="rdp", ledger=tmp_path / "l")
    assert check_vote_request(request, inside).epsilon == pytest.approx(node_epsilon, rel=1e-12)
    for factor in OUTSIDE:
        policy = NodePolicy(max_epsilon=node_epsilon / factor, accountant="rdp", ledger=tmp_path / "l")
        assert refusal(check_vote_request, request, policy) == "policy_epsilon"


def test_lifetime_budget(tmp_path):
    guarantee = check_vote_request(make_request(), NodePolicy(ledger=tmp_path / "l"))
    ledger = Ledger(tmp_path / "ledger.json")
    after = ledger.check(guarantee, NodePolicy(lifetime_epsilon=100.0, ledger=ledger.path))  # one vote, empty ledger
    assert after == pytest.approx(guarantee.epsilon, rel=1e-9)
    ledger.check(guarantee, NodePolicy(lifetime_epsilon=after / INSIDE, ledger=ledger.path))
    for factor in OUTSIDE:
        policy = NodePolicy(lifetime_epsilon=after / factor, ledger=ledger.path)
        assert refusal(ledger.check, guarantee, policy) == "lifetime_budget"


def test_survivor_rule_rounds_only_float_noise():
    # (1 - xi) n within 1e-9 of an integer counts as that integer (the variance moves by < 1e-9 relative);
    # a real fraction above it needs one survivor more
    assert min_survivors(10, 0.3) == 7  # (1 - 0.3) * 10 = 7.000000000000001 in floating point
    assert min_survivors(10, 0.3 - 0.5e-10) == 7
    assert min_survivors(10, 0.3 - 2e-10) == 8
    assert min_survivors(10, 0.3 + 1e-12) == 7
