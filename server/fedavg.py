"""FedAvg of the DP-Hype winner through Flower (the step after selection, DP-Hype Section V-B).

The ServerApp initialises the paper's model for the data set, runs Flower's
legacy ``FedAvg`` for ``fedavg-rounds`` rounds over all connected nodes (at
least ``clients``) with the selected candidate's ``lr``/``momentum``/``decay``,
and evaluates every global model on the held-out test split. Each client's update is
:func:`dphype.training.train_candidates` on its whole shard, started from the
global weights (fresh momentum, StepLR restarting each round, as in
:func:`dphype.training.fedavg`). Model updates travel in plaintext, as in
ordinary FedAvg; DP-Hype's guarantee covers the selection only.

torch is imported inside the functions: the CLI imports this module at start-up.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import Context, Message, RecordDict
from flwr.common import NDArrays, Scalar, log, ndarrays_to_parameters
from flwr.server import ServerConfig
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow
from flwr.serverapp.grid import Grid
from flwr.supercore.run import Run

from dphype.candidates import Candidate
from dphype.secure_sum import PHASE_KEY, check_timeout

if TYPE_CHECKING:
    from torch import nn

    from dphype.data import Dataset

#: Fit-config value of :data:`dphype.secure_sum.PHASE_KEY` for a FedAvg training round.
TRAIN_PHASE = "train"
CANDIDATE_KEY = "dphype.candidate"
EPOCHS_KEY = "dphype.epochs"
ROUND_KEY = "dphype.round"


class TimedGrid(Grid):
    """``grid`` with a default reply timeout: ``send_and_receive`` without one waits ``timeout`` s.

    Flower 1.41's legacy ``DefaultWorkflow`` sends each FedAvg round without a
    timeout (it does not read ``ServerConfig.round_timeout``), so a SuperNode
    that disappears would stall the round forever. Everything else is delegated.
    """

    def __init__(self, grid: Grid, timeout: float) -> None:
        self.grid = grid
        self.timeout = timeout

    def set_run(self, run: Run) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        return self.grid.run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        wait = self.timeout if timeout is None else timeout
        return self.grid.send_and_receive(messages, timeout=wait)


def build_global_model(dataset: str, data: Dataset, seed: int) -> nn.Module:
    """The paper's model for ``dataset`` (Appendix B), initialised from ``seed``."""
    import torch

    from dphype.models import MODEL_FOR_DATASET, build_model

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build_model(MODEL_FOR_DATASET[dataset], data.x.shape[1:], data.num_classes)


def get_weights(module: nn.Module) -> NDArrays:
    """Parameters and buffers of ``module`` as numpy arrays (state-dict order)."""
    return [v.detach().cpu().numpy().copy() for v in module.state_dict().values()]


def set_weights(module: nn.Module, weights: NDArrays) -> nn.Module:
    """Load ``weights`` (state-dict order) into ``module``; refuses a mismatching list."""
    import torch

    keys = list(module.state_dict())
    if len(weights) != len(keys):
        raise ValueError(f"expected {len(keys)} weight arrays for the model, got {len(weights)}")
    module.load_state_dict({k: torch.as_tensor(np.asarray(w)) for k, w in zip(keys, weights)})
    return module


def local_update(
    module: nn.Module, data: Dataset, candidate: Candidate, *, epochs: int, seed: int
) -> nn.Module:
    """Train ``module`` (the global model) on ``data`` with ``candidate`` for ``epochs`` epochs."""
    from dphype.training import train_candidates

    trained = train_candidates(lambda: module, data, [candidate], epochs=epochs, seed=seed)
    return trained.unstack(0)


def evaluate_accuracy(module: nn.Module, data: Dataset) -> float:
    """Accuracy of ``module`` on ``data`` (evaluation mode; NaN if it diverged)."""
    from dphype.training import StackedModels, accuracy

    return float(accuracy(StackedModels.replicate(module, 1), data)[0])


def run_fedavg(
    grid: Grid,
    context: Context,
    *,
    dataset: str,
    test: Dataset,
    candidate: Candidate,
    clients: int,
    rounds: int,
    local_epochs: int,
    seed: int,
    round_timeout: float | None = None,
) -> float:
    """FedAvg of ``candidate`` over all nodes (waiting for ``clients``); returns the test accuracy.

    ``round_timeout`` (seconds, None: no limit) bounds each round; FedAvg averages
    the updates that arrived in time.
    """
    check_timeout("round_timeout", round_timeout)
    model = build_global_model(dataset, test, seed)

    def evaluate(server_round: int, weights: NDArrays, config: dict[str, Scalar]):
        acc = evaluate_accuracy(set_weights(model, weights), test)
        log(logging.INFO, "FedAvg round %d: test accuracy %.4f", server_round, acc)
        return 0.0, {"accuracy": acc}

    def fit_config(server_round: int) -> dict[str, Scalar]:
        return {
            PHASE_KEY: TRAIN_PHASE,
            CANDIDATE_KEY: json.dumps(candidate, sort_keys=True),
            EPOCHS_KEY: local_epochs,
            ROUND_KEY: server_round,
        }

    strategy = FedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=clients,
        min_available_clients=clients,
        initial_parameters=ndarrays_to_parameters(get_weights(model)),
        on_fit_config_fn=fit_config,
        evaluate_fn=evaluate,
    )
    legacy = LegacyContext(context, config=ServerConfig(num_rounds=rounds), strategy=strategy)
    DefaultWorkflow()(grid if round_timeout is None else TimedGrid(grid, round_timeout), legacy)
    history: dict[str, Any] = legacy.history.metrics_centralized
    return float(history["accuracy"][-1][1])
