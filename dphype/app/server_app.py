"""The bundled ServerApp: DP-Hype selects the hyperparameters, then Flower's FedAvg trains with them.

A worked example of the Message API end to end, in one ``@app.main()``:

1. `dphype.flower.DPHype` -- every client votes on the public candidate list. With ``release =
   "argmax"`` (the app's default, `dphype.app.run_config.APP_RELEASE`) the clients seal shares of their
   ballots to a committee of ``tallies`` tally nodes, whose keys the ServerApp first asks the connected
   nodes for (`dphype.flower.connected_committee`), and only the winner's index is released;
   with ``release = "sum"`` one SecAgg+ round releases the noisy vote sum and the rule selects. Either way
   with a privacy report;
2. ``flwr.serverapp.strategy.FedAvg`` -- ``fedavg-rounds`` rounds with the selected candidate as the train
   config; the global model is evaluated on the held-out test split after every round, and by a
   ``fraction-evaluate`` share of the clients on their own data. With ``train-epsilon > 0`` FedAvg runs in
   Flower's DP wrapper (`dphype.flower.final_training`) and the report composes both phases;
3. `dphype.flower.PrivateEvaluation` -- with ``private-evaluation`` (the default) the voters evaluate the final model
   on their held-out rows and the federation releases the mean accuracy and majority-class baseline with noise, for
   ``evaluation-share`` of ``epsilon``, composed with the run's guarantee; a model below the baseline is named in the
   run's last line.

Every run writes its run folder (`dphype.flower.run_folder`: ``result.json``, the final model's ``model.npz``,
``log.txt``; by default ``runs/`` of the app folder under ``dphype run``). The summary (selection, privacy report,
test accuracy, timings) is logged as text (`dphype.result.summarize_run`) and as one JSON line prefixed
``DPHYPE_RESULT``, and, when the run config names a ``result-file``, also written there (on the ServerApp's host).
A failed run logs one line prefixed ``DP-Hype: the run failed:`` with its cause.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from dphype.app.run_config import AppConfig, result_path
from dphype.flower import (
    BoundedFedAvg,
    DPHype,
    PreflightError,
    PrivateEvaluation,
    TrainingBudget,
    check_private_training,
    connected_committee,
    plaintext_training,
    private_training,
    run_folder,
    save_model,
    train_config,
)
from dphype.ml.data import dataset_spec
from dphype.ml.reference import majority_of_test_split
from dphype.ml.torch_task import TorchTask, load_cached
from dphype.result import FAILURE_FORMAT, DPHypeResult, summarize_run
from dphype.runs import RunFolder
from dphype.secure.secure_sum import SecureSumError
from dphype.selection.candidates import CandidateList
from dphype.strict_json import jsonable

#: Prefix of the log line that carries the run summary as JSON.
RESULT_PREFIX = "DPHYPE_RESULT "
#: Prefix of the one log line that names why a run failed (``server/run.sh`` prints it as its last line).
FAILURE_PREFIX = "DP-Hype: the run failed: "


def candidates(run_config: Mapping[str, Any]) -> CandidateList:
    """The public candidate list a run config names, every key of it checked (`AppConfig.from_run_config`).

    ``dphype run`` calls it before Flower starts (`dphype.flower.local.app_candidates`).

    Args:
        run_config: The Flower run config.

    Returns:
        The candidate list.

    Raises:
        ValueError: If a key is unknown or missing, or a value is invalid.
    """  # noqa: DOC502
    return AppConfig.from_run_config(run_config).candidate_list()


def run_app(grid: Grid, cfg: AppConfig, run: RunFolder) -> dict[str, Any]:
    """DP-Hype selection, then FedAvg with the winner.

    The tally nodes are found among the connected nodes first (in argmax mode the committee; in sum mode those that
    answer as tallies, which neither vote nor train), and FedAvg trains and evaluates the voters only, going on
    without a voter that vanished (down to the selection's fewest survivors; private training: none may vanish) after
    a round timeout's wait; with a training budget the training's preconditions are checked before the selection
    spends anything, and DP-FedAvg is accounted together with the selection.

    Args:
        grid: The ServerApp's grid.
        cfg: The validated app configuration.
        run: The run folder: the selection is recorded in it and the final model saved there.

    Returns:
        The run summary: the selection's `dphype.result.DPHypeResult.to_dict` record (with the private evaluation's
        ``evaluation``, or ``evaluation_error`` when it released nothing), the training's and the whole run's
        privacy, the configuration, the plan, the final test accuracy, the test split's majority baseline and loss,
        and the times.

    Raises:
        ValueError: If the selection or the private training is refused before it starts.
    """  # noqa: DOC502
    candidates = cfg.candidate_list()
    budget = cfg.training_budget()
    survivors = cfg.dphype.clients  # at least the vote's survivors train: checked here, set after the vote
    if budget is not None:  # the training accountant's preconditions, before the selection spends anything
        check_private_training(_fedavg(cfg, survivors), budget, delta=cfg.dphype.delta,
                               neighbouring=cfg.dphype.neighbouring, sampled_clients=survivors)
    # the private evaluation's share, noise and secure-sum graph, before the selection spends anything
    evaluation = PrivateEvaluation(cfg.dphype, share=cfg.evaluation_share) if cfg.private_evaluation else None
    # without a committee the selection is checked before any node is asked (a committee's keys come from its nodes)
    checked = None if cfg.dphype.mode.uses_committee else DPHype(candidates, cfg.dphype)
    # the central evaluation's split, parsed while the nodes work (the thread ends with the parsing)
    loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dphype-test-split")
    split = loader.submit(load_cached, cfg.dataset)
    loader.shutdown(wait=False)
    # argmax: the committee's keys from its nodes (hello only); sum: the connected tallies, set aside
    committee = connected_committee(grid, cfg.dphype, cfg.tallies, candidates=candidates,
                                    connect_timeout=cfg.connect_timeout, timeout=cfg.round_timeout)
    voters = committee.voters  # FedAvg samples, trains and evaluates the voters only
    # checks all before any client works
    selection = checked or DPHype(candidates, cfg.dphype, tallies=committee.keys)
    start = time.perf_counter()
    result = selection.start(committee.selection_grid, timeout=cfg.round_timeout, connect_timeout=cfg.connect_timeout,
                             committee_nodes=committee.nodes,  # the committee answered hello above
                             tally_timeout=cfg.tally_timeout)
    result = run.selected(result)  # its summary names the run folder
    selected_at = time.perf_counter()

    test = TorchTask(split.result()[1], dataset_spec(cfg.dataset).model)  # central evaluation

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord(dict(test.evaluate(arrays.to_torch_state_dict())))

    survivors = result.report.survivors or cfg.dphype.clients  # only the vote's survivors are waited for
    sampled = len(list(voters.get_node_ids()))
    fedavg = _fedavg(cfg, survivors, training_floor(selection.request.min_survivors, budget, sampled))
    # DP-FedAvg, accounted together with the selection, when the run has a training budget
    private = None if budget is None else private_training(fedavg, result.report, budget, sampled_clients=sampled)
    strategy: Strategy = fedavg if private is None else private.strategy
    trained = strategy.start(
        voters,
        initial_arrays=ArrayRecord(test.initial_state(cfg.seed)),
        num_rounds=cfg.fedavg_rounds,
        timeout=cfg.round_timeout,
        train_config=train_config(result.best_params, **{"local-epochs": cfg.local_epochs}),
        evaluate_fn=evaluate,
    )
    evaluation_error = None
    if evaluation is not None:  # the voters' held-out accuracy and baseline, composed before the report is made
        try:
            result = evaluation.start(voters, trained.arrays, result, accountant=None if private is None else
                                      private.accountant, timeout=cfg.round_timeout,
                                      connect_timeout=cfg.connect_timeout)
        except (PreflightError, SecureSumError) as err:  # it released nothing; the selection and training stand
            evaluation_error = f"the private evaluation released nothing: {err}"
            log(logging.WARNING, "DP-Hype: %s", evaluation_error)
    if evaluation is not None and evaluation_error is None:
        result = run.selected(result)  # the record with the private evaluation
    # after training: the rounds actually released
    phases = private.report() if private is not None else plaintext_training(
        cfg.dphype.delta, cfg.fedavg_rounds, client_evaluation=cfg.fraction_evaluate > 0)
    final = trained.evaluate_metrics_serverapp[cfg.fedavg_rounds]
    save_model(run, trained.arrays)
    return {
        **result.to_dict(),
        **phases,
        "epsilon": cfg.dphype.epsilon,
        "delta": cfg.dphype.delta,
        "k": cfg.dphype.k,
        "clients": cfg.dphype.clients,
        "num_candidates": len(selection.candidates),
        "accuracy": float(cast(float, final["accuracy"])),
        "baseline": majority_of_test_split(cfg.dataset),  # the majority class's share of the same test split
        "test_loss": float(cast(float, final["loss"])),
        "selection_seconds": selected_at - start,
        "fedavg_seconds": time.perf_counter() - selected_at,
        **({} if evaluation_error is None else {"evaluation_error": evaluation_error}),
    }


def _result_path(cfg: AppConfig | None, context: Context) -> Path | None:
    """Where a failed run writes its `dphype.result.FAILURE_FORMAT` record.

    The checked ``result-file``, also when the rest of the run config was refused; ``None`` when there is none, or
    it names no usable file.
    """
    named = context.run_config.get("result-file", "") if cfg is None else cfg.result_file
    try:
        return result_path(named) if isinstance(named, str) else None
    except ValueError:
        return None


def training_floor(selection_floor: int, budget: TrainingBudget | None, sampled: int) -> int:
    """The fewest nodes final training goes on with.

    Plaintext FedAvg goes on without a vanished voter down to the selection's floor; DP-FedAvg (a training
    ``budget``) needs every ``sampled`` node: its accounting assumes them all, and Flower would refuse later.
    """
    return selection_floor if budget is None else sampled


def _fedavg(cfg: AppConfig, survivors: int, fewest: int | None = None) -> BoundedFedAvg:
    return BoundedFedAvg(fewest=survivors if fewest is None else min(fewest, survivors), wait=cfg.round_timeout,
                         fraction_evaluate=cfg.fraction_evaluate, min_train_nodes=survivors,
                         min_evaluate_nodes=round(cfg.fraction_evaluate * survivors), min_available_nodes=survivors)


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Read and check the run config, select, train, report, all recorded in the run's folder.

    The run folder (`dphype.flower.run_folder`) keeps the record, the model and the log. The log shows the
    summary as text (`dphype.result.summarize_run`) and as one strict-JSON line after `RESULT_PREFIX`; with
    ``result-file`` set the JSON is also written there, on the ServerApp's host
    (`dphype.app.run_config.AppConfig.result_path`). A run that fails logs one line after `FAILURE_PREFIX` naming
    the cause, writes a `dphype.result.FAILURE_FORMAT` record to ``result-file`` if one is named and to its run
    folder, then lets Flower mark the run failed.

    Args:
        grid: The ServerApp's grid.
        context: The run's context (its run config).

    Raises:
        Exception: Whatever stopped the run (a bad run config is a ``ValueError`` or ``FileNotFoundError``, found
            before any client works), after the `FAILURE_PREFIX` line.
    """
    cfg = None
    with run_folder(context) as run:
        try:
            cfg = AppConfig.from_run_config(context.run_config)
            summary = run_app(grid, cfg, run)
        except Exception as err:
            cause = f"{type(err).__name__}: {err}"
            log(logging.ERROR, "%s%s", FAILURE_PREFIX, " | ".join(cause.splitlines()))  # one line, details too
            path = _result_path(cfg, context)
            if path is not None:  # no earlier run's result stays there, and its reader learns why
                path.write_text(json.dumps({"format": FAILURE_FORMAT, "error": cause}) + "\n", encoding="utf-8")
            raise
        run.add(**summary)
        line = json.dumps(jsonable(summary), sort_keys=True, allow_nan=False)  # strict JSON (inf as "inf")
        log(logging.INFO, "DP-Hype run summary:\n%s", summarize_run(summary))
        log(logging.INFO, "%s%s", RESULT_PREFIX, line)
        path = cfg.result_path()
        if path is not None:
            path.write_text(line + "\n", encoding="utf-8")
            log(logging.INFO, "DP-Hype: the summary's JSON is in %s (on the ServerApp's host)", path)
        evaluated = DPHypeResult.from_dict(summary).evaluation
        verdict = None if evaluated is None else evaluated.verdict()
        if verdict is not None:  # the run's last line
            log(logging.WARNING, "DP-Hype: %s", verdict)
