"""Benchmark: one Adult client's local evaluation of the 100 Table III candidates (DP-Hype, Section V-B/D).

Client 0 of ``--clients`` iid clients (default 50, about 780 rows: 625 to train, 156 to validate)
trains the paper's MLP for 5 epochs with batch 64 per candidate and scores it on its validation
split. Measured, in wall-clock seconds (best of ``--repeats`` warm runs, variants interleaved; the
first, cold call of the process is reported separately; ``*_cpu_s`` is the process CPU time of the
same run, which load from other processes disturbs less):

* ``adult_batched_s``: :func:`dphype.ml.training.evaluate_candidates` (all candidates at once, the
  MLP's hand-written ``stacked_forward``);
* ``adult_vmap_s``: the same with the generic ``torch.func.vmap`` forward;
* ``adult_batched_1thread_s``: the batched path with one torch thread;
* ``adult_sequential_s``: the reference path (one ``torch.optim.SGD`` + ``StepLR`` per candidate);
* ``adult_validation_<scheme>_s`` for every scheme of ``--validations`` (:mod:`dphype.ml.validation`, e.g.
  ``split kfold:5``): the client's scores under that scheme (:func:`dphype.ml.crossval.cross_validate_candidates`,
  every fold of every candidate at once), with one torch thread: the client's compute per scheme.

``max_abs_weight_diff`` compares the weights trained by the batched and the sequential path with
dropout switched off (same initialisation, same mini-batches). The machine's load average is
printed too: timings on a busy machine are not comparable.

Run: ``.venv/bin/python -m simulations.bench_training [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dphype.ml.crossval import cross_validate_candidates
from dphype.ml.data import Dataset, load_adult, partition_iid
from dphype.ml.models import AdultMLP  # before torch: sets the OpenMP wait policy (see dphype.ml.models)
from dphype.ml.training import evaluate_candidates, train_candidates
from dphype.ml.validation import check_validation
from dphype.selection.candidates import table_iii_grid

import torch  # noqa: E402  isort: skip


class _VmapMLP(AdultMLP):
    """The Adult MLP without its hand-written batched forward, so training falls back to vmap."""

    stacked_forward = None  # type: ignore[assignment]


def _seconds(run: Callable[[], Any]) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of ``run()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def _max_weight_diff(client: Dataset, candidates: list[dict], epochs: int) -> float:
    """Largest |batched - sequential| over all trained weights, dropout off."""

    def factory() -> AdultMLP:
        return AdultMLP(client.x.shape[1], dropout=False)

    kwargs: dict[str, Any] = dict(epochs=epochs, seed=0, device="cpu")
    batched = train_candidates(factory, client, candidates, **kwargs)
    sequential = train_candidates(factory, client, candidates, sequential=True, **kwargs)
    return max(float((batched.params[k] - sequential.params[k]).abs().max()) for k in batched.params)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50, help="number of iid clients (default 50)")
    parser.add_argument("--epochs", type=int, default=5, help="local epochs (default 5)")
    parser.add_argument("--repeats", type=int, default=3, help="warm repetitions, best reported (default 3)")
    parser.add_argument("--no-sequential", action="store_true", help="skip the slow sequential reference")
    parser.add_argument("--validations", nargs="*", default=[],
                        help="validation schemes to time with one thread (e.g. split kfold:5; default none)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {args.repeats}")
    args.validations = [check_validation(v) for v in args.validations]

    pool, _ = load_adult()
    client = pool.subset(partition_iid(pool.y, args.clients, seed=0)[0])
    candidates = list(table_iii_grid())

    def batched(model: Any = "adult-mlp", num_threads: int | None = None) -> np.ndarray:
        return evaluate_candidates(model, client, candidates, epochs=args.epochs, device="cpu", num_threads=num_threads)

    scores: np.ndarray = np.empty(0)

    def keep_scores() -> None:
        nonlocal scores
        scores = batched()

    variants: dict[str, Callable[[], Any]] = {
        "batched": batched,
        "vmap": lambda: batched(lambda: _VmapMLP(client.x.shape[1])),
        "batched_1thread": lambda: batched(num_threads=1),
    }
    for scheme in args.validations:
        variants[f"validation_{scheme}"] = lambda scheme=scheme: cross_validate_candidates(
            "adult-mlp", client, candidates, validation=scheme, epochs=args.epochs, device="cpu", num_threads=1)
    cold, _ = _seconds(keep_scores)
    timings: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(args.repeats):  # interleaved, so that load changes hit every variant alike
        for name, run in variants.items():
            timings[name].append(_seconds(run))
    best = {name: min(t) for name, t in timings.items()}  # fastest wall time, with its CPU time
    result: dict[str, Any] = {
        "client_rows": len(client),
        "candidates": len(candidates),
        "epochs": args.epochs,
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "adult_batched_cold_s": round(cold, 3),
    }
    for name, (wall, cpu) in best.items():
        result[f"adult_{name}_s"] = round(wall, 3)
        result[f"adult_{name}_cpu_s"] = round(cpu, 3)
    result["accuracy_min"] = round(float(np.nanmin(scores)), 4)
    result["accuracy_max"] = round(float(np.nanmax(scores)), 4)
    result["diverged"] = int(np.isnan(scores).sum())
    if not args.no_sequential:
        sequential_s, _ = _seconds(
            lambda: evaluate_candidates(
                "adult-mlp", client, candidates, epochs=args.epochs, device="cpu", sequential=True
            )
        )
        result["adult_sequential_s"] = round(sequential_s, 3)
        result["speedup"] = round(sequential_s / best["batched"][0], 1)
        result["max_abs_weight_diff"] = _max_weight_diff(client, candidates, args.epochs)
    for key, value in result.items():
        print(f"{key}: {value}")
    if args.json:
        print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
