"""Synthetic study (Fig. 2): samplers are exact, votes match the library, the CLI writes its files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dphype.cli import main
from dphype.voting import top_k_votes
from simulations import synthetic as syn


def test_ranking_prefix_gives_the_library_top_k_votes() -> None:
    rng = np.random.default_rng(1)
    model = syn.LossModel(num_good=3, num_candidates=40, sigma_loss=0.6)
    losses = model.losses(50, rng)
    prefix = syn.ranking_from_losses(losses, 20)
    for k in (1, 3, 7, 20):
        counts = syn.vote_counts(prefix, [k], reps=5, clients=10, num_candidates=40)[k]
        expected = np.stack([top_k_votes(row, k, maximize=False) for row in losses])
        assert np.array_equal(counts, expected.reshape(5, 10, 40).sum(axis=1))


def test_rank_keys_order_candidates_like_the_losses() -> None:
    from scipy.special import log_ndtr

    model = syn.LossModel(num_good=6, num_candidates=80, sigma_loss=0.3)
    losses = model.losses(200, np.random.default_rng(5)).astype(np.float64)
    keys = log_ndtr((losses - 1.0) / model.sigma_loss)  # the direct sampler's keys (before negation)
    assert np.array_equal(syn.ranking_from_losses(losses, 30), syn.ranking_from_losses(keys, 30))


@pytest.mark.parametrize("sampler", ["direct", "order"])
def test_fast_samplers_match_the_loss_sampler(sampler: str) -> None:
    model = syn.LossModel(num_good=4, num_candidates=150, sigma_loss=0.45)
    rows, depth = 40_000, 20
    reference = syn.ranking_prefix(model, rows, depth, np.random.default_rng(2), sampler="losses")
    fast = syn.ranking_prefix(model, rows, depth, np.random.default_rng(3), sampler=sampler)
    for prefix in (reference, fast):  # every row is a ranking: distinct candidates
        srt = np.sort(prefix, axis=1)
        assert not np.any(srt[:, 1:] == srt[:, :-1])
        assert prefix.min() >= 0 and prefix.max() < model.num_candidates
    # P(rank t holds a good candidate) for every rank t: 20 proportions from 40k rows each
    p_ref = (reference < model.num_good).mean(axis=0)
    p_fast = (fast < model.num_good).mean(axis=0)
    se = np.sqrt((p_ref * (1 - p_ref) + p_fast * (1 - p_fast)) / rows) + 1e-9
    assert np.max(np.abs(p_ref - p_fast) / se) < 4.5
    # which good / bad candidate holds the votes is uniform within each group
    for prefix in (reference, fast):
        top5 = prefix[:, :5].ravel()
        good_freq = np.bincount(top5[top5 < 4], minlength=4)
        assert good_freq.min() / good_freq.max() > 0.95
        bad_freq = np.bincount(top5[top5 >= 4] - 4, minlength=146)
        assert bad_freq.std() / bad_freq.mean() < 0.25


def test_distinct_uniform_tuples() -> None:
    rng = np.random.default_rng(4)
    tuples = syn._distinct_uniform(rng, 30_000, 8, 12)
    srt = np.sort(tuples, axis=1)
    assert not np.any(srt[:, 1:] == srt[:, :-1])
    # every (position, value) pair is equally likely: 1/12
    freq = np.stack([np.bincount(tuples[:, j], minlength=12) for j in range(8)]) / 30_000
    assert np.allclose(freq, 1 / 12, atol=0.012)


def test_success_is_certain_without_overlap_and_chance_with_k_equal_p() -> None:
    settings = syn.Settings(clients=50, ks=(1, 100), epsilons=(1.0,), delta=1e-5, repetitions=400,
                            accountant="rdp", noise="gaussian", per_client_noise=False, workers=1)
    wins = syn.success_counts(syn.LossModel(1, 100, 0.05), settings, [0])
    assert wins[(1, 1.0)] == 400  # 50 unanimous votes for the good candidate, sigma ~ 5.7
    # k = |H|: every candidate gets n votes, selection is pure noise: P(good) = 1/100
    assert wins[(100, 1.0)] <= 14


def test_cli_tiny_run_writes_csv_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "syn"
    code = main(["bench", "synthetic", "--repetitions", "20", "--clients", "20", "--ks", "1", "5",
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
def test_cli_rejects_bad_input(argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "synthetic", "--out", str(tmp_path / "x"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_cli_flower_run_picks_a_candidate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "synthetic", "--repetitions", "2", "--clients", "5", "--panels", "a", "--sigma-losses", "0.2",
                 "--flower", "--flower-clients", "4", "--out", str(tmp_path / "s"), "--json"])
    assert code == 0
    flower = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["flower"]
    assert 0 <= flower["selected_index"] < 100 and flower["clients"] == 4
