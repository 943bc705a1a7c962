"""Release modes (dphype.release): the registry, the round trips through the configuration and JSON, and each mode's
methods against the independent formulas the other tests use (DP-Hype Appendix A for the sum release, the discrete
Laplace mechanism of dphype.privacy.winner's docstring for the winner release)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from dphype.config import DPHypeConfig
from dphype.node.policy import NodePolicy, check_vote_request
from dphype.privacy.accounting import calibrate, mechanism_epsilon, vote_sensitivity
from dphype.privacy.noise import client_noise_variance, min_survivors, replay_noisy_sums
from dphype.privacy.winner import WINNER_NOISE, replay_winners, winner_probabilities
from dphype.protocol import VoteRequest, make_vote_request
from dphype.release import (
    DEFAULT_ARGMAX_BALLOT,
    RELEASE_MODES,
    Aggregator,
    ArgmaxRelease,
    CommitteeMode,
    CommitteeSumRelease,
    ReleaseMode,
    SumRelease,
    release_mode,
    release_modes,
)
from dphype.secure.committee import OPENS_ARGMAX, OPENS_SUM, Tally
from dphype.selection.ballots import BallotForm
from dphype.selection.candidates import candidate_grid as grid
from dphype.selection.planner import Forecast, PlannedRelease, plan

CANDS = grid(lr=[10.0**-i for i in range(6)])


@pytest.fixture(scope="module")
def committee() -> tuple[bytes, ...]:
    return tuple(Tally(j).public for j in range(3))


def a_request(name: str, committee: tuple[bytes, ...], **changes: Any) -> VoteRequest:
    config = DPHypeConfig(**{"epsilon": 1.0, "delta": 1e-5, "k": 2, "clients": 10, "release": name, **changes})
    return make_vote_request(config, CANDS, tallies=committee)


# ------------------------------------------------------------------------------------------------ registry
def test_the_registry_maps_each_configuration_name_to_its_class() -> None:
    # definition order: the planner's ties go to the first
    assert RELEASE_MODES.names() == ("sum", "argmax", "committee-sum")
    assert RELEASE_MODES.get("sum") is SumRelease and RELEASE_MODES.get("argmax") is ArgmaxRelease
    assert RELEASE_MODES.get("committee-sum") is CommitteeSumRelease
    assert (SumRelease.aggregator, ArgmaxRelease.aggregator, CommitteeSumRelease.aggregator) == (
        Aggregator.SECAGG, Aggregator.COMMITTEE, Aggregator.COMMITTEE)
    assert (SumRelease.forecast, ArgmaxRelease.forecast, CommitteeSumRelease.forecast) == (
        Forecast.NOISY_SUM, Forecast.WINNER, Forecast.NOISY_SUM)
    assert release_modes() == (SumRelease(), ArgmaxRelease(), CommitteeSumRelease())
    assert SumRelease() == SumRelease() != ArgmaxRelease() and len({SumRelease(), SumRelease()}) == 1


@pytest.mark.parametrize("name", [None, "max", "Sum", 1])
def test_an_unknown_name_names_the_parameter_the_allowed_names_and_the_fix(name: Any) -> None:
    with pytest.raises(ValueError, match=r"release must be one of sum, argmax, committee-sum, got .*: set release "
                                         r".* to one of them"):
        release_mode(name)
    with pytest.raises(ValueError, match="release must be one of sum, argmax, committee-sum"):
        DPHypeConfig(epsilon=1.0, delta=1e-5, k=2, clients=10, release=name)


@pytest.mark.parametrize("name", RELEASE_MODES.names())
def test_every_mode_round_trips_through_the_configuration_and_json(name: str, committee: tuple[bytes, ...]) -> None:
    mode = release_mode(name)
    assert isinstance(mode, RELEASE_MODES.get(name)) and mode.name == name
    assert release_mode(json.loads(json.dumps(mode.name))) == mode
    config = DPHypeConfig(epsilon=1.0, delta=1e-5, k=2, clients=10, release=name)
    assert config.mode == mode and config.release == name
    assert DPHypeConfig.from_run_config({"epsilon": 1, "delta": 1e-5, "k": 2, "clients": 10, "release": name}) == config
    request = a_request(name, committee)
    assert request.mode == mode
    back = VoteRequest.from_record(json.loads(json.dumps(request.to_record())))
    assert back == request and back.mode == mode and back.digest() == request.digest()
    planned: PlannedRelease = mode  # what the planner needs of a mode
    assert planned.name == name and planned.forecast in Forecast


def test_a_subclass_that_sets_a_name_registers_itself_once() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RELEASE_MODES, "_items", RELEASE_MODES.copy()._items)  # the throwaway mode's entries

        class Louder(SumRelease):  # a variant of the sum release: one class
            name = "louder"

        assert release_mode("louder") == Louder() and "louder" in RELEASE_MODES
        assert DPHypeConfig(epsilon=1.0, delta=1e-5, k=2, clients=10, release="louder").mode == Louder()
        with pytest.raises(ValueError, match="release mode 'louder' is already registered"):
            type("Again", (SumRelease,), {"name": "louder"})
    assert RELEASE_MODES.names() == ("sum", "argmax", "committee-sum")
    with pytest.raises(TypeError):
        ReleaseMode()  # type: ignore[abstract]


def test_a_mode_is_described_by_plain_data_and_accounted_by_five_methods_of_its_own() -> None:
    """What the server, the clients, the tallies and the planner read of a mode is class data; the accounting
    defaults to the noisy vote sum's, so a mode implements only what differs."""
    assert ReleaseMode.__abstractmethods__ == {"node_cost", "ballot", "release", "replay", "describe"}
    assert CommitteeMode.__abstractmethods__ == ReleaseMode.__abstractmethods__ - {"ballot"} | {"tally_noise"}
    described = {name: (mode.aggregator, mode.opens, mode.forecast, mode.noise_inflation, mode.integer_noise,
                        mode.default_ballot, mode.graded_ballots) for name, mode in RELEASE_MODES.items()}
    assert described == {
        "sum": (Aggregator.SECAGG, None, Forecast.NOISY_SUM, 1.0, False, "top-k", False),
        "argmax": (Aggregator.COMMITTEE, OPENS_ARGMAX, Forecast.WINNER, 1.0, False, DEFAULT_ARGMAX_BALLOT, True),
        "committee-sum": (Aggregator.COMMITTEE, OPENS_SUM, Forecast.NOISY_SUM, pytest.approx(math.sqrt(1.5)), True,
                          "top-k", False)}


def test_only_the_committee_carries_tallies(committee: tuple[bytes, ...]) -> None:
    assert a_request("sum", committee).tallies == ()  # make_vote_request leaves them out for SecAgg+
    assert a_request("argmax", committee).tallies == committee
    with pytest.raises(ValueError,
                       match=r"tallies must be empty unless release is one of the committee releases \(argmax, "
                             r"committee-sum\)"):
        VoteRequest(CANDS, DPHypeConfig(epsilon=1.0, delta=1e-5, k=2, clients=10), 10.0, committee)
    with pytest.raises(ValueError, match="at least 3 tallies"):
        Aggregator.COMMITTEE.check_tallies(committee[:2])


# ---------------------------------------------------------------------------- the methods against formulas
@pytest.mark.parametrize("noise", ["skellam", "gaussian"])
def test_sum_release_methods_agree_with_appendix_a(noise: str, committee: tuple[bytes, ...], tmp_path) -> None:
    mode = SumRelease()
    request = a_request("sum", committee, noise=noise, dropout=0.3)
    cfg = request.config
    assert mode.calibrate(cfg, CANDS) == request.sigma == calibrate(1.0, 1e-5, 2, num_candidates=len(CANDS),
                                                                    noise=noise).sigma
    assert mode.accounting(request).sigma == request.sigma and mode.announced_epsilon(request) == 1.0
    # the node's worst case: ceil((1 - xi) n) shares of variance sigma^2 / ((1 - xi) n), at its own relation
    survivors = min_survivors(10, 0.3)
    total_std = math.sqrt(survivors * client_noise_variance(request.sigma, 10, 0.3))
    cost = mode.node_cost(request, survivors=survivors, delta=1e-5, accountant="auto", neighbouring="add-remove")
    l2, l1 = vote_sensitivity(2, "add-remove")
    accountant = "rdp" if noise == "skellam" else "analytic"
    assert (cost.noise, cost.accountant) == (noise, accountant)
    assert cost.total_std == pytest.approx(total_std, rel=1e-12)
    assert cost.epsilon == pytest.approx(mechanism_epsilon(l2, l1, total_std, noise, 1e-5, accountant), rel=1e-12)
    guarantee = check_vote_request(request, NodePolicy(min_clients=2, neighbouring="add-remove",
                                                       ledger=tmp_path / "l.json"))
    assert (guarantee.epsilon, guarantee.total_std) == (cost.epsilon, cost.total_std)
    # the release: the survivors' report; the replay: the privacy layer's draws, in the same order
    assert mode.release(request, np.arange(6.0), 7).report.epsilon == pytest.approx(1.0, rel=1e-6)
    drawn = mode.replay(request, np.arange(6.0), repetitions=5, rng=np.random.default_rng(3), survivors=8)
    expected = replay_noisy_sums(np.arange(6.0), sigma=request.sigma, clients=10, dropout=0.3, noise=noise,
                                 repetitions=5, rng=np.random.default_rng(3), survivors=8)
    np.testing.assert_array_equal(drawn, expected)
    assert "delta=1e-05" in mode.describe(request) and f"noise={noise!r}" in mode.describe(request)


def test_argmax_release_methods_agree_with_the_discrete_laplace_mechanism(committee: tuple[bytes, ...]) -> None:
    mode = ArgmaxRelease()
    request = a_request("argmax", committee)
    t = math.exp(-1.0 / 2)  # replace-one: t = exp(-epsilon / 2)
    assert mode.calibrate(request.config, CANDS) == request.sigma == pytest.approx(math.sqrt(2 * t) / (1 - t))
    assert mode.announced_epsilon(request) is None and mode.accounting(request).epsilon == 1.0
    # the same noise under add/remove costs half (t = e^-1/2 is e^-eps for eps = 1/2), whatever delta or accountant
    cost = mode.node_cost(request, survivors=10, delta=1e-9, accountant="rdp", neighbouring="add-remove")
    assert (cost.noise, cost.epsilon, cost.total_std) == (WINNER_NOISE, pytest.approx(0.5), request.sigma)
    result = mode.release(request, 3, 10)
    assert result.selected == CANDS[3] and result.noisy_sum is None and result.report.epsilon == 1.0
    counts = np.array([5, 7, 7, 2, 0, 1])
    np.testing.assert_array_equal(  # the committee's noise: the contributors do not change it
        mode.replay(request, counts, repetitions=20, rng=np.random.default_rng(7), survivors=9),
        replay_winners(counts, epsilon=1.0, neighbouring="replace-one", repetitions=20,
                       rng=np.random.default_rng(7)))
    # the committee samples one discrete Laplace per count (no share per tally): the exact law's frequencies
    picks = mode.replay(request, counts, repetitions=50_000, rng=np.random.default_rng(6))
    np.testing.assert_allclose(np.bincount(picks, minlength=6) / picks.size, winner_probabilities(counts, 1.0),
                               atol=0.01)
    sampler = mode.tally_noise(request)  # every tally derives the same sampler from the request
    assert sampler == mode.tally_noise(request) and sampler.size == len(CANDS) and sampler.t == pytest.approx(t)
    assert "tallies=3, ballots verified" in mode.describe(request) and "delta" not in mode.describe(request)


def test_a_replayed_release_is_a_release_input(committee: tuple[bytes, ...]) -> None:
    votes = np.array([0.0, 9.0, 2.0, 8.0, 0.0, 1.0])
    for name in RELEASE_MODES.names():
        request = a_request(name, committee, epsilon=50.0)
        (opened,) = request.mode.replay(request, votes, repetitions=1, rng=np.random.default_rng(0))
        assert request.mode.release(request, opened, 10).selected_index == 1


# -------------------------------------------------------------------------------------------- the planner
def test_the_planner_predicts_the_mode_it_is_given() -> None:
    common: dict[str, Any] = dict(consensus="moderate", rule="max-votes", ks=[2, 5], repetitions=50, search=False)
    unnamed = plan(20, 1.0, 1e-5, None, 50, **common)
    summed = plan(20, 1.0, 1e-5, None, 50, release=SumRelease(), **common)
    winner = plan(20, 1.0, 1e-5, None, 50, release=ArgmaxRelease(), releases=release_modes(), **common)
    assert (unnamed.release, unnamed.recommended_release) == (None, None) and summed.release == "sum"
    assert unnamed.success == summed.success and summed.recommended_release == "sum"
    assert winner.release == "argmax" and winner.recommended_release in RELEASE_MODES
    assert winner.success == {r["k"]: r for r in winner.by_k}[winner.k]["success_winner"]


# -------------------------------------------------------------------------------------------- committee sum
def test_the_committee_sum_is_the_sum_releases_accounting_with_noise_the_tallies_make(
        committee: tuple[bytes, ...]) -> None:
    from dphype.secure.committee import Opening

    mode = CommitteeSumRelease()
    request = a_request("committee-sum", committee, dropout=0.2)  # at least 8 valid ballots of 10
    summed = SumRelease().calibrate(request.config, CANDS)
    assert request.sigma == mode.calibrate(request.config, CANDS) == pytest.approx(summed)
    with pytest.raises(ValueError, match=r"noise must be 'skellam', got 'gaussian' \(--noise skellam\)"):
        a_request("committee-sum", committee, noise="gaussian")
    # the noise is the committee's: the node's cost does not depend on the contributors
    costs = {n: mode.node_cost(request, survivors=n, delta=1e-5, accountant="auto", neighbouring="replace-one")
             for n in (2, 10)}
    l2, l1 = vote_sensitivity(2, "replace-one")
    assert costs[2] == costs[10] and costs[2].total_std == request.sigma
    assert costs[2].epsilon == pytest.approx(mechanism_epsilon(l2, l1, request.sigma, "skellam", 1e-5, "rdp"))
    assert costs[2].epsilon <= 1.0 * (1 + 1e-6)
    # any 2 of the 3 tallies' shares carry sigma^2; all 3 (the replay) 1.5 sigma^2, one share per tally or summed
    two = np.concatenate([mode.tally_noise(request) + mode.tally_noise(request) for _ in range(4000)])
    assert np.var(two) == pytest.approx(request.sigma**2, rel=0.05)
    votes = np.zeros(len(CANDS))
    for per_tally in (False, True):
        noisy = mode.replay(request, votes, repetitions=4000, rng=np.random.default_rng(3), per_client=per_tally)
        assert np.var(noisy) == pytest.approx(1.5 * request.sigma**2, rel=0.05)
    noisy_sum = (1, 30, 2, 9, 0, 1)
    result = mode.release(request, Opening(noisy_sum, ("7",)), 10)  # 9 valid ballots of 10 contributors
    assert result.noisy_sum is not None and result.noisy_sum.tolist() == list(noisy_sum)
    assert result.selection is not None and result.selected_index == 1
    assert (result.report.survivors, result.report.excluded, result.report.ballots_verified) == (9, ("7",), True)
    assert result.report.sigma == pytest.approx(request.sigma) and result.report.noise == "skellam"
    assert "ballots: verified by the tally committee under MPC (1 invalid left out, from contributors 7)" in (
        result.summary())
    with pytest.raises(ValueError, match=r"survivors must be an integer in \[7, 10\]"):  # 8 less 1 in 10
        mode.release(request, Opening(noisy_sum, ("6", "7", "8", "9")), 10)  # 6 valid ballots: below the floor
    assert "ballots verified, committee noise std=" in mode.describe(request)
# ----------------------------------------------------------------------------------- the ballot
def test_each_mode_has_its_default_ballot_and_only_argmax_takes_graded_ones() -> None:
    base = {"epsilon": 1.0, "delta": 1e-5, "k": 2, "clients": 10}
    assert DPHypeConfig(**base).ballot == "top-k"
    argmax = DPHypeConfig(**base, release="argmax")
    assert argmax.ballot == ArgmaxRelease.default_ballot == DEFAULT_ARGMAX_BALLOT in ("share", "auto")
    from dphype.privacy.winner import noise_std
    from dphype.selection.voting import auto_depth, share_depth

    k = {"share": share_depth(100, noise_std(1.0)), "auto": auto_depth(100, noise_std(1.0), 10)}
    assert ArgmaxRelease().votes_per_client(argmax, 100) == k[DEFAULT_ARGMAX_BALLOT]
    assert ArgmaxRelease().ballot_form(argmax, 100) == BallotForm.top_k(k[DEFAULT_ARGMAX_BALLOT])
    for name in k:  # both selectable: k from p and epsilon (share), from p, epsilon and n (auto)
        assert ArgmaxRelease().votes_per_client(argmax.replace(ballot=name), 100) == k[name]
    with pytest.raises(ValueError, match="needs the number of candidates"):
        ArgmaxRelease().ballot_form(argmax)
    with pytest.raises(ValueError, match=r"ballot must be 'top-k' for release='sum'"):
        DPHypeConfig(**base, ballot="auto")
    graded = DPHypeConfig(**base, release="argmax", ballot="rank:20:2")
    assert graded.ballot == "rank:20:2" and graded.replace(release="sum").ballot == "top-k"
    assert graded.replace(epsilon=0.5).ballot == "rank:20:2"
    with pytest.raises(ValueError, match=r"ballot must be 'top-k' for release='sum'.*set ballot='top-k'"):
        DPHypeConfig(**base, ballot="score:0.05")
    with pytest.raises(ValueError, match=r"ballot must be .*got 'borda'.*set ballot"):
        DPHypeConfig(**base, release="argmax", ballot="borda")
    assert DPHypeConfig.from_run_config({**base, "release": "argmax", "ballot": "score:0.1"}).ballot == "score:0.1"
    # "default" (a run config holds no None): the release's own
    assert DPHypeConfig.from_run_config({**base, "release": "sum", "ballot": "default"}).ballot == "top-k"
    assert DPHypeConfig.from_run_config({**base, "release": "argmax", "ballot": "default"}).ballot \
        == DEFAULT_ARGMAX_BALLOT


def test_a_graded_argmax_request_carries_its_ballot_and_scales_its_noise(committee: tuple[bytes, ...]) -> None:
    request = a_request("argmax", committee, ballot="rank:10")
    top_k = a_request("argmax", committee, ballot="top-k")
    assert request.sigma == pytest.approx(15 * top_k.sigma, rel=0.02)  # std ~ sqrt(2) shift G / eps
    back = VoteRequest.from_record(json.loads(json.dumps(request.to_record())))
    assert back == request and back.config.ballot == "rank:10" and back.digest() == request.digest()
    assert request.digest() != top_k.digest()
    mode = request.mode
    assert mode.ballot_form(request.config, len(CANDS)) == BallotForm(15, 54, 54)  # depth cut to p = 6: 15+13+10+8+5+3
    assert mode.accounting(request).sensitivity == 15
    cost = mode.node_cost(request, survivors=10, delta=1e-5, accountant="auto", neighbouring="replace-one")
    assert cost.epsilon == pytest.approx(1.0)
    cost = mode.node_cost(request, survivors=10, delta=1e-5, accountant="auto", neighbouring="add-remove")
    assert cost.epsilon == pytest.approx(0.5)
    with pytest.raises(ValueError, match="sigma must be"):
        VoteRequest(request.candidates, request.config, top_k.sigma, request.tallies)


def test_the_planner_forecasts_the_committees_noisy_sum_with_all_its_noise_shares() -> None:
    """The committee's noisy sum carries all 3 tallies' shares (std sqrt(3/2) sigma): its forecast is the sum
    release's with that noise, below the plain sum's on the same votes, and the same sigma is reported."""
    from dphype.selection.planner import plan

    assert SumRelease().noise_inflation == 1.0 and ArgmaxRelease().noise_inflation == 1.0
    assert CommitteeSumRelease().noise_inflation == pytest.approx(np.sqrt(1.5))
    common = {"clients": 20, "epsilon": 1.0, "delta": 1e-5, "space": None, "num_candidates": 30, "k": 3,
              "rule": "max-votes", "repetitions": 400}
    summed, committee = plan(**common, release=SumRelease()), plan(**common, release=CommitteeSumRelease())
    assert committee.sigma == summed.sigma
    assert committee.success < summed.success


def test_the_default_ballot_request_still_refuses_a_k_above_the_candidates(committee: tuple[bytes, ...]) -> None:
    """The default ballot picks its own k, but a configured k outside [1, p] is still an error (server side,
    before any client works), never silently ignored; at k = p it is accepted."""
    assert a_request("argmax", committee, k=len(CANDS)).config.ballot == DEFAULT_ARGMAX_BALLOT
    with pytest.raises(ValueError, match=rf"k must be an integer in \[1, {len(CANDS)}\], got {len(CANDS) + 1}$"):
        a_request("argmax", committee, k=len(CANDS) + 1)
