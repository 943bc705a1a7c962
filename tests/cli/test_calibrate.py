import json
import math

import pytest

from dphype import cli
from dphype.cli import main


@pytest.fixture(autouse=True)
def only_calibrate(monkeypatch):
    """Build the real ``dphype`` parser with just the ``calibrate`` entry of the registry, so these tests
    do not depend on the other engineers' command modules being importable."""
    monkeypatch.setattr(cli, "COMMANDS", {"calibrate": cli.COMMANDS["calibrate"]})


def run_json(capsys, *argv):
    code = main(["calibrate", *argv, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out.strip().splitlines()[-1]) if code == 0 else None), err


def test_gaussian_analytic(capsys):
    code, res, _ = run_json(capsys, "--epsilon", "1", "--delta", "1e-5", "--k", "5", "--noise", "gaussian")
    assert code == 0
    assert res["accountant"] == "analytic" and res["noise"] == "gaussian"
    assert res["clients"] == 50 and res["dropout"] == 0.0 and res["k"] == 5 and res["delta"] == 1e-5
    assert f"{res['sigma']:.4g}" == "11.8"
    assert res["client_std"] == pytest.approx(res["sigma"] / math.sqrt(50))
    assert res["epsilon"] == pytest.approx(1.0, rel=1e-8)


def test_skellam_with_dropout(capsys):
    code, res, _ = run_json(
        capsys, "--epsilon", "0.5", "--delta", "1e-5", "--k", "5", "--noise", "skellam",
        "--clients", "20", "--dropout", "0.25",
    )
    assert code == 0 and res["accountant"] == "rdp"
    assert f"{res['sigma']:.4g}" == "24.27"
    assert res["client_std"] == pytest.approx(res["sigma"] / math.sqrt(15))
    assert res["min_survivors"] == 15


def test_rdp_and_candidates(capsys):
    code, res, _ = run_json(
        capsys, "--epsilon", "3", "--delta", "1e-5", "--k", "5", "--accountant", "rdp", "--candidates", "table3",
        "--noise", "gaussian")
    assert code == 0 and res["num_candidates"] == 100 and f"{res['sigma']:.4g}" == "4.722"
    code, res, _ = run_json(capsys, "--epsilon", "1", "--delta", "1e-5", "--k", "1", "--candidates", "10",
                            "--raw-scores", "--noise", "gaussian")
    assert code == 0 and res["l2_sensitivity"] == pytest.approx(math.sqrt(10))


def test_human_readable_output(capsys):
    assert main(["calibrate", "--epsilon", "1", "--delta", "1e-5", "--k", "5"]) == 0
    out = capsys.readouterr().out
    assert "sigma: " in out and "client_std: " in out


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--epsilon", "0"], "epsilon must be a finite number in (0, 100], got 0.0; set epsilon within it, e.g. 1"),
        (["--epsilon", "inf"], "epsilon must be a finite number in (0, 100], got inf; set epsilon within it, e.g. "
                               "1\nabove 100"),
        (["--epsilon", "1e9"], "got 1000000000.0; set epsilon within it, e.g. 1\nabove 100 the guarantee lets the "
                               "odds of any inference"),
        (["--delta", "1"], "delta must be a number in (0, 1)"),
        (["--k", "0"], "k must be an integer in [1, "),
        (["--k", "101", "--candidates", "table3"], "k must be an integer in [1, 100]"),
        (["--clients", "1"], "clients must be an integer in [2, 10000]"),
        (["--dropout", "1"], "dropout must be a number in [0, 1)"),
        (["--noise", "skellam", "--accountant", "analytic"], "accountant must be 'rdp' for skellam"),
    ],
)
def test_bad_input_exits_2_with_message(capsys, extra, needle):
    argv = {"--epsilon": "1", "--delta": "1e-5", "--k": "5"}
    args = []
    for key, value in argv.items():
        if key not in extra:
            args += [key, value]
    code, _, err = run_json(capsys, *args, *extra)
    assert code == 2 and needle in err


def test_unknown_choice_is_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--epsilon", "1", "--delta", "1e-5", "--k", "5", "--noise", "laplace"])
    assert exc.value.code == 2


def test_neighbouring_option(capsys):
    code, res, _ = run_json(capsys, "--epsilon", "1", "--delta", "1e-5", "--k", "5", "--noise", "gaussian",
                            "--neighbouring", "add-remove")
    assert code == 0 and res["neighbouring"] == "add-remove"
    assert res["l2_sensitivity"] == pytest.approx(math.sqrt(5))
    assert res["sigma"] == pytest.approx(11.8 / math.sqrt(2), rel=2e-3)  # sqrt(2) less noise than replace-one
    with pytest.raises(SystemExit) as exit_info:  # argparse refuses values outside its choices
        run_json(capsys, "--epsilon", "1", "--delta", "1e-5", "--k", "5", "--neighbouring", "swap")
    assert exit_info.value.code == 2 and "--neighbouring" in capsys.readouterr().err
