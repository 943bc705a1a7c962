"""What a client evaluates: a `dphype.task.Task` scores every public candidate on local data (DP-Hype, Sec. III).

DP-Hype is task-agnostic: anything with ``maximize`` and ``score(candidates)`` works. `TorchTask` is the task of
the paper's experiments (Section V-B): train the data set's model (Appendix B) for each candidate and report its
local validation loss (Algorithm 1's score) and accuracy as lexicographic keys, under the task's ``validation``
scheme (`dphype.ml.validation`). `make_task` builds client ``partition_id``'s task from a data set name: the same
``seed`` gives every client the same partitioning. torch is imported inside functions only, so importing this
module is cheap.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dphype.ml.data import Dataset, dataset_spec, load_dataset, partition_dirichlet, partition_iid
from dphype.ml.validation import DEFAULT_VALIDATION, check_validation

if TYPE_CHECKING:
    from dphype.ml.training import ModelSpec
    from dphype.selection.candidates import CandidateList

#: Partitioning schemes accepted by `make_task` (Section V-C, Appendix C).
PARTITIONS: tuple[str, ...] = ("iid", "dirichlet")


@dataclass
class TorchTask:
    """Local validation loss and accuracy of one model per candidate (Section V-B), all trained at once.

    ``validation`` picks how rows are held out and which key ranks first: the default ``"split:loss"`` returns
    ``[-validation loss, accuracy]`` of one 80/20 split; ``"split"``, the paper's, ``[accuracy, -validation loss]``
    (the loss breaks the many ties of accuracies on small validation sets); ``"kfold:F"`` cross-validates over every
    local row (`dphype.ml.crossval.cross_validate_candidates`).

    Attributes:
        data: The client's local data.
        model: A name of `dphype.ml.models.MODELS` or a zero-argument factory of a fresh module.
        epochs: Local training epochs.
        batch_size: The minibatch size.
        seed: Seeds the training.
        device: The torch device; ``None`` uses CUDA when available.
        chunk_size: Caps the candidates trained at once (memory); ``None``: all.
        num_threads: The torch threads (set it when several clients share one machine); ``None``: unchanged.
        maximize: Higher scores are better.
        validation: A name of `dphype.ml.validation.Validation` (checked when the task is made).
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
    validation: str = DEFAULT_VALIDATION

    def __post_init__(self) -> None:
        self.validation = check_validation(self.validation)

    def check(self, candidates: Sequence[Mapping[str, Any]]) -> None:
        """Refuse public candidates this task cannot train (`check_candidates`)."""
        check_candidates(candidates)

    def score(
        self,
        candidates: Sequence[Mapping[str, Any]],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> np.ndarray:
        """Train and validate one model per candidate (per fold) under the task's ``validation``.

        Args:
            candidates: The public candidates.
            progress: ``progress(done, total)`` counts local epochs, or ``None``.

        Returns:
            ``(p, 2)`` keys in the scheme's order (class docstring); a NaN row for a diverged candidate.
        """
        # lazy import: torch
        from dphype.ml.crossval import cross_validate_candidates

        return cross_validate_candidates(
            self.model,
            self.data,
            candidates,
            validation=self.validation,
            epochs=self.epochs,
            batch_size=self.batch_size,
            seed=self.seed,
            device=self.device,
            chunk_size=self.chunk_size,
            num_threads=self.num_threads,
            progress=progress,
        )

    # ---- final training of the selected candidate (one model, e.g. FedAvg through Flower) ----
    def initial_state(self, seed: int = 0) -> dict[str, Any]:
        """The model's initial weights (a torch state dict) drawn with ``seed``: the global model's start."""
        # lazy import: torch
        from dphype.ml.training import initial_state

        return initial_state(self.model, self.data, seed=seed, device=self.device)

    def fit(self, candidate: Mapping[str, Any], state: Mapping[str, Any], *, epochs: int | None = None,
            seed: int = 0) -> tuple[dict[str, Any], dict[str, float]]:
        """One local update of the global weights ``state`` with ``candidate`` on all local data.

        Args:
            candidate: The hyperparameters.
            state: The global weights (a torch state dict).
            epochs: Local epochs; ``None``: this task's ``epochs``.
            seed: Seeds the update.

        Returns:
            The new weights and ``{"num-examples", "train-loss", "train-accuracy"}`` measured after the update.
        """
        # lazy import: torch
        from dphype.ml.training import evaluate_state, local_update

        new = local_update(self.model, self.data, state, candidate, epochs=self.epochs if epochs is None else epochs,
                           batch_size=self.batch_size, seed=seed, device=self.device)
        acc, loss = evaluate_state(self.model, self.data, new, device=self.device)
        return new, {"num-examples": len(self.data), "train-loss": loss, "train-accuracy": acc}

    def evaluate(self, state: Mapping[str, Any]) -> dict[str, float]:
        """``{"num-examples", "loss", "accuracy"}`` of the weights ``state`` on all local data."""
        # lazy import: torch
        from dphype.ml.training import evaluate_state

        acc, loss = evaluate_state(self.model, self.data, state, device=self.device)
        return {"num-examples": len(self.data), "loss": loss, "accuracy": acc}


def check_candidates(candidates: Sequence[Mapping[str, Any]]) -> None:
    """Refuse candidates `TorchTask`'s batched SGD cannot train (what the server checks before any client works).

    Args:
        candidates: The public candidates.

    Raises:
        ValueError: A missing ``lr``, a key training does not use (named, with the keys it reads), a negative or
            non-finite value.
    """  # noqa: DOC502
    # lazy import: torch
    import torch

    # lazy import: torch
    from dphype.ml.training import Hyperparameters

    Hyperparameters.from_candidates(candidates, torch.device("cpu"))


def default_epochs(dataset: str) -> int:
    """Local (and FedAvg) epochs the paper uses for a registered ``dataset`` (Section V-B)."""
    return dataset_spec(dataset).epochs


def load_cached(dataset: str, data_dir: str | None = None) -> tuple[Dataset, Dataset]:
    """`dphype.ml.data.load_dataset`'s ``(pool, test)``, loaded once per process and shared: do not modify."""
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
    """Row indices of every client's shard of the ``dataset`` pool (computed once per process).

    Args:
        dataset: The data set's name.
        num_partitions: The number of clients.
        seed: Seeds the partitioning.
        partition: One of `PARTITIONS`.
        beta: The Dirichlet concentration for ``"dirichlet"``, ``None`` for ``"iid"``.
        data_dir: The folder holding a non-bundled data set.

    Returns:
        One sorted index array per client.

    Raises:
        ValueError: ``partition`` is unknown, or ``beta`` is given for ``"iid"`` or missing for
            ``"dirichlet"``.
    """
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {', '.join(PARTITIONS)}; got {partition!r}")
    if (beta is None) != (partition == "iid"):
        raise ValueError(f"beta must be given for partition='dirichlet' and only then; got beta={beta!r}")
    labels = load_cached(dataset, data_dir)[0].y
    if beta is None:
        return tuple(partition_iid(labels, num_partitions, seed))
    return tuple(partition_dirichlet(labels, num_partitions, beta, seed))


class FixedScoresTask:
    """A `Task` replaying precomputed local scores (a `TorchTask` run's, or from outside dphype): no retraining.

    Args:
        scores: ``(p,)`` or ``(p, j)`` precomputed scores.
        maximize: Whether higher scores are better.
    """

    def __init__(self, scores: np.ndarray, maximize: bool = True) -> None:
        self.scores = np.asarray(scores, dtype=np.float64)
        self.maximize = maximize

    def score(self, candidates: Sequence[Mapping[str, Any]], **_: Any) -> np.ndarray:
        """The precomputed scores; a different number of candidates is refused."""
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
    device: str | None = None,
    validation: str = DEFAULT_VALIDATION,
) -> TorchTask:
    """Client ``partition_id``'s task: its shard of the ``dataset`` pool and the paper's model.

    The partitioning depends only on ``(dataset, num_partitions, seed, partition, beta)``; the training seed is
    derived from ``seed`` and ``partition_id``.

    Args:
        dataset: The data set's name.
        partition_id: The client, in ``[0, num_partitions)``.
        num_partitions: The number of clients.
        seed: Seeds the partitioning and (with ``partition_id``) the training.
        partition: ``"iid"`` or ``"dirichlet"``.
        beta: The Dirichlet concentration for ``"dirichlet"``.
        epochs: Local epochs, ``>= 1``; ``None``: the paper's value (`default_epochs`).
        data_dir: The folder holding a non-bundled data set.
        device: The torch device; ``None``: CUDA when available.
        validation: How the client holds rows out to score (`dphype.ml.validation`).

    Returns:
        The client's task.

    Raises:
        ValueError: ``dataset`` is not registered, ``partition_id`` or ``epochs`` is out of its range, or
            ``validation`` is not a scheme's name.
    """
    spec = dataset_spec(dataset)
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition_id must lie in [0, {num_partitions}), got {partition_id}")
    if epochs is not None and epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    shards = partition_cached(dataset, num_partitions, seed, partition, beta, data_dir)
    pool = load_cached(dataset, data_dir)[0]
    client_seed = int(np.random.SeedSequence([seed, partition_id]).generate_state(1)[0])
    return TorchTask(
        data=pool.subset(shards[partition_id]),
        model=spec.model,
        epochs=spec.epochs if epochs is None else epochs,
        seed=client_seed,
        device=device,
        validation=validation,
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
    device: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    validation: str = DEFAULT_VALIDATION,
) -> np.ndarray:
    """Every client's local scores on a simulated federation, through the real client path (`make_task`).

    Args:
        dataset: The data set's name.
        candidates: The candidates.
        clients: The number of clients.
        seed: Seeds the partitioning and the training.
        partition: ``"iid"`` or ``"dirichlet"``.
        beta: The Dirichlet concentration for ``"dirichlet"``.
        epochs: Local epochs; ``None``: the paper's value.
        data_dir: The folder holding a non-bundled data set.
        device: The torch device; ``None``: CUDA when available.
        progress: ``progress(done, clients)`` is called after each client, or ``None``.
        validation: Every client's validation scheme.

    Returns:
        ``(clients, p)`` scores, or ``(clients, p, j)`` for lexicographic keys.
    """
    rows = []
    for i in range(clients):
        task = make_task(dataset, i, clients, seed=seed, partition=partition, beta=beta, epochs=epochs,
                         data_dir=data_dir, device=device, validation=validation)
        rows.append(np.asarray(task.score(candidates), dtype=np.float64))
        if progress is not None:
            progress(i + 1, clients)
    return np.stack(rows)
