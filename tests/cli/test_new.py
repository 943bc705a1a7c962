"""`dphype new APP_DIR`: a runnable Flower app with DP-Hype, written offline from the package's templates."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from dphype.cli import main
from dphype.cli.new import TEMPLATE_GRID, TEMPLATE_KS, TEMPLATE_RUN
from dphype.flower import selected_candidate
from dphype.flower.local import LocalGrid, node_id
from dphype.release import DEFAULT_ARGMAX_BALLOT, RELEASE_MODES

SUMMARY = r"DP-Hype selected candidate \d of 8: lr=[0-9.e-]+, steps=\d+\n"


def new_app(folder, *options):
    assert main(["new", str(folder), *options]) == 0
    return folder


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("release", ["argmax", "sum"])
def test_new_writes_an_app_that_selects_and_trains_in_process(tmp_path, capsys, monkeypatch, release):
    """The app of either release on the nodes ``dphype run`` gives it: 10 voters, and in argmax mode 3 more that
    the ClientApp's simulated_roles mod makes the tallies (MPyC on loopback) and the voters pin; FedAvg trains the
    voters only."""
    import dphype.flower.client.roles as roles

    monkeypatch.setattr(roles, "simulated", lambda: True)  # as in a Ray worker of Flower's simulation
    folder = new_app(tmp_path / "My-App", *(["--release", release] if release != "argmax" else []))
    printed = capsys.readouterr().out
    assert ("files: pyproject.toml, README.md, .gitignore, my_app/__init__.py, my_app/client_app.py, "
            "my_app/server_app.py" in printed)
    assert (folder / ".gitignore").read_text().splitlines()[-1] == "runs/"  # out of git and of the app's FAB
    assert f"release: {release}" in printed and f"next: cd {folder} && dphype run" in printed
    project = tomllib.loads((folder / "pyproject.toml").read_text())
    assert project["tool"]["flwr"]["app"]["components"] == {"serverapp": "my_app.server_app:app",
                                                            "clientapp": "my_app.client_app:app"}
    run_config = project["tool"]["flwr"]["app"]["config"]
    # the sum release needs more than 10 clients for the planner's 0.5 (the app would refuse 10)
    clients = {"argmax": 10, "sum": 13}[release]
    assert run_config == {"release": release, "epsilon": 1.0, "delta": 1e-5, "k": {"argmax": 2, "sum": 1}[release],
                          "clients": clients, "min-success": 0.5, "num-server-rounds": 3, "runs-dir": "runs",
                          "private-evaluation": True, "evaluation-share": 0.5}
    assert {key: run_config[key] for key in TEMPLATE_RUN if key != "clients"} == {  # what the planner chose k for
        key: value for key, value in TEMPLATE_RUN.items() if key != "clients"}
    assert "#   dphype-max-epsilon = 1.0: largest epsilon" in (folder / "pyproject.toml").read_text()
    client = load(folder / "my_app" / "client_app.py", f"new_client_app_{release}")
    server = load(folder / "my_app" / "server_app.py", f"new_server_app_{release}")
    committee = RELEASE_MODES.get(release).uses_committee
    nodes = clients + (3 if committee else 0)
    # in argmax mode the simulated_roles mod gives every node its role and its simulated federation, as in a Ray
    # worker; in sum mode the grid makes its nodes' roster (the node policy would in a Ray worker)
    grid = LocalGrid(client.app, nodes, run_config=run_config, federation=not committee)
    server.app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    guarantee = r"\(1, 2e-19\)-DP" if release == "argmax" else r"\(1, 1e-05\)-DP"  # argmax: its sampler's delta
    printed = capsys.readouterr().out
    assert re.search(SUMMARY + r".*\nprivacy: " + guarantee + " per client", printed)
    trains = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(trains) == 3 * clients and len({str(selected_candidate(m)) for m in trains}) == 1
    assert {m.metadata.dst_node_id for m in trains} == {node_id(i) for i in range(clients)}
    # then the voters' private evaluation of the final model: the summary's last lines say how good it turned out
    assert f"private evaluation of the final model on {clients} of {clients} clients' held-out rows" in printed
    evaluated = {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "query.dphype_evaluation"}
    assert evaluated == {node_id(i) for i in range(clients)}
    assert not any(r.has_error() for r in grid.replies)
    # the run folder (here the test's DPHYPE_RUNS_DIR): the record names the pick, the model is the trained one
    (run,) = (Path(os.environ["DPHYPE_RUNS_DIR"])).iterdir()
    assert re.fullmatch(r"\d{8}-\d{6}-1", run.name) and sorted(p.name for p in run.iterdir()) == [
        "log.txt", "model.npz", "result.json"]
    record = json.loads((run / "result.json").read_text())
    assert record["status"] == "completed" and record["best_params"] == selected_candidate(trains[0])
    assert 0.5 <= record["baseline"] < 1 and 0 <= record["accuracy"] <= 1 and record["run"]["epsilon"] is None
    assert np.load(run / "model.npz")["0"].shape == (5,)
    assert record["evaluation"]["clients"] == clients  # the private evaluation in the record too
    assert "DP-Hype selected candidate" in (run / "log.txt").read_text()


def test_every_mode_gets_an_app_whose_k_is_the_planners_choice_for_its_candidates(tmp_path, capsys):
    """``--release`` offers every registered mode; the app's k is the k with the highest simulated chance of a good
    pick for the template's 8 candidates, 10 clients, epsilon 1 (the argmax release's over 0.7 with the committee's
    noise), planned as the server plans a run; the app's own run config passes its server's plan check."""
    from dphype.config import DPHypeConfig
    from dphype.flower import DPHype
    from dphype.selection.candidates import candidate_grid

    candidates = candidate_grid(**TEMPLATE_GRID)
    assert f"candidate_grid({', '.join(f'{k}={v!r}' for k, v in TEMPLATE_GRID.items())})" in (
        new_app(tmp_path / "grid") / "grid" / "server_app.py").read_text()  # the template's candidates
    tallies = tuple(bytes([j]) * 32 for j in range(3))
    for release, mode in RELEASE_MODES.items():
        run_config = tomllib.loads((new_app(tmp_path / release, "--release", release) / "pyproject.toml").read_text())[
            "tool"]["flwr"]["app"]["config"]
        k = run_config["k"]
        keys = tallies if mode.uses_committee else ()
        # the app passes its own server's check: its clients reach its min-success (the sum releases need more than
        # 10 here, and get the planner's smallest federation)
        plan = DPHype(candidates, DPHypeConfig.from_run_config(run_config), tallies=keys).plan()
        assert run_config["min-success"] == 0.5 <= plan.success and run_config["clients"] >= 10
        success = {kk: DPHype(candidates, DPHypeConfig(**TEMPLATE_RUN, k=kk, release=release, ballot="top-k"),
                              tallies=keys).plan().success for kk in TEMPLATE_KS}
        assert max(success, key=success.get) == k, (release, success)
        if release == "argmax":  # the default: a first run worth having
            assert success[k] >= 0.7 and k == 2
    # the argmax release's default ballot needs no k: its k follows from public facts (here its floor of 2 votes,
    # the planner's choice above)
    auto = DPHype(candidates, DPHypeConfig(epsilon=1.0, delta=1e-5, k=1, clients=10, release="argmax"),
                  tallies=tallies)
    assert auto.config.ballot == DEFAULT_ARGMAX_BALLOT and auto.plan().k == 2
    assert auto.plan().success >= 0.7
    # the app's comment states the auto rule with the library's constants
    from dphype.selection.voting import AUTO_EXPONENT, AUTO_SCALE

    assert AUTO_EXPONENT == 1.0 and f"round({AUTO_SCALE:g} p s / n)" in (
        new_app(tmp_path / "auto") / "pyproject.toml").read_text()


def test_a_new_mode_is_offered_with_no_other_edit(tmp_path):
    """One class registers a mode: ``dphype new`` and the commands' ``--release`` offer it, its app asks the planner
    for its k, and a name no class registered is refused."""
    from dphype.cli import build_parser
    from dphype.cli.new import template_plan
    from dphype.release import CommitteeSumRelease

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RELEASE_MODES, "_items", RELEASE_MODES.copy()._items)  # the throwaway mode's entries

        class Quieter(CommitteeSumRelease):  # a throwaway committee mode: one class
            name = "quieter"

        args = build_parser(["new"]).parse_args(["new", str(tmp_path / "q"), "--release", "quieter"])
        assert args.release == "quieter"
        planned = ["plan", "--clients", "10", "--epsilon", "1", "--delta", "1e-5", "--candidates", "table3"]
        assert build_parser(["plan"]).parse_args([*planned, "--release", "quieter"]).release == "quieter"
        assert template_plan("quieter") == template_plan("committee-sum")  # the same forecast, the same k
    with pytest.raises(SystemExit):
        build_parser(["new"]).parse_args(["new", str(tmp_path / "q"), "--release", "quieter"])


def test_new_refuses_a_folder_that_is_not_empty(tmp_path, capsys):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "keep.txt").write_text("mine")
    assert main(["new", str(tmp_path / "app")]) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "app").iterdir()] == ["keep.txt"]
