"""Every data-driven study on a tiny configuration through ``python -m simulations ... --json`` (what ``dphype
bench`` runs), in process, plus bad input.

A small slice of Adult (600 training / 300 test rows; of mnist5k 120 / 60) replaces the data set for speed:
the studies load data only through :mod:`dphype.ml.torch_task`'s cached loader, which the ``small_adult`` fixture
(``conftest.py`` beside this file) swaps.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY, bench

from dphype.ml.validation import DEFAULT_VALIDATION
from simulations.cli import main


def test_tradeoff_on_image_data_uses_the_cnn(
    small_adult: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """mnist5k (the subset fixture keeps 120/60 rows): the MNIST CNN path of the tradeoff study."""
    res = bench(["tradeoff", "--dataset", "mnist5k", "--clients", "2", "--betas", "iid", "--candidates", "3",
                  "--k", "1", "--epochs", "1", "--rounds", "1", "--repetitions", "4", "--epsilons", "3", "inf",
                  "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "m")], capsys)
    assert res["dataset"] == "mnist5k" and len(res["summary"]) == 2  # one partition x two epsilons
    assert {Path(p).name for p in res["outputs"]} >= {"tradeoff.csv", "tradeoff_mnist5k.png"}
    for row in res["summary"]:
        assert 0.0 <= row["dphype"] <= 1.0 and row["gap_to_opt_points"] >= 0 and row["rule"] == "gp"
        assert 0.0 <= row["within_1pt"] <= 1.0 and row["worst5_gap_points"] >= row["gap_to_opt_points"] - 1e-9
        assert "max_votes_gap_to_opt_points" in row  # the max-votes rule side by side
        assert 0.0 <= row["zero_vote_share"] <= 1.0 and 0.0 <= row["max_votes_zero_vote_share"] <= 1.0


def test_tradeoff_then_ablations_and_distributions_reuse_the_cache(
    small_adult: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = str(tmp_path / "cache")
    res = bench(["tradeoff", *TINY, "--repetitions", "4", "--epsilons", "1", "inf", "--cache", cache,
                  "--out", str(tmp_path / "t")], capsys)
    assert res["study"] == "tradeoff"
    assert res["scale"] == {"epochs": 1, "rounds": 1, "fedavg_epochs": 1, "fedavg_chunk": None,
                            "validation": DEFAULT_VALIDATION}  # the product's local signal, as TorchTask's
    assert {Path(p).name for p in res["outputs"]} == {"tradeoff.csv", "tradeoff_candidates.csv", "tradeoff_adult.png"}
    assert len(res["summary"]) == 2 * 2  # partitions x epsilons
    without_noise = [s for s in res["summary"] if s["epsilon"] == "inf"]  # strict JSON: infinity as "inf"
    assert all(s["gap_to_opt_points"] >= 0 for s in without_noise)
    rows = (tmp_path / "t" / "tradeoff.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * (2 + 2 * 2)  # header + partitions x (Opt, RandGuess, 2 epsilons x 2 rules)
    assert set(res["select_seconds"]) == {"max-votes", "gp"} and res["default_rule"] == "gp"
    cached = sorted(p.name for p in (tmp_path / "cache").glob("*.npy"))
    assert len(cached) == 4  # scores and accuracies for two partitions

    res = bench(["ablations", *TINY, "--repetitions", "4", "--epsilons", "0.5", "--cache", cache,
                  "--out", str(tmp_path / "a")], capsys)
    assert res["methods"] == ["DP-Hype", "Raw scores", "Subsets", "Feathers (corrected)"]
    assert {r["method"] for r in res["summary"]} >= {"Opt", "RandGuess", "Subsets", "Feathers (corrected)"}
    assert {r["rule"] for r in res["summary"] if r["method"] == "DP-Hype"} == {"max-votes", "gp"}
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 4  # nothing retrained

    res = bench(["distributions", *TINY, "--cache", cache, "--out", str(tmp_path / "d")], capsys)
    assert {Path(p).name for p in res["outputs"]} == {
        "distributions_labels.csv", "distributions_labels_adult.png", "distributions_accuracy.csv",
        "distributions_accuracy_adult.png"}
    assert res["client_size_range"]["n=3,iid"] == [200, 200]


def test_feathers_noise_is_calibrated_for_100_releases() -> None:
    from dphype.privacy.noise_kinds import gaussian_rdp_epsilon
    from simulations.ablations import feathers_sigma

    sigma = feathers_sigma(1.0, 1e-5)
    # 100 Gaussian releases of sensitivity 1 compose (RDP) like one of sensitivity sqrt(100) = 10
    assert gaussian_rdp_epsilon(10.0, sigma, 1e-5) == pytest.approx(1.0, rel=0.02)
    assert feathers_sigma(float("inf"), 1e-5) == 0.0


def test_subsets_and_feathers_pick_the_best_candidate_without_noise() -> None:
    from simulations.ablations import feathers_picks, subsets_sums

    rng = np.random.default_rng(0)
    scores = np.tile(np.array([0.2, 0.9, 0.4, 0.1]), (40, 1))
    sums, sizes = subsets_sums(scores, 5, rng)
    assert np.all(sizes == 10) and np.all(np.argmax(sums / sizes, axis=1) == 1)
    _, few = subsets_sums(scores[:3], 200, rng)  # n < p: 3 random candidates per run, all of them over runs
    assert np.all(few.sum(axis=1) == 3) and np.all(few.max(axis=1) == 1) and np.all(few.sum(axis=0) > 0)
    assert np.all(feathers_picks(scores, 0.0, 5, rng) == 1)


def test_resources_local_evaluation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = bench(["resources", "--clients", "300", "--candidates", "3", "--epochs", "1", "--skip-voting",
                  "--out", str(tmp_path / "r")], capsys)
    (entry,) = res["table"]
    assert entry["part"] == "local evaluation" and entry["clients"] == 300
    assert entry["seconds"] > 0 and entry["memory_mb"] >= 0
    assert entry["memory_kind"] in {"peak RSS growth (CPU)", "cuda max_memory_allocated"}


@pytest.mark.slow
def test_resources_voting_round_through_flower_in_both_release_modes(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    res = bench(["resources", "--skip-local", "--vote-clients", "4", "--release", "sum", "argmax",
                  "--out", str(tmp_path / "r")], capsys)
    secagg, winner = res["table"]
    assert (secagg["part"], secagg["release"], winner["part"], winner["release"]) == (
        "voting round", "sum", "voting round", "argmax")
    assert secagg["upload_kb"] > 0.8  # 100 masked entries at least
    assert {"seconds", "simulation_seconds", "peak_memory_mb", "upload_kb", "download_kb", "num_shares",
            "reconstruction_threshold"} <= set(secagg)
    # a client's 3 sealed shares of 100 counts (8 bytes each); each tally downloads the 4 clients' shares for it
    assert winner["upload_kb"] > 3 * 0.8 and winner["tally_download_kb"] > 4 * 0.8
    assert {"seconds", "simulation_seconds", "peak_memory_mb", "tally_upload_kb"} <= set(winner)
    assert "num_shares" not in winner or winner["num_shares"] == ""
    assert min(secagg["peak_memory_mb"], winner["peak_memory_mb"]) > 50 and res["secagg"] == "secure"
    assert res["releases"] == ["sum", "argmax"] and res["time_exponent"] == {"sum": None, "argmax": None}
    # the round stage by stage: every SecAgg+ stage of the sum, the committee's of the argmax, the clients' work seen
    stages = {release: [r for r in res["stages"] if r["release"] == release] for release in ("sum", "argmax")}
    assert [r["stage"] for r in stages["sum"]][1:] == ["pre-flight", "share_keys", "masked_input", "consistency",
                                                        "unmask"]
    assert "committee vote" in [r["stage"] for r in stages["argmax"]]
    assert all(sum(r["clients_cpu_s"] for r in rows) > 0 for rows in stages.values())
    assert all(r["wall_s"] > 0 and r["idle_estimate_s"] >= r["server_cpu_s"] >= 0 for r in res["stages"])
    assert (tmp_path / "r" / "resources_stages.txt").read_text().count("total") == 2


@pytest.mark.slow
def test_speed_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = bench(["speed", "--clients", "250", "--epochs", "1", "--synthetic-repetitions", "2",
                  "--synthetic-clients", "5", "--skip-voting", "--out", str(tmp_path / "s")], capsys)
    assert res["adult_batched_s"] > 0 and res["adult_sequential_s"] > 0 and res["speedup"] > 0
    assert res["synthetic_s"] > 0 and "synthetic_over_adult_batched" in res


@pytest.mark.slow
def test_tradeoff_flower_run(small_adult: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = bench(["tradeoff", "--clients", "4", "--betas", "iid", "--candidates", "6", "--epochs", "1", "--rounds",
                  "1", "--repetitions", "2", "--epsilons", "3", "--flower", "--cache", str(tmp_path / "c"),
                  "--out", str(tmp_path / "t")], capsys)
    assert 0 <= res["flower"]["selected_index"] < 6 and res["flower"]["privacy"]["survivors"] == 4


@pytest.mark.parametrize(
    "argv, message",
    [
        (["tradeoff", "--dataset", "imagenet"], "dataset must be one of"),
        (["tradeoff", "--betas", "0"], "beta must be"),
        (["tradeoff", "--betas", "-1"], "beta must be"),
        (["tradeoff", "--dataset", "mnist", "--data-dir", "/no/such/dir"], "not an existing directory"),
        (["tradeoff", "--dataset", "cifar10"], "needs --data-dir"),
        (["tradeoff", "--clients", "100000"], "clients must be an integer in [2, 10000]"),
        (["tradeoff", "--clients", "10000"], "too many"),
        (["tradeoff", "--k", "200"], "k must be"),
        (["tradeoff", "--consensus", "unanimous"], "consensus must be one of strong, moderate, weak or a number > 0"),
        (["tradeoff", "--consensus", "-1"], "consensus must be a finite number > 0"),
        (["tradeoff", "--epsilons", "0"], "epsilon must be"),
        (["tradeoff", "--device", "gpu0"], "device must be a torch device such as cpu, cuda or cuda:1, got 'gpu0'"),
        pytest.param(["tradeoff", "--device", "cuda"], "torch sees no CUDA device",
                     marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")),
        (["ksweep", "--epsilons", "1", "inf"], "epsilons must be finite"),
        (["ksweep", "--candidates", "6", "--ks", "6", "8"], "ks must contain at least one k in [1, 5]"),
        (["ksweep", "--ks", "0"], "ks must be"),
        (["ksweep", "--consensus", "moderate", "unanimous"], "consensus must be one of"),
        (["ablations", "--repetitions", "0"], "repetitions"),
        (["ablations", "--noise", "skellam", "--accountant", "analytic"], "accountant must be 'rdp'"),
        (["distributions", "--show", "0"], "show"),
        (["resources", "--vote-clients", "1"], "vote client count"),
        (["speed", "--clients", "1"], "clients"),
    ],
)
def test_bad_input_is_refused_before_any_work(argv: list[str], message: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out), "--cache", "none"] if argv[0] != "resources" and argv[0] != "speed"
                else [*argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_resources_refuses_an_unknown_release_mode(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        main(["resources", "--skip-local", "--release", "max"])
    assert err.value.code == 2
    err_text = capsys.readouterr().err
    assert "argument --release: invalid choice: 'max'" in err_text and "sum" in err_text and "argmax" in err_text


def test_unknown_study_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        main(["nonsense"])
    assert err.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_resources_scaling_keys_and_exponent(tmp_path: Path) -> None:
    from simulations import harness, resources

    table = [{"part": "voting round", "release": "sum", "clients": n, "seconds": 0.01 * n**1.5,
              "simulation_seconds": 0.02 * n**1.5} for n in (50, 100, 400)]
    assert resources.time_exponent(table) == pytest.approx(1.5)
    assert resources.time_exponent(table[:1]) is None
    study = harness.StudyRun("resources", tmp_path)
    resources.plot_scaling(table, {"sum": 1.5, "argmax": None}, study)
    assert study.outputs and Path(study.outputs[0]).name == "resources_scaling.png"


def test_resources_secagg_arguments_are_the_secure_ones() -> None:
    from dphype.secure.secagg_params import secure_parameters
    from simulations.resources import secagg_arguments

    secure = secure_parameters(1000, dropout=0.1)
    got = secagg_arguments(1000, "secure", 0.1)
    assert (got["num_shares"], got["reconstruction_threshold"]) == (secure.num_shares, secure.threshold)
    assert got["log2_insecure"] <= -40 and got["log2_failure"] <= -20
    paper = secagg_arguments(100, "paper", 0.0)
    assert (paper["num_shares"], paper["reconstruction_threshold"]) == (31, 31)  # 0.3 n made odd, all shares
