"""Synthetic study (Fig. 2): success counts and the CLI (the samplers are tested in test_planner.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dphype.selection.planner import LossModel
from simulations import synthetic as syn
from simulations.cli import main


def test_success_is_certain_without_overlap_and_chance_with_k_equal_p() -> None:
    settings = syn.Settings(clients=50, ks=(1, 100), epsilons=(1.0,), delta=1e-5, repetitions=400,
                            accountant="rdp", noise="gaussian", per_client_noise=False, workers=1)
    wins = syn.success_counts(LossModel(1, 100, 0.05), settings, [0])
    assert wins[(1, 1.0)] == 400  # 50 unanimous votes for the good candidate, sigma ~ 5.7
    # k = |H|: every candidate gets n votes, selection is pure noise: P(good) = 1/100
    assert wins[(100, 1.0)] <= 14


def test_cli_tiny_run_writes_csv_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "syn"
    code = main(["synthetic", "--repetitions", "20", "--clients", "20", "--ks", "1", "5",
                 "--sigma-losses", "0.2", "--good-exponents", "0", "3", "--num-candidates", "100", "1000",
                 "--out", str(out), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["study"] == "synthetic" and result["seconds"] > 0
    assert set(result["panel_seconds"]) == {"a", "b", "c"}
    for name in ("synthetic.csv", "synthetic_fig2.png"):
        assert str(out / name) in result["outputs"] and (out / name).stat().st_size > 0
    lines = (out / "synthetic.csv").read_text().splitlines()
    assert len(lines) == 1 + (1 + 2 + 2) * 2 * 2  # header + points x ks x epsilons


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--clients", "1"], "clients"),
        (["--repetitions", "0"], "repetitions"),
        (["--epsilons", "-1"], "epsilon"),
        (["--sigma-losses", "0"], "sigma_loss"),
        (["--ks", "101"], "k must"),
        (["--good-exponents", "7"], "good exponent"),
        (["--delta", "2"], "delta"),
    ],
)
def test_cli_rejects_bad_input(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["synthetic", "--out", str(tmp_path / "x"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_cli_flower_run_picks_a_candidate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["synthetic", "--repetitions", "2", "--clients", "5", "--panels", "a", "--sigma-losses", "0.2",
                 "--flower", "--flower-clients", "4", "--out", str(tmp_path / "s"), "--json"])
    assert code == 0
    flower = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["flower"]
    assert 0 <= flower["selected_index"] < 100 and flower["clients"] == 4
