"""The dphype console script: command dispatch, errors and strict JSON output."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dphype import cli


def test_jsonable_gives_strict_json_for_numpy_and_non_finite_values():
    data = {"eps": [0.5, math.inf, -math.inf], "nan": float("nan"), "arr": np.array([1, 2]), "x": np.float32(1.5)}
    out = cli.jsonable(data)
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
