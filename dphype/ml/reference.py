"""Reference accuracies a run's result is compared with, computed from the data, outside any private protocol.

The majority-class baseline (always predict the most frequent test label) and the candidates' own test
accuracies after the same FedAvg the bundled app runs (their best is Opt, DP-Hype Section V-C). Both read the
test split: what whoever owns that split (the demo's operator, a benchmark) may compute, never something a
DP-Hype release carries or pays for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dphype.ml.data import dataset_spec
from dphype.ml.torch_task import load_cached, make_task


def majority_accuracy(labels: Any) -> float:
    """Accuracy of always predicting the most frequent of ``labels``."""
    labels = np.asarray(labels)
    return float(np.bincount(labels).max() / labels.size)


def majority_of_test_split(dataset: str) -> float:
    """`majority_accuracy` of ``dataset``'s test split, on which the bundled app evaluates."""
    return majority_accuracy(load_cached(dataset)[1].y)


def candidate_accuracies(dataset: str, clients: int, candidates: Sequence[Mapping[str, Any]], *, rounds: int,
                         local_epochs: int, seed: int = 0) -> np.ndarray:
    """Test accuracy of every candidate after the bundled app's FedAvg, trained centrally on the same shards.

    ``rounds`` batched FedAvg rounds (`dphype.ml.training.fedavg`) over the ``clients`` iid shards; the maximum is Opt.

    Args:
        dataset: A data set name.
        clients: The number of shards (the run's clients).
        candidates: The candidates.
        rounds: FedAvg rounds.
        local_epochs: Local epochs per round.
        seed: The partition and initialisation seed.

    Returns:
        ``(p,)`` test accuracies, in candidate order.
    """
    # lazy import: torch
    from dphype.ml.training import accuracy, fedavg

    shards = [make_task(dataset, i, clients, seed=seed, epochs=local_epochs).data for i in range(clients)]
    models = fedavg(dataset_spec(dataset).model, shards, list(candidates), rounds=rounds, local_epochs=local_epochs,
                    seed=seed, device="cpu")
    return accuracy(models, load_cached(dataset)[1])
