"""The dphype console script: command dispatch, errors and strict JSON output."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
from helpers import REPO

from dphype import cli
from dphype.strict_json import jsonable


def test_jsonable_gives_strict_json_for_numpy_and_non_finite_values():
    data = {"eps": [0.5, math.inf, -math.inf], "nan": float("nan"), "arr": np.array([1, 2]), "x": np.float32(1.5)}
    out = jsonable(data)
    assert out == {"eps": [0.5, "inf", "-inf"], "nan": None, "arr": [1, 2], "x": 1.5}
    json.dumps(out, allow_nan=False)  # raises on NaN/Infinity


def test_json_flag_prints_one_parsable_last_line(capsys):
    argv = ["calibrate", "--epsilon", "1", "--delta", "1e-5", "--k", "5", "--noise", "gaussian", "--json"]
    assert cli.main(argv) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last)["sigma"] == pytest.approx(11.80, abs=0.01)  # dp-facts.md, analytic column


def test_bad_input_exits_2_with_the_parameter_named(capsys):
    assert cli.main(["calibrate", "--epsilon", "1", "--delta", "2", "--k", "5"]) == 2
    assert "delta must be a number in (0, 1)" in capsys.readouterr().err


def test_only_the_chosen_command_module_is_imported():
    parser = cli.build_parser(["calibrate"])
    args = parser.parse_args(["calibrate", "--epsilon", "1", "--delta", "1e-5", "--k", "2"])
    assert args._module == "dphype.cli.calibrate"
    with pytest.raises(SystemExit):  # other commands' options are not registered
        parser.parse_args(["demo", "--clients", "5"])


def test_plan_prints_a_readable_table(capsys):
    argv = ["plan", "--clients", "20", "--epsilon", "1", "--delta", "1e-5", "--candidates", "table3:random:10:0",
            "--repetitions", "20"]
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("by_k:")
    header = lines[at + 1].split()
    assert header[:6] == ["k", "sigma", "success", "success_max_votes", "bound", "success_winner"]
    assert header[6:] in ([], ["success_winner_tie_break"])  # the winner release's ties, simulated when there are
    assert lines[at + 2].split()[0] == "1" and not any("[{" in line or "{'" in line for line in lines)
    assert "scenario: name=moderate, num_good=1, sigma_loss=0.5" in lines


def test_the_demo_defaults_to_the_winner_release_and_the_library_commands_to_the_sum():
    demo = cli.build_parser(["demo"]).parse_args(["demo"])
    plan = cli.build_parser(["plan"]).parse_args(["plan", "--clients", "10", "--epsilon", "1", "--delta", "1e-5",
                                                  "--candidates", "table3"])
    assert (demo.release, plan.release) == ("argmax", "sum")


def test_demo_summary_renders_the_result_and_the_training():
    from helpers import a_release

    from dphype.cli import demo

    reference = {"majority_class": 0.7638, "best_candidate": 3, "best_accuracy": 0.8517, "pick_accuracy": 0.85,
                 "note": demo.REFERENCE_NOTE}
    summary = {**a_release().to_dict(), "training": {"private": False, "released": "plaintext"},
               "run": {"epsilon": None, "delta": 1e-5}, "accuracy": 0.8512, "reference": reference, "seconds": 61.0,
               "warnings": ["low"]}
    text = demo.render(summary)
    assert text.startswith("DP-Hype selected candidate ") and "rank  index" in text
    assert "training: private=False, released=plaintext" in text
    # the reference point right after the pick's accuracy, saying where it comes from
    assert ("accuracy: 0.8512\nreference: majority_class=0.7638, best_candidate=3, best_accuracy=0.8517, "
            "pick_accuracy=0.85, note=computed by the demo from the test split") in text
    assert "outside the private protocol; DP-Hype released none of it" in text
    assert text.endswith("warning: low")


def test_the_demo_refuses_a_candidate_key_before_flower_starts(tmp_path, capsys, monkeypatch):
    """A key the bundled app's task does not use: exit status 2, a first line naming the option, the key and the fix,
    then the keys the task reads, and no Flower run; a missing file names the option too."""
    import dphype.flower.local

    monkeypatch.setattr(dphype.flower.local, "LocalSuperLink", None)  # starting Flower would fail the test
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"lr": 0.1, "batch": 32}, {"lr": 0.01, "batch": 32}]))
    assert cli.main(["demo", "--candidates", str(bad), "--k", "1"]) == 2
    line, *details = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"dphype demo: error: --candidates {bad}: candidates[0] has key(s) 'batch'")
    assert line.endswith("remove them") and details[0].startswith("it reads only lr, momentum, decay")
    assert details[-1].endswith("e.g. --candidates table3")
    assert cli.main(["demo", "--candidates", str(tmp_path / "none.json")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[0]
    assert line.startswith("dphype demo: error: candidates (--candidates, or the run config's candidates): no file")


def test_a_failed_demo_run_exits_1_with_the_servers_cause_in_one_line(capsys, monkeypatch):
    """The ServerApp's failure record in result-file (what a refused run leaves there) becomes the demo's last line,
    without a traceback."""
    import dphype.flower.local
    from dphype.flower.local import RunOutcome
    from dphype.result import FAILURE_FORMAT

    class FailingSuperLink:  # what the bundled ServerApp leaves when the run fails
        def __init__(self, env):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def run(self, app, *, run_config, **kwargs):
            with open(run_config["result-file"], "w") as fh:
                json.dump({"format": FAILURE_FORMAT, "error": "PreflightError: only 2 of 4 clients ready; start "
                           "more SuperNodes"}, fh)
            return RunOutcome(exit_code=0, run_id=1, status="finished:failed", details="PreflightError", tail=())

    monkeypatch.setattr(dphype.flower.local, "LocalSuperLink", FailingSuperLink)
    argv = ["demo", "--clients", "4", "--epsilon", "20", "--k", "2", "--candidates", "table3:random:6:0"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == ("dphype demo: error: the run failed: PreflightError: only 2 of 4 clients "
                                            "ready; start more SuperNodes")
    assert "Traceback" not in err


def test_bench_runs_the_checkouts_program_in_a_child_process(monkeypatch, capfd):
    """``dphype bench`` is ``python -m simulations`` from the repository root: its exit status and output are the
    program's, and the library imports no benchmark driver."""
    monkeypatch.chdir(REPO)
    before = set(sys.modules)
    assert cli.main(["bench", "nonsense"]) == 2
    err = capfd.readouterr().err
    assert "usage: dphype bench" in err and "invalid choice: 'nonsense'" in err
    assert not {name for name in set(sys.modules) - before if name.split(".")[0] == "simulations"}


def test_bench_outside_a_checkout_is_a_usage_error(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "synthetic"]) == 2
    assert "the paper's studies run in a dphype repository checkout (its root)" in capsys.readouterr().err


def test_the_demo_names_the_bundled_apps_components_as_the_repository_does():
    """``dphype demo`` writes the bundled app's components by name (the command line never imports the app): the
    objects the repository's own ``flwr run .`` components (``server/``, ``clients/``) re-export."""
    import importlib
    import tomllib

    from dphype.cli.demo import COMPONENTS

    def load(ref: str) -> object:
        module, attr = ref.split(":")
        return getattr(importlib.import_module(module), attr)

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    repository = pyproject["tool"]["flwr"]["app"]["components"]
    assert set(COMPONENTS) == set(repository) == {"serverapp", "clientapp"}
    for role, ref in COMPONENTS.items():
        assert load(ref) is load(repository[role])


def test_the_help_names_the_release_each_command_runs(capsys):
    """`dphype --help` and `dphype demo --help` name the release the demo runs by default (its --release default),
    not another one."""
    demo = next(action for action in cli.build_parser(["demo"])._subparsers._group_actions[0].choices["demo"]._actions
                if "--release" in action.option_strings)
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    listed = " ".join(capsys.readouterr().out.split())
    assert f"demo the bundled Flower app on Adult: DP-Hype's {demo.default} release" in listed
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    assert f"DP-Hype's {demo.default} release" in " ".join(capsys.readouterr().out.split())
