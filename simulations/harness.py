"""Shared machinery of the ``dphype bench`` studies.

The studies replay DP-Hype's release many times without re-running local training:

1. every client's vote vector is computed ONCE through the real client code path
   (:meth:`dphype.task.Task.score` -> :func:`dphype.selection.voting.top_k_votes` or
   :func:`dphype.selection.voting.raw_score_votes`), see :func:`client_scores` and :func:`client_votes`;
2. the noisy sum is then drawn ``repetitions`` times by the protocol's one replay,
   :func:`dphype.privacy.noise.replay_noisy_sums` (one noise share per client summed, ``per_client=True``, or one
   draw carrying the total variance of all shares, which has the same distribution);
3. the server's rule is applied to every replay: the argmax (:func:`select_rows`) or any rule of
   :mod:`dphype.selection.rules` (:func:`dphype.selection.rules.select_batch`, as the tradeoff and ablation studies do).

Because the votes are deterministic given the local data, the distribution of the selected candidate is
identical to re-running the whole protocol with fresh noise. Everything here is numpy; torch, Flower and
the data sets are imported only inside the functions that need them.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dphype.checks import (  # noqa: F401 (check_* re-exported for the studies)
    DEFAULT_NOISE,
    check_clients,
    check_delta,
    check_int,
    check_positive,
)
from dphype.cli import add_candidates_argument, add_noise_arguments  # noqa: F401 (re-exported for the studies)
from dphype.ml.data import dataset_names, dataset_spec
from dphype.ml.validation import DEFAULT_VALIDATION, Validation, check_validation
from dphype.plotting import pyplot, save_figure  # noqa: F401 (pyplot re-exported for the studies)
from dphype.privacy.accounting import calibrate
from dphype.privacy.noise_kinds import check_noise  # noqa: F401 (re-exported for the studies)
from dphype.selection.voting import raw_score_votes, top_k_votes

#: fewest local samples a client needs (80/20 split into at least 8 training and 2 validation rows).
MIN_CLIENT_SAMPLES = 10


# ----------------------------------------------------------------------------------------------- noise
def sigma_for(
    epsilon: float,
    delta: float,
    k: int,
    *,
    num_candidates: int,
    accountant: str | None,
    noise: str = DEFAULT_NOISE,
    raw_scores: bool = False,
) -> float:
    """Total noise std for one release (:func:`dphype.privacy.accounting.calibrate`); ``epsilon = inf`` gives 0."""
    if math.isinf(epsilon) and epsilon > 0:
        return 0.0
    release = calibrate(
        epsilon, delta, k, num_candidates=num_candidates, accountant=accountant, noise=noise, raw_scores=raw_scores
    )
    return release.sigma


def select_rows(noisy: np.ndarray) -> np.ndarray:
    """:func:`dphype.selection.rules.select` on every row: the argmax, ties to the lowest index."""
    arr = np.asarray(noisy)
    if arr.ndim != 2 or not np.all(np.isfinite(arr)):
        raise ValueError(f"noisy must be a finite 2-D array (repetitions, candidates), got shape {arr.shape}")
    return np.argmax(arr, axis=1)


# ---------------------------------------------------------------------------------------------- votes
def client_votes(scores: np.ndarray, k: int, *, maximize: bool = True) -> np.ndarray:
    """Each client's top-k vote vector via :func:`dphype.selection.voting.top_k_votes`; ``scores`` is ``(n, p)``."""
    return np.stack([top_k_votes(row, k, maximize=maximize) for row in np.asarray(scores)])


def client_raw_votes(scores: np.ndarray, *, maximize: bool = True) -> np.ndarray:
    """Appendix F raw-score vote of each client, :func:`dphype.selection.voting.raw_score_votes` (primary key only)."""
    return np.stack([raw_score_votes(row, maximize=maximize) for row in np.asarray(scores)])


def local_accuracies(scores: np.ndarray, validation: str) -> np.ndarray:
    """``(n, p)``: each client's local validation accuracy, a key of its ``(n, p, 2)`` scores under ``validation``
    (the first, the second for a ``":loss"`` scheme, :func:`cached_scores`)."""
    return np.asarray(scores)[..., Validation.parse(validation).accuracy_key]


@dataclass(frozen=True)
class Federation:
    """One federated setting of the data-driven studies: data set, ``n`` clients and their partition."""

    dataset: str
    clients: int
    beta: float | None  # None = iid (Section V-C), else Dirichlet concentration
    seed: int = 0
    data_dir: str | None = None
    device: str | None = None  # torch device of the training; None: CUDA when available (not in the cache key)

    @property
    def partition(self) -> str:
        return "iid" if self.beta is None else "dirichlet"

    @property
    def label(self) -> str:
        return "iid" if self.beta is None else f"beta={self.beta:g}"


def validate_federations(federations: Sequence[Federation]) -> None:
    """Reject unknown data sets, ``beta <= 0``, missing data directories and too many clients, before any work.

    Loads every data set and asks TRAIN's partitioners for the split, so the limits are the library's own
    (Dirichlet needs a minimum number of rows per client). Both go through :mod:`dphype.ml.torch_task`'s per-process
    caches, which the studies then use: the data set is loaded and each federation split once per process,
    not once here and again for the study (a Dirichlet split of Adult takes seconds).
    """
    from dphype.ml.torch_task import load_cached, partition_cached

    for fed in federations:
        check_device(fed.device)
        spec = dataset_spec(fed.dataset)
        if fed.beta is not None:
            check_positive("beta", fed.beta)
        check_clients(fed.clients)
        if fed.data_dir is not None and not Path(fed.data_dir).is_dir():
            raise ValueError(f"data_dir {fed.data_dir!r} is not an existing directory")
        if spec.needs_data_dir and fed.data_dir is None:
            raise ValueError(f"dataset {fed.dataset!r} needs --data-dir (it is not bundled)")
        try:
            load_cached(fed.dataset, fed.data_dir)
        except FileNotFoundError as err:
            raise ValueError(f"dataset {fed.dataset!r}: {err}") from err
        parts = partition_cached(fed.dataset, fed.clients, fed.seed, fed.partition, fed.beta, fed.data_dir)
        smallest = min(len(p) for p in parts)
        if smallest < MIN_CLIENT_SAMPLES:
            raise ValueError(
                f"clients={fed.clients} is too many for {fed.dataset} ({fed.label}): the smallest client holds "
                f"{smallest} samples, at least {MIN_CLIENT_SAMPLES} are needed for an 80/20 local split"
            )


def check_device(device: str | None) -> None:
    """Refuse a ``--device`` torch cannot parse, or CUDA where torch sees none (``None``: chosen automatically)."""
    if device is None:
        return
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device must be a torch device such as cpu, cuda or cuda:1, got {device!r}") from err
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device: use --device cpu or leave "
                         "--device out")


# ----------------------------------------------------------------------------------------- statistics
def mean_ci(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the Student-t confidence interval (0 for a single value)."""
    from scipy.stats import t

    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        raise ValueError("values must not be empty")
    if arr.size == 1:
        return float(arr[0]), 0.0
    half = t.ppf(0.5 + confidence / 2.0, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size)
    return float(arr.mean()), float(half)


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a success probability (synthetic study, Fig. 2)."""
    from scipy.stats import norm

    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    z = float(norm.ppf(0.5 + confidence / 2.0))
    phat = successes / trials
    denom = 1.0 + z * z / trials
    centre = (phat + z * z / (2 * trials)) / denom
    half = z * math.sqrt(phat * (1 - phat) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


# ------------------------------------------------------------------------------------------ reporting
@dataclass
class StudyRun:
    """Bookkeeping of one study run: output folder, files written, wall time."""

    name: str
    out: Path
    started: float = field(default_factory=time.perf_counter)
    cpu_started: float = field(default_factory=time.process_time)
    outputs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.out = Path(self.out)

    def path(self, filename: str) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        return self.out / filename

    def write_csv(self, filename: str, rows: Sequence[Mapping[str, Any]]) -> Path:
        """Write ``rows`` (dicts with the same keys) as CSV and record the file."""
        if not rows:
            raise ValueError(f"no rows to write to {filename}")
        target = self.path(filename)
        with target.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
            writer.writeheader()
            writer.writerows(rows)
        self.outputs.append(str(target))
        return target

    def save_figure(self, fig: Any, filename: str) -> Path:
        """Save a matplotlib figure as a small PNG, close it and record the file."""
        target = Path(save_figure(fig, self.path(filename), dpi=90))
        self.outputs.append(str(target))
        return target

    def result(self, **extra: Any) -> dict[str, Any]:
        """The dict ``run`` returns: study name, wall and CPU seconds (all threads of this process), the
        study's own keys, then the files written."""
        return {"study": self.name, "seconds": round(time.perf_counter() - self.started, 3),
                "cpu_seconds": round(time.process_time() - self.cpu_started, 3), **extra,
                "outputs": list(self.outputs)}


def progress_bar(total: int, desc: str) -> Any:
    """A tqdm progress bar on standard error (standard output stays clean for ``--json``)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True,
                disable=os.environ.get("DPHYPE_NO_PROGRESS") == "1")


def chunked(total: int, size: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` pairs covering ``range(total)`` in pieces of at most ``size``."""
    for start in range(0, total, size):
        yield start, min(total, start + size)



def check_epsilons(values: Sequence[float]) -> list[float]:
    """Privacy budgets of a sweep: finite numbers > 0 or ``inf`` (no noise)."""
    out = []
    for eps in values:
        if math.isnan(eps) or eps <= 0:
            raise ValueError(f"epsilon must be a number > 0 (or inf), got {eps!r}")
        out.append(float(eps))
    if not out:
        raise ValueError("epsilon list must not be empty")
    return out


# ------------------------------------------------------------------------------ federated ground truth
def federation_clients(fed: Federation) -> list[Any]:
    """The clients' local data sets (the same shards :func:`dphype.ml.torch_task.make_task` hands each client)."""
    from dphype.ml.torch_task import load_cached, partition_cached

    shards = partition_cached(fed.dataset, fed.clients, fed.seed, fed.partition, fed.beta, fed.data_dir)
    pool = load_cached(fed.dataset, fed.data_dir)[0]
    return [pool.subset(ix) for ix in shards]


def global_accuracies(
    fed: Federation,
    candidates: Sequence[Mapping[str, Any]],
    *,
    rounds: int,
    local_epochs: int,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Test accuracy of FedAvg trained with every candidate (Section V-B: Opt and RandGuess ground truth).

    All candidates are trained at once by :func:`dphype.ml.training.fedavg` and scored on the data set's
    test split with :func:`dphype.ml.training.accuracy` (NaN for a diverged candidate).
    """
    from dphype.ml.torch_task import load_cached
    from dphype.ml.training import accuracy, fedavg

    done = [0]

    def tick(now: int, total: int) -> None:
        if progress is not None:
            progress(now - done[0])
        done[0] = now

    models = fedavg(dataset_spec(fed.dataset).model, federation_clients(fed), list(candidates), rounds=rounds,
                    local_epochs=local_epochs, seed=fed.seed, device=fed.device, progress=tick)
    return np.asarray(accuracy(models, load_cached(fed.dataset, fed.data_dir)[1]), dtype=np.float64)


class ArrayCache:
    """Arrays computed once per configuration and kept as ``.npy`` files (scores, FedAvg accuracies).

    The key is a JSON-able dict (data set, clients, partition, seed, epochs, candidate fingerprint, ...);
    a file name is its sha256. ``folder=None`` disables caching.
    """

    def __init__(self, folder: str | Path | None) -> None:
        self.folder = None if folder is None else Path(folder)

    def get(self, key: Mapping[str, Any], compute: Callable[[], np.ndarray],
            on_hit: Callable[[], None] | None = None) -> np.ndarray:
        """The cached array of ``key``, or ``compute()`` stored under it; ``on_hit`` runs on a cache hit."""
        import hashlib
        import json

        if self.folder is None:
            return compute()
        blob = json.dumps(dict(key), sort_keys=True, default=str)
        target = self.folder / (hashlib.sha256(blob.encode()).hexdigest()[:24] + ".npy")
        if target.exists():
            if on_hit is not None:
                on_hit()
            return np.load(target)
        value = np.asarray(compute())
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        with partial.open("wb") as fh:  # a run stopped while writing leaves no truncated array behind
            np.save(fh, value)
        partial.replace(target)
        target.with_suffix(".json").write_text(blob)
        return value


# ------------------------------------------------------------------------------- shared CLI options
def parse_partition(value: str) -> float | None:
    """``"iid"`` -> None, else a Dirichlet ``beta`` (validated later, before any work)."""
    if value == "iid":
        return None
    try:
        return float(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"partition must be 'iid' or a Dirichlet beta > 0, got {value!r}") from err


def add_federation_arguments(parser: argparse.ArgumentParser, *, clients: Sequence[int],
                             partitions: Sequence[str], validation: bool = True) -> None:
    """Options shared by the data-driven studies (scale-down knobs for CPU runs included); ``validation=False``
    leaves out ``--validation`` (for a study that compares schemes itself)."""
    parser.add_argument("--dataset", default="adult", help=f"one of {', '.join(dataset_names())} (default adult)")
    parser.add_argument("--data-dir", default=None, help="folder with the data set's files (mnist, cifar10, ...)")
    parser.add_argument("--clients", type=int, nargs="+", default=list(clients),
                        help=f"n values (default {' '.join(map(str, clients))})")
    parser.add_argument("--betas", type=parse_partition, nargs="+", default=[parse_partition(p) for p in partitions],
                        metavar="PARTITION",
                        help=f"'iid' and/or Dirichlet betas (default {' '.join(partitions)})")
    add_candidates_argument(parser)
    parser.add_argument("--epochs", type=int, default=None,
                        help="local epochs of each client's evaluation (default: the paper's, 5; CIFAR-10 10)")
    parser.add_argument("--rounds", type=int, default=5, help="FedAvg rounds for the ground truth (default 5)")
    parser.add_argument("--fedavg-epochs", type=int, default=None,
                        help="local epochs per FedAvg round (default: same as --epochs)")
    parser.add_argument("--fedavg-chunk", type=int, default=None,
                        help="train the ground truth's FedAvg on this many candidates at a time, each chunk cached on "
                             "its own so that a stopped run resumes (default: all at once)")
    parser.add_argument("--device", default=None,
                        help="torch device of all training, e.g. cpu, cuda, cuda:1 (default: CUDA when available); "
                             "cached arrays are reused whatever the device")
    if validation:
        parser.add_argument("--validation", default=DEFAULT_VALIDATION,
                            help="how each client holds its rows out to score the candidates (dphype.ml.validation: "
                                 f"default {DEFAULT_VALIDATION!r}, the library's; 'split', the paper's one 80/20 "
                                 "split, to reproduce the paper's figures; 'kfold:F'; 'repeat:R')")
    parser.add_argument("--cache", default="results/cache",
                        help="folder that keeps computed scores/accuracies for reuse ('none' disables)")


def candidates_from_args(args: argparse.Namespace) -> Any:
    """The candidate list of ``--candidates`` (:func:`dphype.selection.candidates.load_candidates`)."""
    from dphype.selection.candidates import load_candidates

    return load_candidates(str(args.candidates))


def federations_from_args(args: argparse.Namespace) -> list[Federation]:
    """All ``(n, partition)`` settings of the run, validated before any training starts."""
    feds = [Federation(args.dataset, n, beta, args.seed, args.data_dir, getattr(args, "device", None))
            for n in args.clients for beta in args.betas]
    validate_federations(feds)
    return feds


@dataclass(frozen=True)
class Scale:
    """Epochs and rounds actually used (stated in every study's output), and the clients' validation scheme."""

    epochs: int
    rounds: int
    fedavg_epochs: int
    fedavg_chunk: int | None = None  #: candidates per FedAvg run of the ground truth (None: all at once)
    validation: str = DEFAULT_VALIDATION

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Scale:
        from dphype.ml.torch_task import default_epochs

        epochs = default_epochs(args.dataset) if args.epochs is None else args.epochs
        fedavg_epochs = epochs if args.fedavg_epochs is None else args.fedavg_epochs
        chunk = getattr(args, "fedavg_chunk", None)
        return cls(check_int("epochs", epochs, 1), check_int("rounds", args.rounds, 1),
                   check_int("fedavg_epochs", fedavg_epochs, 1),
                   None if chunk is None else check_int("fedavg_chunk", chunk, 1),
                   check_validation(getattr(args, "validation", DEFAULT_VALIDATION)))


def cache_from_args(args: argparse.Namespace) -> ArrayCache:
    return ArrayCache(None if str(args.cache).lower() == "none" else args.cache)


#: Names the Dirichlet split in the cache key: arrays of another partitioner (other shards for the same beta and
#: seed) are never reused.
DIRICHLET_PARTITIONER = "flwr-datasets:DirichletPartitioner"


def federation_key(fed: Federation, candidates: Any, **extra: Any) -> dict[str, Any]:
    """Cache key of one federation's arrays."""
    scheme = {} if fed.beta is None else {"partitioner": DIRICHLET_PARTITIONER}
    return {"dataset": fed.dataset, "clients": fed.clients, "beta": fed.beta, "seed": fed.seed,
            "data_dir": fed.data_dir, "candidates": candidates.fingerprint(), **scheme, **extra}


#: What :func:`dphype.ml.torch_task.score_clients` stores; part of the cache key, so arrays of an older score format
#: (``(n, p)`` accuracies only, before the loss tie-break) are never reused.
SCORE_FORMAT = "keys:accuracy,-validation_loss"


def cached_scores(fed: Federation, candidates: Any, scale: Scale, cache: ArrayCache, bar: Any = None) -> np.ndarray:
    """Every client's local scores ``(n, p, 2)`` (:func:`dphype.ml.torch_task.score_clients`: the real client code
    path, Algorithm 1 lines 2-4), computed once per configuration.

    A ``":loss"`` scheme ranks its base scheme's keys loss first: its scores are the base scheme's arrays with the
    two keys swapped, so both share one cache entry."""
    from dphype.ml.torch_task import score_clients
    from dphype.selection.candidates import CandidateList

    scheme = Validation.parse(scale.validation)
    base = dataclasses.replace(scheme, loss_first=False).name
    # the single split's key names no scheme, so the arrays cached before schemes existed are reused
    named = {} if base == "split" else {"validation": base}
    key = federation_key(fed, candidates, what="client_scores", epochs=scale.epochs, format=SCORE_FORMAT, **named)
    cands = candidates if isinstance(candidates, CandidateList) else CandidateList(candidates)

    def compute() -> np.ndarray:
        return score_clients(fed.dataset, cands, fed.clients, seed=fed.seed, partition=fed.partition,
                             beta=fed.beta, epochs=scale.epochs, data_dir=fed.data_dir, device=fed.device,
                             validation=base,
                             progress=None if bar is None else lambda done, total: bar.update(1))

    scores = cache.get(key, compute, on_hit=None if bar is None else lambda: bar.update(fed.clients))
    return scheme.ranked(scores)


def cached_accuracies(fed: Federation, candidates: Any, scale: Scale, cache: ArrayCache, bar: Any = None) -> np.ndarray:
    """FedAvg test accuracy of every candidate (:func:`global_accuracies`), computed once per configuration.

    With ``scale.fedavg_chunk`` below the number of candidates, FedAvg runs on consecutive chunks of that many
    candidates, each cached on its own: a stopped run resumes after its last finished chunk. A chunk trains from the
    same initial weights on the same batches as the whole list; only the dropout masks drawn differ."""
    key = federation_key(fed, candidates, what="fedavg_accuracy", rounds=scale.rounds,
                         local_epochs=scale.fedavg_epochs)
    size = len(candidates) if scale.fedavg_chunk is None else scale.fedavg_chunk
    pieces = list(chunked(len(candidates), size))
    parts = []
    for start, stop in pieces:
        piece_key = key if len(pieces) == 1 else {**key, "candidate_slice": [start, stop]}
        parts.append(cache.get(piece_key, _fedavg_piece(fed, list(candidates)[start:stop], scale, bar, len(pieces)),
                               on_hit=None if bar is None else lambda: bar.update(fed.clients * scale.rounds
                                                                                  / len(pieces))))
    return np.concatenate(parts)


def _fedavg_piece(fed: Federation, candidates: list[Any], scale: Scale, bar: Any, pieces: int
                  ) -> Callable[[], np.ndarray]:
    """The computation of one chunk's accuracies; the progress bar advances by its share of the federation."""
    def compute() -> np.ndarray:
        return global_accuracies(fed, candidates, rounds=scale.rounds, local_epochs=scale.fedavg_epochs,
                                 progress=None if bar is None else lambda done: bar.update(done / pieces))
    return compute


def work_units(feds: Sequence[Federation], scale: Scale, *, scores: bool = True, accuracies: bool = True) -> int:
    """Progress-bar total: one unit per client evaluation and per FedAvg client update."""
    return sum(fed.clients * (int(scores) + int(accuracies) * scale.rounds) for fed in feds)


def fill_diverged(accuracy: np.ndarray, test_labels: np.ndarray) -> np.ndarray:
    """Replace NaN accuracies (diverged candidates) by the majority-class rate of the test set.

    A diverged model carries no information; the best it can be credited with is always predicting the
    most frequent label. Keeps Opt, RandGuess and DP-Hype comparable when a diverged candidate is picked.
    """
    counts = np.bincount(np.asarray(test_labels, dtype=np.int64))
    return np.where(np.isfinite(accuracy), accuracy, counts.max() / counts.sum())


# ------------------------------------------------------------------------------ measuring library code
@contextlib.contextmanager
def swapped(owner: Any, name: str, value: Any) -> Iterator[None]:
    """Set ``owner.name = value`` for the duration of the block (a benchmark's variant of the code path)."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def timed(totals: dict[str, float], label: str, owner: Any, name: str) -> Iterator[None]:
    """Replace ``owner.name`` by a wrapper that adds its wall time to ``totals[label]``; restore it after. A
    method of a class is timed for every instance (the wrapper receives ``self`` like the method)."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[label] += time.perf_counter() - start

    with swapped(owner, name, wrapper):
        yield
