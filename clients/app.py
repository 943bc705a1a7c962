"""The dphype ClientApp: DP-Hype voting over SecAgg+, then FedAvg training of the winner.

Each node builds the paper's task for its shard of the data set
(:func:`dphype.task.make_task`, from ``partition-id`` / ``num-partitions`` in the
node config, which the simulation engine also sets) and the public candidate list
from the run config. It answers

* the DP-Hype vote request (inside SecAgg+) with its noisy top-k votes, refusing
  a request for more than the run config's ``epsilon``;
* FedAvg training rounds with a local update of the global model using the
  selected candidate.

Run with ``flwr run .`` (components in pyproject.toml) or embed
:func:`build_client_app` in your own simulation. Under the Ray simulation
backend each client actor gets ``OMP_NUM_THREADS=1`` (measured: torch then uses
one thread), so clients do not oversubscribe the CPUs.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Context
from flwr.client import Client
from flwr.clientapp import ClientApp
from flwr.common import NDArrays, Scalar

from dphype.candidates import CandidateList, load_candidates
from dphype.client import DPHypeClient
from dphype.secure_sum import PHASE_KEY, secure_vote_mod
from server.config import AppConfig
from server.fedavg import (
    CANDIDATE_KEY,
    EPOCHS_KEY,
    ROUND_KEY,
    TRAIN_PHASE,
    build_global_model,
    get_weights,
    local_update,
    set_weights,
)

if TYPE_CHECKING:
    from dphype.task import TorchTask


class AppClient(DPHypeClient):
    """A DP-Hype client that also trains the selected candidate in FedAvg rounds."""

    def __init__(
        self, task: TorchTask, candidates: CandidateList, *, dataset: str, max_epsilon: float
    ) -> None:
        super().__init__(task, candidates, max_epsilon=max_epsilon)
        self.dataset = dataset

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """FedAvg rounds train locally; everything else must be a DP-Hype vote request."""
        if config.get(PHASE_KEY) == TRAIN_PHASE:
            return self.train(parameters, config)
        return super().fit(parameters, config)

    def train(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """One FedAvg local update of the global model with the selected candidate."""
        candidate = json.loads(str(config[CANDIDATE_KEY]))
        if candidate not in list(self.candidates):
            raise ValueError(f"selected candidate {candidate} is not in the public candidate list")
        data = self.task.data
        module = set_weights(build_global_model(self.dataset, data, seed=0), parameters)
        seed = int(np.random.SeedSequence([self.task.seed, int(config[ROUND_KEY])]).generate_state(1)[0])
        trained = local_update(module, data, candidate, epochs=int(config[EPOCHS_KEY]), seed=seed)
        return get_weights(trained), len(data), {}


def build_client_app(config: AppConfig | None = None) -> ClientApp:
    """The ClientApp; ``config=None`` reads the run config of each run (``flwr run``)."""

    def client_fn(context: Context) -> Client:
        from dphype.task import make_task

        cfg = config if config is not None else AppConfig.from_run_config(context.run_config)
        task = make_task(
            cfg.dataset,
            int(context.node_config["partition-id"]),
            int(context.node_config["num-partitions"]),
            seed=cfg.seed,
            epochs=cfg.local_epochs,
        )
        candidates = load_candidates(cfg.candidates)
        return AppClient(task, candidates, dataset=cfg.dataset, max_epsilon=cfg.epsilon).to_client()

    return ClientApp(client_fn=client_fn, mods=[secure_vote_mod])


app = build_client_app()
