"""``dphype bench ksweep-loto``: default ballots fitted without the task they are measured on, on synthetic sweeps."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from helpers import bench, write_sweep

from dphype.privacy.winner import noise_std
from dphype.selection.voting import rule_depth
from simulations import ksweep_loto
from simulations.cli import main
from simulations.ksweep_report import read_runs


def test_a_fixed_k_is_fitted_on_the_other_tasks_only(tmp_path: Path) -> None:
    ks = range(1, 7)
    runs = [write_sweep(tmp_path / "a", "alpha", {(20, 1.0): 4}, ks, 4.0),
            write_sweep(tmp_path / "b", "beta", {(20, 1.0): 4}, ks, 4.0),
            write_sweep(tmp_path / "c", "gamma", {(20, 1.0): 2}, ks, 4.0)]
    grid = ksweep_loto.Grid.of(read_runs(runs)[0], 20)
    constant, share = ksweep_loto.families(list(ks), ["constant", "share"])
    res = ksweep_loto.evaluate(grid, constant, (20, "replace-one"))
    fits = {f["held_out"]: f for f in res["fits"]}
    # without gamma, alpha and beta want k = 4; without alpha, beta (4) and gamma (2) meet at k = 3, 4 behind each
    assert fits["gamma"]["K"] == 4 and fits["gamma"]["mean_behind"] == 8.0
    assert fits["alpha"]["K"] == 3 and fits["alpha"]["worst_behind"] == 4.0
    # on all three the bars are 4.5 (the floor's worst 4, at k = 3) and 8 / 3 + 0.5: k = 4 trails by 0, 0, 8 (mean
    # 8 / 3, the best mean; worst 3.5 over its bar), k = 3 by 4 at each (mean 0.83 over its bar): the worst weighs
    assert fits["(none: fit on all tasks)"]["K"] == 3
    shares = {f["held_out"]: f for f in ksweep_loto.evaluate(grid, share, (20, "replace-one"))["fits"]}
    assert 0.175 <= shares["gamma"]["c"] < 0.225  # round(20 c) = 4, the smallest such c
    assert {r["k"] for r in res["points"] if r["held_out"] == "gamma"} == {4}
    # the held-out task's own data never enter its fit: change gamma, and gamma's fit stays (alpha's moves)
    runs[2] = write_sweep(tmp_path / "c2", "gamma", {(20, 1.0): 6}, ks, 4.0)
    moved = {f["held_out"]: f for f in ksweep_loto.evaluate(ksweep_loto.Grid.of(read_runs(runs)[0], 20), constant,
                                                             (20, "replace-one"))["fits"]}
    assert moved["gamma"]["K"] == 4 and moved["gamma"]["mean_behind"] == 8.0
    assert moved["alpha"]["K"] == 5


@pytest.mark.parametrize("family, scale, exponents, distinct",
                         [("auto", 0.4, (0.75, 0.75), 5), ("ratio", 0.4, (1.0, 1.0), 5),
                          ("noise", 0.04, (0.5, 0.0), 2)])
def test_a_rule_the_tasks_follow_is_found_and_holds_out_of_sample(tmp_path: Path, family: str, scale: float,
                                                                   exponents: tuple[float, float],
                                                                   distinct: int) -> None:
    cells = [(n, eps) for n in (10, 20, 50) for eps in (0.5, 1.0)]
    best = {cell: int(rule_depth(100, noise_std(cell[1], "replace-one"), cell[0], scale, *exponents))
            for cell in cells}
    assert len(set(best.values())) == distinct  # the rule's k differ from cell to cell
    runs = [write_sweep(tmp_path / name, name, best, range(1, 51)) for name in ("alpha", "beta", "gamma")]
    grid = ksweep_loto.Grid.of(read_runs(runs)[0], 100)
    [fam, constant] = ksweep_loto.families(list(range(1, 51)), [family, "constant"])
    res = ksweep_loto.evaluate(grid, fam, (20, "replace-one"))
    assert all(r["behind_best_k_points"] == 0.0 for r in res["points"])
    assert all(f["worst_behind"] == 0.0 for f in res["fits"])
    assert max(r["behind_best_k_points"] for r in
               ksweep_loto.evaluate(grid, constant, (20, "replace-one"))["points"]) > 0


def test_the_study_writes_its_tables_against_the_goals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ks = range(1, 21)
    cells = {(20, 1.0): 6, (10, 0.5): 12}
    runs = [write_sweep(tmp_path / "a", "alpha", cells, ks), write_sweep(tmp_path / "b", "beta", cells, ks),
            write_sweep(tmp_path / "c", "gamma", {(20, 1.0): 10, (10, 0.5): 12}, ks)]
    res = bench(["ksweep-loto", "--runs", *map(str, runs), "--families", "constant", "noise", "--goal-clients", "20",
                 "--out", str(tmp_path / "r")], capsys)
    assert res["points"] == 6 and res["tasks"] == ["alpha", "beta", "gamma"]
    # the floor: one k per cell; at n = 20, epsilon 1 k = 6 trails by 0, 0, 4 (mean 4 / 3), k = 8 by 2, 2, 2
    assert res["floor"] == {"mean_behind": pytest.approx(4 / 6, abs=1e-3), "worst_behind": 2.0}
    # constant: without gamma each cell's floor is 0 (bars 2 and 1); k = 6 or 12 trail by 6 at one cell (5 over the
    # mean's bar), k = 9 by 3 at both (2 over); out of sample gamma's k = 9 trails by 1 and 3
    assert res["held_out"]["constant gamma"] == "K = 9"
    with open(tmp_path / "r" / "ksweep_loto_cells.csv") as fh:
        cells_out = [r for r in csv.DictReader(fh) if r["family"] == "noise"]
    at_goal = next(r for r in cells_out if (r["clients"], r["epsilon"]) == ("20", "1.0"))
    # the floor at n = 20, epsilon 1: one k for 6, 6 and 10 trails by at least 2 (k = 8)
    assert (float(at_goal["floor_worst"]), at_goal["floor_worst_k"]) == (2.0, "8")
    text = (tmp_path / "r" / "ksweep_loto.md").read_text()
    assert "| constant | k = K | K = " in text
    # the share goal's federations (6, 6 and 10 best) with one k: k = 8 gives the least of them 1 - 2 / 10
    assert res["share_goal_one_k"] == {"k": 8, "least_share": 0.8}
    assert "at best 80% for the least of them, in the worst (n, epsilon) (there k = 8)" in text
    assert "| gamma | constant | K = 9 | 2 | 2.00 | 3.00 | 1 | gamma iid n 20 eps 1 0.90 | 0.00 / 0.00 |" in text
    assert main(["ksweep-loto", "--runs", str(runs[0]), "--out", str(tmp_path / "r2")]) == 2
    assert "at least 2 data sets" in capsys.readouterr().err
    assert main(["ksweep-loto", "--runs", str(tmp_path), "--out", str(tmp_path / "r3")]) == 2
    assert "has no ksweep.csv" in capsys.readouterr().err


def test_the_objective_is_the_largest_excess_over_the_cells_bars() -> None:
    behind = np.array([[0.0, 0.0, 3.0], [1.5, 1.5, 1.5]])
    cells = [np.array([0, 1]), np.array([2])]
    # row 0: the first cell is 2 under its worst bar and 1 under its mean bar, the second 1 over (worst) and 2 over
    # (mean); row 1: 0.5 over the mean bar at both cells, though its mean (1.5) is the larger
    assert ksweep_loto.objective(behind, cells, [(2.0, 1.0), (2.0, 1.0)]) == pytest.approx([2.0, 0.5])
    # a cell with a higher bar (its floor + 0.5) forgives more
    assert ksweep_loto.objective(behind, cells, [(2.0, 1.0), (3.5, 3.5)]) == pytest.approx([-0.5, 0.5])
    assert ksweep_loto.bars(np.array([[0.0, 3.0, 6.0], [6.0, 3.0, 0.0]])) == (3.5, 3.5)
    assert ksweep_loto.bars(np.array([[0.0, 1.0], [1.0, 0.0]])) == (3.0, 1.0)  # the goals: worst 3, mean 1


def test_the_fit_takes_the_smallest_largest_excess_not_the_smallest_mean(tmp_path: Path) -> None:
    ks = range(1, 21)
    runs = [write_sweep(tmp_path / name, name, {(20, 1.0): best}, ks)
            for name, best in (("alpha", 4), ("beta", 4), ("gamma", 10))]
    grid = ksweep_loto.Grid.of(read_runs(runs)[0], 100)
    [constant] = ksweep_loto.families(list(ks), ["constant"])
    everyone = np.ones(len(grid.points), dtype=bool)
    mask = ksweep_loto.goal_mask(grid, (20, "replace-one"))
    behind = grid.behind.mean(axis=0)
    assert grid.ks[np.argmin(behind)] == 4  # the mean-optimal k: 0, 0 and 6 behind
    # the bars: the floor's worst 3 (k = 7) + 0.5, the floor's mean 2 (k = 4) + 0.5; k = 6 and 7 are both 0.5 over
    # (k = 6: 4 worst; k = 7: mean 3), k = 4 is 2.5 over; between 6 and 7 the share goal decides (0.6 vs 0.7 at worst)
    assert constant.grid[ksweep_loto.fit(constant, grid, everyone, mask)][0] == 7
    assert constant.grid[ksweep_loto.fit(constant, grid, everyone, 0 * mask)][0] == 6  # no share goal: the mean


def test_a_fit_on_a_knife_edge_loses_to_one_with_a_margin(tmp_path: Path) -> None:
    ks = range(1, 51)
    # every task trails by 0 at k = 20 only (10 at 19 and 21) and by 1 from k = 36 to 44
    runs = [write_sweep(tmp_path / name, name, {(20, 1.0): 20}, ks,
                        gaps=lambda k: 0.0 if k == 20 else 1.0 if 36 <= k <= 44 else 10.0)
            for name in ("alpha", "beta", "gamma")]
    grid = ksweep_loto.Grid.of(read_runs(runs)[0], 100)
    [constant] = ksweep_loto.families(list(ks), ["constant"])
    everyone = np.ones(len(grid.points), dtype=bool)
    none = np.zeros(len(grid.points), dtype=bool)
    assert constant.grid[ksweep_loto.fit(constant, grid, everyone, none, band=1.0)][0] == 20
    # with its K off by up to 8% the edge (19 to 21) trails by 10; the smallest K whose band lies in the basin: 38
    # (36 to 41)
    assert constant.grid[ksweep_loto.fit(constant, grid, everyone, none)][0] == 38
    rows = np.array([[1.0, 0.0], [1.05, 0.0], [1.1, 0.0], [1.2, 0.0], [1.3, 0.0], [1.05, 1.0]])
    score = np.array([0.0, 5.0, 0.0, 0.0, 0.0, 0.0])
    # the band spans factors up to 1.08 in the first parameter and never crosses to another value of the second
    assert ksweep_loto.robust(rows, score).tolist() == [5.0, 5.0, 5.0, 0.0, 0.0, 0.0]
    assert ksweep_loto.robust(rows, score, 1.0).tolist() == score.tolist()


def test_the_robust_band_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [write_sweep(tmp_path / name, name, {(20, 1.0): 4}, range(1, 7)) for name in ("alpha", "beta")]
    assert main(["ksweep-loto", "--runs", *map(str, runs), "--robust-band", "0.9", "--out", str(tmp_path / "r")]) == 2
    assert "--robust-band must be a finite number >= 1" in capsys.readouterr().err


def test_the_floor_family_holds_k_up_where_the_ratio_falls_with_n(tmp_path: Path) -> None:
    """``k = max(round(c p s / n), round(f p))``: the ratio's k at small n, the floor's at large n."""
    s = noise_std(1.0, "replace-one")
    assert rule_depth(100, s, 10, 0.4, 1.0, 1.0, 0.12) == max(round(40 * s / 10), 12)
    assert rule_depth(100, s, 100, 0.4, 1.0, 1.0, 0.12) == 12
    [floor] = ksweep_loto.families(list(range(1, 51)), ["floor"])
    p, ss, n = np.array([100, 100]), np.array([s, s]), np.array([10, 100])
    row = np.flatnonzero((np.abs(floor.grid[:, 0] - 0.4) < 0.02) & (floor.grid[:, 1] == 0.12))[0]
    assert floor.depths(floor.grid[[row]], p, ss, n).tolist() == [[max(round(floor.grid[row, 0] * 100 * s / 10), 12),
                                                                  12]]


def test_the_share_goal_holds_at_every_iid_point_from_its_smallest_n(tmp_path: Path) -> None:
    ks = range(1, 21)
    runs = [write_sweep(tmp_path / name, name, {(20, 1.0): 4, (50, 1.0): 4, (100, 0.5): 4}, ks)
            for name in ("alpha", "beta")]
    grid = ksweep_loto.Grid.of(read_runs(runs)[0], 100)
    mask = ksweep_loto.goal_mask(grid, (50, "replace-one"))
    assert sorted((grid.points[i][0], grid.points[i][1]) for i in np.flatnonzero(mask)) == [
        ("alpha", 50), ("alpha", 100), ("beta", 50), ("beta", 100)]
    assert not ksweep_loto.goal_mask(grid, (50, "add-remove")).any()
    assert ksweep_loto.at_goal(50, "iid", "replace-one", (50, "replace-one"))
    assert not ksweep_loto.at_goal(50, "beta=0.5", "replace-one", (50, "replace-one"))
