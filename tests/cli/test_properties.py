"""Property-based tests (Hypothesis) of the command line, in process (`dphype.cli.main`): any option value gives
either the command's result (exit status 0) or an error on standard error whose first line names the bad option
(exit status 2, from the command's own check or argparse's; details may follow) -- never a traceback, never another
exception, and never a Flower run for input that the command could have refused first."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dphype.checks import MAX_EPSILON
from dphype.cli import main
from dphype.flower.local import RunOutcome

#: The budget of these tests (fast suite): the examples each tries, no database folder left behind.
CLI = settings(max_examples=40, deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

#: What a user may type for a number.
NUMBER_TEXT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers(-10**6, 10**6).map(str),
    st.sampled_from(["0", "-0.0", "1e9", "1e300", "5e-324", "nan", "inf", "-inf", "100", "100.0001", "abc", "",
                     "1,5", "0x10", "2", "10", "1e-5", "0.5", "0.99", "1"]),
)
PRIVACY_OPTIONS = ("--epsilon", "--delta", "--k", "--clients", "--dropout")


def outcome(capsys, argv):
    """``(exit status, standard error)`` of ``dphype ARGV`` in process (argparse's exit caught)."""
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse: a value that is no number, an unknown choice
        code = exit_.code
    return code, capsys.readouterr().err


def assert_refused_by_name(code, err, command, names):
    """Exit status 2 and one line ``dphype COMMAND: error: ...`` that names one of ``names``; no traceback."""
    assert code == 2, err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith(f"dphype {command}: error: ")]
    spellings = names | {f"--{name}" for name in names}
    assert any(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", line) for name in spellings), line


@CLI
@given(st.dictionaries(st.sampled_from(PRIVACY_OPTIONS), NUMBER_TEXT, min_size=1))
def test_calibrate_answers_or_names_the_bad_option(capsys, options):
    argv = ["calibrate", *[f"{option}={value}" for option, value in options.items()]]  # "=": "-1" is a value
    code, err = outcome(capsys, argv)
    if code != 0:
        names = {option.removeprefix("--") for option in options} | set(options)
        assert_refused_by_name(code, err, "calibrate", names)


@settings(CLI, max_examples=20)
@given(st.one_of(st.floats(min_value=MAX_EPSILON, exclude_min=True), st.floats(max_value=0.0),
                 st.sampled_from([float("nan"), float("inf")])), st.sampled_from(["sum", "argmax"]))
def test_plan_and_demo_refuse_an_epsilon_outside_the_budget_before_any_work(capsys, monkeypatch, epsilon, release):
    monkeypatch.setattr("dphype.cli.run.run_locally", _no_flower)
    plan = ["plan", "--clients", "50", "--delta", "1e-5", "--candidates", "table3", "--release", release]
    for argv in (plan, ["demo", "--release", release]):
        code, err = outcome(capsys, [*argv, f"--epsilon={epsilon!r}"])
        assert_refused_by_name(code, err, argv[0], {"epsilon"})
        assert f"epsilon must be a finite number in (0, {MAX_EPSILON:g}]" in err


def _no_flower(*args, **kwargs):
    raise AssertionError("Flower started for input that should have been refused first")


#: A Flower app's run config as `dphype new` declares it.
DECLARED = {"release": "'argmax'", "epsilon": "1.0", "delta": "1e-5", "k": "2", "clients": "10",
            "num-server-rounds": "3"}
#: What a user may give for a run-config value (TOML).
TOML_TEXT = st.one_of(NUMBER_TEXT, st.sampled_from(["'sum'", "'argmax'", "'median'", "true", "'1'", "argmax",
                                                    "[1]", "9", "0.0", "1e9", "nan"]))


@pytest.fixture(scope="module")
def app_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("app")
    config = "\n".join(f"{key} = {value}" for key, value in DECLARED.items())
    (folder / "pyproject.toml").write_text(f'[project]\nname = "app"\nversion = "1.0.0"\n\n[tool.flwr.app]\n'
                                           f'publisher = "x"\n\n[tool.flwr.app.config]\n{config}\n')
    return folder


@CLI
@given(st.dictionaries(st.sampled_from(list(DECLARED)), TOML_TEXT, min_size=1, max_size=3),
       st.one_of(st.none(), st.integers(-3, 30)))
def test_run_checks_its_run_config_before_flower_starts(capsys, monkeypatch, app_dir, overrides, clients):
    started = []
    monkeypatch.setattr("dphype.cli.run.run_locally", lambda *a, **k: started.append(a) or RunOutcome(0, 1, "ok", "",
                                                                                                        ()))
    argv = ["run", str(app_dir), "--run-config", " ".join(f"{key}={value}" for key, value in overrides.items())]
    if clients is not None:
        argv.append(f"--clients={clients}")
    code, err = outcome(capsys, argv)
    if code == 0:
        assert len(started) == 1
        return
    assert not started
    names = set(overrides) | {"--run-config", "dphype-min-clients", "dphype-max-delta"} | \
        ({"clients"} if clients is not None else set())
    assert_refused_by_name(code, err, "run", names)
