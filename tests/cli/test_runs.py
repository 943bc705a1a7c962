"""`dphype run` keeps and prints its run's record; `dphype runs` lists an app's runs, `dphype show RUN` prints one;
a federation too small to select is refused before Flower starts."""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import REPO, a_release

from dphype.cli import RunFailedError, main
from dphype.flower.local import RunOutcome
from dphype.runs import RUNS_ENV, RunFolder


def serverapp_stand_in(monkeypatch, fail=None):
    """`run_locally` replaced by what the ServerApp does with the environment `dphype run` gives it: its run folder
    in ``DPHYPE_RUNS_DIR`` (the selection recorded), then the run's outcome."""
    calls = []

    def run_locally(app, run_config, supernodes, *, env=None, json=False, timeout=None):
        calls.append(env)
        run = RunFolder.create(Path(env[RUNS_ENV]), 17)
        if fail is not None:
            run.write(fail)
            raise RunFailedError(f"the Flower run failed: run 17 ended finished:failed: {fail}")
        run.selected(a_release())
        run.add(accuracy=0.9)
        run.write()
        return RunOutcome(0, 17, "finished:completed", "", ())

    monkeypatch.setattr("dphype.cli.run.run_locally", run_locally)
    return calls


def test_run_prints_its_run_folder_and_with_json_its_record(tmp_path, capsys, monkeypatch):
    assert main(["new", str(tmp_path / "app")]) == 0
    calls = serverapp_stand_in(monkeypatch)
    assert main(["run", str(tmp_path / "app")]) == 0
    (folder,) = (tmp_path / "app" / "runs").iterdir()  # the app folder's runs/ (the run config's runs-dir)
    assert calls == [{RUNS_ENV: str(tmp_path / "app" / "runs")}]
    last = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(rf"run 17 completed in \d+ s: {re.escape(str(folder))}", last), last
    assert main(["run", str(tmp_path / "app"), "--json", "--runs-dir", str(tmp_path / "elsewhere")]) == 0
    (other,) = (tmp_path / "elsewhere").iterdir()
    printed = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert printed == json.loads((other / "result.json").read_text())
    assert printed["best_params"] == a_release().best_params and printed["accuracy"] == 0.9


def test_a_failed_run_names_its_folder(tmp_path, capsys, monkeypatch):
    assert main(["new", str(tmp_path / "app")]) == 0
    serverapp_stand_in(monkeypatch, fail=ValueError("k must be an integer in [1, 8], got 9"))
    assert main(["run", str(tmp_path / "app")]) == 1
    (folder,) = (tmp_path / "app" / "runs").iterdir()
    assert capsys.readouterr().err.strip().endswith(f"got 9 (run folder: {folder})")
    assert main(["show", "last", "--app", str(tmp_path / "app")]) == 0
    shown = capsys.readouterr().out
    assert "run 17 failed" in shown and "error: ValueError: k must be an integer in [1, 8], got 9" in shown
    assert shown.rstrip().endswith(f"folder: {folder} (result.json)")  # the files there: here no model, no log


def test_runs_lists_an_apps_runs_and_show_prints_one(tmp_path, capsys):
    runs = tmp_path / "app" / "runs"
    run = RunFolder.create(runs, 5)
    run.selected(a_release())
    run.add(accuracy=0.875, baseline=0.5)
    run.save_model({"w": [1.0]})
    run.write()
    assert main(["runs", str(tmp_path / "app")]) == 0
    table = capsys.readouterr().out
    assert table.startswith(f"1 runs in {runs}:") and run.path.name in table and "0.875" in table
    assert main(["show", "5", "--app", str(tmp_path / "app")]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("run 5 completed (") and "DP-Hype selected candidate 4 of 8" in shown
    assert "accuracy: 0.875\nbaseline: 0.5" in shown
    assert shown.rstrip().endswith(f"folder: {run.path} (result.json, model.npz)")  # the files there
    assert main(["show", "6", "--app", str(tmp_path / "app")]) == 2
    assert "no run '6' in" in capsys.readouterr().err
    assert main(["runs", str(tmp_path / "nothing")]) == 0
    assert "no runs in" in capsys.readouterr().out


def test_a_federation_too_small_to_select_is_refused_before_flower_starts(tmp_path, capsys, monkeypatch):
    """The bundled app (its candidates in the run config) at 3 voters: the planner's chance of a good pick is below
    the app's min-success, so `dphype run` refuses, naming the size that would do; min-success=0 opts in."""
    calls = serverapp_stand_in(monkeypatch)
    monkeypatch.setenv("DPHYPE_NODE_POLICY", "dphype-min-clients=3 dphype-min-neighbours=2")
    assert main(["run", str(REPO), "--clients", "3"]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first == ("dphype run: error: run config: clients=3 is too few to select at epsilon 1: use clients >= 11, "
                     "or min-success = 0 to run anyway")
    assert not calls
    assert main(["run", str(REPO), "--clients", "3", "--run-config", "min-success=0", "--runs-dir",
                 str(tmp_path)]) == 0
    assert len(calls) == 1
