"""What a client evaluates: a :class:`Task` scores every public candidate on local data (DP-Hype, Section III).

DP-Hype is task-agnostic: anything with ``maximize`` and ``score(candidates)`` works. :class:`TorchTask`
is the concrete task of the paper's experiments (Section V-B): train the data set's model (Appendix B)
for each candidate and report its local validation accuracy, with the validation loss (the score of
Algorithm 1) as the tie-breaking second key. :func:`make_task` builds client
``partition_id``'s task from a data set name, so every Flower client can build its own shard: the
same ``seed`` gives every client the same partitioning.

torch is imported inside :func:`make_task` and :meth:`TorchTask.score` only, so importing this module
is cheap.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dphype.ml.data import Dataset, load_dataset, partition_dirichlet, partition_iid

if TYPE_CHECKING:
    from dphype.ml.training import ModelSpec
    from dphype.selection.candidates import CandidateList

#: Partitioning schemes accepted by :func:`make_task` (Section V-C, Appendix C).
PARTITIONS: tuple[str, ...] = ("iid", "dirichlet")


class Task(Protocol):
    """Scores every candidate on the client's local data; higher is better iff ``maximize``."""

    maximize: bool

    def score(
        self,
        candidates: Sequence[Mapping[str, Any]],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> np.ndarray:
        """Scores in candidate order: shape ``(p,)``, one score per candidate, or ``(p, j)``, lexicographic
        keys (column 0 decides, later columns break ties; all in the ``maximize`` direction; see
        :func:`dphype.selection.voting.top_k_votes`). NaN for a failed candidate."""
        ...


@dataclass
class TorchTask:
    """Local validation accuracy of one model per candidate (Section V-B), via
    :func:`dphype.ml.training.evaluate_candidates` (all candidates trained at once).

    score = validation accuracy; ties broken by validation loss (Algorithm 1's loss): :meth:`score`
    returns the ``(p, 2)`` keys ``[accuracy, -validation loss]``. With a few dozen local validation rows
    most candidates share one of a handful of accuracies; the loss separates them, so a client's top-k
    vote does not fall back to candidate order.

    ``model`` is a name of :data:`dphype.ml.models.MODELS` or a zero-argument factory of a fresh module.
    ``device=None`` uses CUDA when available. ``chunk_size`` caps the candidates trained at once
    (memory), ``num_threads`` the torch threads (set it when several clients share one machine).
    """

    data: Dataset
    model: ModelSpec
    epochs: int = 5
    batch_size: int = 64
    seed: int = 0
    device: str | None = None
    chunk_size: int | None = None
    num_threads: int | None = None
    maximize: bool = True

    def check(self, candidates: Sequence[Mapping[str, Any]]) -> None:
        """Refuse (``ValueError``, naming the key) candidates this task cannot train: a missing ``lr``, a key
        training does not use, a negative or non-finite value. Looks at the public candidates only."""
        import torch

        from dphype.ml.training import Hyperparameters

        Hyperparameters.from_candidates(candidates, torch.device("cpu"))

    def score(
        self,
        candidates: Sequence[Mapping[str, Any]],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> np.ndarray:
        """``(p, 2)`` keys ``[validation accuracy, -validation loss]`` (NaN row for a diverged candidate);
        ``progress(done, total)`` counts local epochs."""
        from dphype.ml.training import evaluate_candidates

        return evaluate_candidates(
            self.model,
            self.data,
            candidates,
            epochs=self.epochs,
            batch_size=self.batch_size,
            seed=self.seed,
            device=self.device,
            chunk_size=self.chunk_size,
            num_threads=self.num_threads,
            progress=progress,
            with_loss=True,
        )

    # ---- final training of the selected candidate (one model, e.g. FedAvg through Flower) ----
    def initial_state(self, seed: int = 0) -> dict[str, Any]:
        """The model's initial weights (a torch state dict) drawn with ``seed``: the global model's start."""
        from dphype.ml.training import initial_state

        return initial_state(self.model, self.data, seed=seed, device=self.device)

    def fit(self, candidate: Mapping[str, Any], state: Mapping[str, Any], *, epochs: int | None = None,
            seed: int = 0) -> tuple[dict[str, Any], dict[str, float]]:
        """One local update of the global weights ``state`` with ``candidate`` on all local data
        (:func:`dphype.ml.training.local_update`; ``epochs=None``: this task's ``epochs``); returns the new
        weights and ``{"num-examples", "train-loss", "train-accuracy"}`` measured after the update."""
        from dphype.ml.training import evaluate_state, local_update

        new = local_update(self.model, self.data, state, candidate, epochs=self.epochs if epochs is None else epochs,
                           batch_size=self.batch_size, seed=seed, device=self.device)
        acc, loss = evaluate_state(self.model, self.data, new, device=self.device)
        return new, {"num-examples": len(self.data), "train-loss": loss, "train-accuracy": acc}

    def evaluate(self, state: Mapping[str, Any]) -> dict[str, float]:
        """``{"num-examples", "loss", "accuracy"}`` of the weights ``state`` on all local data."""
        from dphype.ml.training import evaluate_state

        acc, loss = evaluate_state(self.model, self.data, state, device=self.device)
        return {"num-examples": len(self.data), "loss": loss, "accuracy": acc}


#: Local epochs per data set (Section V-B: 5, CIFAR-10: 10).
DEFAULT_EPOCHS: dict[str, int] = {"cifar10": 10}


def default_epochs(dataset: str) -> int:
    """Local (and FedAvg) epochs the paper uses for ``dataset`` (Section V-B)."""
    return DEFAULT_EPOCHS.get(dataset, 5)


def load_cached(dataset: str, data_dir: str | None = None) -> tuple[Dataset, Dataset]:
    """:func:`dphype.ml.data.load_dataset`, loaded once per process. Do not modify the returned arrays."""
    return _load_cached(dataset, data_dir)


@functools.lru_cache(maxsize=4)
def _load_cached(dataset: str, data_dir: str | None) -> tuple[Dataset, Dataset]:
    # One entry per (dataset, data_dir) however the caller spells them: ``lru_cache`` keys on the arguments as
    # passed, so ``load_cached("adult")`` and ``load_cached("adult", None)`` would each load the data set.
    return load_dataset(dataset, data_dir)


@functools.lru_cache(maxsize=16)
def partition_cached(
    dataset: str,
    num_partitions: int,
    seed: int,
    partition: str,
    beta: float | None,
    data_dir: str | None = None,
) -> tuple[np.ndarray, ...]:
    """Row indices of every client's shard of the ``dataset`` pool (computed once per process)."""
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {', '.join(PARTITIONS)}; got {partition!r}")
    if (beta is None) != (partition == "iid"):
        raise ValueError(f"beta must be given for partition='dirichlet' and only then; got beta={beta!r}")
    labels = load_cached(dataset, data_dir)[0].y
    if beta is None:
        return tuple(partition_iid(labels, num_partitions, seed))
    return tuple(partition_dirichlet(labels, num_partitions, beta, seed))


class FixedScoresTask:
    """A :class:`Task` whose local scores were computed beforehand (e.g. by a :class:`TorchTask` run, or
    outside dphype): replaying them runs the voting round without retraining."""

    def __init__(self, scores: np.ndarray, maximize: bool = True) -> None:
        self.scores = np.asarray(scores, dtype=np.float64)
        self.maximize = maximize

    def score(self, candidates: Sequence[Mapping[str, Any]], **_: Any) -> np.ndarray:
        if len(candidates) != len(self.scores):
            raise ValueError(f"got {len(candidates)} candidates for {len(self.scores)} precomputed scores")
        return self.scores


def make_task(
    dataset: str,
    partition_id: int,
    num_partitions: int,
    *,
    seed: int = 0,
    partition: str = "iid",
    beta: float | None = None,
    epochs: int | None = None,
    data_dir: str | None = None,
) -> TorchTask:
    """Client ``partition_id``'s task: its shard of the ``dataset`` pool and the paper's model.

    ``partition`` is ``"iid"`` or ``"dirichlet"`` (then ``beta`` is the Dirichlet concentration).
    The partitioning depends only on ``(dataset, num_partitions, seed, partition, beta)``; the
    client's training seed is derived from ``seed`` and ``partition_id``. ``epochs=None`` uses the
    paper's value (:func:`default_epochs`).
    """
    from dphype.ml.models import MODEL_FOR_DATASET

    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition_id must lie in [0, {num_partitions}), got {partition_id}")
    if epochs is not None and epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    shards = partition_cached(dataset, num_partitions, seed, partition, beta, data_dir)
    pool = load_cached(dataset, data_dir)[0]
    client_seed = int(np.random.SeedSequence([seed, partition_id]).generate_state(1)[0])
    return TorchTask(
        data=pool.subset(shards[partition_id]),
        model=MODEL_FOR_DATASET[dataset],
        epochs=default_epochs(dataset) if epochs is None else epochs,
        seed=client_seed,
    )


def score_clients(
    dataset: str,
    candidates: CandidateList,
    clients: int,
    *,
    seed: int = 0,
    partition: str = "iid",
    beta: float | None = None,
    epochs: int | None = None,
    data_dir: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Every client's local scores on a simulated federation, through the real client path.

    Client ``i`` is :func:`make_task` ``(dataset, i, clients, ...)`` and scores every candidate on its
    own shard (Algorithm 1, lines 2-4). Returns ``(clients, p)``, or ``(clients, p, j)`` when
    ``Task.score`` returns lexicographic keys (``TorchTask``: ``[accuracy, -validation loss]``).
    ``progress(done, clients)`` is called after each client.
    """
    rows = []
    for i in range(clients):
        task = make_task(dataset, i, clients, seed=seed, partition=partition, beta=beta, epochs=epochs,
                         data_dir=data_dir)
        rows.append(np.asarray(task.score(candidates), dtype=np.float64))
        if progress is not None:
            progress(i + 1, clients)
    return np.stack(rows)
