"""The planner (dphype.selection.planner): exact samplers of the loss model, Theorem IV.1, the synthetic study's
measured success rates, recommendations, the CLI and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dphype.checks import MAX_CLIENTS
from dphype.cli import main
from dphype.privacy.winner import noise_std
from dphype.release import ArgmaxRelease
from dphype.selection.candidates import candidate_grid, table_iii_grid
from dphype.selection.loss_model import _distinct_uniform
from dphype.selection.planner import (
    LossModel,
    _smallest_clients,
    check_plan,
    plan,
    ranking_from_losses,
    ranking_prefix,
    scenario,
    simulate_votes,
    theorem_iv1_success,
    unanimous_success,
    vote_counts,
)
from dphype.selection.rules import good_selection_probability_bound, selection_gap
from dphype.selection.voting import Ballot, top_k_votes


def test_ranking_prefix_gives_the_library_top_k_votes() -> None:
    rng = np.random.default_rng(1)
    model = LossModel(num_good=3, num_candidates=40, sigma_loss=0.6)
    losses = model.losses(50, rng)
    prefix = ranking_from_losses(losses, 20)
    for k in (1, 3, 7, 20):
        counts = vote_counts(prefix, [k], reps=5, clients=10, num_candidates=40)[k]
        expected = np.stack([top_k_votes(row, k, maximize=False) for row in losses])
        assert np.array_equal(counts, expected.reshape(5, 10, 40).sum(axis=1))


def test_rank_keys_order_candidates_like_the_losses() -> None:
    from scipy.special import log_ndtr

    model = LossModel(num_good=6, num_candidates=80, sigma_loss=0.3)
    losses = model.losses(200, np.random.default_rng(5)).astype(np.float64)
    keys = log_ndtr((losses - 1.0) / model.sigma_loss)  # the direct sampler's keys (before negation)
    assert np.array_equal(ranking_from_losses(losses, 30), ranking_from_losses(keys, 30))


@pytest.mark.parametrize("sampler", ["direct", "order"])
def test_fast_samplers_match_the_loss_sampler(sampler: str) -> None:
    model = LossModel(num_good=4, num_candidates=150, sigma_loss=0.45)
    rows, depth = 40_000, 20
    reference = ranking_prefix(model, rows, depth, np.random.default_rng(2), sampler="losses")
    fast = ranking_prefix(model, rows, depth, np.random.default_rng(3), sampler=sampler)
    for prefix in (reference, fast):  # every row is a ranking: distinct candidates
        srt = np.sort(prefix, axis=1)
        assert not np.any(srt[:, 1:] == srt[:, :-1])
        assert prefix.min() >= 0 and prefix.max() < model.num_candidates
    # P(rank t holds a good candidate) for every rank t: 20 proportions from 40k rows each
    p_ref = (reference < model.num_good).mean(axis=0)
    p_fast = (fast < model.num_good).mean(axis=0)
    se = np.sqrt((p_ref * (1 - p_ref) + p_fast * (1 - p_fast)) / rows) + 1e-9
    assert np.max(np.abs(p_ref - p_fast) / se) < 4.5
    # which good / bad candidate holds the votes is uniform within each group
    for prefix in (reference, fast):
        top5 = prefix[:, :5].ravel()
        good_freq = np.bincount(top5[top5 < 4], minlength=4)
        assert good_freq.min() / good_freq.max() > 0.95
        bad_freq = np.bincount(top5[top5 >= 4] - 4, minlength=146)
        assert bad_freq.std() / bad_freq.mean() < 0.25


def test_distinct_uniform_tuples() -> None:
    rng = np.random.default_rng(4)
    tuples = _distinct_uniform(rng, 30_000, 8, 12)
    srt = np.sort(tuples, axis=1)
    assert not np.any(srt[:, 1:] == srt[:, :-1])
    # every (position, value) pair is equally likely: 1/12
    freq = np.stack([np.bincount(tuples[:, j], minlength=12) for j in range(8)]) / 30_000
    assert np.allclose(freq, 1 / 12, atol=0.012)



@pytest.mark.parametrize(
    "sigma_loss, k, measured",  # results/paper.md, Fig. 2a: n = 250, epsilon = 0.25, |H_good| = 5 of 100, 5000 runs
    [(0.5, 1, 0.796), (0.5, 5, 0.961), (1.0, 1, 0.231), (1.0, 5, 0.344)],
)
def test_planner_reproduces_the_synthetic_studys_measured_success(sigma_loss, k, measured):
    result = plan(250, 0.25, 1e-5, None, 100, k=k, consensus=sigma_loss, num_good=5, rule="max-votes",
                  noise="gaussian", accountant="rdp", ks=[k], repetitions=1500, search=False)
    se = np.sqrt(measured * (1 - measured) * (1 / 1500 + 1 / 5000))
    assert abs(result.success - measured) < 4 * se
    assert result.success == result.success_max_votes and result.rule == "max-votes"


def test_theorem_iv1_bound_by_hand_and_below_the_simulated_success():
    votes = np.array([[40, 35, 10, 8, 0, 0]])
    good = np.array([[True, True, False, False, False, False]])
    sigma = 4.0
    # best H': {0, 1} with gap 35 - 10 = 25, or {0} with gap 40 - 35 = 5 (the other good one counts as bad)
    by_hand = max(good_selection_probability_bound(selection_gap(votes[0], [0, 1]), sigma, 2, 4),
                  good_selection_probability_bound(selection_gap(votes[0], [0]), sigma, 1, 5))
    assert theorem_iv1_success(votes, good, sigma) == pytest.approx(by_hand)
    # strong consensus, many clients: the theorem is informative and never above the simulated success
    result = plan(250, 1.0, 1e-5, None, 100, consensus="strong", rule="max-votes", noise="gaussian",
                  accountant="rdp", ks=[1, 5, 25], repetitions=400, search=False)
    rows = {r["k"]: r for r in result.by_k}
    assert rows[5]["bound"] > 0.9
    for row in rows.values():
        assert row["bound"] <= row["success_max_votes"] + 1e-9


def test_unanimous_success_matches_simulation():
    rng = np.random.default_rng(0)
    n, k, p, sigma = 10, 3, 40, 6.0
    noisy = np.zeros((20000, p))
    noisy[:, :k] = n
    noisy += sigma * rng.standard_normal(noisy.shape)
    rate = np.mean(np.argmax(noisy, axis=1) < k)
    assert unanimous_success(n, k, p, sigma) == pytest.approx(rate, abs=0.01)


def test_simulated_votes_place_good_candidates_on_a_neighbourhood():
    space = table_iii_grid().feature_space()
    votes, good = simulate_votes(scenario(100, "strong", 4), 30, [1, 4], 100, space, 50, np.random.default_rng(1))
    assert good.sum(axis=1).tolist() == [4] * 50
    assert np.all(votes[1].sum(axis=1) == 30) and np.all(votes[4].sum(axis=1) == 120)
    # strong consensus: most votes of k = 4 go to the 4 good candidates (a bad loss N(1, 0.25^2) undercuts a
    # good one N(0, 0.25^2) with probability Phi(-1 / 0.354) = 0.0023, against 96 bad candidates)
    assert 0.9 < (votes[4] * good).sum() / votes[4].sum() < 0.97
    # each good set is the 4 nearest candidates of one centre: small diameter in the feature space
    for mask in good:
        pts = space.numeric[mask]
        assert np.max(np.linalg.norm(pts[:, None] - pts[None], axis=2)) < 1.0


def test_plan_recommends_the_best_k_and_finds_min_epsilon_and_clients():
    result = plan(60, 0.5, 1e-5, None, 100, consensus="moderate", rule="max-votes", noise="gaussian",
                  accountant="rdp", ks=[1, 3, 5, 10], repetitions=300, target=0.8)
    best = max(result.by_k, key=lambda r: (r["success"], -r["k"]))
    assert result.recommended_k == best["k"] == result.k and result.success == best["success"]
    assert result.min_epsilon is not None and result.min_clients is not None
    common = dict(k=result.k, consensus="moderate", rule="max-votes", noise="gaussian", accountant="rdp",
                  ks=[result.k], repetitions=300, search=False)
    assert plan(60, result.min_epsilon * 1.03, 1e-5, None, 100, **common).success >= 0.8
    assert plan(60, result.min_epsilon / 1.1, 1e-5, None, 100, **common).success < 0.8
    assert plan(result.min_clients, 0.5, 1e-5, None, 100, **common).success >= 0.8
    assert plan(result.min_clients - 1, 0.5, 1e-5, None, 100, **common).success < 0.8


@pytest.mark.parametrize("start", [2, 3, 10, 36, 37, 38, 500, MAX_CLIENTS])
@pytest.mark.parametrize("answer", [2, 3, 37, 4_999, MAX_CLIENTS, None])
def test_smallest_clients_search_finds_the_boundary_from_any_start(start, answer):
    asked: list[int] = []

    def ok(n: int) -> bool:
        assert 2 <= n <= MAX_CLIENTS
        asked.append(n)
        return answer is not None and n >= answer

    assert _smallest_clients(ok, start) == answer
    if answer is None:
        assert max(asked) == MAX_CLIENTS
    elif start >= answer:
        assert max(asked) == start  # it only halves down from the run's n
    else:
        assert max(asked) < 2 * answer or max(asked) == MAX_CLIENTS  # it doubles past the answer once at most


def test_structure_aware_rule_in_the_planner():
    cands = candidate_grid(lr=[float(x) for x in np.logspace(-5, 0, 8)], decay=[0.0, 0.5, 1.0], momentum=[0.0, 0.9])
    result = plan(30, 1.0, 1e-5, cands.feature_space(), len(cands), k=6, num_good=6, consensus="moderate", ks=[6],
                  repetitions=400, search=False)
    assert result.rule == "gp"
    # the good neighbourhood is found more often (measured 0.835 vs 0.633; 400 runs: std error <= 0.025)
    assert result.success > result.success_max_votes + 0.1


def test_preflight_warns_and_refuses():
    quiet = check_plan(100, 1.0, 1e-5, None, 100, 5, consensus="strong", rule="max-votes", repetitions=100)
    assert quiet.warnings == [] and quiet.success > 0.9
    noisy = check_plan(10, 0.01, 1e-5, None, 100, 5, rule="max-votes", repetitions=100)
    assert any("release is noise" in w for w in noisy.warnings)
    assert any("(< 0.5)" in w for w in noisy.warnings)
    with pytest.raises(ValueError, match=r"(?s)^clients=10 is too few to select at epsilon 0.01: even 160 clients "
                                         r"would not reach it \(or epsilon >= [0-9.]+\).*< min-success 0.5"):
        check_plan(10, 0.01, 1e-5, None, 100, 5, rule="max-votes", repetitions=100, min_success=0.5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(clients=1), r"clients must be an integer in \[2, 10000\], got 1"),
        (dict(clients=20000), r"clients must be an integer in \[2, 10000\]"),
        (dict(epsilon=0.0), r"epsilon must be a finite number > 0"),
        (dict(delta=1.0), r"delta must be a number in \(0, 1\)"),
        (dict(k=101), r"k must be an integer in \[1, 100\]"),
        (dict(dropout=1.0), r"dropout must be a number in \[0, 1\)"),
        (dict(target=1.5), r"target must be a number in \[0, 1\]"),
        (dict(consensus="lukewarm"), r"consensus must be one of strong, moderate, weak"),
        (dict(consensus=-1.0), r"consensus must be a finite number > 0"),
        (dict(num_good=100), r"num_good must be an integer in \[1, 99\]"),
        (dict(repetitions=5), r"repetitions must be an integer >= 10"),
        (dict(rule="median"), r"rule must be one of max-votes, gp"),
        (dict(noise="laplace"), r"noise must be one of gaussian, skellam"),
    ],
)
def test_planner_refuses_bad_values(kwargs, message):
    args = dict(clients=50, epsilon=1.0, delta=1e-5, space=None, num_candidates=100, repetitions=20,
                search=False, rule="max-votes") | kwargs
    with pytest.raises(ValueError, match=message):
        plan(**args)


def test_plan_cli_json_and_min_success(capsys):
    argv = ["plan", "--clients", "40", "--epsilon", "2", "--delta", "1e-5", "--candidates", "table3:random:30:0",
            "--k", "3", "--rule", "max-votes", "--repetitions", "50", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("success", "recommended_k", "min_epsilon", "min_clients", "bound", "by_k", "scenario", "warnings"):
        assert key in out
    assert out["k"] == 3 and 0.0 <= out["success"] <= 1.0
    assert main(argv[:-1] + ["--min-success", "1.0", "--clients", "2"]) == 2
    assert "min_success" in capsys.readouterr().err
    assert main(["plan", "--clients", "40", "--epsilon", "1", "--delta", "1e-5", "--candidates", "table3",
                 "--min-success", "2"]) == 2
    assert "min_success must be a number in [0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize("noise", ["skellam", "gaussian"])
@pytest.mark.parametrize("dropout,voters", [(0.5, 10), (0.3, 14)])
def test_dropout_is_planned_as_its_worst_case(noise, dropout, voters):
    # 20 clients tolerating xi: only ceil((1 - xi) 20) vote, and their shares add up to exactly sigma, which is
    # the run of that many clients without dropout (same voters, same total noise, common random numbers)
    kw = dict(k=5, rule="max-votes", noise=noise, ks=[5], repetitions=300, search=False)
    dropped = plan(20, 1.0, 1e-5, None, 100, dropout=dropout, **kw)
    fewer = plan(voters, 1.0, 1e-5, None, 100, **kw)
    full = plan(20, 1.0, 1e-5, None, 100, **kw)
    assert (dropped.voters, fewer.voters, full.voters) == (voters, voters, 20)
    assert dropped.success == pytest.approx(fewer.success, abs=1e-12)
    assert dropped.unanimous_success == pytest.approx(fewer.unanimous_success, abs=1e-12)
    assert dropped.success < full.success - 0.05  # fewer votes under the same noise: a worse prediction


def test_winner_release_ties_go_to_the_number_of_good_candidates_when_it_is_tied() -> None:
    """At saturation (n = 100, epsilon 1, add/remove) every k simulates success 1.0 under the moderate scenario
    (5 good candidates of 100): the tie goes to k = 5, a vote for exactly the good ones, not to the smallest k;
    with ``--good 8`` to k = 8."""
    space = table_iii_grid().feature_space()
    result = plan(100, 1.0, 1e-5, space, 100, release=ArgmaxRelease(), neighbouring="add-remove", rule="max-votes",
                  search=False)
    tied = [r["k"] for r in result.by_k if r["success_winner"] == 1.0]
    assert len(tied) > 3 and min(tied) < 5 and 5 in tied
    assert result.recommended_k_winner == result.k == 5
    assert all("success_winner_tie_break" not in r for r in result.by_k)  # no weaker scenario was needed
    eight = plan(100, 1.0, 1e-5, space, 100, release=ArgmaxRelease(), neighbouring="add-remove", num_good=8,
                 rule="max-votes", search=False)
    assert 8 in [r["k"] for r in eight.by_k if r["success_winner"] == 1.0] and eight.recommended_k_winner == 8


def test_winner_release_other_ties_are_broken_under_twice_the_disagreement() -> None:
    """Ties without k = |H_good| among them (here ks without 5, at saturation): the tied k that the weak scenario
    (sigma_loss 1.0, twice moderate's) simulates best, with exactly the successes that a plan under the weak
    scenario over those k reports; not the smallest k."""
    space = table_iii_grid().feature_space()
    ks = [1, 2, 3, 8, 10, 15]
    result = plan(100, 1.0, 1e-5, space, 100, release=ArgmaxRelease(), neighbouring="add-remove", ks=ks,
                  rule="max-votes", search=False)
    top = max(r["success_winner"] for r in result.by_k)
    tied = [r["k"] for r in result.by_k if r["success_winner"] == top]
    assert top == 1.0 and len(tied) > 1
    weak = plan(100, 1.0, 1e-5, space, 100, release=ArgmaxRelease(), neighbouring="add-remove", consensus="weak",
                ks=tied, rule="max-votes", search=False)
    weak_rows = {r["k"]: r["success_winner"] for r in weak.by_k}
    for row in result.by_k:
        if row["k"] in tied:
            assert row["success_winner_tie_break"] == weak_rows[row["k"]]
        else:
            assert "success_winner_tie_break" not in row
    best = max(weak_rows.values())
    assert result.recommended_k_winner == min(k for k, s in weak_rows.items() if s == best)
    assert result.recommended_k_winner > min(tied)  # the smallest saturated k is not the weak scenario's best
    assert result.k == result.recommended_k_winner


def test_winner_release_without_ties_takes_the_highest_success() -> None:
    """n = 10, epsilon 1, replace-one: one k simulates the highest success; no tie-break is simulated."""
    space = table_iii_grid().feature_space()
    result = plan(10, 1.0, 1e-5, space, 100, release=ArgmaxRelease(), rule="max-votes", search=False)
    best = max(result.by_k, key=lambda r: r["success_winner"])
    assert sum(r["success_winner"] == best["success_winner"] for r in result.by_k) == 1
    assert result.recommended_k_winner == best["k"]
    assert all("success_winner_tie_break" not in r for r in result.by_k)


def test_the_winner_plan_with_a_measured_ballot_quotes_the_shipped_tables_nearest_cell(capsys):
    from dphype.selection.measured import MEASURED_BALLOT, load_measured, measured_ballots, measured_within

    table = load_measured()
    assert MEASURED_BALLOT == ArgmaxRelease.default_ballot and MEASURED_BALLOT in measured_ballots()
    assert {cell[2] for cell in table} == {"replace-one", "add-remove"}
    for (ballot, p, relation, n, eps), points in table.items():  # every cell is on the grid at its own point
        got = measured_within(n, eps, relation, p, ballot)
        assert got["on_grid"] and got["federations"] == len(points) and got["outside"] == []
        assert got["gap_points"]["median"] == pytest.approx(float(np.median([x.gap_points for x in points])))
    kw = dict(k=6, ks=[6], repetitions=50, search=False, release=ArgmaxRelease())
    auto = plan(20, 1.0, 1e-5, None, 100, ballot=MEASURED_BALLOT, **kw)
    assert auto.within_opt == measured_within(20, 1.0, "replace-one")
    iid = plan(20, 1.0, 1e-5, None, 100, ballot=MEASURED_BALLOT, partition="iid", **kw)
    assert iid.within_opt == measured_within(20, 1.0, partition="iid")
    assert plan(20, 1.0, 1e-5, None, 100, ballot="top-k", **kw).within_opt is None  # top-k was not measured
    summed = plan(20, 1.0, 1e-5, None, 100, ballot=MEASURED_BALLOT, k=6, ks=[6], repetitions=50, search=False)
    assert summed.within_opt is None and "simulates a good pick" in summed.advice()  # no measurement applies
    # no chance of a good pick is claimed: the measured gaps of the cell, in the run's own terms
    assert auto.predicted_success is None and auto.to_dict()["predicted_success"] is None
    gap = auto.within_opt["gap_points"]
    assert auto.advice().startswith(f"100 candidates, 20 voters, epsilon 1: bench gap to Opt median "
                                    f"{gap['median']:.1f}, p90 {gap['p90']:.1f} points")
    assert not any("bench" in w for w in auto.warnings)  # the advice is said once, not again as a warning
    # dphype plan: the argmax release's default ballot reports at its own k, with the measured cell
    assert main(["plan", "--clients", "20", "--epsilon", "1", "--delta", "1e-5", "--candidates", "8",
                 "--release", "argmax", "--repetitions", "30", "--partition", "iid", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["k"] == Ballot.parse(MEASURED_BALLOT).resolve(8, noise_std(1.0), 20).depth
    assert out["within_opt"] == measured_within(20, 1.0, num_candidates=8, partition="iid")
    assert out["predicted_success"] is None and out["advice"].startswith("8 candidates, 20 voters, epsilon 1: ")
    assert "p outside the grid" in out["advice"] and len(out["advice"]) < 200
    assert main(["plan", "--clients", "20", "--epsilon", "1", "--delta", "1e-5", "--candidates", "8",
                 "--release", "argmax", "--repetitions", "30", "--partition", "iid"]) == 0
    text = capsys.readouterr().out.splitlines()  # readable: the advice first, once
    assert text[0] == f"advice: {out['advice']}" and sum(out["advice"] in line for line in text) == 1
    assert main(["plan", "--clients", "20", "--epsilon", "1", "--delta", "1e-5", "--candidates", "table3",
                 "--release", "argmax", "--ballot", "top-k", "--k", "5", "--repetitions", "30", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["k"] == 5 and out["within_opt"] is None
    assert main(["plan", "--clients", "20", "--epsilon", "1", "--delta", "1e-5", "--candidates", "table3",
                 "--ballot", "rank:5"]) == 2
    assert "ballot must be 'top-k' for release='sum'" in capsys.readouterr().err


def test_a_huge_epsilon_plans_without_noise_instead_of_dividing_by_it() -> None:
    assert unanimous_success(10, 5, 100, 0.0) == 1.0  # no noise: the unanimous counts always lead
    winner = check_plan(10, 1e6, 1e-5, None, 100, 5, repetitions=20, release=ArgmaxRelease(), ballot="auto")
    assert winner.sigma == 0.0 and winner.unanimous_success == 1.0 and winner.success == 1.0
    summed = check_plan(10, 1e6, 1e-5, None, 100, 5, repetitions=20)
    assert summed.sigma < 0.01 and summed.unanimous_success == 1.0
