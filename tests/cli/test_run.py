"""`dphype run [APP_DIR]`: a local simulation run that fails loudly; the README's first app, run verbatim."""

from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pytest
from helpers import REPO, clean_env, doc_blocks

from dphype.cli import main
from dphype.flower.local import RunOutcome, parse_run_config

FAILED_LINE = r"dphype run: error: the Flower run failed: run \d+ ended finished:failed: \w+ failed with exception: "


def test_run_refuses_a_folder_without_a_flower_app(tmp_path, capsys):
    assert main(["run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds no Flower app: run it in the app's folder or name the folder\n" in err
    assert "(a Flower app: a pyproject.toml with [tool.flwr.app]" in err


def test_run_names_a_run_config_key_the_app_does_not_declare_before_flower_starts(tmp_path, capsys):
    assert main(["new", str(tmp_path / "app")]) == 0
    assert main(["run", str(tmp_path / "app"), "--run-config", "releese='sum' k=1"]) == 2
    err = capsys.readouterr().err
    assert "run-config key(s) releese are not declared in" in err and "add them there with a default" in err
    assert "release" in err.split("use a declared key")[1]


@pytest.mark.parametrize(("options", "message"), [
    (["--clients", "1"], "clients must be an integer"),
    (["--run-config", "release='median'"], "release must be one of sum, argmax, committee-sum, got 'median'"),
    (["--run-config", "release=argmax"], "--run-config must be key=value pairs with TOML values (strings quoted"),
    (["--timeout", "0"], "timeout"),
    (["--run-config", "epsilon=1e9"], "run config: epsilon must be a finite number in (0, 100], got 1000000000.0; "
                                      "set epsilon within it, e.g. 1\nabove 100 the guarantee"),
    (["--run-config", "epsilon=0.0"], "run config: epsilon must be a finite number in (0, 100], got 0.0; set epsilon"),
    (["--run-config", "epsilon=nan"], "run config: epsilon must be a finite number in (0, 100], got nan"),
    (["--run-config", "k=0"], "run config: k must be an integer in [1, "),
    (["--run-config", "k=9"], "run config: k must be an integer in [1, 8], got 9 (the app's 8 candidates): change it"),
    (["--run-config", "release='sum' k=9"], "run config: k must be an integer in [1, 8], got 9 (the app's 8 "),
    (["--clients", "5"], "every simulated node would refuse this run (5 contributors < dphype-min-clients=10, their "
                         "policy from DPHYPE_NODE_POLICY or its defaults): run with more clients (--clients N) or a "
                         "smaller dropout, or lower the simulated nodes' limit (default 10): "
                         "DPHYPE_NODE_POLICY='dphype-min-clients=N' in the environment of `dphype run`"),
    (["--run-config", "delta=0.5"], "DPHYPE_NODE_POLICY='dphype-max-delta=D'"),
    (["--run-config", "num-server-rounds=nan"], "--run-config num-server-rounds=nan: run-config values must be finite"),
])
def test_run_refuses_bad_options_by_name(tmp_path, capsys, options, message):
    assert main(["new", str(tmp_path / "app")]) == 0
    assert main(["run", str(tmp_path / "app"), *options]) == 2
    assert message in capsys.readouterr().err


def test_k_beyond_the_apps_candidates_is_refused_in_one_line_before_flower_starts(tmp_path):
    """As a user meets it: exit status 2 and one line naming k, its range from the app's own candidates (the
    ServerApp module's ``candidates``) and the fix; nothing on stdout, where Flower's log would stream."""
    assert main(["new", str(tmp_path / "app")]) == 0
    done = subprocess.run(["dphype", "run", "--run-config", "k=9"], cwd=tmp_path / "app", capture_output=True,
                          text=True, env=clean_env(tmp_path / "home"), timeout=120, check=False)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == ["dphype run: error: run config: k must be an integer in [1, 8], got 9 (the "
                                        "app's 8 candidates): change it with --run-config or in pyproject.toml"]


@pytest.mark.parametrize(("run_config", "message"), [
    ("k=200", "run config: k must be an integer in [1, 100], got 200 (the app's 100 candidates)"),
    ("dataset='x'", "dataset must be one of adult, mnist5k, fashion-mnist, got 'x'"),
    ("candidates='table3:random:200:0'", "run config candidates='table3:random:200:0': "),
])
def test_the_bundled_app_checks_its_whole_run_config_before_flower_starts(capsys, monkeypatch, run_config, message):
    """The repository's app names its candidates in its run config: its ServerApp module's ``candidates(run_config)``
    reads and checks every key (`dphype.app.run_config.AppConfig`) before anything starts."""
    monkeypatch.setattr("dphype.cli.run.run_locally", lambda *args, **kwargs: pytest.fail("Flower started"))
    assert main(["run", str(REPO), "--run-config", run_config]) == 2
    assert message in capsys.readouterr().err


def test_the_simulated_nodes_policy_is_read_before_flower_starts(tmp_path, capsys, monkeypatch):
    """The nodes' limits come from DPHYPE_NODE_POLICY: lowered there, 5 clients pass the check (and Flower would
    start: here a stand-in records it); a policy that does not parse is refused by its variable's name."""
    assert main(["new", str(tmp_path / "app")]) == 0
    started = []
    monkeypatch.setattr("dphype.cli.run.run_locally",
                        lambda *args, **kwargs: started.append(args) or RunOutcome(0, 1, "finished:completed", "", ()))
    monkeypatch.setenv("DPHYPE_NODE_POLICY", "dphype-min-clients=5")
    assert main(["run", str(tmp_path / "app"), "--clients", "5"]) == 0 and len(started) == 1
    monkeypatch.setenv("DPHYPE_NODE_POLICY", "dphype-min-clients=")
    assert main(["run", str(tmp_path / "app"), "--clients", "5"]) == 2 and len(started) == 1
    assert "DPHYPE_NODE_POLICY must hold dphype-* keys" in capsys.readouterr().err


def test_a_node_refusal_in_a_simulation_names_the_variable_that_sets_the_nodes_limits(tmp_path, monkeypatch):
    """A refusal that only a node could make (its remedy names the node config) says where that config is in a
    simulation: the DPHYPE_NODE_POLICY environment variable."""
    from dphype.cli import RunFailedError
    from dphype.cli.run import run_locally

    class Refused:
        def __init__(self, env=None):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def run(self, *args, **kwargs):
            return RunOutcome(0, 7, "finished:failed", "PreflightError: 0 of 10 clients ready; 10 x refused: "
                              "policy_epsilon (...; to resolve: lower the run's epsilon, or the node operators raise "
                              "dphype-max-epsilon in their node config)", ())

    monkeypatch.setattr("dphype.flower.local.LocalSuperLink", Refused)
    with pytest.raises(RunFailedError, match=r"in their node config\) \(the simulated nodes' node config is the "
                                             r"DPHYPE_NODE_POLICY environment variable of this command, e.g. "):
        run_locally(tmp_path, {}, 10)


def test_parse_run_config_reads_flowers_syntax():
    assert parse_run_config("release='argmax' k=2 epsilon=0.5") == {"release": "argmax", "k": 2, "epsilon": 0.5}
    assert parse_run_config(None) == {} and parse_run_config("") == {}


def test_a_runs_outcome_names_its_cause_in_one_line():
    """Flower's own status decides, not flwr run's exit status (0 when the ServerApp raises)."""
    done = RunOutcome(0, 7, "finished:completed", "", ())
    assert done.completed and done.cause() == ""
    failed = RunOutcome(0, 7, "finished:failed", "ServerApp failed with exception: k must be\nat most 8", ("x",))
    assert not failed.completed
    assert failed.cause() == "run 7 ended finished:failed: ServerApp failed with exception: k must be at most 8"
    late = RunOutcome(-9, 7, "running", "", (), timed_out=True)
    assert late.cause() == "run 7 did not finish in time (status running)"
    refused = RunOutcome(1, None, "", "", ("Starting...", "Invalid run configuration", ""))
    assert refused.cause() == "flwr run started no run (exit status 1): Invalid run configuration"


def test_help_lists_run(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert re.search(r"run\s+run a Flower app with DP-Hype in a local simulation", capsys.readouterr().out)


@pytest.mark.slow
def test_readme_first_app_runs_verbatim_keeps_its_run_folder_and_a_failed_run_says_why(tmp_path):
    """The README's first-app block (docs/getting-started.md repeats it), verbatim, in a fresh folder with a clean
    environment (no variable of the other tests or the developer; a private HOME and FLWR_HOME): the template's
    argmax run on 10 voters and 3 simulated tallies completes; its plan line, printed once, quotes the bench's gap
    to Opt in the app's own terms (its 8 candidates, 10 voters); the model's accuracy is logged every round. Its run
    folder in the app folder holds the whole record (pick, guarantees, accuracy above the majority baseline, the
    plan), the trained model and the log without colour codes, which `dphype show last` prints again and
    `dphype runs` lists. Then, in the app it wrote, a run whose nodes refuse it (their policy's epsilon limit, which
    only they apply) exits 1 with one line naming the cause, keeps its failed run's folder, and no traceback of
    ours."""
    (block,) = doc_blocks("README.md", "A first app", "bash")
    env = clean_env(tmp_path / "home")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    app = tmp_path / "my-app"
    (folder,) = (app / "runs").iterdir()
    assert re.search(rf"run \d+ completed in \d+ s: {re.escape(str(folder))}\n", done.stdout), done.stdout[-2000:]
    (plan_line,) = [line for line in output.splitlines() if "DP-Hype plan:" in line]  # printed once per run
    advice = plan_line.split("DP-Hype plan: ", 1)[1]
    assert advice.startswith("8 candidates, 10 voters, epsilon 1: bench gap to Opt median ")
    assert len(re.sub(r"\x1b\[[0-9;]*m", "", plan_line)) < 200  # as shown, Flower's level and colour codes aside
    assert re.search(r"DP-Hype selected candidate \d of 8: lr=[0-9.e-]+, steps=\d+\n", output), output[-4000:]
    assert "aggregate_train: Received 10 results and 0 failures" in output
    assert output.count("'accuracy': ") >= 4  # the server's evaluation before and after each of the 3 rounds
    # the run folder: <UTC start>-<run id>, the record, the model, the log
    assert re.fullmatch(r"\d{8}-\d{6}-\d+", folder.name) and sorted(p.name for p in folder.iterdir()) == [
        "log.txt", "model.npz", "result.json"]
    record = json.loads((folder / "result.json").read_text())
    assert record["status"] == "completed" and folder.name.endswith(f"-{record['run_id']}")
    assert record["folder"] == str(folder) and record["model"] == "model.npz" and record["seconds"] > 0
    assert record["best_params"] == record["candidates"][record["selected_index"]]
    assert record["privacy"]["epsilon"] == pytest.approx(1.0) and record["privacy"]["clients"] == 10
    assert record["training"]["private"] is False and record["run"]["epsilon"] is None  # plaintext FedAvg: said
    assert 0.5 <= record["baseline"] < record["accuracy"] <= 1.0 and record["plan"]["advice"] in advice
    assert None not in record.values()  # a field is present when measured, absent otherwise
    assert np.load(folder / "model.npz")["0"].shape == (5,)
    log = (folder / "log.txt").read_text()
    assert "\x1b[" not in log and "DP-Hype selected candidate" in log and "ServerApp-side Evaluate Metrics" in log
    assert "DP-Hype: the run's record is" in log
    shown = done.stdout.rsplit(str(folder) + "\n", 1)[1]  # `dphype show last`, after `dphype run`'s last line
    assert re.search(r"DP-Hype selected candidate \d of 8", shown) and f"folder: {folder} (result.json, model.npz, " \
        "log.txt)" in shown
    assert "accuracy: " in shown and "baseline: " in shown
    listed = subprocess.run(["dphype", "runs", "--json"], cwd=app, env=env, capture_output=True, text=True, timeout=60)
    (row,) = json.loads(listed.stdout.splitlines()[-1])["runs"]
    assert row["run"] == folder.name and row["status"] == "completed" and row["accuracy"] == record["accuracy"]
    shown = subprocess.run(["dphype", "show", str(record["run_id"]), "--json"], cwd=app, env=env,
                           capture_output=True, text=True, timeout=60)
    assert json.loads(shown.stdout.splitlines()[-1]) == record

    # a run the simulated nodes refuse (their policy, which only they apply): the ServerApp fails, in one line
    failed = subprocess.run(["dphype", "run"], cwd=app, capture_output=True, text=True, timeout=600,
                            env={**env, "DPHYPE_NODE_POLICY": "dphype-max-epsilon=0.5"})
    last = failed.stderr.strip().splitlines()[-1]
    assert failed.returncode == 1, failed.stdout[-2000:] + failed.stderr[-2000:]
    assert re.match(FAILED_LINE + r"10 of 10 clients are not ready: 10 x refused: policy \(this node's privacy "
                    r"policy does not admit the request", last), last
    (failed_folder,) = set((app / "runs").iterdir()) - {folder}
    assert str(failed_folder) in last  # the failed run's folder keeps its cause
    assert "not ready" in json.loads((failed_folder / "result.json").read_text())["error"]
    assert "Traceback" not in failed.stderr.split("dphype run: error:")[-1]
