"""Reference accuracies the end-to-end tests compare a run with, computed from the data: the majority-class
baseline (always predict the most frequent test label) and Opt (the best candidate's test accuracy after the
same FedAvg the bundled app runs, DP-Hype Section V-C)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dphype.ml.models import MODEL_FOR_DATASET
from dphype.ml.task import load_cached, make_task
from dphype.ml.training import accuracy, fedavg


def majority_accuracy(labels: Any) -> float:
    """Accuracy of always predicting the most frequent of ``labels`` (integer class labels)."""
    labels = np.asarray(labels)
    return float(np.bincount(labels).max() / labels.size)


def majority_of_test_split(dataset: str) -> float:
    """:func:`majority_accuracy` of ``dataset``'s test split, on which the bundled app evaluates."""
    return majority_accuracy(load_cached(dataset)[1].y)


def candidate_accuracies(dataset: str, clients: int, candidates: Sequence[Mapping[str, Any]], *, rounds: int,
                         local_epochs: int, seed: int = 0) -> np.ndarray:
    """Test accuracy of every candidate after ``rounds`` FedAvg rounds of ``local_epochs`` over the ``clients``
    iid shards the bundled ClientApp trains on (batched, :func:`dphype.ml.training.fedavg`); Opt is the max."""
    shards = [make_task(dataset, i, clients, seed=seed, epochs=local_epochs).data for i in range(clients)]
    models = fedavg(MODEL_FOR_DATASET[dataset], shards, list(candidates), rounds=rounds, local_epochs=local_epochs,
                    seed=seed, device="cpu")
    return accuracy(models, load_cached(dataset)[1])
