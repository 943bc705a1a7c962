"""Candidate default ballots fitted on all tasks but one and measured on the one left out, every task in turn.

``dphype bench ksweep`` measures, per point of the grid (data set, ``n``, partition, epsilon, relation), the gap to
Opt and the shares of releases within 1 and 2 points of Opt at every fixed ``k``. A default ballot of the top-k kind
is a rule that picks ``k`` from public facts (the number of candidates ``p``, the noise std ``s`` of the release,
``n``); its result at a point is the sweep's at the ``k`` it picks (the same releases, common random numbers). This
study reads the folders of several runs (``--runs``, as ``ksweep-report``) and, for each family of rules:

* ``constant``: ``k = K`` (the ballot ``top-k``);
* ``share``: ``k = round(c p)`` (the ballot ``share:c:0``);
* ``auto``: the auto ballot's form, ``k = round(c p (s / n)^a)``, ``c`` and ``a`` fitted;
* ``ratio``: the same form with ``a = 1``, ``k = round(c p s / n)``, only ``c`` fitted (the noise per voter);
* ``noise``: ``k = round(c p s^a)``, the noise alone, no ``n`` (the ballot ``share:c:a``);
* ``power``: ``k = round(c p s^a / n^b)``;

(every family but ``constant`` through `dphype.selection.voting.rule_depth`: at least 2 and ``AUTO_FLOOR p``, at most
``p / 2``), and the data-aware families of `simulations.ksweep_aware` (``score``, ``joint``, ``shallow``,
``threshold``: measured at every point from the runs' cached arrays, ``--cache``), fits its parameters on every
task but one, over a grid, and applies them to the task left out. The
fit's objective is the goals' largest excess over the training cells ``(relation, n, epsilon)``: per cell, the
worst gap behind the best fixed ``k`` in hindsight over the cell's training points less the cell's bar (the goal,
2 points, or the cell's training floor + 0.5 where that is higher), and the mean gap less its bar (1 point, or the
floor's mean + 0.5); the largest of these over the cells (`objective`). A rule of public facts takes one ``k`` per
cell, so each cell is a compromise between its tasks; the fit keeps a margin by scoring each grid row with the
largest objective of the rows that differ from it only in the first parameter, by at most a factor
`ROBUST_BAND` (`robust`): a fit that holds only on a knife's edge of the training tasks does not win. Ties go to
the plain objective, then the largest shortfall of the share goal (within 2 points at the goal point ``--goal`` of
each training federation where some fixed ``k`` reaches 90%), the mean, the worst gap and the smaller
parameters. The held-out task's points never enter its fit.

It writes ``ksweep_loto.csv`` (per family, held-out task and point: the fitted parameters, ``k``, gap, how far
behind the best ``k``, share within 2 points), ``ksweep_loto_fits.csv`` (per family and held-out task: parameters,
held-out mean and worst, goal shares; and the fit on all tasks), ``ksweep_loto_cells.csv`` (per family and cell
``(relation, n, epsilon)``: out-of-sample mean and worst against the floor, the best any one fixed ``k`` reaches
over the cell's federations) and ``ksweep_loto.md`` (the tables against the goals, with each family's `most_met`).
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dphype.checks import NEIGHBOURING
from dphype.ml.validation import DEFAULT_VALIDATION, check_validation
from dphype.privacy.winner import noise_std
from dphype.selection.voting import AUTO_FLOOR, rule_depth
from simulations import harness
from simulations.ksweep_aware import FORMS, PARAMETERS, measure_points
from simulations.ksweep_report import Point, partition_label, percent, read_runs, run_folders

#: The goals: the mean and the worst gap behind the best fixed ``k`` (points), the share of releases within 2 points
#: of Opt at the goal point wherever some fixed ``k`` reaches it, and the slack over the floor where a goal is out of
#: reach (points).
GOAL_MEAN, GOAL_WORST, GOAL_SHARE, FLOOR_SLACK = 1.0, 3.0, 0.8, 0.5
#: The share goal holds at every iid point with at least this many clients (`goal_mask`).
GOAL_CLIENTS = 50
#: A fit's first parameter may be off by this factor (either way) and the fit must still score as well: `robust`.
ROBUST_BAND = 1.08

_SCALES = np.unique(np.concatenate([np.round(np.geomspace(0.002, 50.0, 121), 4),
                                    np.round(np.arange(0.01, 2.0, 0.01), 2)]))


@dataclass(frozen=True)
class Family:
    """A family of default ballots: parameter names, the grid the fit searches, and per grid row either ``k`` at each
    point (a rule of public facts, ``depths``) or each point's measured gap and share (a data-aware family,
    ``measured``: `simulations.ksweep_aware`)."""

    name: str
    form: str
    params: tuple[str, ...]
    grid: np.ndarray
    depths: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None
    measured: np.ndarray | None = None  #: ``(rows, points, 2)``: gap to Opt (points), share within 2 points

    def outcomes(self, grid: Grid, idx: np.ndarray, rows: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(behind, within2, gap, k)``, each with one row per grid row of ``rows`` (default every row) and one column
        per point of ``idx``; ``k`` is -1 where the data choose the depth."""
        chosen = slice(None) if rows is None else rows
        if self.measured is not None:
            gap, within2 = self.measured[chosen][:, idx, 0], self.measured[chosen][:, idx, 1]
            return gap - grid.gap[idx].min(axis=1)[None, :], within2, gap, np.full(gap.shape, -1)
        assert self.depths is not None
        cols = grid.column(self.depths(self.grid[chosen], grid.p[idx], grid.s[idx], grid.n[idx]))
        pts = np.arange(len(idx))[None, :]
        return (grid.behind[idx][pts, cols], grid.within2[idx][pts, cols], grid.gap[idx][pts, cols],
                grid.ks[cols])


def _power(grid: np.ndarray, p: np.ndarray, s: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``k`` for each grid row ``(c, a, b)`` or ``(c, a, b, f)`` (rows) at each point (columns); ``f`` the floor's
    share of ``p`` (default `dphype.selection.voting.AUTO_FLOOR`)."""
    c, a, b = (grid[:, i, None] for i in range(3))
    floor = grid[:, 3, None] if grid.shape[1] > 3 else AUTO_FLOOR
    return rule_depth(p[None, :], s[None, :], n[None, :], c, a, b, floor)  # type: ignore[arg-type]


#: The families of rules of public facts, in report order (`families`).
RULE_NAMES = ("constant", "share", "auto", "ratio", "floor", "noise", "power")
#: Every family the study can fit: the rules, then the data-aware families (`simulations.ksweep_aware`).
FAMILY_NAMES = (*RULE_NAMES, *PARAMETERS)


def families(ks: Sequence[int], names: Sequence[str]) -> list[Family]:
    """The rule families named (any of `RULE_NAMES`; others are skipped), with their grids over ``ks`` (the swept
    ``k``)."""
    exps = np.round(np.arange(0.0, 1.51, 0.05), 2)
    shares = np.round(np.arange(0.01, 0.505, 0.005), 3)
    every: dict[str, Family] = {
        "constant": Family("constant", "k = K", ("K",), np.array(ks, dtype=np.float64)[:, None],
                           lambda g, p, s, n: np.broadcast_to(g[:, :1].astype(np.int64), (len(g), len(p)))),
        "share": Family("share", "k = round(c p)", ("c",), shares[:, None],
                        lambda g, p, s, n: _power(np.column_stack([g[:, 0], 0 * g[:, 0], 0 * g[:, 0]]), p, s, n)),
        "auto": Family("auto", "k = round(c p (s / n)^a)", ("c", "a"),
                       np.array(list(itertools.product(_SCALES, exps))),
                       lambda g, p, s, n: _power(np.column_stack([g, g[:, 1]]), p, s, n)),
        "ratio": Family("ratio", "k = round(c p s / n)", ("c",), _SCALES[:, None],
                        lambda g, p, s, n: _power(np.column_stack([g[:, 0], 1 + 0 * g[:, 0], 1 + 0 * g[:, 0]]),
                                                  p, s, n)),
        "floor": Family("floor", "k = max(round(c p s / n), round(f p))", ("c", "f"),
                        np.array(list(itertools.product(_SCALES[::2], np.round(np.arange(0.02, 0.301, 0.01), 2)))),
                        lambda g, p, s, n: _power(np.column_stack([g[:, 0], 1 + 0 * g[:, 0], 1 + 0 * g[:, 0],
                                                                   g[:, 1]]), p, s, n)),
        "noise": Family("noise", "k = round(c p s^a)", ("c", "a"),
                        np.array(list(itertools.product(_SCALES, exps))),
                        lambda g, p, s, n: _power(np.column_stack([g, 0 * g[:, 0]]), p, s, n)),
        "power": Family("power", "k = round(c p s^a / n^b)", ("c", "a", "b"),
                        np.array(list(itertools.product(_SCALES[::2], exps[::2],
                                                        np.round(np.arange(-0.5, 1.51, 0.1), 2)))),
                        _power),
    }
    return [every[name] for name in names if name in every]


def aware_families(names: Sequence[str], measured: dict[str, np.ndarray]) -> list[Family]:
    """The data-aware families named, their outcomes ``measured`` at the grid's points (`measure_points`)."""
    return [Family(name, FORMS[name], PARAMETERS[name][0], np.array(PARAMETERS[name][1], dtype=np.float64),
                   measured=measured[name]) for name in names if name in PARAMETERS]


@dataclass
class Grid:
    """The measured points as arrays: per point (rows) and swept ``k`` (columns)."""

    points: list[Point]
    ks: np.ndarray
    behind: np.ndarray
    gap: np.ndarray
    within2: np.ndarray
    p: np.ndarray
    s: np.ndarray
    n: np.ndarray

    @classmethod
    def of(cls, sweeps: dict[Point, dict[int, dict[str, float]]], candidates: int) -> Grid:
        points = sorted(sweeps)
        ks = sorted(set.intersection(*(set(sweeps[pt]) for pt in points)))
        gap = np.array([[sweeps[pt][k]["gap_points"] for k in ks] for pt in points])
        within2 = np.array([[sweeps[pt][k]["within_2pt"] for k in ks] for pt in points])
        best = np.array([min(m["gap_points"] for m in sweeps[pt].values()) for pt in points])
        return cls(points, np.array(ks), gap - best[:, None], gap, within2, np.full(len(points), candidates),
                   np.array([noise_std(pt[3], pt[4]) for pt in points]), np.array([pt[1] for pt in points]))

    def column(self, k: np.ndarray) -> np.ndarray:
        """The column of the swept ``k`` nearest each ``k`` (a rule's ``k`` beyond the sweep takes its end)."""
        idx = np.clip(np.searchsorted(self.ks, k), 0, len(self.ks) - 1)
        lower = np.clip(idx - 1, 0, len(self.ks) - 1)
        return np.where(np.abs(self.ks[lower] - k) <= np.abs(self.ks[idx] - k), lower, idx)


def at_goal(clients: int, partition: str, relation: str, goal: tuple[int, str]) -> bool:
    """Whether a point is one of the share goal's ``(smallest n, relation)``: iid, at least that many clients."""
    return partition == "iid" and clients >= goal[0] and relation == goal[1]


def goal_mask(grid: Grid, goal: tuple[int, str]) -> np.ndarray:
    """The points of the share goal (`at_goal`) where some fixed ``k`` puts `GOAL_SHARE` within 2 points."""
    at = np.array([at_goal(pt[1], pt[2], pt[4], goal) for pt in grid.points])
    return at & (grid.within2.max(axis=1) >= GOAL_SHARE - 1e-9)


def most_met(family: Family, grid: Grid, mask: np.ndarray) -> int:
    """The most points of ``mask`` (`goal_mask`) at which one row of ``family``, chosen in hindsight, puts
    `GOAL_SHARE` within 2 points: what no fit of the family can exceed."""
    within2 = family.outcomes(grid, np.flatnonzero(mask))[1]
    return int((within2 >= GOAL_SHARE - 1e-9).sum(axis=1).max())


def share_floor(grid: Grid, mask: np.ndarray) -> tuple[int, float]:
    """One fixed ``k`` per ``(n, epsilon)`` for the points of ``mask`` (what a rule of public facts gives points of
    the same ``p``, ``n`` and epsilon): in each group the ``k`` whose least share within 2 points over its points is
    largest; that ``k`` and share in the group where the share is smallest."""
    groups: dict[tuple[int, float], list[int]] = {}
    for i in np.flatnonzero(mask):
        groups.setdefault((grid.points[i][1], grid.points[i][3]), []).append(int(i))
    least = [grid.within2[rows].min(axis=0) for rows in groups.values()]
    worst = min(least, key=lambda row: float(row.max()))
    return int(grid.ks[np.argmax(worst)]), float(worst.max())


def cells_of(grid: Grid, idx: np.ndarray) -> dict[tuple[str, int, float], np.ndarray]:
    """The points ``idx`` grouped by cell ``(relation, n, epsilon)``, cells sorted (positions into ``idx``)."""
    cells: dict[tuple[str, int, float], list[int]] = {}
    for j, i in enumerate(idx):
        pt = grid.points[i]
        cells.setdefault((pt[4], pt[1], pt[3]), []).append(j)
    return {c: np.array(cells[c]) for c in sorted(cells)}


def bars(behind: np.ndarray) -> tuple[float, float]:
    """A cell's bars from its points' gaps behind the best ``k`` (rows: points, columns: swept ``k``): the worst
    goal or the floor's worst + `FLOOR_SLACK`, the mean goal or the floor's mean + `FLOOR_SLACK`, the higher."""
    return (max(GOAL_WORST, float(behind.max(axis=0).min()) + FLOOR_SLACK),
            max(GOAL_MEAN, float(behind.mean(axis=0).min()) + FLOOR_SLACK))


def objective(behind: np.ndarray, cells: Sequence[np.ndarray], cell_bars: Sequence[tuple[float, float]]) -> np.ndarray:
    """The largest excess of each rule (rows) over the cells' bars: per cell its worst and its mean gap over the
    cell's points (columns of ``behind``, grouped by ``cells``) less `bars`; see the module docstring."""
    return np.max([np.maximum(behind[:, c].max(axis=1) - w, behind[:, c].mean(axis=1) - m)
                   for c, (w, m) in zip(cells, cell_bars, strict=True)], axis=0)


def robust(grid: np.ndarray, score: np.ndarray, band: float = ROBUST_BAND) -> np.ndarray:
    """Per grid row, the largest ``score`` over the rows equal to it but in the first parameter, which may differ by
    a factor up to ``band`` (the row itself included)."""
    out = score.copy()
    first = np.log(np.maximum(grid[:, 0], 1e-300))
    groups: dict[tuple[float, ...], list[int]] = {}
    for i, rest in enumerate(map(tuple, grid[:, 1:])):
        groups.setdefault(rest, []).append(i)
    band = np.log(band) + 1e-12
    for rows in map(np.array, groups.values()):
        near = np.abs(first[rows][:, None] - first[rows][None, :]) <= band
        out[rows] = np.where(near, score[rows][None, :], -np.inf).max(axis=1)
    return out


def fit(family: Family, grid: Grid, train: np.ndarray, goal: np.ndarray, band: float = ROBUST_BAND) -> int:
    """The grid row of ``family`` with the smallest `robust` `objective` over the ``train`` points (ties: see the
    module docstring).

    Args:
        family: The family.
        grid: The measured points.
        train: Which points the fit may read.
        goal: `goal_mask`.
        band: `robust`'s factor.

    Returns:
        The row of ``family.grid``.
    """
    idx = np.flatnonzero(train)
    behind, within2, _, _ = family.outcomes(grid, idx)
    cells = list(cells_of(grid, idx).values())
    score = objective(behind, cells, [bars(grid.behind[idx[c]]) for c in cells])
    at_goal = goal[idx]
    short = np.maximum(0.0, GOAL_SHARE - within2[:, at_goal]).max(axis=1) if at_goal.any() else 0.0 * score
    keys = (*family.grid.T[::-1], np.round(behind.max(axis=1), 9), np.round(behind.mean(axis=1), 9),
            np.round(short, 9), np.round(score, 9), np.round(robust(family.grid, score, band), 9))
    return int(np.lexsort(keys)[0])


def floor_of(grid: Grid, idx: np.ndarray) -> tuple[float, float]:
    """The floor over the points ``idx``: one fixed ``k`` per cell ``(relation, n, epsilon)``, chosen in hindsight for
    the smallest mean (then for the smallest largest) gap behind the best ``k``; ``(mean, worst)`` over the points."""
    cells = [idx[c] for c in cells_of(grid, idx).values()]
    total = sum(float(grid.behind[c].sum(axis=0).min()) for c in cells)
    return total / len(idx), max(float(grid.behind[c].max(axis=0).min()) for c in cells)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", nargs="+", required=True, metavar="DIR",
                        help="output folders of dphype bench ksweep runs (their ksweep.csv, every point once)")
    parser.add_argument("--families", nargs="+", default=list(RULE_NAMES), choices=FAMILY_NAMES,
                        help="the families to fit (default the six rules of public facts; the data-aware "
                             f"{', '.join(PARAMETERS)} read each federation's arrays from --cache)")
    parser.add_argument("--relations", nargs="+", choices=NEIGHBOURING, default=["replace-one"],
                        help="the relations whose points are fitted and measured (default replace-one, the goals')")
    parser.add_argument("--candidates", type=int, default=100,
                        help="the number of candidates p the runs measured (default 100, Table III's grid)")
    parser.add_argument("--goal-clients", type=int, default=GOAL_CLIENTS, metavar="N",
                        help="the share goal holds at every iid point with at least N clients "
                             f"(default {GOAL_CLIENTS})")
    parser.add_argument("--robust-band", type=float, default=ROBUST_BAND, metavar="FACTOR",
                        help="the fit must score as well with its first parameter off by this factor, >= 1 "
                             f"(default {ROBUST_BAND:g}; 1: the plain objective)")
    parser.add_argument("--cache", default=None, metavar="DIR",
                        help="the ksweep runs' --cache folder (the data-aware families only)")
    parser.add_argument("--candidate-list", default="table3", metavar="SPEC",
                        help="the runs' --candidates (the data-aware families only; default table3)")
    parser.add_argument("--validation", default=DEFAULT_VALIDATION,
                        help=f"the runs' --validation (the data-aware families only; default {DEFAULT_VALIDATION})")
    parser.add_argument("--data-dirs", nargs="+", default=[], metavar="DATASET=DIR",
                        help="the runs' --data-dir of each data set read from a folder (the data-aware families only)")
    parser.add_argument("--repetitions", type=int, default=2000,
                        help="draws per point where the data choose the depth (joint, skew, threshold; default 2000)")


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """Validated options (``ValueError`` naming the option, before any file is read)."""
    if not np.isfinite(args.robust_band) or args.robust_band < 1:
        raise ValueError(f"--robust-band must be a finite number >= 1 (1: no margin), got {args.robust_band!r}")
    runs = run_folders(args.runs)
    names = list(dict.fromkeys(args.families))
    if any(name in PARAMETERS for name in names) and args.cache in (None, "none"):
        raise ValueError(f"--cache: the data-aware families ({', '.join(n for n in names if n in PARAMETERS)}) read "
                         "each federation's scores and accuracies; pass the --cache folder of the ksweep runs")
    candidates = harness.check_int("candidates", args.candidates, 2)
    listed = None
    if any(name in PARAMETERS for name in names):
        from dphype.selection.candidates import load_candidates

        listed = load_candidates(str(args.candidate_list))
        if len(listed) != candidates:
            raise ValueError(f"--candidate-list {args.candidate_list!r} has {len(listed)} candidates, --candidates "
                             f"says {candidates}; pass the list the ksweep runs used")
    data_dirs = {}
    for pair in args.data_dirs:
        dataset, sep, folder = pair.partition("=")
        if not sep or not dataset or not folder:
            raise ValueError(f"--data-dirs takes DATASET=DIR pairs, got {pair!r}")
        data_dirs[dataset] = folder
    return {"runs": runs, "families": names, "data_dirs": data_dirs,
            "repetitions": harness.check_int("repetitions", args.repetitions, 2),
            "candidate_list": listed, "validation": check_validation(args.validation),
            "relations": list(dict.fromkeys(args.relations)),
            "candidates": candidates, "goal_clients": harness.check_int("goal_clients", args.goal_clients, 1),
            "band": float(args.robust_band)}


def _params(family: Family, row: int) -> dict[str, float]:
    return {name: float(v) for name, v in zip(family.params, family.grid[row], strict=True)}


def _words(params: dict[str, float]) -> str:
    return ", ".join(f"{k} = {v:g}" for k, v in params.items())


def _depth(k: int | None) -> str:
    return "k from the data" if k is None else f"k {k}"


def _label(pt: Point) -> str:
    return f"{pt[0]} {partition_label(pt[2])}"


def evaluate(grid: Grid, family: Family, goal: tuple[int, str], band: float = ROBUST_BAND) -> dict[str, Any]:
    """Leave one task out for ``family``: per held-out task its fit on the others and its points' results.

    Args:
        grid: The measured points (one relation or several).
        family: The family.
        goal: The share goal's smallest ``n`` and relation (`at_goal`).
        band: `robust`'s factor.

    Returns:
        ``{"points": [per point], "fits": [per held-out task, then "all tasks"]}``.
    """
    tasks = sorted({pt[0] for pt in grid.points})
    task_of = np.array([pt[0] for pt in grid.points])
    mask = goal_mask(grid, goal)
    points, fits = [], []
    for task in [*tasks, None]:
        held = task_of == task if task is not None else np.ones(len(task_of), dtype=bool)
        train = ~held if task is not None else held
        row = fit(family, grid, train, mask, band)
        every, within2, gap, ks = (a[0] for a in family.outcomes(grid, np.arange(len(grid.points)),
                                                                 np.array([row])))
        idx = np.flatnonzero(held)
        behind = every[idx]
        params = _params(family, row)
        floor = floor_of(grid, idx)
        fits.append({"family": family.name, "held_out": task or "(none: fit on all tasks)", **params,
                     "params": _words(params), "points": len(idx), "mean_behind": round(float(behind.mean()), 3),
                     "worst_behind": round(float(behind.max()), 3), "missed": int((behind > GOAL_MEAN).sum()),
                     "floor_mean": round(floor[0], 3), "floor_worst": round(floor[1], 3),
                     "goal_within_2pt": "; ".join(f"{_label(grid.points[i])} n {grid.points[i][1]} eps "
                                                  f"{grid.points[i][3]:g} {within2[i]:.2f}" for i in idx if mask[i])})
        if task is None:
            continue
        for i in idx:
            dataset, n, partition, eps, relation = grid.points[i]
            points.append({"family": family.name, "held_out": task, "params": _words(params), "dataset": dataset,
                           "clients": n, "partition": partition, "epsilon": eps, "neighbouring": relation,
                           "k": int(ks[i]) if ks[i] > 0 else None, "gap_points": round(float(gap[i]), 3),
                           "behind_best_k_points": round(float(every[i]), 3), "within_2pt": float(within2[i]),
                           "best_k": int(grid.ks[np.argmin(grid.behind[i])]),
                           "most_within_2pt": float(grid.within2[i].max())})
    return {"points": points, "fits": fits}


def cell_rows(grid: Grid, points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per family and cell ``(relation, n, epsilon)``: the out-of-sample mean and worst gap behind the best ``k``
    against the floor (the smallest largest and the smallest mean gap one fixed ``k`` reaches over the cell's
    federations), and whether each is within the goal or `FLOOR_SLACK` of its floor."""
    rows = []
    for (relation, n, eps), idx in cells_of(grid, np.arange(len(grid.points))).items():
        worst_k, mean_k = grid.behind[idx].max(axis=0), grid.behind[idx].mean(axis=0)
        bar_worst, bar_mean = bars(grid.behind[idx])
        floor_worst, floor_mean = float(worst_k.min()), float(mean_k.min())
        for family in dict.fromkeys(r["family"] for r in points):
            mine = [r["behind_best_k_points"] for r in points
                    if r["family"] == family and (r["neighbouring"], r["clients"], r["epsilon"]) == (relation, n, eps)]
            worst, mean = max(mine), float(np.mean(mine))
            rows.append({"family": family, "neighbouring": relation, "clients": n, "epsilon": eps,
                         "federations": len(idx), "floor_worst": round(floor_worst, 3),
                         "floor_worst_k": int(grid.ks[np.argmin(worst_k)]), "floor_mean": round(floor_mean, 3),
                         "worst_behind": round(worst, 3), "mean_behind": round(mean, 3),
                         "worst_ok": worst <= bar_worst + 1e-9, "mean_ok": mean <= bar_mean + 1e-9})
    return rows


def overall(points: Sequence[dict[str, Any]], cells: Sequence[dict[str, Any]], goal: tuple[int, str]
            ) -> dict[str, dict[str, Any]]:
    """Per family over every held-out point: mean, worst, points more than 1 behind, the share goal's federations
    (met / reachable, the smallest share where reachable) and the cells within the goal or the floor's slack."""
    out = {}
    for family in dict.fromkeys(r["family"] for r in points):
        mine = [r for r in points if r["family"] == family]
        behind = np.array([r["behind_best_k_points"] for r in mine])
        reach = [r for r in mine if at_goal(r["clients"], r["partition"], r["neighbouring"], goal)
                 and r["most_within_2pt"] >= GOAL_SHARE - 1e-9]
        fam_cells = [c for c in cells if c["family"] == family]
        out[family] = {"points": len(mine), "mean_behind": round(float(behind.mean()), 3),
                       "worst_behind": round(float(behind.max()), 3), "missed": int((behind > GOAL_MEAN).sum()),
                       "goal_reachable": len(reach),
                       "goal_met": sum(r["within_2pt"] >= GOAL_SHARE - 1e-9 for r in reach),
                       "goal_min_share": round(min((r["within_2pt"] for r in reach), default=float("nan")), 3),
                       "cells": len(fam_cells), "cells_worst_ok": sum(c["worst_ok"] for c in fam_cells),
                       "cells_mean_ok": sum(c["mean_ok"] for c in fam_cells)}
    return out


def markdown(fits: Sequence[dict[str, Any]], points: Sequence[dict[str, Any]], cells: Sequence[dict[str, Any]],
             summary: dict[str, dict[str, Any]], fams: Sequence[Family], goal: tuple[int, str],
             floor: tuple[float, float], band: float = ROBUST_BAND,
             one_k: tuple[int, float] | None = None) -> str:
    """The tables against the goals (overall, per held-out task, per cell with the floor, the share goal)."""
    n, relation_goal = goal
    forms = {f.name: f.form for f in fams}
    all_fit = {f["family"]: f["params"] for f in fits if f["held_out"].startswith("(none")}
    hindsight = {name: s["goal_met_any_row"] for name, s in summary.items()}
    lines = [f"Out of sample (each task's points with the parameters fitted on the other tasks). Goals: mean <= "
             f"{GOAL_MEAN:g}, worst <= {GOAL_WORST:g} points behind the best fixed k in hindsight; >= "
             f"{percent(GOAL_SHARE)} of releases within 2 points of Opt at every iid point with n >= {n}, "
             f"{relation_goal}, wherever some fixed k reaches it; where a goal is out of reach, within "
             f"{FLOOR_SLACK:g} of the cell's floor. The floor over all points (one fixed k per cell (relation, n, "
             f"epsilon), chosen in hindsight): mean {floor[0]:.2f}, worst {floor[1]:.2f}. Each fit minimises the "
             "largest excess over the training "
             f"cells' bars (the goal or the training floor + {FLOOR_SLACK:g}), scored at its worst over its first "
             f"parameter times or divided by up to {band:g}. \"Its best row in hindsight\": the most of the share "
             "goal's federations that one parameter row of the family meets, the row chosen knowing them all (no fit "
             "of the family can meet more).", "",
             "| family | form | fitted on all tasks | mean behind | worst behind | points > 1 behind | "
             "share goal met (where reachable) | its best row in hindsight | smallest share there | cells: worst ok | "
             "cells: mean ok |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for fam, s in summary.items():
        lines.append(f"| {fam} | {forms[fam]} | {all_fit[fam]} | {s['mean_behind']:.2f} | {s['worst_behind']:.2f} | "
                     f"{s['missed']} of {s['points']} | {s['goal_met']} of {s['goal_reachable']} | "
                     f"{hindsight[fam]} of {s['goal_reachable']} | "
                     f"{percent(s['goal_min_share']) if s['goal_reachable'] else '-'} | "
                     f"{s['cells_worst_ok']} of {s['cells']} | {s['cells_mean_ok']} of {s['cells']} |")
    lines += ["", "Per held-out task (parameters fitted without it; mean / worst behind the best k; share within 2 "
              f"points at its share goal's points, iid, n >= {n}):", "",
              "| held out | family | fitted on the others | points | mean | worst | > 1 behind | "
              "shares at the goal point | the task's floor (one k per cell in hindsight): mean / worst |",
              "|---|---|---|---|---|---|---|---|---|"]
    for f in sorted((f for f in fits if not f["held_out"].startswith("(none")), key=lambda f: (f["held_out"],)):
        lines.append(f"| {f['held_out']} | {f['family']} | {f['params']} | {f['points']} | {f['mean_behind']:.2f} | "
                     f"{f['worst_behind']:.2f} | {f['missed']} | {f['goal_within_2pt']} | "
                     f"{f['floor_mean']:.2f} / {f['floor_worst']:.2f} |")
    names = list(summary)
    lines += ["", "Per cell, out of sample: worst / mean behind the best k, against the floor (the smallest largest "
              "and smallest mean gap one fixed k reaches over the cell's federations, in hindsight; `*` marks a cell "
              f"where the family misses both the goal and the floor + {FLOOR_SLACK:g}):", "",
              "| relation | n | epsilon | federations | floor worst (its k) | floor mean | " + " | ".join(names) + " |",
              "|---|---|---|---|---|---|" + "---|" * len(names)]
    by_cell: dict[tuple[str, int, float], dict[str, dict[str, Any]]] = {}
    for c in cells:
        by_cell.setdefault((c["neighbouring"], c["clients"], c["epsilon"]), {})[c["family"]] = c
    for (relation, cn, ce), row in by_cell.items():
        first = next(iter(row.values()))
        lines.append(f"| {relation} | {cn} | {ce:g} | {first['federations']} | {first['floor_worst']:.2f} "
                     f"({first['floor_worst_k']}) | {first['floor_mean']:.2f} | "
                     + " | ".join(f"{row[f]['worst_behind']:.2f}{'' if row[f]['worst_ok'] else '*'} / "
                                  f"{row[f]['mean_behind']:.2f}{'' if row[f]['mean_ok'] else '*'}" for f in names)
                     + " |")
    goal_points = sorted({(r["dataset"], r["clients"], r["epsilon"]) for r in points
                          if at_goal(r["clients"], r["partition"], r["neighbouring"], goal)})
    lines += ["", f"Share of releases within 2 points of Opt at the iid points with n >= {n}, {relation_goal}, out of "
              "sample (the floor: the most any fixed k reaches):", "",
              "| federation | n | epsilon | most at any k | " + " | ".join(names) + " |",
              "|---|---|---|---|" + "---|" * len(names)]
    for dataset, cn, ce in goal_points:
        mine = {r["family"]: r for r in points if (r["dataset"], r["partition"], r["clients"], r["epsilon"],
                                                   r["neighbouring"]) == (dataset, "iid", cn, ce, relation_goal)}
        most = next(iter(mine.values()))["most_within_2pt"]
        lines.append(f"| {dataset} | {cn} | {ce:g} | {percent(most)} | "
                     + " | ".join(f"{percent(mine[f]['within_2pt'])} ({_depth(mine[f]['k'])})" for f in names) + " |")
    if one_k is not None:
        lines += ["", f"One fixed k per (n, epsilon) for the federations above where some k reaches "
                  f"{percent(GOAL_SHARE)} (a rule of public facts gives them all the same k): at best "
                  f"{percent(one_k[1])} for the least of them, in the worst (n, epsilon) (there k = {one_k[0]})."]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    opts = settings(args)
    sweeps, _ = read_runs(opts["runs"])
    sweeps = {pt: m for pt, m in sweeps.items() if pt[4] in opts["relations"]}
    if len({pt[0] for pt in sweeps}) < 2:
        raise ValueError("--runs: leaving one task out needs points of at least 2 data sets in --relations")
    grid = Grid.of(sweeps, opts["candidates"])
    goal = (opts["goal_clients"], "replace-one" if "replace-one" in opts["relations"] else opts["relations"][0])
    fams = families(grid.ks.tolist(), opts["families"])
    aware = [name for name in opts["families"] if name in PARAMETERS]
    if aware:
        measured = measure_points(aware, grid.points, cache=harness.ArrayCache(args.cache),
                                  candidates=opts["candidate_list"], validation=opts["validation"], seed=args.seed,
                                  repetitions=opts["repetitions"], data_dirs=opts["data_dirs"])
        fams += aware_families(aware, measured)
    fams.sort(key=lambda f: opts["families"].index(f.name))
    points: list[dict[str, Any]] = []
    fits: list[dict[str, Any]] = []
    for family in fams:
        res = evaluate(grid, family, goal, opts["band"])
        points += res["points"]
        fits += res["fits"]
    cells = cell_rows(grid, points)
    summary = overall(points, cells, goal)
    mask = goal_mask(grid, goal)
    for family in fams:
        summary[family.name]["goal_met_any_row"] = most_met(family, grid, mask) if mask.any() else 0
    study.write_csv("ksweep_loto.csv", points)
    names = {name for family in fams for name in family.params}
    study.write_csv("ksweep_loto_fits.csv", [{k: v for k, v in f.items() if k not in names} for f in fits])
    study.write_csv("ksweep_loto_cells.csv", cells)
    path = study.path("ksweep_loto.md")
    floor = floor_of(grid, np.arange(len(grid.points)))
    one_k = share_floor(grid, mask) if mask.any() else None
    path.write_text(markdown(fits, points, cells, summary, fams, goal, floor, opts["band"], one_k))
    study.outputs.append(str(path))
    return study.result(points=len(grid.points), tasks=sorted({pt[0] for pt in grid.points}),
                        relations=opts["relations"], robust_band=opts["band"], summary=summary,
                        floor={"mean_behind": round(floor[0], 3), "worst_behind": round(floor[1], 3)},
                        share_goal_one_k=None if one_k is None else {"k": one_k[0], "least_share": round(one_k[1], 3)},
                        fitted_on_all={f["family"]: f["params"] for f in fits if f["held_out"].startswith("(none")},
                        held_out={f"{f['family']} {f['held_out']}": f["params"] for f in fits
                                  if not f["held_out"].startswith("(none")})
