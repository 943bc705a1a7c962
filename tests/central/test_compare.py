"""dphype compare on a tiny configuration, and DP-Hype's selection through the real client path."""

import json

import numpy as np
import pytest

from dphype.central import compare as cmp
from dphype.config import DPHypeConfig
from dphype.selection.candidates import load_candidates


def test_dphype_select_through_client_code_picks_the_consensus():
    candidates = load_candidates("table3:random:12:0")
    rng = np.random.default_rng(0)
    scores = rng.random((300, 12)) * 0.5
    scores[:, 7] += 0.6  # every client ranks candidate 7 first
    index, report = cmp.dphype_select(scores, candidates, DPHypeConfig(epsilon=1.0, delta=1e-5, k=3, clients=300),
                                      rng=rng)
    assert index == 7
    assert report["epsilon"] == pytest.approx(1.0, rel=1e-6) and report["accountant"] == "rdp"
    assert report["clients"] == 300 and report["k"] == 3


def test_compare_tiny_configuration(tmp_path):
    from dphype.cli import main

    out = tmp_path / "cmp"
    argv = ["compare", "--candidates", "table3:random:6:1", "--clients", "4", "--epochs", "1",
            "--dpbo-iterations", "4", "--repetitions", "3", "--out", str(out), "--json"]
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    result = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert set(result) >= {"rows", "seconds", "outputs"}
    rows = {r["method"]: r for r in result["rows"]}
    assert list(rows) == ["DP-Hype", "DP-BO", "propose-test", "Opt", "RandGuess"]
    assert rows["DP-Hype"]["trusted_curator"] is False
    assert rows["DP-BO"]["trusted_curator"] and rows["propose-test"]["trusted_curator"]
    assert rows["DP-Hype"]["epsilon"] == pytest.approx(1.0, rel=1e-6)
    assert rows["DP-BO"]["epsilon"] == 1.0 and rows["DP-BO"]["delta"] == 1e-5
    assert rows["propose-test"]["epsilon"] <= 1.0 + 1e-9
    assert rows["propose-test"]["epsilon_realised_iterations_max"] <= rows["propose-test"]["epsilon"] + 1e-12
    assert rows["DP-Hype"]["repetitions"] == 3 and rows["DP-Hype"]["test_accuracy_std"] >= 0
    assert rows["Opt"]["epsilon"] is None and "non-private" in rows["Opt"]["accountant"]
    best = rows["Opt"]["test_accuracy"]
    assert all(0.0 <= r["test_accuracy"] <= best + 1e-12 for r in rows.values())
    for r in rows.values():
        assert r["assumptions"] and r["wall_seconds"] >= 0
    for path in result["outputs"]:
        assert (out / path.split("/")[-1]).exists()
    with open(out / "compare.csv") as fh:
        assert fh.readline().startswith("method,epsilon,delta,accountant,trusted_curator")


def test_compare_rejects_bad_budget():
    with pytest.raises(ValueError, match="epsilon"):
        DPHypeConfig(epsilon=-1.0, delta=1e-5, k=5, clients=50)
    with pytest.raises(ValueError, match="delta"):
        DPHypeConfig(epsilon=1.0, delta=0.0, k=5, clients=50)
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 4\]"):
        cmp.compare(candidates=load_candidates("table3:random:4:0"),
                    config=DPHypeConfig(epsilon=1.0, delta=1e-5, k=5, clients=50))
