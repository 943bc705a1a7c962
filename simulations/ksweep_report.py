"""The ballot grid's tables from ``dphype bench ksweep`` runs: the tables of docs/ballots.md.

``dphype bench ksweep`` measures one data set per run (its ``ksweep.csv``: the gap to Opt and the shares within 1 and 2
points at every ``k`` of the sweep; its ``ksweep_ballots.csv``: the same for each ballot of ``--ballots``). This study
reads the folders of several runs (``--runs``), checks that no point of the grid (data set, ``n``, partition, epsilon,
relation) appears twice, and writes:

* ``ksweep_report_points.csv``: per point and ballot, the gap to Opt, the shares within 1 and 2 points, the best
  fixed ``k`` in hindsight (the smallest gap over the points' swept ``k``, ties to the smaller ``k``) and how far the
  ballot trails it (``gap - best gap``; the same releases, common random numbers, so the difference is the
  ballots' alone);
* ``ksweep_report_floor.csv``: per cell ``(relation, n, epsilon)``, the fixed ``k`` that minimises the largest gap
  behind the best ``k`` over the cell's federations, and that smallest largest gap. No rule that reads only public
  facts (``p``, ``n``, epsilon, the relation: what the cell fixes) can pick different ``k`` for the federations of
  one cell, so over the measured tasks none trails the best ``k`` by less than the largest floor (a lower bound for
  every such rule, the measured tasks' own data included in hindsight);
* ``ksweep_report_within.csv``: per federation (data set, partition) of each cell ``(relation, n, epsilon)``, the
  mean gap to Opt of ``--default`` and its shares of releases within 1 and within 2 points of Opt, with the ballot and
  the number of candidates (``--candidates``): the table the planner quotes (`dphype.selection.measured`, which
  takes the distribution over each cell's federations). ``--planner-table FILE`` also writes it into ``FILE`` (the
  package's is ``dphype/data/ksweep_report_within.csv``), replacing that file's rows of the same ballot and number of
  candidates and keeping the others, and checks the result with the planner's loader;
* ``ksweep_report.md``: the tables of docs/ballots.md: each ballot and the ``--top-fixed`` fixed ``k`` with the
  smallest largest gap, over the grid (largest gap / mean / points more than 1 behind, per relation; the share of
  releases within 2 points of Opt at the goal's point, ``--goal``); per point, ``--default`` (``auto``) against the
  best ``k``; the floor per cell.

It reads CSV files only (no training, no noise draws): seconds for the whole grid.
"""

from __future__ import annotations

import argparse
import csv
import io
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dphype.checks import NEIGHBOURING
from dphype.privacy.winner import noise_std
from dphype.release import DEFAULT_ARGMAX_BALLOT
from dphype.selection.measured import COLUMNS, read_measured
from dphype.selection.voting import Ballot
from simulations import harness

#: A point of the grid: data set, n, partition label, epsilon, relation.
Point = tuple[str, int, str, float, str]
#: Accuracy points behind the best fixed ``k`` beyond which a point counts as missed ("more than 1 behind").
MISS_POINTS = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", nargs="+", required=True, metavar="DIR",
                        help="output folders of dphype bench ksweep runs (each with ksweep.csv and, for the "
                             "ballots, ksweep_ballots.csv); each point of the grid in one of them only")
    parser.add_argument("--default", default=DEFAULT_ARGMAX_BALLOT,
                        help="the ballot compared point by point (default the argmax release's, "
                             f"{DEFAULT_ARGMAX_BALLOT}); a share or auto ballot is read off the sweep at the k its "
                             "rule gives now")
    parser.add_argument("--top-fixed", type=int, default=5,
                        help="fixed k rows in the ballot table: those with the smallest largest gap (default 5)")
    parser.add_argument("--candidates", type=int, default=100,
                        help="the number of candidates the runs measured, for the planner's table and a share or auto "
                             "ballot's k (default 100, "
                             "Table III's grid)")
    parser.add_argument("--planner-table", default=None, metavar="FILE",
                        help="also write the planner's table of measured shares into FILE (e.g. "
                             "dphype/data/ksweep_report_within.csv), replacing its rows of this ballot and number of "
                             "candidates")
    parser.add_argument("--goal", nargs=3, default=["20", "1", "replace-one"], metavar=("N", "EPSILON", "RELATION"),
                        help="the point whose share within 2 points is tabulated per task (default 20 1 replace-one)")


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """Validated options (``ValueError`` naming the option, before any file is read)."""
    n, eps, relation = args.goal
    if relation not in NEIGHBOURING:
        raise ValueError(f"--goal RELATION must be one of {', '.join(NEIGHBOURING)}, got {relation!r}")
    try:
        goal = (int(n), float(eps), relation)
    except ValueError:
        raise ValueError(f"--goal takes N (an integer) EPSILON (a number) RELATION, got {args.goal!r}") from None
    runs = run_folders(args.runs)
    table = None if args.planner_table is None else Path(args.planner_table)
    if table is not None and table.exists():
        read_measured(table.read_text(encoding="utf-8"), str(table))  # a malformed table is refused, not merged
    return {"runs": runs, "default": Ballot.parse(args.default).name, "goal": goal, "planner_table": table,
            "candidates": harness.check_int("candidates", args.candidates, 2),
            "top_fixed": harness.check_int("top-fixed", args.top_fixed, 0)}


def _point(row: dict[str, str]) -> Point:
    return (row["dataset"], int(row["clients"]), row["partition"], float(row["epsilon"]), row["neighbouring"])


def partition_label(partition: str) -> str:
    """A run's partition as the tables name it (``beta=0.5`` -> ``Dirichlet 0.5``)."""
    return partition.replace("beta=", "Dirichlet ")


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def run_folders(dirs: Sequence[str]) -> list[Path]:
    """``--runs`` as folders, each refused unless it holds a ``ksweep.csv``."""
    runs = [Path(d) for d in dirs]
    for d in runs:
        if not (d / "ksweep.csv").is_file():
            raise ValueError(f"--runs: {d} has no ksweep.csv; pass the --out folders of dphype bench ksweep runs")
    return runs


def read_runs(runs: Iterable[Path]) -> tuple[dict[Point, dict[int, dict[str, float]]],
                                              dict[Point, dict[str, dict[str, float]]]]:
    """The sweeps and the ballots of every run, by point.

    Args:
        runs: ``dphype bench ksweep`` output folders.

    Returns:
        ``(sweeps, ballots)``: per point, ``{k: {gap_points, within_1pt, within_2pt}}`` and
        ``{ballot: {depth, gap_points, within_1pt, within_2pt}}``.

    Raises:
        ValueError: A point appears in two runs.
    """
    sweeps: dict[Point, dict[int, dict[str, float]]] = {}
    ballots: dict[Point, dict[str, dict[str, float]]] = {}
    seen: dict[Point, Path] = {}
    for d in runs:
        mine: dict[Point, dict[int, dict[str, float]]] = {}
        for row in _read(d / "ksweep.csv"):
            mine.setdefault(_point(row), {})[int(row["k"])] = {
                key: float(row[key]) for key in ("gap_points", "within_1pt", "within_2pt")}
        for point in mine:
            if point in seen:
                raise ValueError(f"--runs: the point {point} is in both {seen[point]} and {d}; pass each point once")
            seen[point] = d
        sweeps.update(mine)
        if (d / "ksweep_ballots.csv").is_file():
            for row in _read(d / "ksweep_ballots.csv"):
                ballots.setdefault(_point(row), {})[row["ballot"]] = {
                    key: float(row[key]) for key in ("depth", "gap_points", "within_1pt", "within_2pt")}
    return sweeps, ballots


def read_off_sweep(sweeps: dict[Point, dict[int, dict[str, float]]],
                   ballots: dict[Point, dict[str, dict[str, float]]], name: str, candidates: int) -> None:
    """A share or auto ballot ``name`` at each point as its rule resolves it now (``p = candidates``, the noise of the
    point's epsilon and relation, all ``n`` voting): the sweep's row at that ``k`` (the same releases, as ``dphype
    bench ksweep`` replays a resolved ballot), or the run's measurement of ``name`` if it voted with that ``k``; a
    measurement with another ``k`` (the rule's constants since refitted) is dropped."""
    ballot = Ballot.parse(name)
    if not ballot.from_public_facts:
        return
    for point, sweep in sweeps.items():
        mine = ballots.setdefault(point, {})
        k = ballot.resolve(candidates, noise_std(point[3], point[4]), point[1]).depth
        if k in sweep:
            mine[name] = {"depth": float(k), **sweep[k]}
        elif name in mine and mine[name]["depth"] != k:
            del mine[name]


def point_rows(sweeps: dict[Point, dict[int, dict[str, float]]],
               ballots: dict[Point, dict[str, dict[str, float]]]) -> list[dict[str, Any]]:
    """Per point and ballot (the fixed ``k`` as ``top-k, k = K``): its gap, shares and how far it trails the best ``k``.

    Args:
        sweeps: Per point, the sweep (`read_runs`).
        ballots: Per point, the ballots (`read_runs`).

    Returns:
        One row per point and ballot.
    """
    rows = []
    for point in sorted(sweeps):
        sweep = sweeps[point]
        best_k = min(sweep, key=lambda k: (sweep[k]["gap_points"], k))
        best = sweep[best_k]
        entries = [(f"top-k, k = {k}", float(k), m) for k, m in sorted(sweep.items())]
        entries += [(name, m["depth"], m) for name, m in ballots.get(point, {}).items()]
        dataset, n, partition, eps, relation = point
        for name, depth, m in entries:
            rows.append({"dataset": dataset, "clients": n, "partition": partition, "epsilon": eps,
                         "neighbouring": relation, "ballot": name, "depth": int(depth),
                         "gap_points": m["gap_points"], "within_1pt": m["within_1pt"], "within_2pt": m["within_2pt"],
                         "best_k": best_k, "best_k_gap_points": best["gap_points"],
                         "best_k_within_1pt": best["within_1pt"], "best_k_within_2pt": best["within_2pt"],
                         "most_within_2pt": max(s["within_2pt"] for s in sweep.values()),
                         "behind_best_k_points": round(m["gap_points"] - best["gap_points"], 3)})
    return rows


def floor_rows(sweeps: dict[Point, dict[int, dict[str, float]]]) -> list[dict[str, Any]]:
    """Per cell ``(relation, n, epsilon)``: the fixed ``k`` with the smallest largest gap behind the best ``k`` over
    the cell's federations, and that gap (the ``k`` swept at every federation of the cell only).

    Args:
        sweeps: Per point, the sweep (`read_runs`).

    Returns:
        One row per cell, sorted by relation, ``n``, epsilon.
    """
    cells: dict[tuple[str, int, float], list[Point]] = {}
    for point in sweeps:
        cells.setdefault((point[4], point[1], point[3]), []).append(point)
    rows = []
    for (relation, n, eps), points in sorted(cells.items()):
        ks = sorted(set.intersection(*(set(sweeps[p]) for p in points)))
        if not ks:
            continue
        best = {p: min(m["gap_points"] for m in sweeps[p].values()) for p in points}
        worst = {k: max(sweeps[p][k]["gap_points"] - best[p] for p in points) for k in ks}
        k_star = min(ks, key=lambda k: (worst[k], k))
        rows.append({"neighbouring": relation, "clients": n, "epsilon": eps, "federations": len(points),
                     "minimax_k": k_star, "floor_points": round(worst[k_star], 3)})
    return rows


def within_rows(rows: Sequence[dict[str, Any]], ballot: str, candidates: int = 100) -> list[dict[str, Any]]:
    """``ballot``'s rows of `point_rows` in the planner's table's columns (`dphype.selection.measured.COLUMNS`): per
    federation, its cell, its mean gap to Opt and its shares within 1 and 2 points.

    Args:
        rows: `point_rows`.
        ballot: The ballot's name.
        candidates: The number of candidates the runs measured.

    Returns:
        One row per point of ``ballot``, its partition labelled as the tables label it (`partition_label`).
    """
    return [{"ballot": ballot, "candidates": candidates, "neighbouring": r["neighbouring"], "clients": r["clients"],
             "epsilon": r["epsilon"], "partition": partition_label(r["partition"]), "dataset": r["dataset"],
             "gap_points": r["gap_points"], "within_1pt": r["within_1pt"], "within_2pt": r["within_2pt"]}
            for r in rows if r["ballot"] == ballot]


def write_planner_table(path: Path, within: Sequence[dict[str, Any]]) -> Path:
    """Write ``within`` into the planner's table at ``path``, keeping its rows of other ballots or candidates.

    Args:
        path: The table (created if missing; an existing one was checked by `settings`).
        within: `within_rows` of one ballot and number of candidates.

    Returns:
        ``path``, after the planner's loader accepted what was written.
    """
    mine = {(r["ballot"], str(r["candidates"])) for r in within}
    kept: list[dict[str, Any]] = []
    if path.exists():
        with path.open(newline="") as fh:
            kept = [r for r in csv.DictReader(fh) if (r["ballot"], r["candidates"]) not in mine]
    merged = sorted([*kept, *within], key=lambda r: (r["ballot"], int(r["candidates"]), r["neighbouring"],
                                                      int(r["clients"]), float(r["epsilon"]), r["partition"],
                                                      r["dataset"]))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(COLUMNS), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(merged)
    read_measured(buffer.getvalue(), str(path))  # what the planner will load
    path.write_text(buffer.getvalue(), encoding="utf-8")
    return path


def ballot_summary(rows: Sequence[dict[str, Any]], goal: tuple[int, float, str]) -> dict[str, dict[str, Any]]:
    """Per ballot and relation over the grid: points, largest and mean gap behind the best ``k``, points more than
    `MISS_POINTS` behind; and its share within 2 points at each federation of the goal's ``(n, epsilon, relation)``.

    Args:
        rows: `point_rows`.
        goal: ``(n, epsilon, relation)``.

    Returns:
        ``{ballot: {relation: {points, max_behind, mean_behind, missed}, "goal_within_2pt": {task: share}}}``.
    """
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        entry = out.setdefault(r["ballot"], {"goal_within_2pt": {}})
        stats = entry.setdefault(r["neighbouring"], {"behind": []})
        stats["behind"].append(r["behind_best_k_points"])
        if (r["clients"], r["epsilon"], r["neighbouring"]) == goal:
            entry["goal_within_2pt"][f"{r['dataset']} {partition_label(r['partition'])}"] = r["within_2pt"]
    for entry in out.values():
        for relation in NEIGHBOURING:
            if relation in entry:
                behind = entry[relation].pop("behind")
                entry[relation] = {"points": len(behind), "max_behind": round(float(np.max(behind)), 3),
                                   "mean_behind": round(float(np.mean(behind)), 3),
                                   "missed": int(sum(b > MISS_POINTS for b in behind))}
    return out


def _summary_cell(stats: dict[str, Any] | None) -> str:
    if stats is None:
        return ""
    return f"{stats['max_behind']:.2f} / {stats['mean_behind']:.2f} / {stats['missed']} of {stats['points']}"


def percent(x: float) -> str:
    """A share as a whole percentage."""
    return f"{100 * x:.0f}%"


def markdown(rows: Sequence[dict[str, Any]], floors: Sequence[dict[str, Any]], summary: dict[str, dict[str, Any]],
             *, default: str, top_fixed: int, goal: tuple[int, float, str]) -> str:
    """docs/ballots.md's tables (see the module docstring).

    Args:
        rows: `point_rows`.
        floors: `floor_rows`.
        summary: `ballot_summary`.
        default: The ballot compared point by point.
        top_fixed: How many fixed ``k`` rows the ballot table shows.
        goal: ``(n, epsilon, relation)`` of the per-task column.

    Returns:
        Markdown text.
    """
    def worst(name: str) -> float:
        return max(summary[name][rel]["max_behind"] for rel in NEIGHBOURING if rel in summary[name])

    fixed = sorted((b for b in summary if b.startswith("top-k, k = ")), key=lambda b: (worst(b), b))[:top_fixed]
    named = sorted((b for b in summary if not b.startswith("top-k, k = ")), key=lambda b: (worst(b), b))
    tasks = sorted({t for entry in summary.values() for t in entry["goal_within_2pt"]})
    n, eps, relation = goal
    lines = [f"Behind the best fixed k in hindsight (largest / mean / points more than {MISS_POINTS:g} behind), and "
             f"the share of releases within 2 points of Opt at n = {n}, epsilon {eps:g}, {relation}:", "",
             "| ballot | replace-one | add-remove | " + " | ".join(tasks) + " |",
             "|---|---|---|" + "---|" * len(tasks)]
    for b in named + fixed:
        goal_shares = summary[b]["goal_within_2pt"]
        lines.append(f"| `{b}` | {_summary_cell(summary[b].get('replace-one'))} | "
                     f"{_summary_cell(summary[b].get('add-remove'))} | "
                     + " | ".join(percent(goal_shares[t]) if t in goal_shares else "" for t in tasks) + " |")
    for relation_ in NEIGHBOURING:
        mine = [r for r in rows if r["ballot"] == default and r["neighbouring"] == relation_]
        if not mine:
            continue
        lines += ["", f"Per point, `{default}` against the best k in hindsight ({relation_}):", "",
                  f"| task | n | partition | epsilon | {default}'s k | gap | within 1 | within 2 | best k | its gap | "
                  "its within 1 | its within 2 | most within 2 at any k | behind |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in mine:
            lines.append(f"| {r['dataset']} | {r['clients']} | {partition_label(r['partition'])} | {r['epsilon']:g} | "
                         f"{r['depth']} | {r['gap_points']:.2f} | {percent(r['within_1pt'])} | "
                         f"{percent(r['within_2pt'])} | {r['best_k']} | {r['best_k_gap_points']:.2f} | "
                         f"{percent(r['best_k_within_1pt'])} | {percent(r['best_k_within_2pt'])} | "
                         f"{percent(r['most_within_2pt'])} | {r['behind_best_k_points']:.2f} |")
    lines += ["", "The floor of any rule of public facts: per cell, the one k with the smallest largest gap behind "
              "the best k over the cell's federations:", "",
              "| relation | n | epsilon | federations | that k | its largest gap behind the best k |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {f['neighbouring']} | {f['clients']} | {f['epsilon']:g} | {f['federations']} | {f['minimax_k']} | "
              f"{f['floor_points']:.2f} |" for f in floors]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    opts = settings(args)
    sweeps, ballots = read_runs(opts["runs"])
    read_off_sweep(sweeps, ballots, opts["default"], opts["candidates"])
    rows = point_rows(sweeps, ballots)
    if not any(r["ballot"] == opts["default"] for r in rows):
        raise ValueError(f"--default {opts['default']!r} was not measured in these runs (their --ballots); "
                         "pass one of them, or a share or auto ballot whose k the runs swept")
    floors = floor_rows(sweeps)
    summary = ballot_summary(rows, opts["goal"])
    study.write_csv("ksweep_report_points.csv", rows)
    study.write_csv("ksweep_report_floor.csv", floors)
    within = within_rows(rows, opts["default"], opts["candidates"])
    study.write_csv("ksweep_report_within.csv", within)
    if opts["planner_table"] is not None:
        study.outputs.append(str(write_planner_table(opts["planner_table"], within)))
    path = study.path("ksweep_report.md")
    path.write_text(markdown(rows, floors, summary, default=opts["default"], top_fixed=opts["top_fixed"],
                             goal=opts["goal"]))
    study.outputs.append(str(path))
    default = summary[opts["default"]]
    return study.result(points=len(sweeps), runs=[str(d) for d in opts["runs"]], default=opts["default"],
                        default_behind={rel: default[rel] for rel in NEIGHBOURING if rel in default},
                        default_goal_within_2pt=default["goal_within_2pt"],
                        floor_points={rel: max((f["floor_points"] for f in floors if f["neighbouring"] == rel),
                                               default=None) for rel in NEIGHBOURING})
