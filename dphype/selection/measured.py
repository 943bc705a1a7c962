"""What the bench measured of the winner release: how far from Opt its releases landed, loaded from a data file.

The planner sees no data: how close a release lands to Opt depends on how well the clients' local scores predict the
federated accuracy, which no scenario knows. What it can quote is what ``dphype bench ksweep`` measured on its tasks,
as ``dphype bench ksweep-report`` tabulates it (``ksweep_report_within.csv``, written into the package with its
``--planner-table`` option): one row per measured federation and ballot, with the cell it belongs to (ballot, number
of candidates ``p``, relation, ``n``, epsilon, partition), the task, the mean gap to Opt of its releases in accuracy
points and the shares of its releases within 1 and within 2 points of Opt. `load_measured` reads and checks such a
file (the package's own by default; rows are added by appending, columns it does not read are ignored) and
`measured_within` quotes the cell nearest a run: the distribution of the gap to Opt over the cell's federations
(`cell_distance` says which cell is nearest).
"""

from __future__ import annotations

import csv
import functools
import importlib.resources
import io
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dphype.checks import NEIGHBOURING, check_neighbouring

#: The ballot the planner quotes by default (`dphype.release.ArgmaxRelease`'s default).
MEASURED_BALLOT = "auto"
#: The package's table, in ``dphype/data``.
MEASURED_FILE = "ksweep_report_within.csv"
#: The columns the loader reads, in the order ``dphype bench ksweep-report`` writes them (other columns are ignored).
COLUMNS: tuple[str, ...] = ("ballot", "candidates", "neighbouring", "clients", "epsilon", "partition", "dataset",
                            "gap_points", "within_1pt", "within_2pt")
#: The partitions a plan can ask for: ``iid`` matches a row's ``iid``, ``dirichlet`` any ``Dirichlet BETA``.
PARTITIONS: tuple[str, ...] = ("iid", "dirichlet")
#: Fewer federations than this in the nearest cell: its median and 90th percentile are a spread, not a distribution.
MIN_FEDERATIONS = 5
#: The fix every refusal names.
_REGENERATE = "regenerate it with dphype bench ksweep-report --planner-table FILE"

#: A cell of the table: ballot, number of candidates, relation, number of clients, epsilon.
Cell = tuple[str, int, str, int, float]


@dataclass(frozen=True)
class Point:
    """One measured federation of a cell: a task under one partition, and where its releases landed.

    Attributes:
        dataset: The task's data set.
        partition: ``iid`` or ``Dirichlet BETA``.
        gap_points: The mean gap to Opt of its releases, in accuracy points.
        within_1pt: The share of its releases within 1 point of Opt.
        within_2pt: The share within 2 points.
    """

    dataset: str
    partition: str
    gap_points: float
    within_1pt: float
    within_2pt: float


def _row(row: Mapping[str, str], where: str) -> tuple[Cell, Point]:
    """One row of a table, checked; ``ValueError`` naming the row, the column and the fix."""
    def number(column: str, kind: type) -> Any:
        try:
            value = kind(row[column])
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {column} must be {'an integer' if kind is int else 'a number'}, got "
                             f"{row[column]!r}; {_REGENERATE}") from None
        if not math.isfinite(value):
            raise ValueError(f"{where}: {column} must be finite, got {row[column]!r}; {_REGENERATE}")
        return value

    def share(column: str) -> float:
        value = number(column, float)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{where}: {column} must be a share in [0, 1], got {value!r}; {_REGENERATE}")
        return float(value)

    if row["neighbouring"] not in NEIGHBOURING:
        raise ValueError(f"{where}: neighbouring must be one of {', '.join(NEIGHBOURING)}, got "
                         f"{row['neighbouring']!r}; {_REGENERATE}")
    candidates, clients = number("candidates", int), number("clients", int)
    epsilon, gap = number("epsilon", float), number("gap_points", float)
    if candidates < 2 or clients < 1 or epsilon <= 0 or gap < 0 or not (row["ballot"] and row["dataset"]):
        raise ValueError(f"{where}: needs a ballot, a dataset, candidates >= 2, clients >= 1, epsilon > 0 and "
                         f"gap_points >= 0; {_REGENERATE}")
    if partition_kind(row["partition"]) is None:
        raise ValueError(f"{where}: partition must be 'iid' or 'Dirichlet BETA', got {row['partition']!r}; "
                         f"{_REGENERATE}")
    within_1pt, within_2pt = share("within_1pt"), share("within_2pt")
    if within_1pt > within_2pt:
        raise ValueError(f"{where}: the share within 1 point must be at most the share within 2; {_REGENERATE}")
    return ((row["ballot"], candidates, row["neighbouring"], clients, float(epsilon)),
            Point(row["dataset"], row["partition"], float(gap), within_1pt, within_2pt))


def partition_kind(label: str) -> str | None:
    """The `PARTITIONS` entry a table's partition label belongs to (``None``: neither)."""
    if label == "iid":
        return "iid"
    kind, _, beta = label.partition(" ")
    try:
        return "dirichlet" if kind == "Dirichlet" and float(beta) > 0 else None
    except ValueError:
        return None


def read_measured(text: str, source: str = MEASURED_FILE) -> dict[Cell, tuple[Point, ...]]:
    """A table's cells from its CSV text, every row checked.

    Args:
        text: The CSV text, with at least the columns `COLUMNS` (in any order; other columns are ignored).
        source: The file's name, for the errors.

    Returns:
        Cell -> its measured federations.

    Raises:
        ValueError: Naming the file, the row and the column, for a missing column, a value of the wrong type or out
            of range, a federation given twice in a cell, or no rows.
    """
    reader = csv.DictReader(io.StringIO(text))
    missing = sorted(set(COLUMNS) - set(reader.fieldnames or ()))
    if missing:
        raise ValueError(f"{source}: the columns must include {', '.join(COLUMNS)} (missing: {missing}); "
                         f"{_REGENERATE}")
    table: dict[Cell, list[Point]] = {}
    for line, row in enumerate(reader, start=2):
        where = f"{source}, line {line}"
        if None in row or any(row[c] is None for c in COLUMNS):
            raise ValueError(f"{where}: expected {len(reader.fieldnames or ())} fields; {_REGENERATE}")
        cell, point = _row(row, where)
        mine = table.setdefault(cell, [])
        if any((p.dataset, p.partition) == (point.dataset, point.partition) for p in mine):
            raise ValueError(f"{where}: {point.dataset} ({point.partition}) appears twice in the cell {cell}; "
                             f"{_REGENERATE}")
        mine.append(point)
    if not table:
        raise ValueError(f"{source}: no rows; {_REGENERATE}")
    return {cell: tuple(points) for cell, points in table.items()}


def load_measured(path: str | Path | None = None) -> dict[Cell, tuple[Point, ...]]:
    """The measured table at ``path`` (``dphype bench ksweep-report``'s), or the package's own, read once.

    Args:
        path: A table file; ``None``: the package's (`MEASURED_FILE`).

    Returns:
        Cell -> its measured federations (`read_measured`).

    Raises:
        ValueError: If the file is malformed.
        OSError: If ``path`` cannot be read.
    """  # noqa: DOC502
    if path is None:
        return _packaged()
    return read_measured(Path(path).read_text(encoding="utf-8"), str(path))


@functools.cache
def _packaged() -> dict[Cell, tuple[Point, ...]]:
    text = importlib.resources.files("dphype").joinpath("data", MEASURED_FILE).read_text(encoding="utf-8")
    return read_measured(text, f"dphype/data/{MEASURED_FILE}")


def measured_ballots(table: Mapping[Cell, Iterable[Point]] | None = None,
                     neighbouring: str | None = None) -> frozenset[str]:
    """The ballots the table (default the package's) measured, under ``neighbouring`` (``None``: under any).

    Args:
        table: A table from `load_measured`; ``None``: the package's.
        neighbouring: A relation, or ``None``.

    Returns:
        Their names.
    """
    return frozenset(cell[0] for cell in (load_measured() if table is None else table)
                     if neighbouring is None or cell[2] == neighbouring)


def cell_distance(cell: Cell, num_candidates: int, clients: int, epsilon: float) -> float:
    """How far a measured cell lies from a run: ``|ln(p'/p)| + |ln(n'/n)| + |ln(eps'/eps)|``.

    Each axis counts by its ratio (a cell at twice the run's ``n`` is as far as one at half of it), and the three
    axes weigh the same: doubling ``p``, ``n`` or epsilon moves the noise and the votes by comparable factors.

    Args:
        cell: The measured cell.
        num_candidates: The run's ``p``.
        clients: The run's ``n``.
        epsilon: The run's epsilon.

    Returns:
        The distance, 0 on the cell.
    """
    return (abs(math.log(cell[1] / num_candidates)) + abs(math.log(cell[3] / clients))
            + abs(math.log(cell[4] / epsilon)))


def measured_within(clients: int, epsilon: float, neighbouring: str = "replace-one", num_candidates: int = 100,
                    ballot: str = MEASURED_BALLOT, partition: str | None = None,
                    table: Mapping[Cell, Iterable[Point]] | None = None) -> dict[str, Any]:
    """Where the measured releases of the cell nearest the run landed: the distribution over its federations.

    The cells of ``ballot`` and the run's relation, with their federations of ``partition`` (``None``: every
    partition), are ordered by `cell_distance` (ties: the smaller ``p``, ``n``, epsilon); the nearest is quoted.

    Args:
        clients: The number ``n`` of clients.
        epsilon: The run's epsilon.
        neighbouring: The run's neighbouring relation.
        num_candidates: The number ``p`` of candidates.
        ballot: The run's ballot (one of `measured_ballots`).
        partition: How the run's data is split across its clients, one of `PARTITIONS`, or ``None``: unknown.
        table: A table from `load_measured`; ``None``: the package's.

    Returns:
        ``{"ballot", "neighbouring", "partition", "candidates", "clients", "epsilon", "distance", "on_grid",
        "outside", "federations", "enough", "measured_on", "gap_points", "within_2pt", "within_1pt"}``: the cell,
        its `cell_distance`, whether the run is on it, the run's values outside the measured range of each axis (in
        words; extrapolated), how many federations it holds, whether they are at least `MIN_FEDERATIONS`, which
        they are; ``gap_points``: ``{"median", "p90", "max"}`` of their mean gaps to Opt (points; ``p90``: the 90th
        percentile, linear between the federations' values);
        ``within_2pt`` / ``within_1pt``: ``{"median", "min"}`` of their shares of releases within 2 / 1 points.

    Raises:
        ValueError: If the table holds no federation of ``ballot``, the relation and the partition, or
            ``partition`` is not one of `PARTITIONS`.
    """
    relation = check_neighbouring(neighbouring)
    if partition is not None and partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {', '.join(PARTITIONS)} or unknown (None), got {partition!r}")
    source = load_measured() if table is None else table
    cells = {c: [p for p in points if partition is None or partition_kind(p.partition) == partition]
             for c, points in source.items() if c[0] == ballot and c[2] == relation}
    cells = {c: points for c, points in cells.items() if points}
    if not cells:
        raise ValueError(f"ballot {ballot!r} was not measured under {relation}"
                         f"{'' if partition is None else f' on {partition} partitions'} (measured: "
                         f"{', '.join(sorted(measured_ballots(source)))})")
    cell = min(cells, key=lambda c: (cell_distance(c, num_candidates, clients, epsilon), c[1], c[3], c[4]))
    points = cells[cell]
    outside = []
    for name, value, measured in (("candidates", num_candidates, [c[1] for c in cells]),
                                  ("n", clients, [c[3] for c in cells]), ("epsilon", epsilon, [c[4] for c in cells])):
        lo, hi = min(measured), max(measured)
        if not lo <= value <= hi:
            outside.append(f"{name} {value:g} is outside the measured {lo:g}" + ("" if lo == hi else f"-{hi:g}"))
    gaps = np.array([p.gap_points for p in points])

    def stats(values: Any, *names: str) -> dict[str, float]:
        got = {"median": np.median(values), "p90": np.percentile(values, 90), "max": np.max(values),
               "min": np.min(values)}
        return {name: round(float(got[name]), 4) for name in names}

    return {"ballot": ballot, "neighbouring": relation, "partition": partition, "candidates": cell[1],
            "clients": cell[3], "epsilon": cell[4],
            "distance": round(cell_distance(cell, num_candidates, clients, epsilon), 4),
            "on_grid": (cell[1], cell[3], cell[4]) == (num_candidates, clients, epsilon), "outside": outside,
            "federations": len(points), "enough": len(points) >= MIN_FEDERATIONS,
            "measured_on": measured_on(points),
            "gap_points": stats(gaps, "median", "p90", "max"),
            **{key: stats([getattr(p, key) for p in points], "median", "min") for key in ("within_2pt", "within_1pt")}}


def measured_on(points: Iterable[Point]) -> str:
    """The federations of ``points`` in words: ``"adult (Dirichlet 0.5, iid); digits (iid)"``."""
    parts: dict[str, set[str]] = {}
    for p in points:
        parts.setdefault(p.dataset, set()).add(p.partition)
    return "; ".join(f"{d} ({', '.join(sorted(labels))})" for d, labels in sorted(parts.items()))
