"""The README's embedding example, run exactly as written: in process, and through `flwr run`."""

from __future__ import annotations

import ast
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict
from helpers import REPO

from dphype.flower import selected_candidate
from dphype.flower.local import LocalGrid


def readme_files() -> dict[str, str]:
    """The README's Python blocks whose first line names a file of the example app."""
    blocks = re.findall(r"```python\n(# (my_app/\S+)\n.*?)```", (REPO / "README.md").read_text(), re.S)
    return {name: code for code, name in blocks}


def run_config() -> dict:
    """The README's ``[tool.flwr.app.config]`` (what ``flwr run`` hands the ServerApp)."""
    (toml,) = re.findall(r"```toml\n# my_app/pyproject.toml\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    return tomllib.loads(toml)["tool"]["flwr"]["app"]["config"]


SELECTED = r"DP-Hype selected candidate \d of 8: lr=[0-9.e-]+, steps=\d+\n"


def write_app(folder: Path) -> Path:
    files = readme_files()
    assert set(files) == {"my_app/client_app.py", "my_app/server_app.py", "my_app/server_app_dp.py"}
    (folder / "my_app").mkdir()
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
    for name, code in readme_files().items():
        if name.endswith("_dp.py"):
            continue
        added = [line for line in code.splitlines() if line.rstrip().endswith("# +") or "# + " in line]
        assert 0 < len(added) <= 20, name


def test_readme_app_selects_then_trains_in_process(tmp_path, capsys):
    folder = write_app(tmp_path)
    client = load(folder / "my_app" / "client_app.py", "readme_client_app")
    server = load(folder / "my_app" / "server_app.py", "readme_server_app")
    grid = LocalGrid(client.app, 10)
    server.app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config()))
    printed = capsys.readouterr().out
    assert re.search(SELECTED + r".*\nprivacy: \(1, 1e-05\)-DP per client", printed), printed
    trains = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(trains) == 3 * 10  # FedAvg: every client in each of 3 rounds
    lr = {selected_candidate(m)["lr"] for m in trains}
    assert len(lr) == 1 and lr <= {0.001, 0.01, 0.1, 1.0}  # the selected candidate is the train config
    assert not any(r.has_error() for r in grid.replies)


def test_readme_app_trains_privately_in_process(tmp_path, capsys):
    folder = write_app(tmp_path)
    client = load(folder / "my_app" / "client_app.py", "readme_client_app")  # the ordinary client serves DP rounds
    server = load(folder / "my_app" / "server_app_dp.py", "readme_server_app_dp")
    grid = LocalGrid(client.app, 10)
    server.app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config()))
    run = ast.literal_eval(capsys.readouterr().out.strip().splitlines()[-1])  # the printed report dict
    assert run["releases"] == 4 and run["delta"] == 1e-5 and 2.0 < run["epsilon"] < 3.0
    trains = [r for r in grid.replies if r.metadata.message_type == "train"]
    assert len(trains) == 30 and not any(r.has_error() for r in grid.replies)


@pytest.mark.slow
def test_readme_app_runs_with_flwr_run(tmp_path):
    from dphype.flower.local import LocalSuperLink

    folder = write_app(tmp_path)
    (folder / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n'
        '[project]\nname = "my-app"\nversion = "1.0.0"\ndependencies = []\n\n'
        '[tool.hatch.build.targets.wheel]\npackages = ["."]\n\n'
        '[tool.flwr.app]\npublisher = "readme"\n\n'
        '[tool.flwr.app.components]\nserverapp = "my_app.server_app:app"\nclientapp = "my_app.client_app:app"\n\n'
        '[tool.flwr.app.config]\n' + "".join(f"{key} = {value!r}\n" for key, value in run_config().items()))
    log = tmp_path / "run.log"
    with LocalSuperLink() as superlink, open(log, "w") as out:
        code = superlink.run(folder, run_config={}, supernodes=10, stdout=out, timeout=600)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert re.search(SELECTED, text), text[-3000:]
    assert "DP-Hype pre-flight: 10 of 10 clients ready" in text
    assert "aggregate_train: Received 10 results and 0 failures" in text
