"""The planner's measured table (dphype.selection.measured): the nearest cell of a table built here is quoted with the
distribution of its federations' gaps to Opt; the shipped file loads; a malformed one is refused naming the line and
column."""

from __future__ import annotations

import csv
import dataclasses
import importlib.resources
import io
import math
from pathlib import Path

import numpy as np
import pytest

from dphype.release import ArgmaxRelease
from dphype.selection.measured import (
    COLUMNS,
    MEASURED_FILE,
    MIN_FEDERATIONS,
    cell_distance,
    load_measured,
    measured_within,
    read_measured,
)
from dphype.selection.plan_result import ADVICE_CHARS
from dphype.selection.planner import plan


def table_text(rows: list[dict[str, object]], extra: tuple[str, ...] = ()) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*COLUMNS, *extra], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def row(dataset: str, gap: float, *, n: int = 20, eps: float = 1.0, p: int = 100, partition: str = "iid",
        relation: str = "replace-one", within_2pt: float = 0.5, ballot: str = "auto") -> dict[str, object]:
    return {"ballot": ballot, "candidates": p, "neighbouring": relation, "clients": n, "epsilon": eps,
            "partition": partition, "dataset": dataset, "gap_points": gap, "within_1pt": within_2pt / 2,
            "within_2pt": within_2pt}


#: A small grid: at n = 20, eps 1, ten iid federations with gaps 0..9 and four Dirichlet ones; one cell at n = 50.
SMALL = [row(f"task{i}", float(i), within_2pt=1.0 - i / 10) for i in range(10)] + [
    row(f"task{i}", 10.0 + i, partition="Dirichlet 0.5", within_2pt=0.2) for i in range(4)] + [
    row("task0", 0.5, n=50, within_2pt=0.99), row("task1", 1.5, n=50, within_2pt=0.9)]


def test_the_nearest_cell_is_quoted_with_the_median_and_90th_percentile_of_its_federations_gaps() -> None:
    table = read_measured(table_text(SMALL), "small.csv")
    iid = measured_within(20, 1.0, partition="iid", table=table)
    gaps = np.arange(10.0)  # the ten iid federations of the cell, by construction
    assert (iid["candidates"], iid["clients"], iid["epsilon"], iid["on_grid"]) == (100, 20, 1.0, True)
    assert iid["federations"] == 10 and iid["enough"] and iid["outside"] == [] and iid["distance"] == 0.0
    assert iid["gap_points"] == {"median": 4.5, "p90": pytest.approx(float(np.percentile(gaps, 90))), "max": 9.0}
    assert iid["within_2pt"] == {"median": pytest.approx(0.55), "min": pytest.approx(0.1)}
    both = measured_within(20, 1.0, table=table)  # partition unknown: every federation of the cell
    assert both["federations"] == 14 and both["gap_points"]["median"] == pytest.approx(6.5)
    few = measured_within(20, 1.0, partition="dirichlet", table=table)
    assert few["federations"] == 4 < MIN_FEDERATIONS and not few["enough"]
    assert few["gap_points"]["median"] == pytest.approx(11.5)
    # off the grid: nearest by |ln p'/p| + |ln n'/n| + |ln eps'/eps|; n = 35 is nearer 50 than 20 in log n
    near = measured_within(35, 1.0, table=table)
    assert (near["clients"], near["on_grid"], near["federations"]) == (50, False, 2)
    assert near["distance"] == pytest.approx(math.log(50 / 35), abs=1e-4) and near["outside"] == []
    assert measured_within(31, 1.0, table=table)["clients"] == 20  # ln(31/20) < ln(50/31)
    far = measured_within(400, 0.1, num_candidates=8, table=table)
    assert far["outside"] == ["candidates 8 is outside the measured 100", "n 400 is outside the measured 20-50",
                              "epsilon 0.1 is outside the measured 1"]
    assert cell_distance(("auto", 100, "replace-one", 50, 1.0), 8, 400, 0.1) == pytest.approx(
        math.log(100 / 8) + math.log(400 / 50) + math.log(10))
    with pytest.raises(ValueError, match="ballot 'top-k' was not measured under replace-one"):
        measured_within(20, 1.0, ballot="top-k", table=table)
    with pytest.raises(ValueError, match="not measured under add-remove"):
        measured_within(20, 1.0, "add-remove", table=table)
    with pytest.raises(ValueError, match="partition must be one of iid, dirichlet"):
        measured_within(20, 1.0, partition="skewed", table=table)


def test_new_rows_and_new_columns_extend_a_table_without_a_code_change() -> None:
    grown = [*SMALL, *(row(f"new{i}", 0.25 * i, n=100) for i in range(6))]
    table = read_measured(table_text([{**r, "seconds": 1.0} for r in grown], extra=("seconds",)))
    got = measured_within(100, 1.0, table=table)
    assert (got["clients"], got["federations"], got["gap_points"]["median"]) == (100, 6, pytest.approx(0.625))
    assert measured_within(400, 1.0, table=table)["outside"] == ["n 400 is outside the measured 20-100"]


def test_the_plans_advice_quotes_the_cell_in_one_short_line_in_the_runs_own_terms() -> None:
    table = read_measured(table_text(SMALL))
    base = plan(20, 1.0, 1e-5, None, 100, ballot="auto", k=3, ks=[3], repetitions=20, search=False,
                release=ArgmaxRelease())
    quoted = dataclasses.replace(base, within_opt=measured_within(20, 1.0, partition="iid", table=table))
    assert quoted.advice() == ("100 candidates, 20 voters, epsilon 1: bench gap to Opt median 4.5, p90 8.1 points, "
                               "median 55% within 2 over 10 runs at this cell; yours: dphype bench ksweep")
    few = dataclasses.replace(base, within_opt=measured_within(20, 1.0, partition="dirichlet", table=table))
    assert "median 11.5, p90 12.7 points" in few.advice() and "too few runs to tell" in few.advice()
    small = plan(400, 1.0, 1e-5, None, 8, ballot="auto", k=2, ks=[2], repetitions=20, search=False,
                 release=ArgmaxRelease())
    off = dataclasses.replace(small, within_opt=measured_within(400, 1.0, num_candidates=8, table=table))
    assert off.advice().startswith("8 candidates, 400 voters, epsilon 1: bench gap to Opt median 1.0")
    assert "p=100 n=50 eps=1; p, n outside the grid" in off.advice()
    for p, n, eps in [(2, 2, 0.001), (8, 10, 1.0), (1000, 10000, 0.001), (37, 9999, 99.5), (100, 3, 1e-3)]:
        for partition in (None, "iid", "dirichlet"):
            within = measured_within(n, eps, num_candidates=p, partition=partition, table=table)
            assert len(dataclasses.replace(small, num_candidates=p, clients=n, epsilon=eps,
                                           within_opt=within).advice()) <= ADVICE_CHARS < 200


def shipped_text() -> str:
    return importlib.resources.files("dphype").joinpath("data", MEASURED_FILE).read_text(encoding="utf-8")


def test_the_shipped_table_round_trips_through_the_loader(tmp_path: Path) -> None:
    text = shipped_text()
    table = load_measured()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert tuple(rows[0]) == COLUMNS and sum(len(points) for points in table.values()) == len(rows)
    for r in rows:  # every row is a federation of its cell, with its values as written
        points = table[(r["ballot"], int(r["candidates"]), r["neighbouring"], int(r["clients"]), float(r["epsilon"]))]
        point = next(p for p in points if (p.dataset, p.partition) == (r["dataset"], r["partition"]))
        assert (point.gap_points, point.within_1pt, point.within_2pt) == (
            float(r["gap_points"]), float(r["within_1pt"]), float(r["within_2pt"]))
    copy = tmp_path / "copy.csv"
    copy.write_text(table_text(rows), encoding="utf-8")
    assert copy.read_text(encoding="utf-8") == text and load_measured(copy) == table


def edited(line: int, column: str, value: str) -> str:
    rows = [dict(r) for r in SMALL]
    rows[line - 2][column] = value
    return table_text(rows)


@pytest.mark.parametrize(("text", "message"), [
    ("", "the columns must include"),
    (table_text(SMALL).replace("dataset,", "", 1), r"missing: \['dataset'\]"),
    (",".join(COLUMNS) + "\n", "no rows"),
    (edited(3, "within_2pt", "1.5"), r"line 3: within_2pt must be a share in \[0, 1\], got 1.5"),
    (edited(2, "gap_points", "many"), "line 2: gap_points must be a number, got 'many'"),
    (edited(4, "clients", "2.5"), "line 4: clients must be an integer, got '2.5'"),
    (edited(2, "epsilon", "nan"), "line 2: epsilon must be finite"),
    (edited(2, "neighbouring", "swap-two"), "line 2: neighbouring must be one of replace-one, add-remove"),
    (edited(2, "gap_points", "-1"), "line 2: needs a ballot, a dataset, candidates >= 2"),
    (edited(2, "partition", "beta=0.5"), "line 2: partition must be 'iid' or 'Dirichlet BETA'"),
    (edited(5, "within_1pt", "0.9"), "line 5: the share within 1 point must be at most the share within 2"),
    (table_text([*SMALL, SMALL[0]]), r"task0 \(iid\) appears twice"),
    (table_text(SMALL) + "auto,10\n", "expected 10 fields"),
])
def test_a_malformed_table_is_refused_naming_where_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        read_measured(text, "table.csv")
    assert "table.csv" in str(err.value) and "dphype bench ksweep-report --planner-table" in str(err.value)
