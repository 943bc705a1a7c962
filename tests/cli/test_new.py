"""`dphype new APP_DIR`: a runnable Flower app with DP-Hype, written offline from the package's templates."""

from __future__ import annotations

import importlib.util
import re
import tomllib

import pytest
from flwr.app import Context, RecordDict

from dphype.cli import main
from dphype.flower import selected_candidate
from dphype.flower.local import LocalGrid

SUMMARY = r"DP-Hype selected candidate \d of 8: lr=[0-9.e-]+, steps=\d+\n"


def new_app(folder):
    assert main(["new", str(folder)]) == 0
    return folder


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_new_writes_an_app_that_selects_and_trains_in_process(tmp_path, capsys):
    folder = new_app(tmp_path / "My-App")
    printed = capsys.readouterr().out
    assert "files: pyproject.toml, my_app/__init__.py, my_app/client_app.py, my_app/server_app.py" in printed
    project = tomllib.loads((folder / "pyproject.toml").read_text())
    assert project["tool"]["flwr"]["app"]["components"] == {"serverapp": "my_app.server_app:app",
                                                            "clientapp": "my_app.client_app:app"}
    run_config = project["tool"]["flwr"]["app"]["config"]
    assert run_config == {"epsilon": 1.0, "delta": 1e-5, "k": 2, "clients": 10, "num-server-rounds": 3}
    assert "#   dphype-max-epsilon = 1.0: largest epsilon" in (folder / "pyproject.toml").read_text()
    client = load(folder / "my_app" / "client_app.py", "new_client_app")
    server = load(folder / "my_app" / "server_app.py", "new_server_app")
    grid = LocalGrid(client.app, 10)
    server.app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    assert re.search(SUMMARY + r".*\nprivacy: \(1, 1e-05\)-DP per client", capsys.readouterr().out)
    trains = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(trains) == 3 * 10 and len({str(selected_candidate(m)) for m in trains}) == 1
    assert not any(r.has_error() for r in grid.replies)


def test_new_refuses_a_folder_that_is_not_empty(tmp_path, capsys):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "keep.txt").write_text("mine")
    assert main(["new", str(tmp_path / "app")]) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "app").iterdir()] == ["keep.txt"]


@pytest.mark.slow
def test_new_app_runs_with_flwr_run(tmp_path):
    from dphype.flower.local import LocalSuperLink

    folder = new_app(tmp_path / "my-app")
    log = tmp_path / "run.log"
    with LocalSuperLink() as superlink, open(log, "w") as out:
        code = superlink.run(folder, run_config={}, supernodes=10, stdout=out, timeout=600)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert re.search(SUMMARY, text), text[-3000:]
    assert "DP-Hype pre-flight: 10 of 10 clients ready" in text
    assert "aggregate_train: Received 10 results and 0 failures" in text
