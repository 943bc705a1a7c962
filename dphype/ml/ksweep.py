"""Measure the argmax release's ``k`` on your own task over a public proxy data set, before a federation votes.

The planner sees no data (`dphype.selection.measured` quotes the bench's tasks). This measures yours: a public data set
like your clients' (`load_proxy`: a registered data set of `dphype.ml.data`, or a CSV file) is split into
simulated clients (`split_proxy`: iid, or Dirichlet label skew), each client builds YOUR task on its rows and scores
every candidate, and `sweep` replays the winner release (`dphype.privacy.winner.replay_winners`: the tallies'
report-noisy-max with the noise epsilon and the relation imply) for top-k ballots at every ``k`` and for the argmax
release's default ballot, on the same noise draws (common random numbers, so two ballots differ by their votes alone).
Nothing here is private or released: the proxy is public.

What a pick is worth is measured with the same task on the pooled rows of all simulated clients (the reference:
what the federation would know if it could pool its data): a candidate's reference score is the task's own score on
them (a failed candidate, NaN, counts as the worst one). The gap of a release is how far its pick's reference score
lies from the best candidate's (Opt), in the units of the task's score; ``within`` is the share of releases with a gap
of at most ``tolerance`` (``0.02``: two accuracy points for an accuracy in ``[0, 1]``).

A task is built by ``task_fn(x, y)`` from one client's rows (``x``: ``(rows, features)`` float32, ``y``: ``(rows,)``
integer labels) and follows `dphype.task.Task`.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dphype.checks import check_epsilon, check_int, check_neighbouring, check_positive
from dphype.ml.data import Dataset, dataset_names, load_dataset, partition_dirichlet, partition_iid
from dphype.privacy.winner import noise_std, replay_winners
from dphype.release import DEFAULT_ARGMAX_BALLOT
from dphype.selection.voting import Ballot, primary_scores, top_k_votes
from dphype.task import Task

#: The fewest rows a simulated client holds (a Dirichlet split is redrawn until each has them).
MIN_ROWS = 4


@dataclass(frozen=True)
class Partition:
    """How the proxy's rows are split across the simulated clients.

    Attributes:
        beta: The Dirichlet concentration of the label skew (`dphype.ml.data.partition_dirichlet`); ``None``: iid
            (`dphype.ml.data.partition_iid`).
    """

    beta: float | None = None

    @classmethod
    def parse(cls, value: str) -> Partition:
        """``"iid"`` or ``"dirichlet:BETA"`` (``BETA > 0``; smaller is more skewed).

        Args:
            value: The option's text.

        Returns:
            The partition.

        Raises:
            ValueError: Naming ``--partition``, the allowed values and the fix.
        """
        if value == "iid":
            return cls()
        kind, _, beta = value.partition(":")
        try:
            parsed = float(beta)
        except ValueError:
            parsed = float("nan")
        if kind != "dirichlet" or not parsed > 0 or not np.isfinite(parsed):
            raise ValueError(f"--partition must be iid or dirichlet:BETA with BETA > 0 (e.g. dirichlet:0.5), got "
                             f"{value!r}")
        return cls(parsed)

    @property
    def label(self) -> str:
        """``iid`` or ``Dirichlet BETA``, as the planner's table names a partition."""
        return "iid" if self.beta is None else f"Dirichlet {self.beta:g}"


def load_proxy(spec: str, data_dir: str | None = None) -> Dataset:
    """The proxy data set: a registered data set's training pool, or a CSV file.

    Args:
        spec: One of `dphype.ml.data.dataset_names`, or the path of a CSV file with a header row, numeric feature
            columns and the label in the last column (any values; each distinct one a class, in sorted order).
            Features are standardized (zero mean, unit variance per column) as the registered ones are.
        data_dir: The folder of a data set that is not bundled (e.g. ``mnist``).

    Returns:
        The rows.

    Raises:
        ValueError: For an unknown name, or a CSV file that is not numeric, has fewer than 2 classes or no rows.
        FileNotFoundError: If the CSV file does not exist.
    """  # noqa: DOC502, DOC503
    if not spec.endswith(".csv"):
        if spec not in dataset_names():
            raise ValueError(f"--proxy must be a registered data set ({', '.join(dataset_names())}) or a .csv file, "
                             f"got {spec!r}")
        return load_dataset(spec, data_dir)[0]
    path = Path(spec).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"--proxy: no file {spec!r}; name a CSV file (header row, label last) or a registered "
                                f"data set\n(looked for {path.absolute()})")
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))[1:]
    try:
        x = np.array([[float(v) for v in row[:-1]] for row in rows], dtype=np.float64)
    except ValueError as err:
        raise ValueError(f"--proxy {spec}: every column but the last (the label) must be numeric: {err}") from None
    classes, y = np.unique(np.array([row[-1] for row in rows]), return_inverse=True)
    if x.ndim != 2 or x.shape[1] == 0 or len(classes) < 2:
        raise ValueError(f"--proxy {spec}: needs rows of >= 1 feature and a label, >= 2 classes; give such a file\n"
                         f"got {x.shape[0]} rows and {len(classes)} classes")
    scale = x.std(axis=0)
    x = (x - x.mean(axis=0)) / np.where(scale > 0, scale, 1.0)
    return Dataset(x, y, len(classes), path.stem)


def split_proxy(data: Dataset, clients: int, partition: Partition, seed: int) -> list[Dataset]:
    """The proxy's rows split across ``clients`` simulated clients.

    Args:
        data: The proxy.
        clients: The number ``n`` of simulated clients, at least 2.
        partition: iid or Dirichlet label skew.
        seed: Seeds the split.

    Returns:
        One data set per client, each of at least `MIN_ROWS` rows.

    Raises:
        ValueError: If the proxy has too few rows for ``clients`` (naming the fix).
    """
    check_int("clients", clients, 2)
    if len(data) < clients * MIN_ROWS:
        raise ValueError(f"--clients {clients} needs at least {clients * MIN_ROWS} rows of the proxy, has "
                         f"{len(data)}: use fewer clients or a larger proxy\n({MIN_ROWS} rows per client)")
    shards = (partition_iid(data.y, clients, seed) if partition.beta is None
              else partition_dirichlet(data.y, clients, partition.beta, seed, min_size=MIN_ROWS))
    return [data.subset(rows) for rows in shards]


def _build(task_fn: Callable[[np.ndarray, np.ndarray], Task], rows: Dataset) -> Task:
    """``task_fn(x, y)`` on ``rows``; a ``TypeError`` (another signature) as a ``ValueError`` naming the contract."""
    try:
        return task_fn(rows.x, rows.y)
    except TypeError as err:
        raise ValueError("the task must be built from a client's rows as NAME(x, y): give it that constructor, or "
                         f"a function\n({err}); name a function that builds it with --task MODULE:NAME") from None


def _scores(task: Task, candidates: Sequence[Mapping[str, Any]], who: str) -> np.ndarray:
    """The task's scores of ``candidates``, checked: ``(p,)`` or ``(p, j)`` numbers, a ``ValueError`` naming ``who``."""
    try:
        scores = np.asarray(task.score(candidates), dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"the task's score() on {who} did not return numbers: {err}") from None
    if scores.ndim not in (1, 2) or scores.shape[0] != len(candidates):
        raise ValueError(f"the task's score() on {who} must return one score per candidate, got shape "
                         f"{scores.shape}; fix score()\n(or one row of keys each): {len(candidates)} candidates in all")
    return scores


def _release(counts: np.ndarray, *, gap_of: np.ndarray, epsilon: float, neighbouring: str, repetitions: int,
             tolerance: float, seed: tuple[int, ...], sensitivity: int = 1) -> tuple[float, float]:
    """The mean gap of ``repetitions`` winner releases of ``counts`` and their share within ``tolerance``."""
    gaps = gap_of[replay_winners(counts, epsilon=epsilon, neighbouring=neighbouring, repetitions=repetitions,
                                 rng=np.random.default_rng(list(seed)), sensitivity=sensitivity)]
    return float(gaps.mean()), float(np.mean(gaps <= tolerance + 1e-12))


def sweep(
    task_fn: Callable[[np.ndarray, np.ndarray], Task],
    data: Dataset,
    candidates: Sequence[Mapping[str, Any]],
    *,
    clients: int,
    partition: Partition = Partition(),
    epsilons: Sequence[float] = (1.0,),
    neighbourings: Sequence[str] = ("replace-one",),
    ks: Sequence[int] | None = None,
    repetitions: int = 1000,
    tolerance: float = 0.02,
    seed: int = 0,
) -> dict[str, Any]:
    """The winner release at every ``k`` on the proxy split across ``clients`` clients that run ``task_fn``'s task.

    Args:
        task_fn: Builds a client's task from its rows, ``task_fn(x, y)``.
        data: The proxy (`load_proxy`).
        candidates: The public candidates, at least 2.
        clients: The number ``n`` of simulated clients.
        partition: How the proxy is split (`split_proxy`).
        epsilons: The release's epsilons.
        neighbourings: The neighbouring relations.
        ks: The votes per client of the top-k ballots to sweep (default every ``k`` from 1 to ``p - 1``).
        repetitions: Winner releases per point, at least 10.
        tolerance: A release is within it when its gap is at most this (the task's score units), ``> 0``.
        seed: Seeds the split and the noise.

    Returns:
        ``{"clients", "partition", "candidates", "maximize", "tolerance", "repetitions", "reference", "opt", "rows",
        "best", "seconds"}``: the reference score of every candidate and the index of Opt; ``rows``: per epsilon,
        relation and ballot (top-k at each ``k``, and the argmax release's default ballot,
        `dphype.release.DEFAULT_ARGMAX_BALLOT`, with its ``k`` where it is a top-k one, else ``None``), the mean gap
        and the share within ``tolerance``; ``best``: per epsilon and relation, the ``k`` with the smallest mean gap
        (ties: the smaller ``k``) and the default ballot's ``k``, gap and how far it trails.

    Raises:
        ValueError: For an argument out of range, or a task whose scores are not one per candidate.
    """
    start = time.perf_counter()
    p = check_int("candidates", len(candidates), 2)
    epsilons = [check_epsilon(e) for e in epsilons]
    neighbourings = [check_neighbouring(r) for r in neighbourings]
    repetitions = check_int("repetitions", repetitions, 10)
    tolerance = check_positive("tolerance", tolerance)
    swept = sorted({check_int("k", k, 1) for k in (range(1, p) if ks is None else ks)})
    if not swept or swept[-1] >= p:
        raise ValueError(f"--ks must be integers in [1, {p - 1}] (below the {p} candidates), got {ks!r}")
    shards = split_proxy(data, clients, partition, seed)
    tasks = [_build(task_fn, shard) for shard in shards]
    maximize = bool(tasks[0].maximize)
    scores = [_scores(task, candidates, f"client {i}") for i, task in enumerate(tasks)]
    pooled = Dataset(np.concatenate([s.x for s in shards]), np.concatenate([s.y for s in shards]), data.num_classes,
                     data.name)
    reference = primary_scores(_scores(_build(task_fn, pooled), candidates, "the pooled rows"))
    worst = np.nanmin(reference) if maximize else np.nanmax(reference)
    reference = np.where(np.isfinite(reference), reference, worst if np.isfinite(worst) else 0.0)
    opt = int(np.argmax(reference) if maximize else np.argmin(reference))
    gap_of = np.abs(reference[opt] - reference)
    default = Ballot.parse(DEFAULT_ARGMAX_BALLOT)
    rows: list[dict[str, Any]] = []
    best: list[dict[str, Any]] = []
    for e_index, eps in enumerate(epsilons):
        for r_index, relation in enumerate(neighbourings):
            common = {"epsilon": eps, "neighbouring": relation}
            replay = {**common, "gap_of": gap_of, "repetitions": repetitions, "tolerance": tolerance,
                      "seed": (seed, e_index, r_index)}  # the same draws for every ballot
            point = {k: _release(np.sum([top_k_votes(s, k, maximize=maximize) for s in scores], axis=0), **replay)
                     for k in swept}
            rows += [{**common, "ballot": "top-k", "k": k, "gap": gap, "within": share}
                     for k, (gap, share) in point.items()]
            ballot = default.resolve(p, noise_std(eps, relation), clients)
            depth = min(ballot.depth, p) if ballot.kind == "rank" and ballot.max_entry == 1 else None
            gap, share = _release(np.sum([ballot.cast(s, 1, maximize=maximize) for s in scores], axis=0), **replay,
                                  sensitivity=ballot.max_entry)
            rows.append({**common, "ballot": default.name, "k": depth, "gap": gap, "within": share})
            best_k = min(point, key=lambda k: (point[k][0], k))
            best.append({**common, "best_k": best_k, "best_gap": point[best_k][0], "best_within": point[best_k][1],
                         "default_k": depth, "default_gap": gap, "default_within": share,
                         "default_behind": gap - point[best_k][0]})
    return {"clients": clients, "partition": partition.label, "candidates": p, "maximize": maximize,
            "tolerance": tolerance, "repetitions": repetitions, "reference": reference.tolist(), "opt": opt,
            "rows": rows, "best": best, "seconds": time.perf_counter() - start}

