"""Benchmark: the FedAvg ground truth behind Opt, all candidates at once against one candidate at a time.

:func:`dphype.ml.training.fedavg` on the first ``--shards`` of ``--clients`` iid shards of ``--dataset``, for the
``--candidates``, twice: batched (every candidate in one stacked model) and with ``chunk_size=1`` (the same engine
run once per candidate, the sequential schedule), ``--repeats`` times interleaved. Reported: wall and process CPU
seconds of each (its fastest repeat), the speed-up, the training work (``sample_steps``: samples x epochs x rounds x
candidates), the forward-and-backward FLOPs of one training sample of the data set's model
(``torch.utils.flop_counter``) and the FLOP rate each run reached, the figure from which a run of another size or on
another device is projected. The test accuracies of the two runs (on
the first 1,000 test rows) differ only through their dropout masks (``max_accuracy_difference``).

Run: ``nice python -m simulations.bench_fedavg --dataset fashion-mnist --clients 20 --shards 1 [--json]``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from dphype.ml.data import dataset_names, dataset_spec
from dphype.ml.torch_task import load_cached
from dphype.ml.training import accuracy, fedavg
from dphype.selection.candidates import load_candidates
from simulations.harness import Federation, federation_clients, validate_federations

import torch  # noqa: E402  isort: skip
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402  isort: skip


def flops_per_sample(model: str, sample_shape: Sequence[int], num_classes: int, batch_size: int = 64) -> float:
    """Forward and backward FLOPs of one training sample of ``model`` (one batch counted, divided by its size)."""
    from dphype.ml.models import build_model
    from dphype.ml.training import _loss

    module = build_model(model, sample_shape, num_classes)
    x = torch.zeros(batch_size, *sample_shape)
    y = torch.zeros(batch_size, dtype=torch.long)
    counter = FlopCounterMode(display=False)
    with counter:
        _loss(module(x), y).backward()
    return counter.get_total_flops() / batch_size


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse ``argv``, time both schedules, print the result (one JSON line with ``--json``) and return it."""
    parser = argparse.ArgumentParser(prog="python -m simulations.bench_fedavg", description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="fashion-mnist", help=f"one of {', '.join(dataset_names())}")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--clients", type=int, default=20, help="iid shards the pool is split into (default 20)")
    parser.add_argument("--shards", type=int, default=1, help="the first SHARDS of them run FedAvg (default 1)")
    parser.add_argument("--candidates", default="table3:random:10:0", help="candidate spec (default 10 of Table III)")
    parser.add_argument("--epochs", type=int, default=1, help="local epochs per round (default 1)")
    parser.add_argument("--rounds", type=int, default=1, help="FedAvg rounds (default 1)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each schedule, interleaved (default 2)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    fed = Federation(args.dataset, args.clients, None, 0, args.data_dir)
    validate_federations([fed])
    if not 1 <= args.shards <= args.clients:
        raise ValueError(f"shards must be in [1, {args.clients}], got {args.shards}")
    shards = federation_clients(fed)[: args.shards]
    candidates = list(load_candidates(args.candidates))
    model = dataset_spec(args.dataset).model
    test = load_cached(args.dataset, args.data_dir)[1]
    test = test.subset(np.arange(min(len(test), 1000)))  # the accuracy check only: FedAvg's timings leave it out
    result: dict[str, Any] = {"dataset": args.dataset, "model": model, "candidates": len(candidates),
                              "shard_rows": [len(s) for s in shards], "epochs": args.epochs, "rounds": args.rounds,
                              "device": args.device, "threads": torch.get_num_threads()}
    accuracies = {}
    for repeat in range(args.repeats):  # the schedules interleaved; the best of the repeats is kept
        for name, chunk in (("batched", None), ("one_at_a_time", 1)):
            wall, cpu = time.perf_counter(), time.process_time()
            models = fedavg(model, shards, candidates, rounds=args.rounds, local_epochs=args.epochs, seed=0,
                            device=args.device, chunk_size=chunk)
            seconds = (round(time.perf_counter() - wall, 2), round(time.process_time() - cpu, 2))
            if repeat == 0 or seconds[0] < result[f"{name}_s"]:
                result[f"{name}_s"], result[f"{name}_cpu_s"] = seconds
            accuracies[name] = accuracy(models, test)
    result["speedup"] = round(result["one_at_a_time_s"] / result["batched_s"], 2)
    result["max_accuracy_difference"] = float(np.nanmax(np.abs(accuracies["batched"] - accuracies["one_at_a_time"])))
    steps = args.rounds * args.epochs * sum(len(s) for s in shards) * len(candidates)
    flops = flops_per_sample(model, shards[0].x.shape[1:], shards[0].num_classes)
    result.update({"sample_steps": steps, "flops_per_sample": flops,
                   "batched_gflops_per_s": round(steps * flops / result["batched_s"] / 1e9, 2),
                   "one_at_a_time_gflops_per_s": round(steps * flops / result["one_at_a_time_s"] / 1e9, 2)})
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return result


if __name__ == "__main__":
    main()
