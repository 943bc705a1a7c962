"""Argmax mode through the protocol, the node policy, the ledger and the run accountant (no Flower, no MPC)."""

import math

import numpy as np
import pytest

from dphype.checks import EPSILON_RTOL
from dphype.config import DPHypeConfig
from dphype.flower.final_training import RunAccountant
from dphype.node.ledger import Ledger
from dphype.node.policy import NodePolicy, check_vote_request
from dphype.privacy.accounting import RDP_ORDERS, rdp_delta, rdp_epsilon
from dphype.privacy.winner import (
    WINNER_NOISE,
    discrete_laplace_pmf,
    noise_parameter,
    sampler_delta,
    winner_rdp,
)
from dphype.protocol import VoteRequest, make_vote_request
from dphype.refusal import Refusal
from dphype.release import ArgmaxRelease, SumRelease, release_mode, release_modes
from dphype.secure.committee import Tally, field_modulus, open_shares, share_context, voter_id
from dphype.secure.relay import open_sealed
from dphype.selection.candidates import candidate_grid


@pytest.fixture(scope="module")
def tallies():
    return [Tally(j) for j in range(3)]


def argmax_request(tallies, *, p=10, **changes):
    cfg = DPHypeConfig(**{"epsilon": 1.0, "delta": 1e-5, "k": 2, "clients": 10, "release": "argmax", "ballot": "top-k",
                          **changes})
    return make_vote_request(cfg, candidate_grid(lr=[10.0**-i for i in range(p)]),
                             tallies=tuple(t.public for t in tallies))


def test_release_mode_is_validated_and_read_from_the_run_config():
    with pytest.raises(ValueError, match="release must be one of sum, argmax, committee-sum, got 'max'"):
        DPHypeConfig(epsilon=1.0, delta=1e-5, k=2, clients=10, release="max")
    cfg = DPHypeConfig.from_run_config({"epsilon": 1, "delta": 1e-5, "k": 2, "clients": 10, "release": "argmax"})
    assert cfg.release == "argmax"
    assert DPHypeConfig(epsilon=1.0, delta=1e-5, k=2, clients=10).release == "sum"


def test_argmax_request_names_its_committee_and_round_trips(tallies):
    req = argmax_request(tallies)
    assert req.sigma == pytest.approx(math.sqrt(2 * math.exp(-0.5)) / (1 - math.exp(-0.5)))
    back = VoteRequest.from_record(req.to_record())
    assert back == req and back.digest() == req.digest()
    assert argmax_request(tallies[::-1]).digest() != req.digest()  # the committee is part of the request
    cfg = req.config
    with pytest.raises(ValueError, match="at least 3 tallies, got 2"):
        make_vote_request(cfg, req.candidates, tallies=req.tallies[:2])
    with pytest.raises(ValueError, match="duplicate tallies"):
        make_vote_request(cfg, req.candidates, tallies=(req.tallies[0],) * 3)
    with pytest.raises(Refusal, match="malformed_request: sigma must be"):
        VoteRequest.from_record({**req.to_record(), "dphype.sigma": req.sigma / 2})
    with pytest.raises(ValueError,
                       match=r"tallies must be empty unless release is one of the committee releases \(argmax, "
                             r"committee-sum\)"):
        VoteRequest(req.candidates, cfg.replace(release="sum"), 10.0, req.tallies)


def test_a_client_sends_its_ballot_only_and_no_tally_holds_any_of_the_noise(tallies):
    """Clients add no noise: two colluding tallies reconstruct exactly the 0/1 ballot with k ones (nothing that could
    hide a boost). No tally holds a noise value either: every tally's job carries the same public sampler, derived
    from the request alone, for one discrete Laplace per count with the request's epsilon (the MPC draws it:
    tests/secure/test_joint_noise.py)."""
    p = 100
    req = argmax_request(tallies, p=p, clients=4)
    q = field_modulus()
    scores = np.linspace(0.0, 1.0, p)
    sealed = req.mode.ballot(req, scores, maximize=True, voter=voter_id(0, 1))
    plain = {j: np.frombuffer(open_sealed(tallies[j].keys, sealed[j], context=share_context(req.digest(), j,
                                                                                         voter_id(0, 1))),
                              dtype=np.uint64) for j in range(3)}
    ballot = open_shares({j: [int(v) for v in plain[j]] for j in (0, 2)}, q)  # two tallies colluding
    assert ballot == [0] * (p - 2) + [1, 1]  # top-2 of increasing scores, and nothing else
    form = req.mode.ballot_form(req.config)
    jobs = []
    for t in (Tally(j) for j in range(3)):  # each tally node takes the committee's noise through the mode
        t.open_round("req-0", p, 0, run=0, form=form, noise=req.mode.tally_noise(req), opens=req.mode.opens)
        jobs.append(t.job())
    assert all("noise" not in job for job in jobs)
    assert jobs[0]["sampler"] == jobs[1]["sampler"] == jobs[2]["sampler"]
    sampler = req.mode.tally_noise(req)
    assert sampler.size == p and sampler.t == pytest.approx(noise_parameter(1.0))
    z = np.arange(-40, 41)
    assert np.max(np.abs(sampler.pmf(z) - discrete_laplace_pmf(z, noise_parameter(1.0)))) < 1e-12


def test_a_client_checks_its_own_ballot_against_the_form_before_it_shares(tallies, monkeypatch):
    from dphype.selection.voting import Ballot

    req = argmax_request(tallies, p=10)
    boosted = np.zeros(10, dtype=np.int64)
    boosted[:2] = 1
    boosted[5] = 30  # modified client code: 30 votes for one candidate
    monkeypatch.setattr(Ballot, "cast", lambda *args, **kwargs: boosted)
    with pytest.raises(ValueError, match=r"a ballot's entries must lie in \[0, 1\]"):
        req.mode.ballot(req, np.arange(10.0), maximize=True, voter=voter_id(0, 1))


def test_node_checks_the_committee_and_recomputes_pure_epsilon_for_its_relation(tallies, tmp_path):
    req = argmax_request(tallies)
    pins = ",".join(t.public.hex() for t in tallies)
    # safe by default: with no tallies pinned a node refuses every committee, naming the key to set
    with pytest.raises(Refusal, match="tally_committee: this node's operator pinned no tallies.*dphype-tallies"):
        check_vote_request(req, NodePolicy(min_clients=10, ledger=tmp_path / "l.json", max_epsilon=1.0))
    policy = NodePolicy(min_clients=10, ledger=tmp_path / "l.json", max_epsilon=1.0, tallies=pins)
    g = check_vote_request(req, policy)
    assert (g.noise, g.epsilon, g.survivors) == (WINNER_NOISE, pytest.approx(1.0), 10)
    # the same noise under add/remove costs half: t = e^-1/2 is e^-eps for eps = 1/2
    assert check_vote_request(req, NodePolicy(ledger=tmp_path / "l.json", neighbouring="add-remove",
                                              tallies=pins)).epsilon == pytest.approx(0.5)
    add_remove = argmax_request(tallies, neighbouring="add-remove")  # t = e^-1 is eps 2 under replace-one
    with pytest.raises(Refusal, match="policy_epsilon: the requested winner release gives epsilon 2"):
        check_vote_request(add_remove, policy)
    pinned = NodePolicy(ledger=tmp_path / "l.json", tallies=",".join(t.public.hex() for t in tallies[:2]))
    with pytest.raises(Refusal, match=r"tally_committee: tally committee has unknown tallies .*\[2\]"):
        check_vote_request(req, pinned)
    with pytest.raises(Refusal, match="policy_clients"):
        check_vote_request(argmax_request(tallies, dropout=0.2), policy)


def test_ledger_records_pure_epsilon_and_composes_it(tallies, tmp_path):
    req = argmax_request(tallies)
    policy = NodePolicy(ledger=tmp_path / "l.json", lifetime_epsilon=3.0,
                        tallies=",".join(t.public.hex() for t in tallies))
    ledger = Ledger(policy.ledger)
    g = check_vote_request(req, policy)
    spent = [ledger.spend(g, policy, req.digest()) for _ in range(3)]
    expected = rdp_epsilon(3 * winner_rdp(1.0, RDP_ORDERS), policy.max_delta)[0]
    assert spent[-1] == pytest.approx(expected) and expected < 3.0  # RDP composes below 3 x pure epsilon
    (entry, *_) = ledger.entries()
    assert (entry.noise, entry.epsilon) == (WINNER_NOISE, pytest.approx(1.0))
    with pytest.raises(Refusal, match="lifetime_budget"):
        while True:
            ledger.spend(g, policy, req.digest())
    assert ledger.spent(policy.max_delta) <= 3.0 * (1 + 1e-6)


def test_release_winner_reports_pure_epsilon_and_the_run_accountant_composes_it(tallies):
    req = argmax_request(tallies, dropout=0.2)
    with pytest.raises(ValueError, match=r"survivors must be an integer in \[7, 10\]"):  # 8 less 1 in 10 invalid
        ArgmaxRelease().release(req, 3, survivors=6)
    with pytest.raises(ValueError, match=r"index must be in \[0, 9\]"):
        ArgmaxRelease().release(req, 10, survivors=9)
    result = ArgmaxRelease().release(req, 3, survivors=9)
    assert result.selected == req.candidates[3]
    report = result.report
    assert (report.epsilon, report.delta, report.noise) == (1.0, 1e-5, WINNER_NOISE)
    assert report.accountant.startswith("report-noisy-max") and report.release_delta == sampler_delta(1.0)
    assert report.guarantee() == "(1, 2e-19)-DP"  # the release's own delta: its MPC sampler's
    assert "winning index only" in report.released and result.to_dict()["noisy_sum"] is None
    acc = RunAccountant(report, population=10, max_epsilon=None)
    # the sampler's delta is composed too: the curve's epsilon at a delta less it, never above the exact one's by much
    assert acc.get_epsilon(1e-5) == pytest.approx(rdp_epsilon(winner_rdp(1.0, RDP_ORDERS), 1e-5)[0], rel=1e-6)
    assert acc.get_epsilon(1e-5) >= rdp_epsilon(winner_rdp(1.0, RDP_ORDERS), 1e-5)[0]
    assert acc.get_delta(1.0) == pytest.approx(rdp_delta(winner_rdp(1.0, RDP_ORDERS), 1.0) + sampler_delta(1.0))
    assert acc.get_epsilon(1e-5) <= 1.0


def test_planner_predicts_both_modes_on_the_same_votes_and_recommends_one():
    from dphype.selection.planner import plan

    result = plan(20, 1.0, 1e-5, None, 100, consensus="moderate", rule="max-votes", ks=[2, 5, 15], repetitions=100,
                  search=False, release=ArgmaxRelease(), releases=release_modes())
    rows = {r["k"]: r for r in result.by_k}
    # the winner release's noise does not grow with k: at k = 15 it wins by far (std 2.8 vs 22 for the sum)
    assert rows[15]["success_winner"] > rows[15]["success"] + 0.4
    assert result.recommended_release == "argmax" and result.release == "argmax"
    assert result.k == result.recommended_k_winner and result.success == rows[result.k]["success_winner"]
    assert result.sigma == pytest.approx(math.sqrt(2 * math.exp(-0.5)) / (1 - math.exp(-0.5)))
    summed = plan(20, 1.0, 1e-5, None, 100, consensus="moderate", rule="max-votes", ks=[2, 5, 15], repetitions=100,
                  search=False, release=SumRelease())
    assert summed.release == "sum" and summed.success == {r["k"]: r for r in summed.by_k}[summed.k]["success"]
    with pytest.raises(ValueError, match="release must be one of sum, argmax, committee-sum"):
        plan(20, 1.0, 1e-5, None, 100, ks=[2], repetitions=10, search=False, release=release_mode("vector"))


@pytest.mark.parametrize(("relation", "factor", "admitted"), [
    ("replace-one", 1.0, True), ("replace-one", 1 + EPSILON_RTOL / 2, True),
    ("replace-one", 1 + 2 * EPSILON_RTOL, False), ("replace-one", 1.01, False),
    ("add-remove", 0.5, True), ("add-remove", 0.5 * (1 + 2 * EPSILON_RTOL), False)])
def test_the_nodes_argmax_epsilon_check_holds_at_its_boundary(tallies, tmp_path, relation, factor, admitted):
    """The node's limit on the pure epsilon it recomputes for an argmax request has no slack beyond
    ``EPSILON_RTOL`` (a 5% slack passed every test). Its limit is 1 under replace-one; an add-remove request's noise
    costs it twice the announced epsilon."""
    req = argmax_request(tallies, epsilon=factor, neighbouring=relation)
    policy = NodePolicy(ledger=tmp_path / "l.json", max_epsilon=1.0, min_clients=10,
                        tallies=",".join(t.public.hex() for t in tallies))
    if admitted:
        assert check_vote_request(req, policy).epsilon == pytest.approx(factor * (2 if relation == "add-remove" else 1))
    else:
        with pytest.raises(Refusal, match="policy_epsilon: the requested winner release gives epsilon"):
            check_vote_request(req, policy)
