"""What the bench measured of the winner release: the shares of releases near Opt, loaded from a data file.

The planner sees no data: how close a release lands to Opt depends on how well the clients' local scores predict the
federated accuracy, which no scenario knows. What it can quote is what ``dphype bench ksweep`` measured on its tasks,
as ``dphype bench ksweep-report`` tabulates it (``ksweep_report_within.csv``, written into the package with its
``--planner-table`` option): per ballot, number of candidates ``p``, relation, ``n`` and epsilon, the smallest and
largest share of releases within 1 and within 2 accuracy points of Opt over the measured federations, how many
there were and which. `load_measured` reads and checks such a file (the package's own by default) and
`measured_within` answers with the grid point nearest a run.
"""

from __future__ import annotations

import csv
import functools
import importlib.resources
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dphype.checks import NEIGHBOURING, check_neighbouring

#: The ballot the planner quotes by default (`dphype.modes.ArgmaxRelease`'s default).
MEASURED_BALLOT = "auto"
#: The package's table, in ``dphype/data``.
MEASURED_FILE = "ksweep_report_within.csv"
#: The columns of a table, in the order ``dphype bench ksweep-report`` writes them.
COLUMNS: tuple[str, ...] = ("ballot", "candidates", "neighbouring", "clients", "epsilon", "tasks", "measured_on",
                            "within_1pt_min", "within_1pt_max", "within_2pt_min", "within_2pt_max")
#: The fix every refusal names.
_REGENERATE = "regenerate it with dphype bench ksweep-report --planner-table FILE"

#: A cell of the table: ballot, number of candidates, relation, number of clients, epsilon.
Cell = tuple[str, int, str, int, float]


@dataclass(frozen=True)
class Measured:
    """The measured shares of one cell over its federations.

    Attributes:
        tasks: How many federations were measured.
        measured_on: Which they were, in words.
        within_1pt: The smallest and largest share of releases within 1 point of Opt.
        within_2pt: The smallest and largest share within 2 points.
    """

    tasks: int
    measured_on: str
    within_1pt: tuple[float, float]
    within_2pt: tuple[float, float]


def _cell(row: dict[str, str], where: str) -> tuple[Cell, Measured]:
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
    candidates, clients, tasks = (number(c, int) for c in ("candidates", "clients", "tasks"))
    epsilon = number("epsilon", float)
    if candidates < 2 or clients < 1 or tasks < 1 or epsilon <= 0 or not row["ballot"]:
        raise ValueError(f"{where}: needs a ballot, candidates >= 2, clients >= 1, tasks >= 1 and epsilon > 0; "
                         f"{_REGENERATE}")
    within_1pt = (share("within_1pt_min"), share("within_1pt_max"))
    within_2pt = (share("within_2pt_min"), share("within_2pt_max"))
    if not (within_1pt[0] <= within_1pt[1] and within_2pt[0] <= within_2pt[1] and within_1pt[0] <= within_2pt[0]
            and within_1pt[1] <= within_2pt[1]):
        raise ValueError(f"{where}: each min must be at most its max, and a share within 1 point at most the share "
                         f"within 2; {_REGENERATE}")
    return ((row["ballot"], candidates, row["neighbouring"], clients, float(epsilon)),
            Measured(tasks, row["measured_on"], within_1pt, within_2pt))


def read_measured(text: str, source: str = MEASURED_FILE) -> dict[Cell, Measured]:
    """A table's cells from its CSV text, every row checked.

    Args:
        text: The CSV text, with the header `COLUMNS` (in any order; other columns are refused).
        source: The file's name, for the errors.

    Returns:
        Cell -> its measured shares.

    Raises:
        ValueError: Naming the file, the row and the column, for a missing or unknown column, a value of the wrong
            type or out of range, a min above its max, a cell given twice, or no rows.
    """
    reader = csv.DictReader(io.StringIO(text))
    header = tuple(reader.fieldnames or ())
    if sorted(header) != sorted(COLUMNS):
        missing, unknown = sorted(set(COLUMNS) - set(header)), sorted(set(header) - set(COLUMNS))
        raise ValueError(f"{source}: the columns must be {', '.join(COLUMNS)} (missing: {missing}, unknown: "
                         f"{unknown}); {_REGENERATE}")
    table: dict[Cell, Measured] = {}
    for line, row in enumerate(reader, start=2):
        where = f"{source}, line {line}"
        if None in row or any(row[c] is None for c in COLUMNS):
            raise ValueError(f"{where}: expected {len(COLUMNS)} fields; {_REGENERATE}")
        cell, measured = _cell(row, where)
        if cell in table:
            raise ValueError(f"{where}: the cell {cell} appears twice; {_REGENERATE}")
        table[cell] = measured
    if not table:
        raise ValueError(f"{source}: no rows; {_REGENERATE}")
    return table


def load_measured(path: str | Path | None = None) -> dict[Cell, Measured]:
    """The measured table at ``path`` (``dphype bench ksweep-report``'s), or the package's own, read once.

    Args:
        path: A table file; ``None``: the package's (`MEASURED_FILE`).

    Returns:
        Cell -> its measured shares (`read_measured`).

    Raises:
        ValueError: If the file is malformed.
        OSError: If ``path`` cannot be read.
    """  # noqa: DOC502
    if path is None:
        return _packaged()
    return read_measured(Path(path).read_text(encoding="utf-8"), str(path))


@functools.cache
def _packaged() -> dict[Cell, Measured]:
    text = importlib.resources.files("dphype").joinpath("data", MEASURED_FILE).read_text(encoding="utf-8")
    return read_measured(text, f"dphype/data/{MEASURED_FILE}")


def measured_ballots(table: dict[Cell, Measured] | None = None, neighbouring: str | None = None) -> frozenset[str]:
    """The ballots the table (default the package's) measured, under ``neighbouring`` (``None``: under any).

    Args:
        table: A table from `load_measured`; ``None``: the package's.
        neighbouring: A relation, or ``None``.

    Returns:
        Their names.
    """
    return frozenset(cell[0] for cell in (load_measured() if table is None else table)
                     if neighbouring is None or cell[2] == neighbouring)


def measured_within(clients: int, epsilon: float, neighbouring: str = "replace-one", num_candidates: int = 100,
                    ballot: str = MEASURED_BALLOT, table: dict[Cell, Measured] | None = None) -> dict[str, Any]:
    """The measured shares of releases within 1 and 2 points of Opt at the grid point nearest the run.

    At the measured number of candidates nearest ``p`` (in ``log p``), then at its grid point nearest ``(clients,
    epsilon)`` (in ``log n`` and ``log epsilon``), for ``ballot`` and the run's relation.

    Args:
        clients: The number ``n`` of clients.
        epsilon: The run's epsilon.
        neighbouring: The run's neighbouring relation.
        num_candidates: The number ``p`` of candidates.
        ballot: The run's ballot (one of `measured_ballots`).
        table: A table from `load_measured`; ``None``: the package's.

    Returns:
        ``{"ballot", "neighbouring", "candidates", "clients", "epsilon", "on_grid", "tasks", "measured_on",
        "within_1pt", "within_2pt"}``: the grid point, whether the run is on it, the ``[min, max]`` shares over the
        tasks and which they were.

    Raises:
        ValueError: If the table holds no cell of ``ballot`` and the relation.
    """
    relation = check_neighbouring(neighbouring)
    cells = [c for c in (load_measured() if table is None else table) if c[:1] == (ballot,) and c[2] == relation]
    if not cells:
        raise ValueError(f"ballot {ballot!r} was not measured under {relation} (measured: "
                         f"{', '.join(sorted(measured_ballots(table)))})")
    p = min({c[1] for c in cells}, key=lambda q: (abs(math.log(q / num_candidates)), q))
    point = min((c for c in cells if c[1] == p),
                key=lambda c: (abs(math.log(c[3] / clients)) + abs(math.log(c[4] / epsilon)), c))
    entry = (load_measured() if table is None else table)[point]
    return {"ballot": ballot, "neighbouring": relation, "candidates": p, "clients": point[3],
            "epsilon": point[4], "on_grid": (point[3], point[4], p) == (clients, epsilon, num_candidates),
            "tasks": entry.tasks, "measured_on": entry.measured_on,
            "within_1pt": list(entry.within_1pt), "within_2pt": list(entry.within_2pt)}
