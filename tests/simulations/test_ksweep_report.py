"""``dphype bench ksweep-report``: the ballot grid's tables from ksweep runs, checked against hand arithmetic."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
from helpers import TINY, bench

from simulations.cli import main

SWEEP_KEYS = ["dataset", "clients", "partition", "epsilon", "neighbouring", "k", "gap_points", "ci95", "within_1pt",
              "within_2pt"]
BALLOT_KEYS = ["dataset", "clients", "partition", "epsilon", "neighbouring", "ballot", "depth", "gap_points", "ci95",
               "within_1pt", "within_2pt"]


def write_run(folder: Path, dataset: str, gaps: dict[tuple[str, int], dict[int, float]],
              auto: dict[tuple[str, int], tuple[int, float]]) -> Path:
    """A ksweep run's two CSV files: per (relation, n) at epsilon 1 on the iid split, the gap at each k, and auto's
    (k, gap); the shares within 2 points are ``1 - gap / 10`` so that they are distinct and checkable."""
    folder.mkdir(parents=True)
    with (folder / "ksweep.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, SWEEP_KEYS)
        w.writeheader()
        for (relation, n), by_k in gaps.items():
            for k, gap in by_k.items():
                w.writerow({"dataset": dataset, "clients": n, "partition": "iid", "epsilon": 1.0,
                            "neighbouring": relation, "k": k, "gap_points": gap, "ci95": 0.1, "within_1pt": 0.5,
                            "within_2pt": 1 - gap / 10})
    with (folder / "ksweep_ballots.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, BALLOT_KEYS)
        w.writeheader()
        for (relation, n), (k, gap) in auto.items():
            w.writerow({"dataset": dataset, "clients": n, "partition": "iid", "epsilon": 1.0, "neighbouring": relation,
                        "ballot": "auto", "depth": k, "gap_points": gap, "ci95": 0.1, "within_1pt": 0.5,
                        "within_2pt": 1 - gap / 10})
    return folder


@pytest.fixture
def two_tasks(tmp_path: Path) -> list[Path]:
    # one cell (replace-one, n = 20, epsilon 1) holding two tasks that want different k, and one add-remove point
    a = write_run(tmp_path / "a", "alpha", {("replace-one", 20): {1: 0.5, 2: 3.0, 3: 6.0},
                                            ("add-remove", 20): {1: 2.0, 2: 1.0, 3: 1.5}},
                  {("replace-one", 20): (2, 3.0), ("add-remove", 20): (2, 1.0)})
    b = write_run(tmp_path / "b", "beta", {("replace-one", 20): {1: 5.0, 2: 2.5, 3: 1.0}},
                  {("replace-one", 20): (2, 2.5)})
    return [a, b]


def test_the_report_computes_gaps_behind_the_best_k_and_the_floor_of_one_k_per_cell(
        two_tasks: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 7 candidates: auto's k is its floor, 2, at every point (as the runs measured it)
    res = bench(["ksweep-report", "--runs", *map(str, two_tasks), "--top-fixed", "2", "--default", "auto",
                 "--candidates", "7", "--out", str(tmp_path / "r")], capsys)
    assert res["points"] == 3
    # auto: alpha replace-one 3.0 - 0.5 = 2.5 behind, beta 2.5 - 1.0 = 1.5; alpha add-remove 0 behind
    assert res["default_behind"]["replace-one"] == {"points": 2, "max_behind": 2.5, "mean_behind": 2.0, "missed": 2}
    assert res["default_behind"]["add-remove"] == {"points": 1, "max_behind": 0.0, "mean_behind": 0.0, "missed": 0}
    assert res["default_goal_within_2pt"] == {"alpha iid": pytest.approx(0.7), "beta iid": pytest.approx(0.75)}
    # the floor of the replace-one cell: k = 1 trails by max(0, 4) = 4, k = 2 by max(2.5, 1.5) = 2.5, k = 3 by
    # max(5.5, 0) = 5.5, so k = 2 and 2.5; the add-remove cell has one task: 0 at its best k
    assert res["floor_points"] == {"replace-one": 2.5, "add-remove": 0.0}
    with open(tmp_path / "r" / "ksweep_report_floor.csv") as fh:
        floors = {r["neighbouring"]: r for r in csv.DictReader(fh)}
    assert (floors["replace-one"]["minimax_k"], floors["replace-one"]["federations"]) == ("2", "2")
    with open(tmp_path / "r" / "ksweep_report_within.csv") as fh:  # the planner's rows: one per federation
        within = {(r["neighbouring"], r["dataset"]): r for r in csv.DictReader(fh)}
    assert {key: (r["partition"], float(r["gap_points"]), float(r["within_2pt"])) for key, r in within.items()} == {
        ("replace-one", "alpha"): ("iid", 3.0, 0.7), ("replace-one", "beta"): ("iid", 2.5, 0.75),
        ("add-remove", "alpha"): ("iid", 1.0, 0.9)}
    with open(tmp_path / "r" / "ksweep_report_points.csv") as fh:
        points = list(csv.DictReader(fh))
    assert len(points) == 3 * 3 + 3  # every k and auto at every point
    beta = next(r for r in points if r["dataset"] == "beta" and r["ballot"] == "top-k, k = 1")
    assert (beta["best_k"], float(beta["behind_best_k_points"]), float(beta["most_within_2pt"])) == ("3", 4.0, 0.9)
    text = (tmp_path / "r" / "ksweep_report.md").read_text()
    # the ballot table: auto and the 2 fixed k with the smallest largest gap (k = 2: 2.5, k = 1: 4)
    assert "| `auto` | 2.50 / 2.00 / 2 of 2 | 0.00 / 0.00 / 0 of 1 | 70% | 75% |" in text
    assert "`top-k, k = 2`" in text and "`top-k, k = 1`" in text and "`top-k, k = 3`" not in text
    assert "| replace-one | 20 | 1 | 2 | 2 | 2.50 |" in text


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--goal", "20", "1", "both"], "--goal RELATION must be one of"),
        (["--goal", "twenty", "1", "replace-one"], "--goal takes N (an integer)"),
        (["--top-fixed", "-1"], "top-fixed"),
        (["--default", "rank:9"], "--default 'rank:9' was not measured"),
    ],
)
def test_bad_options_are_refused_naming_them(two_tasks: list[Path], tmp_path: Path, extra: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ksweep-report", "--runs", *map(str, two_tasks), *extra, "--out", str(tmp_path / "r")]) == 2
    assert message in capsys.readouterr().err


def test_a_point_in_two_runs_or_a_folder_without_a_sweep_is_refused(two_tasks: list[Path], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ksweep-report", "--runs", str(two_tasks[0]), str(two_tasks[0]), "--out", str(tmp_path / "r")]) == 2
    assert "pass each point once" in capsys.readouterr().err
    assert main(["ksweep-report", "--runs", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    assert "has no ksweep.csv" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_the_report_of_a_real_sweep_agrees_with_the_sweeps_own_summary(small_adult: None, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    sweep: dict[str, Any] = bench(["ksweep", *TINY, "--repetitions", "40", "--epsilons", "0.5", "1", "--ks", "1", "2",
                                   "3", "--neighbourings", "replace-one", "--ballots", "auto", "rank:3",
                                   "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "s")], capsys)
    res = bench(["ksweep-report", "--runs", str(tmp_path / "s"), "--goal", "3", "1", "replace-one",
                 "--default", "auto", "--candidates", "6", "--out", str(tmp_path / "r")], capsys)
    assert res["points"] == 2 * 2  # partitions x epsilons
    ours = res["default_behind"]["replace-one"]
    theirs = sweep["ballot_summary"]["auto"]
    assert ours["points"] == theirs["points"]
    assert ours["max_behind"] == pytest.approx(theirs["max_behind_best_k_points"], abs=2e-3)
    assert ours["mean_behind"] == pytest.approx(theirs["mean_behind_best_k_points"], abs=2e-3)
    assert set(res["default_goal_within_2pt"]) == {"adult iid", "adult Dirichlet 5"}


def test_the_planner_table_is_written_for_the_planners_loader_keeping_the_other_rows(
        two_tasks: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.resources

    from dphype.selection.measured import MEASURED_FILE, Point, load_measured

    table = tmp_path / "table.csv"
    table.write_text(importlib.resources.files("dphype").joinpath("data", MEASURED_FILE).read_text(), encoding="utf-8")
    command = ["ksweep-report", "--runs", *map(str, two_tasks), "--candidates", "7", "--planner-table", str(table),
               "--default", "auto"]
    res = bench([*command, "--out", str(tmp_path / "r")], capsys)
    assert str(table) in res["outputs"]
    loaded = load_measured(table)
    assert loaded[("auto", 7, "replace-one", 20, 1.0)] == (Point("alpha", "iid", 3.0, 0.5, 0.7),
                                                           Point("beta", "iid", 2.5, 0.5, 0.75))
    assert loaded[("auto", 7, "add-remove", 20, 1.0)] == (Point("alpha", "iid", 1.0, 0.5, 0.9),)
    assert {cell: m for cell, m in loaded.items() if cell[1] != 7} == load_measured()  # the shipped rows, kept
    bench([*command, "--out", str(tmp_path / "again")], capsys)  # the same ballot and candidates: replaced
    assert load_measured(table) == loaded
    table.write_text("ballot,candidates\nauto,7\n", encoding="utf-8")  # a malformed table is refused, not merged
    assert main([*command, "--out", str(tmp_path / "bad")]) == 2
    assert "the columns must include" in capsys.readouterr().err and table.read_text() == "ballot,candidates\nauto,7\n"


def test_a_share_ballot_the_runs_did_not_measure_is_read_off_the_sweep(two_tasks: list[Path], tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # share:0.3 of 7 candidates: k = round(2.1) = 2 at every point, so it is the fixed k = 2 exactly
    res = bench(["ksweep-report", "--runs", *map(str, two_tasks), "--candidates", "7", "--default", "share:0.3",
                 "--out", str(tmp_path / "r")], capsys)
    assert res["default"] == "share:0.3"
    assert res["default_behind"]["replace-one"] == {"points": 2, "max_behind": 2.5, "mean_behind": 2.0, "missed": 2}
    with open(tmp_path / "r" / "ksweep_report_within.csv") as fh:
        within = {(r["neighbouring"], r["dataset"]): r for r in csv.DictReader(fh)}
    assert {r["ballot"] for r in within.values()} == {"share:0.3"}
    assert float(within["replace-one", "beta"]["within_2pt"]) == 0.75
    # a k outside the sweep (share:0.9 of the default 100 candidates is 50): not measured, refused
    assert main(["ksweep-report", "--runs", *map(str, two_tasks), "--default", "share:0.9",
                 "--out", str(tmp_path / "r2")]) == 2
    assert "was not measured" in capsys.readouterr().err


def test_a_measured_auto_ballot_whose_rule_has_changed_is_read_at_its_new_k(two_tasks: list[Path], tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # the runs measured auto at k = 2; at 100 candidates today's rule votes deeper than the sweep's 3 k under
    # replace-one (not measured there) and for k = 3 under add-remove (the sweep's row: 1.5 - 1.0 behind)
    res = bench(["ksweep-report", "--runs", *map(str, two_tasks), "--default", "auto", "--out", str(tmp_path / "r")],
                capsys)
    assert res["default_behind"] == {"add-remove": {"points": 1, "max_behind": 0.5, "mean_behind": 0.5, "missed": 0}}
    # auto:0.01 of 100 candidates is its floor, 3: the sweep's k = 3 row, not the runs' measurement at k = 2
    res = bench(["ksweep-report", "--runs", *map(str, two_tasks), "--default", "auto:0.01", "--out",
                 str(tmp_path / "r2")], capsys)
    assert res["default_behind"]["replace-one"] == {"points": 2, "max_behind": 5.5, "mean_behind": 2.75, "missed": 1}
