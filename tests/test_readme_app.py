"""The embedding guide's example (docs/embedding.md), run exactly as written: its files in process, and its command
verbatim (in a fresh folder, a clean environment and a private ``FLWR_HOME``) through ``dphype run``."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from helpers import clean_env, doc_blocks

from dphype.config import DPHypeConfig
from dphype.flower import selected_candidate
from dphype.flower.local import LocalGrid, app_candidates

#: The guide and its section that holds the example app.
PAGE = "docs/embedding.md"
SECTION = "Add DP-Hype to your Flower app"
#: Its subsection with the private-training variant of the ServerApp.
PRIVATE = "Private final training (optional)"


def example_files() -> dict[str, str]:
    """The guide's blocks whose first line names a file of the example app (the section's and its private
    training's)."""
    blocks = [block for section in (SECTION, PRIVATE) for lang in ("python", "toml")
              for block in doc_blocks(PAGE, section, lang)]
    named = [block for block in blocks if re.match(r"# (my_app/\S+|pyproject.toml)\n", block)]
    return {block.split("\n", 1)[0][2:]: block for block in named}


def run_config() -> dict:
    """The guide's ``[tool.flwr.app.config]`` (what ``flwr run`` hands the ServerApp)."""
    return tomllib.loads(example_files()["pyproject.toml"])["tool"]["flwr"]["app"]["config"]


SELECTED = r"DP-Hype selected candidate \d of 8: lr=[0-9.e-]+, steps=\d+\n"


def write_app(folder: Path) -> Path:
    files = example_files()
    assert set(files) == {"my_app/client_app.py", "my_app/server_app.py", "my_app/server_app_dp.py", "pyproject.toml"}
    (folder / "my_app").mkdir(parents=True)
    (folder / "my_app" / "__init__.py").write_text("")
    for name, code in files.items():
        (folder / name).write_text(code)
    return folder


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dphype_adds_few_lines_to_each_side():
    for name, code in example_files().items():
        if not name.endswith("app.py"):
            continue
        added = [line for line in code.splitlines() if line.rstrip().endswith("# +") or "# + " in line]
        assert 0 < len(added) <= 20, name


def test_the_guides_k_draws_no_warning_and_dphype_run_finds_its_candidates(tmp_path):
    """The guide's ``k`` is what its release's default ballot votes with for its candidates (else every run logs a
    warning), and ``dphype run`` reads those candidates from the ServerApp module to check ``k`` before Flower
    starts."""
    folder = write_app(tmp_path)
    config = DPHypeConfig.from_run_config(run_config())
    candidates = app_candidates(folder, run_config())
    assert candidates is not None and len(candidates) == 8
    assert config.mode.votes_per_client(config, len(candidates)) == config.k


def test_embedding_app_selects_then_trains_in_process(tmp_path, capsys, monkeypatch):
    """The sum release in process (the argmax release needs tally processes: the commands below run it). At 10
    clients the planner gives it less than the guide's min-success: refused before any node is asked; opted in
    with min-success = 0 it runs, keeps its run folder, and its log ends with the one warning line."""
    folder = write_app(tmp_path)
    client = load(folder / "my_app" / "client_app.py", "embedding_client_app")
    server = load(folder / "my_app" / "server_app.py", "embedding_server_app")
    monkeypatch.setenv("DPHYPE_RUNS_DIR", str(tmp_path / "runs"))
    config = {**run_config(), "release": "sum", "k": 1}
    grid = LocalGrid(client.app, 10)
    with pytest.raises(ValueError, match=r"^clients=10 is too few to select at epsilon 1: use clients >= 13 "
                                         r"\(or epsilon >= [0-9.]+\), or min-success = 0 to run anyway\n"):
        server.app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config))
    assert not grid.sent  # no node was asked anything
    (refused,) = (tmp_path / "runs").iterdir()
    assert json.loads((refused / "result.json").read_text())["error"].startswith("ValueError: clients=10 is too few")

    config["min-success"] = 0.0
    server.app(grid, Context(run_id=2, node_id=0, node_config={}, state=RecordDict(), run_config=config))
    printed = capsys.readouterr().out
    assert re.search(SELECTED + r".*\nprivacy: \(1, 1e-05\)-DP per client", printed), printed
    # the summary ends with the private evaluation: every voter's held-out accuracy and majority baseline, noisy
    assert re.search(r"\nprivate evaluation of the final model on 10 of 10 clients' held-out rows: accuracy -?[0-9.]+, "
                     r"majority-class baseline -?[0-9.]+ \(each \+- [0-9.]+ noise std\); \(0\.5, 1e-05\)-DP", printed)
    trains = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(trains) == 3 * 10  # FedAvg: every client in each of 3 rounds
    lr = {selected_candidate(m)["lr"] for m in trains}
    assert len(lr) == 1 and lr <= {0.001, 0.01, 0.1, 1.0}  # the selected candidate is the train config
    assert not any(r.has_error() for r in grid.replies)
    (run,) = (p for p in (tmp_path / "runs").iterdir() if p.name.endswith("-2"))
    record = json.loads((run / "result.json").read_text())
    assert record["status"] == "completed" and record["best_params"]["lr"] in lr and record["plan"]["success"] < 0.5
    assert record["training"]["private"] is False and 0.5 <= record["baseline"] < 1
    last = (run / "log.txt").read_text().strip().splitlines()[-1]
    assert "DP-Hype: TOO SMALL TO SELECT: clients=10 at epsilon 1 gives a good pick with 0.45" in last, last


def test_embedding_app_trains_privately_in_process(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DPHYPE_RUNS_DIR", str(tmp_path / "runs"))
    folder = write_app(tmp_path)
    client = load(folder / "my_app" / "client_app.py", "embedding_client_app")  # the ordinary client serves DP rounds
    server = load(folder / "my_app" / "server_app_dp.py", "embedding_server_app_dp")
    grid = LocalGrid(client.app, 10)
    config = {**run_config(), "release": "sum", "k": 1, "min-success": 0.0}  # the training is tested here
    server.app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config))
    run = ast.literal_eval(capsys.readouterr().out.strip().splitlines()[-1])  # the printed report dict
    # the selection, 3 DP-FedAvg rounds and the private evaluation, composed
    assert run["releases"] == 5 and run["delta"] == 1e-5 and 2.0 < run["epsilon"] < 3.5
    assert "evaluation" in run["accountant"]
    trains = [r for r in grid.replies if r.metadata.message_type == "train"]
    assert len(trains) == 30 and not any(r.has_error() for r in grid.replies)
    (kept,) = (tmp_path / "runs").iterdir()  # its run folder: the whole run's guarantee, the evaluation, the model
    record = json.loads((kept / "result.json").read_text())
    assert record["run"] == run and record["training"]["private"] is True and "evaluation" in record
    assert np.load(kept / "model.npz")["0"].shape == (5,)


@pytest.mark.slow
def test_embedding_command_runs_verbatim(tmp_path):
    """The section's bash block, verbatim, in the app folder its files make: the argmax release with 3 simulated
    tallies must complete (``dphype run`` exits 1 otherwise); the sum release of the same files runs in process
    above."""
    (block,) = doc_blocks(PAGE, SECTION, "bash")
    folder = write_app(tmp_path / "my-app")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=folder, env=clean_env(tmp_path / "home"),
                          capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    (run,) = (folder / "runs").iterdir()  # the run's folder, named on the command's last line
    assert re.findall(r"run \d+ completed in \d+ s: (.*)\n", done.stdout) == [str(run)], output[-4000:]
    assert json.loads((run / "result.json").read_text())["privacy"]["released"].startswith(
        "winning index only (secure argmax among 3 tallies")
    assert len(re.findall(SELECTED, output)) == 1, output[-4000:]
    assert "released: winning index only" in output and "aggregate_train: Received 10 results and 0 failures" in output
