"""A run's folder (dphype.runs): where it goes, what it holds, how the commands find it."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from datetime import UTC, datetime

import numpy as np
import pytest
from helpers import a_release

from dphype import DPHypeResult
from dphype.runs import (
    RUNS_ENV,
    RunFolder,
    describe,
    find_run,
    list_table,
    read_record,
    run_folders,
    runs_dir,
    strip_colours,
)

START = datetime(2026, 12, 7, 19, 37, 2, tzinfo=UTC)


def test_the_runs_folder_is_the_variable_then_the_run_config_then_runs_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert runs_dir({}, {}) == tmp_path / "runs"
    assert runs_dir({"runs-dir": ""}, {}) == tmp_path / "runs"  # empty: the default
    assert runs_dir({"runs-dir": "out/r"}, {}) == tmp_path / "out" / "r"
    assert runs_dir({"runs-dir": "out/r"}, {RUNS_ENV: "/srv/runs"}) == tmp_path / "/srv/runs"
    with pytest.raises(ValueError, match="run config runs-dir must be a folder path"):
        runs_dir({"runs-dir": 3}, {})


def test_a_run_folder_is_named_by_its_start_and_run_id_and_never_reused(tmp_path):
    run = RunFolder.create(tmp_path / "runs", 42, START)
    assert run.path == tmp_path / "runs" / "20261207-193702-42" and run.path.is_dir()
    assert run.record == {"run_id": 42, "folder": str(run.path), "started": "2026-12-07T19:37:02+00:00"}
    with pytest.raises(ValueError, match=r"cannot create the run folder .*20261207-193702-42 \(File exists\): set "
                                         "DPHYPE_RUNS_DIR"):
        RunFolder.create(tmp_path / "runs", 42, START)


def test_the_record_holds_the_selection_and_what_was_measured_and_loads_back(tmp_path):
    """No top-level null placeholder: a release without a noisy sum, or an unmeasured accuracy, is absent; the
    selection reads back with DPHypeResult.load, and its summary names the folder."""
    run = RunFolder.create(tmp_path, 7, START)
    result = run.selected(a_release())
    assert result.folder == str(run.path) and f"run folder: {run.path} (result.json" in result.summary()
    run.add(accuracy=0.9, baseline=None, training={"private": False}, run={"epsilon": None})
    run.save_model({"w": np.arange(3.0), "b": np.zeros(1)})
    path = run.write()
    record = json.loads(path.read_text())
    assert record["status"] == "completed" and record["accuracy"] == 0.9 and "baseline" not in record
    assert record["run"] == {"epsilon": None} and record["model"] == "model.npz" and record["seconds"] >= 0
    assert None not in record.values()
    loaded = DPHypeResult.load(path)
    assert loaded.best_params == result.best_params and loaded.folder == str(run.path)
    with np.load(run.path / "model.npz") as model:
        assert sorted(model) == ["b", "w"] and model["w"].tolist() == [0.0, 1.0, 2.0]
    winner = dataclasses.replace(result, noisy_sum=None, selection=None)  # a release without votes, nulls left out
    assert DPHypeResult.from_dict({k: v for k, v in winner.to_dict().items() if v is not None}).noisy_sum is None


def test_a_failed_run_records_its_cause_not_a_half_result(tmp_path):
    run = RunFolder.create(tmp_path, 8, START)
    run.selected(a_release())
    record = json.loads(run.write(ValueError("k must be at most 8")).read_text())
    assert record["format"] == "dphype-failure/1" and record["error"] == "ValueError: k must be at most 8"
    assert record["status"] == "failed" and "best_params" not in record and record["run_id"] == 8
    with pytest.raises(ValueError, match="format must be 'dphype-result/1'"):
        DPHypeResult.load(run.path / "result.json")


def test_the_log_copies_stdout_stderr_and_flowers_handlers_without_colours(tmp_path, capsys):
    stream = open(tmp_path / "console", "w", encoding="utf-8")  # noqa: SIM115 -- a handler's own stream
    handler = logging.StreamHandler(stream)
    logging.getLogger("flwr").addHandler(handler)
    try:
        run = RunFolder.create(tmp_path, 9, START)
        with run.capture_output():
            print("\x1b[32mINFO\x1b[0m : selected")
            sys.stderr.write("a warning\n")
            logging.getLogger("flwr").warning("from Flower's logger")
        print("after the block")
    finally:
        logging.getLogger("flwr").removeHandler(handler)
        stream.close()
    log = (run.path / "log.txt").read_text()
    lines = log.splitlines()  # Flower's own console handler (where imported) copies the warning too
    assert lines[:2] == ["INFO : selected", "a warning"] and "from Flower's logger" in lines  # our handler's stream
    assert all(line.endswith("from Flower's logger") and "\x1b" not in line for line in lines[2:])
    assert "write" not in vars(sys.stdout) and "write" not in vars(stream)  # restored
    assert "\x1b[32mINFO" in capsys.readouterr().out  # the console keeps its colours
    assert strip_colours("\x1b[1;31mERROR\x1b[0m") == "ERROR"


def test_runs_are_found_by_folder_name_run_id_or_last_and_listed_oldest_first(tmp_path):
    runs = tmp_path / "runs"
    first = RunFolder.create(runs, 3, START)
    first.selected(a_release())
    first.add(accuracy=0.8)
    first.write()
    second = RunFolder.create(runs, 4, START.replace(hour=20))
    second.write(RuntimeError("stopped"))
    RunFolder.create(runs, 5, START.replace(hour=21))  # still going: no record yet
    (runs / "notes").mkdir()  # not a run folder
    assert [p.name for p in run_folders(runs)] == ["20261207-193702-3", "20261207-203702-4", "20261207-213702-5"]
    assert find_run(runs, "3") == first.path == find_run(runs, "20261207-193702-3") == find_run(runs, str(first.path))
    assert find_run(runs, "last").name.endswith("-5")
    with pytest.raises(FileNotFoundError, match=r"no run '6' in .*: give a run folder, its name or run id "
                                                r"\(`dphype runs` lists them\) or 'last'"):
        find_run(runs, "6")
    with pytest.raises(FileNotFoundError, match="holds no result.json: the run is still going, or was killed"):
        read_record(find_run(runs, "5"))
    rows = [describe(p) for p in run_folders(runs)]
    assert rows[0]["status"] == "completed" and rows[0]["accuracy"] == 0.8
    assert rows[0]["selection_epsilon"] == pytest.approx(5.0)  # the release's achieved epsilon
    assert rows[1] == {"run": "20261207-203702-4", "status": "failed", "error": "RuntimeError: stopped",
                       "seconds": rows[1]["seconds"]}
    assert rows[2] == {"run": "20261207-213702-5", "status": "no record"}
    assert list_table(runs).startswith(f"3 runs in {runs}:\n")
    assert list_table(tmp_path / "none") == f"no runs in {tmp_path / 'none'} (each `dphype run` writes one there)"


def test_a_run_folder_is_its_owners_alone(tmp_path):
    """The folder keeps the final model (a plaintext-trained one is covered by no guarantee) and the server's log:
    mode 0700, whatever the umask lets through, so other users of the ServerApp's host cannot read them."""
    run = RunFolder.create(tmp_path / "runs", 8, START)
    run.save_model({"w": np.arange(3.0)})
    run.write()
    assert run.path.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("text", ["{bad", "[1, 2]"])
def test_a_record_that_is_not_a_json_object_is_refused_naming_the_file(tmp_path, text):
    run = RunFolder.create(tmp_path, 9, START)
    (run.path / "result.json").write_text(text)
    with pytest.raises(ValueError, match=r"result\.json is not a run record \(a JSON object\)"):
        read_record(run.path)
    assert describe(run.path) == {"run": run.path.name, "status": "no record"}
