"""The trade-off and ablation studies replay the argmax release beside the sum release on the same votes."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from helpers import TINY, bench

from dphype.release import ArgmaxRelease


def test_tradeoff_and_ablations_replay_both_release_modes(small_adult: None, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    cache = str(tmp_path / "cache")
    res = bench(["tradeoff", *TINY, "--repetitions", "50", "--epsilons", "1", "inf", "--cache", cache,
                  "--release", "sum", "argmax", "--neighbourings", "replace-one", "add-remove",
                  "--out", str(tmp_path / "t")], capsys)
    assert res["releases"] == ["sum", "argmax"] and len(res["summary"]) == 2 * 2
    winners = res["winner_summary"]
    assert len(winners) == 2 * 2 * 2  # partitions x epsilons x relations
    for row in winners:
        assert 0 <= row["within_1pt"] <= 1 and row["gap_to_opt_points"] >= 0 and "sum_gap_to_opt_points" in row
    assert all(r["gap_to_opt_points"] == r["worst5_gap_points"] for r in winners if r["epsilon"] == "inf")
    with open(tmp_path / "t" / "tradeoff.csv") as fh:
        rows = list(csv.DictReader(fh))
    argmax_rows = [r for r in rows if r["release"] == "argmax"]
    assert {r["rule"] for r in argmax_rows} == {"noisy-max/replace-one", "noisy-max/add-remove"}
    # discrete Laplace std sqrt(2t)/(1-t): t = e^-1/2 under replace-one, e^-1 under add/remove (epsilon 1), the
    # committee's noise sampled once in the MPC
    stds = {r["rule"]: float(r["sigma"]) for r in argmax_rows if r["epsilon"] == "1.0"}
    assert stds["noisy-max/replace-one"] == pytest.approx(2.799, abs=0.001)
    assert stds["noisy-max/add-remove"] == pytest.approx(1.357, abs=0.001)

    res = bench(["ablations", *TINY, "--repetitions", "10", "--epsilons", "0.5", "--cache", cache,
                  "--release", "argmax", "--methods", "DP-Hype", "Subsets", "--out", str(tmp_path / "a")], capsys)
    assert {r["rule"] for r in res["summary"] if r["method"] == "DP-Hype"} == {"noisy-max/replace-one"}


def test_argmax_profile_times_each_part_and_checks_the_opened_index(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    res = bench(["argmax-profile", "--clients", "3", "--candidates", "20", "--repetitions", "1",
                  "--out", str(tmp_path / "p")], capsys)
    (row,) = res["rows"]
    assert row["upload bytes"] == 3 * (32 + 16 + 20 * 8)  # ephemeral key, tag, 20 field elements (bits) per tally
    assert 0 < row["party argmax s"] < row["party check s"] + row["party argmax s"] < row["mpc s"] < row["seconds"]


def test_the_secagg_profile_runs_the_round_of_a_roster_by_default(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rows = {}
    for flag in ([], ["--no-roster"]):
        res = bench(["secagg-profile", "--clients", "6", *flag, "--out", str(tmp_path / "s")], capsys)
        (rows[bool(res["roster"])],) = res["rounds"]  # the study raises unless the sum is exact
    # with the roster every key-list entry carries its member's name and identity signature, and every node checks them
    assert rows[True]["upload_bytes_per_client"] > rows[False]["upload_bytes_per_client"] + 64
    assert rows[True]["download_bytes_per_client"] > rows[False]["download_bytes_per_client"] + 6 * 64
    assert rows[True]["components"]["roster signature checks"] > 0 == rows[False]["components"].get(
        "roster signature checks", 0)


def test_the_committee_bench_names_the_invalid_ballots_and_measures_every_tally(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = bench(["committee", "--clients", "6", "--candidates", "12", "--k", "2", "--invalid", "2",
                  "--out", str(tmp_path / "c")], capsys)
    (row,) = res["rows"]  # the study raises unless the 2 boosted ballots were named and left out
    assert (row["clients"], row["invalid"], row["upload bytes"]) == (6, 2, 3 * (32 + 16 + 12 * 8))
    assert row["tally traffic bytes"] > 0 and row["tally peak MiB"] > 10 and row["seconds"] > row["mpc s"]


def test_without_k_both_studies_replay_the_winner_release_at_the_planners_k(small_adult: None,
                                                                            tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from dphype.selection.candidates import load_candidates
    from dphype.selection.planner import plan

    cache = str(tmp_path / "cache")
    res = bench(["tradeoff", *TINY, "--repetitions", "20", "--epsilons", "0.5", "inf", "--cache", cache,
                  "--release", "sum", "argmax", "--neighbourings", "replace-one", "add-remove",
                  "--out", str(tmp_path / "t")], capsys)
    space = load_candidates("6").feature_space()
    planned = {relation: plan(3, 0.5, 1e-5, space, 6, neighbouring=relation, release=ArgmaxRelease(),
                              search=False).recommended_k_winner for relation in ("replace-one", "add-remove")}
    winners = res["winner_summary"]
    assert {(r["neighbouring"], r["k"]) for r in winners if r["epsilon"] == 0.5} == set(planned.items())
    assert {r["k"] for r in winners if r["epsilon"] == "inf"} == {5}  # no planner without noise: --k's default
    assert {r["sum_k"] for r in winners} == {5} and res["k"] == 5  # the sum release keeps --k's default
    res = bench(["tradeoff", *TINY, "--repetitions", "20", "--epsilons", "0.5", "--cache", cache, "--k", "2",
                  "--release", "argmax", "--out", str(tmp_path / "k2")], capsys)
    assert {r["k"] for r in res["winner_summary"]} == {2}  # an explicit --k is used as given
    res = bench(["tradeoff", *TINY, "--repetitions", "20", "--epsilons", "2", "--cache", cache, "--consensus",
                  "weak", "--release", "argmax", "--out", str(tmp_path / "weak")], capsys)
    weak, moderate = (plan(3, 2.0, 1e-5, space, 6, release=ArgmaxRelease(), consensus=c, search=False)
                      .recommended_k_winner for c in ("weak", "moderate"))
    assert weak != moderate  # here the scenario changes the planner's k (2 against 1) ...
    assert {r["k"] for r in res["winner_summary"]} == {weak}  # ... and --consensus is the planner's scenario
    res = bench(["ablations", *TINY, "--repetitions", "10", "--epsilons", "0.5", "--cache", cache,
                  "--release", "sum", "argmax", "--neighbourings", "replace-one", "add-remove",
                  "--methods", "DP-Hype", "--out", str(tmp_path / "a")], capsys)
    dphype = [r for r in res["summary"] if r["method"] == "DP-Hype"]
    assert {(r["rule"].split("/", 1)[1], r["k"]) for r in dphype if r["rule"].startswith("noisy-max/")} \
        == set(planned.items())
    assert {r["k"] for r in dphype if not r["rule"].startswith("noisy-max/")} == {5}  # the sum release: --k's default
    with open(tmp_path / "a" / "ablations.csv") as fh:
        assert {(r["rule"], r["k"]) for r in csv.DictReader(fh) if r["release"] == "argmax"} \
            == {(f"noisy-max/{relation}", str(k)) for relation, k in planned.items()}


def test_ksweep_measures_every_k_on_the_same_releases_and_scores_the_planners_advice(
        small_adult: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dphype.selection.candidates import load_candidates
    from dphype.selection.planner import plan
    from simulations.ksweep import TOLERANCE

    res = bench(["ksweep", *TINY, "--repetitions", "60", "--epsilons", "0.5", "2", "--ks", "1", "2", "3", "5",
                  "--consensus", "moderate", "weak", "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "s")],
                 capsys)
    with open(tmp_path / "s" / "ksweep.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * 2 * 2 * 4  # partitions x epsilons x relations x ks
    space = load_candidates("6").feature_space()
    advice = res["advice"]
    assert len(advice) == 2 * 2 * 2 * 2  # ... x scenarios
    planned = {}  # the plan sees no partition: one per epsilon, relation and scenario
    for a in advice:
        point = [r for r in rows if (r["partition"], float(r["epsilon"]), r["neighbouring"])
                 == (a["partition"], a["epsilon"], a["neighbouring"])]
        gaps = {int(r["k"]): float(r["gap_points"]) for r in point}
        # the planner's k is dphype plan's, asked independently here with the same ks and scenario
        key = (a["epsilon"], a["neighbouring"], a["consensus"])
        if key not in planned:
            planned[key] = plan(3, a["epsilon"], 1e-5, space, 6, neighbouring=a["neighbouring"],
                                release=ArgmaxRelease(), consensus=a["consensus"], ks=[1, 2, 3, 5],
                                search=False).recommended_k_winner
        assert a["planner_k"] == planned[key]
        assert a["best_gap_points"] == min(gaps.values()) and gaps[a["best_k"]] == a["best_gap_points"]
        assert a["regret_points"] == pytest.approx(gaps[a["planner_k"]] - a["best_gap_points"], abs=2e-3)
        assert a["agrees"] == (a["regret_points"] <= TOLERANCE or a["regret_points"] - a["paired_ci95"] <= 0)
        if a["planner_k"] == a["best_k"]:  # the same releases: no regret and no spread
            assert a["regret_points"] == 0 and a["paired_ci95"] == 0 and a["agrees"]
        # the planner's success for each k is the one its plan reports for that k
        successes = {int(r["k"]): float(r[f"success_{a['consensus']}"]) for r in point}
        assert successes[a["planner_k"]] == max(successes.values())
    assert len(planned) == 2 * 2 * 2
    by_scenario = res["agreement"]
    assert set(by_scenario) == {"moderate", "weak"} and all(v["points"] == 8 for v in by_scenario.values())
    assert by_scenario["moderate"]["agrees"] == sum(a["agrees"] for a in advice if a["consensus"] == "moderate")



def test_ksweep_replays_graded_ballots_on_the_same_releases(small_adult: None, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    res = bench(["ksweep", *TINY, "--repetitions", "80", "--epsilons", "1", "--ks", "1", "2", "3",
                 "--neighbourings", "replace-one", "--ballots", "rank:2:1", "rank:3", "score:0.1", "auto",
                 "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "s")], capsys)
    with open(tmp_path / "s" / "ksweep.csv") as fh:
        top_k = {(r["partition"], int(r["k"])): r for r in csv.DictReader(fh)}
    with open(tmp_path / "s" / "ksweep_ballots.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * 4  # partitions x ballots
    for r in rows:
        assert 0 <= float(r["within_1pt"]) <= float(r["within_2pt"]) <= 1
        if r["ballot"] == "rank:2:1":  # entries 0/1 for the 2 best: top-2 on the same seeds, the same releases
            same = top_k[(r["partition"], 2)]
            assert (r["gap_points"], r["within_1pt"], r["within_2pt"]) == (same["gap_points"], same["within_1pt"],
                                                                           same["within_2pt"])
        best = min(float(top_k[(r["partition"], k)]["gap_points"]) for k in (1, 2, 3))
        assert float(r["best_k_gap_points"]) == best
        assert float(r["behind_best_k_points"]) == pytest.approx(float(r["gap_points"]) - best, abs=2e-3)
    assert set(res["ballot_summary"]) == {"rank:2:1", "rank:3", "score:0.1", "auto"}
    assert all(v["points"] == 2 for v in res["ballot_summary"].values())
