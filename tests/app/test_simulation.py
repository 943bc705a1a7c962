"""The bundled apps in process (real ServerApp logic and ClientApp, no Ray); `dphype demo` runs them through
`flwr run` in tests/deployment/test_packaging.py, from the wheel."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from helpers import PERMISSIVE

from dphype.app.run_config import AppConfig
from dphype.config import DPHypeConfig
from dphype.flower import selected_candidate
from dphype.flower.local import LocalGrid
from dphype.ml.reference import candidate_accuracies, majority_accuracy, majority_of_test_split
from dphype.selection.candidates import load_candidates

SUBSET = "table3:random:10:0"
#: The bundled ServerApp's run config for `app_config`'s defaults (the sum release).
RUN_CONFIG = {"release": "sum", "epsilon": 1.0, "delta": 1e-5, "k": 3, "clients": 4, "candidates": SUBSET,
              "fedavg-rounds": 2, "local-epochs": 1, "dataset": "adult", "seed": 0}


def app_config(**overrides) -> AppConfig:
    dphype = dict(epsilon=1.0, delta=1e-5, k=3, clients=4)
    dphype.update({k: overrides.pop(k) for k in list(overrides) if k in dphype})
    values = dict(candidates=SUBSET, fedavg_rounds=2, local_epochs=1)
    values.update(overrides)
    return AppConfig(DPHypeConfig(**dphype), **values)


def test_apps_in_process_select_then_train(tmp_path, flower_log, monkeypatch):
    """The bundled ServerApp (its ``@app.main()``): DP-Hype over SecAgg+, then Flower's FedAvg with the user's own
    train/evaluate handlers; the summary in the log as text and JSON, and in ``result-file``."""
    import dphype.app.client_app as client_app
    import dphype.flower.server.committee_server as committee_server
    from dphype.app.server_app import RESULT_PREFIX, app

    bounds = []  # the timeout of every round trip of the voters' grid (FedAvg's rounds)

    def bounded(grid, messages, *, timeout, **kwargs):
        bounds.append(timeout)
        return send_and_receive(grid, messages, timeout=timeout, **kwargs)

    send_and_receive = committee_server.send_and_receive
    monkeypatch.setattr(committee_server, "send_and_receive", bounded)
    # 4 clients: at epsilon=1 the noise (sigma ~10), not the vote, would decide, and at 20 it still lifts a candidate
    # without a vote above the voted ones now and then; at 100 the vote decides; the nodes' operators allow it
    run_config = {**RUN_CONFIG, "epsilon": 100.0, "round-timeout": 123.0, "result-file": str(tmp_path / "result.json")}
    grid = LocalGrid(client_app.app, 4, run_config={"dataset": "adult", "seed": 0, "local-epochs": 1},
                     node_config=PERMISSIVE)
    app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    summary = json.loads((tmp_path / "result.json").read_text())
    logged = flower_log.getvalue()
    assert json.loads(logged.split(RESULT_PREFIX, 1)[1].splitlines()[0]) == summary
    # the summary as text: the pick and its guarantee, then the training and the accuracy
    assert f"DP-Hype run summary:\nDP-Hype selected candidate {summary['selected_index']} of 10" in logged
    assert "privacy: (100, 1e-05)-DP per client" in logged and f"accuracy: {summary['accuracy']:.4g}" in logged
    assert f"the summary's JSON is in {tmp_path / 'result.json'}" in logged
    assert summary["best_params"] == load_candidates(SUBSET)[summary["selected_index"]]
    assert len(summary["noisy_sum"]) == 10
    # the vote found a good candidate: within 2 points of Opt, the best of the 10 after the same FedAvg (the
    # candidates range from 0.24 to 0.85 here), and Flower's FedAvg trained it above the majority-class baseline
    accuracies = candidate_accuracies("adult", 4, load_candidates(SUBSET), rounds=2, local_epochs=1)
    assert accuracies[summary["selected_index"]] >= accuracies.max() - 0.02
    assert summary["accuracy"] > majority_of_test_split("adult") + 0.03 and summary["test_loss"] > 0
    assert summary["privacy"]["survivors"] == 4
    # the voters' private evaluation on their shards of the test split: the released mean accuracy is the central
    # one up to its noise (and the shards' unequal sizes), the baseline Adult's majority class
    evaluation = summary["evaluation"]
    assert evaluation["contributors"] == 4 and evaluation["share"] == 0.5
    assert evaluation["epsilon"] == pytest.approx(50.0, rel=1e-9)
    assert abs(evaluation["accuracy"] - summary["accuracy"]) < 6 * evaluation["noise_std"] + 0.01
    assert abs(evaluation["majority_baseline"] - majority_of_test_split("adult")) < 6 * evaluation["noise_std"] + 0.01
    assert "private evaluation of the final model on 4 of 4 clients' held-out rows" in logged
    types = [m.metadata.message_type for m in grid.sent]
    assert types.count("train") == 2 * 4 and types.count("evaluate") == 2 * 4  # every client, every round
    trains = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert all(selected_candidate(m) == summary["best_params"] for m in trains)
    assert {r.metadata.message_type for r in grid.replies if r.has_error()} == set()
    assert set(bounds) == {123.0} and len(bounds) == 4  # every FedAvg round (train, evaluate) is bounded


@pytest.mark.parametrize("change, cause", [
    ({"candidates": "BAD"}, "ValueError: run config candidates='BAD': candidates[0] has key(s) 'batch'"),
    ({"candidates": "missing.json"}, "FileNotFoundError: candidates (--candidates, or the run config's candidates): "
                                     "no file 'missing.json'"),
])
def test_a_failed_run_says_why_in_one_line_and_leaves_no_result(tmp_path, flower_log, change, cause):
    """A run the server refuses: before any client works, one log line names the cause, and ``result-file`` holds
    the failure record instead of an earlier run's result."""
    import dphype.app.client_app as client_app
    from dphype.app.server_app import FAILURE_PREFIX, app
    from dphype.result import FAILURE_FORMAT

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"lr": 0.1, "batch": 32}, {"lr": 0.01, "batch": 32}]))
    change = {key: str(bad) if value == "BAD" else value for key, value in change.items()}
    cause = cause.replace("BAD", str(bad))
    result_file = tmp_path / "result.json"
    result_file.write_text('{"format": "dphype-result/1"}\n')  # an earlier run's
    grid = LocalGrid(client_app.app, 4, node_config=PERMISSIVE)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={**RUN_CONFIG, **change, "result-file": str(result_file)})
    with pytest.raises((ValueError, FileNotFoundError)):
        app(grid, context)
    assert grid.sent == []  # no client was asked anything
    (line,) = [line for line in flower_log.getvalue().splitlines() if FAILURE_PREFIX in line]
    assert line.split(FAILURE_PREFIX, 1)[1].startswith(cause), line
    record = json.loads(result_file.read_text())
    assert record["format"] == FAILURE_FORMAT and record["error"].startswith(cause)
    # the one logged line carries every line of the cause (server/run.sh prints it as the run's last line)
    assert " | ".join(record["error"].splitlines()) in line, line


def test_majority_baseline_counts_the_most_frequent_label():
    assert majority_accuracy([0, 1, 1]) == pytest.approx(2 / 3)
    assert majority_accuracy([2, 0, 2, 1, 2, 0]) == pytest.approx(0.5)
    assert 0.75 < majority_of_test_split("adult") < 0.77  # Adult's test split: about 76% earn <= 50K


def test_local_update_starts_from_the_global_weights_and_is_seeded():
    from dphype.ml.torch_task import make_task

    task = make_task("adult", 0, 40, seed=0, epochs=1)
    candidate = {"lr": 0.1, "decay": 0.99, "momentum": 0.9}
    state, other = task.initial_state(seed=0), task.initial_state(seed=1)
    first, metrics = task.fit(candidate, state, epochs=1, seed=7)
    again, _ = task.fit(candidate, state, epochs=1, seed=7)
    assert all(np.array_equal(first[k], again[k]) for k in state)  # same weights and seed: same update
    moved, _ = task.fit(candidate, other, epochs=1, seed=7)
    assert any(not np.array_equal(first[k], moved[k]) for k in state)  # it starts from the weights it is given
    assert any(not np.array_equal(first[k], state[k]) for k in state)
    assert metrics["num-examples"] == len(task.data) and 0 <= metrics["train-accuracy"] <= 1
    evaluated = task.evaluate(first)
    assert evaluated["loss"] == pytest.approx(metrics["train-loss"])
    with pytest.raises(ValueError, match="key\\(s\\) 'hidden' that batched SGD training does not use"):
        task.fit({**candidate, "hidden": 64}, state, epochs=1)


def test_run_config_is_checked_on_the_server(tmp_path):
    unused = tmp_path / "depth.json"
    unused.write_text(json.dumps([{"lr": 0.1, "depth": 2}, {"lr": 0.2, "depth": 3}]))
    with pytest.raises(ValueError, match=r"candidates\[0\] has key\(s\) 'depth' that batched SGD training does not "
                       r"use: remove them\nit reads only lr, momentum, decay(?s:.)*e.g. candidates='table3'"):
        AppConfig.from_run_config({**RUN_CONFIG, "candidates": str(unused)})
    with pytest.raises(ValueError, match=r"(?s)result-file='/nonexistent/r.json': .*its folder must exist there"):
        app_config(result_file="/nonexistent/r.json")
    assert app_config(result_file="r.json").result_path() == Path.cwd() / "r.json"  # the ServerApp's folder
    with pytest.raises(ValueError, match="dataset must be one of adult, mnist5k, fashion-mnist"):
        app_config(dataset="/etc/passwd")
    with pytest.raises(ValueError, match="candidates spec must be"):
        app_config(candidates="nonsense")
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 10\]"):
        from dphype.flower import DPHype

        DPHype(app_config().candidate_list(), DPHypeConfig(epsilon=1.0, delta=1e-5, k=11, clients=4))

