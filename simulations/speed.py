"""Speed in one run: batched vs sequential local evaluation, the synthetic study, the voting round.

* Adult local evaluation of one client (all candidates): TRAIN's benchmark
  :func:`simulations.bench_training.main` (batched ``adult_batched_s`` vs the sequential reference
  ``adult_sequential_s``, ``speedup``); the MNIST CNN is measured the same way when a GPU is present.
* The synthetic study (Fig. 2) at the given scale: :func:`simulations.synthetic.run` timings.
* One DP-Hype voting round over Flower + SecAgg+ (:func:`simulations.flower.vote_through_flower`).

Ratios put the three on one scale. The 1-minute load average is recorded: on a shared machine the
wall times are only comparable within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from typing import Any

import numpy as np

from simulations import harness, synthetic


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=50, help="Adult iid clients; client 0 is timed (default 50)")
    parser.add_argument("--epochs", type=int, default=5, help="local epochs (default 5)")
    parser.add_argument("--repeats", type=int, default=1, help="warm repetitions of the batched path (default 1)")
    parser.add_argument("--synthetic-repetitions", type=int, default=5000, help="synthetic study runs (default 5000)")
    parser.add_argument("--synthetic-clients", type=int, default=250, help="synthetic study n (default 250)")
    parser.add_argument("--vote-clients", type=int, default=50, help="clients of the timed voting round (default 50)")
    parser.add_argument("--skip-voting", action="store_true", help="skip the Flower voting round")


def _bench_training(argv: list[str]) -> dict[str, Any]:
    """TRAIN's training benchmark, its printout sent to standard error (stdout carries our JSON)."""
    from simulations import bench_training

    with contextlib.redirect_stdout(sys.stderr):
        return bench_training.main(argv)


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    clients = harness.check_clients(args.clients)
    epochs = harness.check_int("epochs", args.epochs, 1)
    repeats = harness.check_int("repeats", args.repeats, 1)
    syn_reps = harness.check_int("synthetic_repetitions", args.synthetic_repetitions, 1)
    syn_clients = harness.check_clients(args.synthetic_clients)
    vote_clients = harness.check_clients(args.vote_clients)
    result: dict[str, Any] = {"load_average_1min_start": round(os.getloadavg()[0], 2)}
    with harness.progress_bar(3 - int(args.skip_voting), "speed") as bar:
        train = _bench_training(["--clients", str(clients), "--epochs", str(epochs), "--repeats", str(repeats)])
        result.update({k: train[k] for k in ("adult_batched_s", "adult_sequential_s", "speedup", "client_rows",
                                              "candidates", "epochs", "adult_batched_cold_s") if k in train})
        bar.update(1)
        if _has_gpu():
            result.update(_mnist_gpu(clients, epochs))
        else:
            result["mnist_cnn"] = "skipped: no GPU on this machine"
        syn_parser = argparse.ArgumentParser()
        synthetic.add_arguments(syn_parser)
        syn_args = syn_parser.parse_args(["--clients", str(syn_clients), "--repetitions", str(syn_reps)])
        syn_args.seed = args.seed
        cpu0, start = time.process_time(), time.perf_counter()
        syn = synthetic.run(syn_args, harness.StudyRun("synthetic", study.out / "synthetic"))
        result["synthetic_s"] = round(time.perf_counter() - start, 3)
        result["synthetic_cpu_s"] = round(time.process_time() - cpu0, 3)
        result["synthetic_scale"] = {"clients": syn_clients, "repetitions": syn_reps}
        study.outputs.extend(syn["outputs"])
        bar.update(1)
        if not args.skip_voting:
            from dphype.config import DPHypeConfig
            from dphype.selection.candidates import table_iii_grid
            from simulations.flower import vote_through_flower

            scores = np.random.default_rng(args.seed).random((vote_clients, 100))
            vote = vote_through_flower(scores, table_iii_grid(),
                                       DPHypeConfig(epsilon=1.0, delta=1e-5, k=5, clients=vote_clients))
            result["voting_round_s"] = round(vote["round_seconds"], 3)
            result["voting_simulation_s"] = round(vote["simulation_seconds"], 3)
            result["voting_clients"] = vote_clients
            bar.update(1)
    batched = result["adult_batched_s"]
    result["synthetic_over_adult_batched"] = round(result["synthetic_s"] / batched, 2)
    if "voting_round_s" in result:
        result["voting_round_over_adult_batched"] = round(result["voting_round_s"] / batched, 2)
    result["load_average_1min_end"] = round(os.getloadavg()[0], 2)
    study.write_csv("speed.csv", [{"metric": k, "value": v} for k, v in result.items() if not isinstance(v, dict)])
    plot(result, study)
    return study.result(**result)


def _has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _mnist_gpu(clients: int, epochs: int) -> dict[str, float]:
    """MNIST CNN (mnist5k client 0 of ``clients`` iid): batched vs sequential local evaluation on the GPU."""
    from dphype.ml.data import partition_iid
    from dphype.ml.torch_task import load_cached
    from dphype.ml.training import evaluate_candidates
    from dphype.selection.candidates import table_iii_grid

    pool = load_cached("mnist5k")[0]
    client = pool.subset(partition_iid(pool.y, clients, seed=0)[0])
    cands = list(table_iii_grid())
    timings = {}
    for name, sequential in (("mnist_batched_s", False), ("mnist_sequential_s", True)):
        start = time.perf_counter()
        evaluate_candidates("mnist-cnn", client, cands, epochs=epochs, device="cuda", sequential=sequential)
        timings[name] = round(time.perf_counter() - start, 3)
    timings["mnist_speedup"] = round(timings["mnist_sequential_s"] / timings["mnist_batched_s"], 1)
    return timings


def plot(result: dict[str, Any], study: harness.StudyRun) -> None:
    """Wall times of the measured pieces (log scale)."""
    plt = harness.pyplot()
    keys = [k for k in ("adult_sequential_s", "adult_batched_s", "mnist_sequential_s", "mnist_batched_s",
                        "synthetic_s", "voting_round_s", "voting_simulation_s") if k in result]
    fig, ax = plt.subplots(figsize=(5.5, 2.8))
    ax.barh(keys, [result[k] for k in keys], color="tab:blue")
    ax.set_xscale("log")
    ax.set_xlabel("seconds (wall)")
    ax.set_title(f"speed (load average {result['load_average_1min_start']} -> {result['load_average_1min_end']})",
                 fontsize=9)
    study.save_figure(fig, "speed.png")
