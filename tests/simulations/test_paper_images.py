"""``simulations/paper_images.sh``, the paper-scale image trade-off, run as is at a tiny scale on the CPU: on
Fashion-MNIST-shaped IDX files and on CIFAR-10-shaped python pickles that the tests write to a temporary folder."""

from __future__ import annotations

import csv
import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "simulations" / "paper_images.sh"


def _idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(array.shape, dtype=">i4").tobytes()
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def _fashion_like(folder: Path, train: int, test: int) -> None:
    rng = np.random.default_rng(0)
    for stem, rows in (("train", train), ("t10k", test)):
        labels = np.arange(rows) % 10
        images = rng.integers(0, 60, size=(rows, 28, 28)) + 19 * labels[:, None, None]  # learnable by brightness
        _idx(folder / f"{stem}-images-idx3-ubyte.gz", images)
        _idx(folder / f"{stem}-labels-idx1-ubyte.gz", labels)


def _cifar_like(folder: Path, per_batch: int, test: int) -> None:
    rng = np.random.default_rng(1)
    for name, rows in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", test)]:
        labels = list(np.arange(rows) % 10)
        pixels = rng.integers(0, 256, size=(rows, 3 * 32 * 32)).astype(np.uint8)
        with (folder / name).open("wb") as fh:
            pickle.dump({b"data": pixels, b"labels": labels}, fh)


def _run(tmp: Path, **env: str) -> dict:
    """The script with the tiny scale's environment; its JSON summary (the last line of its output)."""
    scale = {"CLIENTS": "2", "CANDIDATES": "6", "EPOCHS": "1", "ROUNDS": "1", "FEDAVG_CHUNK": "4", "DEVICE": "cpu",
             "EPSILONS": "1 inf", "REPETITIONS": "5", "CACHE": str(tmp / "cache"), "RESULTS": str(tmp / "out"),
             "PYTHON": sys.executable}
    full = {**os.environ, "PYTHONPATH": str(ROOT), "DPHYPE_NO_PROGRESS": "1", **scale, **env}
    done = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=full, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rows(tmp: Path) -> list[dict[str, str]]:
    with (tmp / "out" / "tradeoff.csv").open() as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow
def test_fashion_mnist_paper_command_runs_both_releases_and_resumes_from_its_cache(tmp_path: Path) -> None:
    data = tmp_path / "fmnist"
    data.mkdir()
    _fashion_like(data, train=200, test=50)
    result = _run(tmp_path, DATA_DIR=str(data), BETAS="iid 0.5")
    assert result["dataset"] == "fashion-mnist" and result["scale"]["fedavg_chunk"] == 4
    assert {Path(p).name for p in result["outputs"]} == {"tradeoff.csv", "tradeoff_candidates.csv",
                                                         "tradeoff_fashion-mnist.png"}
    rows = _rows(tmp_path)
    for partition in ("iid", "beta=0.5"):
        here = [r for r in rows if r["partition"] == partition]
        assert {r["method"] for r in here} == {"Opt", "RandGuess", "DP-Hype"}
        assert {r["release"] for r in here if r["method"] == "DP-Hype"} == {"sum", "argmax"}
        assert {r["rule"] for r in here if r["release"] == "argmax"} == {"noisy-max/replace-one",
                                                                         "noisy-max/add-remove"}
    cached = sorted((tmp_path / "cache").glob("*.npy"))
    chunks = [p for p in cached if "candidate_slice" in p.with_suffix(".json").read_text()]
    assert len(cached) == 2 * 3 and len(chunks) == 2 * 2  # per federation: FedAvg chunks 4 + 2, scores
    first = {p: p.stat().st_mtime_ns for p in cached}
    chunks[0].unlink()  # a run stopped before this chunk: the rerun computes it alone and gives the same table
    _run(tmp_path, DATA_DIR=str(data), BETAS="iid 0.5")
    assert _rows(tmp_path) == rows
    assert [p for p in cached if p.stat().st_mtime_ns != first[p]] == [chunks[0]]


@pytest.mark.slow
def test_cifar10_runs_through_the_same_command_from_a_folder_of_pickles(tmp_path: Path) -> None:
    data = tmp_path / "cifar"
    data.mkdir()
    _cifar_like(data, per_batch=12, test=20)
    result = _run(tmp_path, DATASET="cifar10", DATA_DIR=str(data), BETAS="iid")
    assert result["dataset"] == "cifar10" and result["scale"]["epochs"] == 1
    rows = _rows(tmp_path)
    assert {(r["method"], r["release"]) for r in rows} == {("Opt", ""), ("RandGuess", ""), ("DP-Hype", "sum"),
                                                           ("DP-Hype", "argmax")}
    assert all(0.0 <= float(r["mean_accuracy"]) <= 1.0 for r in rows)


def test_bench_fedavg_reports_both_schedules_and_the_work(capsys: pytest.CaptureFixture[str]) -> None:
    from simulations import bench_fedavg

    result = bench_fedavg.main(["--dataset", "adult", "--clients", "50", "--shards", "2", "--candidates", "4",
                                "--repeats", "1", "--json"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    assert result["shard_rows"] == [781, 781] and result["sample_steps"] == 2 * 781 * 4
    # the Adult MLP (108 -> 64 -> 64 -> 1): forward 2 x MACs, backward the weights' gradients (2 x MACs) and the
    # hidden layers' input gradients (not the first layer's: the data needs none)
    macs = 108 * 64 + 64 * 64 + 64
    assert result["flops_per_sample"] == 2 * macs + 2 * macs + 2 * (64 * 64 + 64)
    assert result["batched_s"] > 0 and result["one_at_a_time_s"] > 0 and result["speedup"] > 0
    with pytest.raises(ValueError, match="shards must be in"):
        bench_fedavg.main(["--dataset", "adult", "--clients", "50", "--shards", "51"])
