"""The planner's measured table (dphype.selection.measured): the shipped file round-trips, a malformed one is
refused naming the line and column."""

from __future__ import annotations

import csv
import importlib.resources
import io
from pathlib import Path

import pytest

from dphype.selection.measured import COLUMNS, MEASURED_FILE, Measured, load_measured, read_measured


def shipped_text() -> str:
    return importlib.resources.files("dphype").joinpath("data", MEASURED_FILE).read_text(encoding="utf-8")


def test_the_shipped_table_round_trips_through_the_loader(tmp_path: Path) -> None:
    text = shipped_text()
    table = load_measured()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert tuple(rows[0]) == COLUMNS and len(table) == len(rows)
    for row in rows:  # every row is a cell, with its values as written
        entry = table[(row["ballot"], int(row["candidates"]), row["neighbouring"], int(row["clients"]),
                       float(row["epsilon"]))]
        assert entry == Measured(int(row["tasks"]), row["measured_on"],
                                 (float(row["within_1pt_min"]), float(row["within_1pt_max"])),
                                 (float(row["within_2pt_min"]), float(row["within_2pt_max"])))
    # written back in the loader's column order and read again: the same table
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    assert out.getvalue() == text
    copy = tmp_path / "copy.csv"
    copy.write_text(out.getvalue(), encoding="utf-8")
    assert load_measured(copy) == table


def edited(line: int, column: str, value: str) -> str:
    rows = list(csv.DictReader(io.StringIO(shipped_text())))
    rows[line - 2][column] = value
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


@pytest.mark.parametrize(("text", "message"), [
    ("", "the columns must be"),
    (shipped_text().replace("measured_on,", "", 1), r"missing: \['measured_on'\]"),
    (shipped_text().replace("within_2pt_max", "within_2pt_max,extra", 1), r"unknown: \['extra'\]"),
    (",".join(COLUMNS) + "\n", "no rows"),
    (edited(3, "within_2pt_max", "1.5"), r"line 3: within_2pt_max must be a share in \[0, 1\], got 1.5"),
    (edited(2, "within_1pt_min", "many"), "line 2: within_1pt_min must be a number, got 'many'"),
    (edited(4, "clients", "2.5"), "line 4: clients must be an integer, got '2.5'"),
    (edited(2, "epsilon", "nan"), "line 2: epsilon must be finite"),
    (edited(2, "neighbouring", "swap-two"), "line 2: neighbouring must be one of replace-one, add-remove"),
    (edited(2, "tasks", "0"), "line 2: needs a ballot, candidates >= 2, clients >= 1, tasks >= 1 and epsilon > 0"),
    (edited(2, "within_2pt_min", "0.99"), "line 2: each min must be at most its max"),
    (edited(2, "within_1pt_max", "1.0"), "within 1 point at most the share within 2"),
    (shipped_text() + shipped_text().splitlines()[1] + "\n", "appears twice"),
    (shipped_text() + "auto,10\n", "expected 11 fields"),
])
def test_a_malformed_table_is_refused_naming_where_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        read_measured(text, "table.csv")
    assert "table.csv" in str(err.value) and "dphype bench ksweep-report --planner-table" in str(err.value)
