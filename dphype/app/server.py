"""The bundled ServerApp: DP-Hype selects the hyperparameters, then Flower's FedAvg trains with them.

A worked example of the Message API end to end, in one ``@app.main()``:

1. `dphype.flower.DPHype` -- every client votes on the public candidate list. With ``release =
   "argmax"`` (the app's default, `dphype.app.config.APP_RELEASE`) the clients seal shares of their
   noisy votes to a committee of ``tallies`` tally nodes, whose keys the ServerApp first asks the connected
   nodes for (`dphype.flower.connected_committee`), and only the winner's index is released;
   with ``release = "sum"`` one SecAgg+ round releases the noisy vote sum and the rule selects. Either way
   with a privacy report;
2. ``flwr.serverapp.strategy.FedAvg`` -- ``fedavg-rounds`` rounds with the selected candidate as the train
   config; the global model is evaluated on the held-out test split after every round, and by a
   ``fraction-evaluate`` share of the clients on their own data. With ``train-epsilon > 0`` FedAvg runs in
   Flower's DP wrapper (`dphype.flower.private_training`) and the report composes both phases.

The summary (selection, privacy report, test accuracy, timings) is logged as one JSON line prefixed
``DPHYPE_RESULT`` and, when the run config names a ``result-file``, written there.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, cast

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Strategy

from dphype.app.config import AppConfig
from dphype.flower import DPHype, check_private_training, connected_committee, private_training, train_config
from dphype.ml.models import MODEL_FOR_DATASET
from dphype.ml.task import TorchTask, load_cached
from dphype.strict_json import jsonable

#: Prefix of the log line that carries the run summary as JSON.
RESULT_PREFIX = "DPHYPE_RESULT "
#: What ordinary FedAvg releases (the report says it plainly).
PLAINTEXT_TRAINING = ("plaintext model updates of every participating client in every FedAvg round (ordinary "
                      "FedAvg): no DP guarantee covers them; set train-epsilon > 0 to train privately")


def run_app(grid: Grid, cfg: AppConfig) -> dict[str, Any]:
    """DP-Hype selection, then FedAvg with the winner.

    In argmax mode the tally committee is found among the connected nodes first, and FedAvg trains and evaluates
    the voters only; with a training budget the training's preconditions are checked before the selection
    spends anything, and DP-FedAvg is accounted together with the selection.

    Args:
        grid: The ServerApp's grid.
        cfg: The validated app configuration.

    Returns:
        The run summary: the selection's `dphype.result.DPHypeResult.to_dict` record, the training's and the
        whole run's privacy, the configuration, the plan, the final test accuracy and loss, and the times.

    Raises:
        ValueError: If the selection or the private training is refused before it starts.
    """  # noqa: DOC502
    # argmax: the committee's keys from its nodes (hello only); sum: no committee
    committee = connected_committee(grid, cfg.dphype, cfg.tallies, connect_timeout=cfg.connect_timeout,
                                    timeout=cfg.round_timeout)
    voters = committee.voters  # FedAvg samples, trains and evaluates the voters only
    selection = DPHype(cfg.candidate_list(), cfg.dphype, tallies=committee.keys)  # checks all before any client works
    budget = cfg.training_budget()
    survivors = cfg.dphype.clients  # at least the vote's survivors train: checked here, set after the vote
    if budget is not None:  # the training accountant's preconditions, before the selection spends anything
        check_private_training(_fedavg(cfg, survivors), budget, delta=cfg.dphype.delta,
                               neighbouring=cfg.dphype.neighbouring, sampled_clients=survivors)
    start = time.perf_counter()
    result = selection.start(grid, timeout=cfg.round_timeout, connect_timeout=cfg.connect_timeout,
                             committee_nodes=committee.nodes)  # the committee answered hello above
    selected_at = time.perf_counter()

    test = TorchTask(load_cached(cfg.dataset)[1], MODEL_FOR_DATASET[cfg.dataset])  # central evaluation

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord(dict(test.evaluate(arrays.to_torch_state_dict())))

    survivors = result.report.survivors or cfg.dphype.clients  # only the vote's survivors are waited for
    fedavg = _fedavg(cfg, survivors)
    # DP-FedAvg, accounted together with the selection, when the run has a training budget
    private = None if budget is None else private_training(fedavg, result.report, budget,
                                                           sampled_clients=len(list(voters.get_node_ids())))
    strategy: Strategy = fedavg if private is None else private.strategy
    trained = strategy.start(
        voters,
        initial_arrays=ArrayRecord(test.initial_state(cfg.seed)),
        num_rounds=cfg.fedavg_rounds,
        timeout=cfg.round_timeout,
        train_config=train_config(result.best_params, **{"local-epochs": cfg.local_epochs}),
        evaluate_fn=evaluate,
    )
    phases = private.report() if private is not None else {  # after training: the rounds actually released
        "training": {"private": False, "released": PLAINTEXT_TRAINING},
        "run": {"epsilon": None, "delta": cfg.dphype.delta, "accountant": "none: the training is not private",
                "releases": 1 + cfg.fedavg_rounds}}
    final = trained.evaluate_metrics_serverapp[cfg.fedavg_rounds]
    return {
        **result.to_dict(),
        **phases,
        "epsilon": cfg.dphype.epsilon,
        "delta": cfg.dphype.delta,
        "k": cfg.dphype.k,
        "clients": cfg.dphype.clients,
        "num_candidates": len(selection.candidates),
        "predicted_success": selection.plan().success,
        "plan_warnings": selection.plan().warnings,
        "accuracy": float(cast(float, final["accuracy"])),
        "test_loss": float(cast(float, final["loss"])),
        "selection_seconds": selected_at - start,
        "fedavg_seconds": time.perf_counter() - selected_at,
    }


def _fedavg(cfg: AppConfig, survivors: int) -> FedAvg:
    return FedAvg(fraction_evaluate=cfg.fraction_evaluate, min_train_nodes=survivors,
                  min_evaluate_nodes=round(cfg.fraction_evaluate * survivors), min_available_nodes=survivors)


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Read and check the run config, select, train, report.

    The summary goes to the log as one strict-JSON line after `RESULT_PREFIX`, and to ``result-file`` if set.

    Args:
        grid: The ServerApp's grid.
        context: The run's context (its run config).

    Raises:
        ValueError: If the run config is invalid.
    """  # noqa: DOC502
    cfg = AppConfig.from_run_config(context.run_config)
    summary = run_app(grid, cfg)
    line = json.dumps(jsonable(summary), sort_keys=True, allow_nan=False)  # strict JSON (inf as "inf")
    log(logging.INFO, "%s%s", RESULT_PREFIX, line)
    if cfg.result_file:
        with open(cfg.result_file, "w", encoding="utf-8") as fh:
            fh.write(line + "\n")
