"""One DP-Hype release through the real Flower path (SecAgg+), for the studies' ``--flower`` checks and Table IV.

The replays of :mod:`simulations.harness` reproduce the release's distribution without Flower. This module
runs a configuration once end to end instead: FLOWER's :func:`dphype.strategy.run_dphype` in a ServerApp,
one :class:`dphype.client.DPHypeClient` per simulated node (top-k votes, its own noise share, encoding),
:func:`dphype.secure_sum.secure_vote_mod` (SecAgg+ client side), all inside
``flwr.simulation.run_simulation``. Each client's task returns scores that were already computed by the
real task (:class:`dphype.task.FixedScoresTask`), so the run measures and exercises the voting round itself.

With ``count_bytes=True`` a client mod adds up the serialized size of every message each node receives
and sends (the protobuf ``RecordDict`` content, i.e. the payload on the wire, without transport framing).
``peak_memory_mb`` is the largest resident size of this process and all its descendants (the Ray head and
workers) seen by a sampler every 0.2 s during the simulation (Linux ``/proc``).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np


def _byte_counter(folder: str) -> Callable[..., Any]:
    """Client mod: append ``received sent`` payload bytes of every message to ``folder/<node>.txt``."""

    def mod(msg: Any, context: Any, call_next: Callable[..., Any]) -> Any:
        from flwr.common.serde import recorddict_to_proto

        received = recorddict_to_proto(msg.content).ByteSize() if msg.has_content() else 0
        reply = call_next(msg, context)
        sent = recorddict_to_proto(reply.content).ByteSize() if reply.has_content() else 0
        with open(os.path.join(folder, f"{context.node_id}.txt"), "a", encoding="utf-8") as fh:
            fh.write(f"{received} {sent}\n")
        return reply

    return mod


def _tree_rss_kb(root: int) -> int:
    """Resident kB of process ``root`` and all its descendants (Linux ``/proc``)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    total = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/status") as fh:
                total += next((int(line.split()[1]) for line in fh if line.startswith("VmRSS:")), 0)
        except OSError:
            continue
    return total


class _PeakMemory:
    """Context manager: the peak of :func:`_tree_rss_kb` for this process, sampled every ``interval`` s."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval, self.peak_kb = interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_kb = max(self.peak_kb, _tree_rss_kb(os.getpid()))
            self._stop.wait(self.interval)

    def __enter__(self) -> _PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def vote_through_flower(
    scores: np.ndarray,
    candidates: Any,
    *,
    epsilon: float,
    delta: float,
    k: int,
    maximize: bool = True,
    noise: str = "skellam",
    accountant: str | None = None,
    num_shares: float | None = None,
    reconstruction_threshold: float = 0.6,
    count_bytes: bool = False,
) -> dict[str, Any]:
    """Run DP-Hype once over Flower + SecAgg+ with ``n = len(scores)`` simulated clients.

    Returns the selected index, the voting round's wall time measured inside the ServerApp
    (``round_seconds``), the whole simulation's wall time (Ray start-up included) and, with
    ``count_bytes``, the mean per-client upload / download payload in bytes.
    """
    import flwr
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from dphype.client import make_client_app
    from dphype.strategy import run_dphype
    from dphype.task import FixedScoresTask

    scores = np.asarray(scores, dtype=np.float64)
    clients = scores.shape[0]
    results: list[dict[str, Any]] = []
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        start = time.perf_counter()
        result = run_dphype(grid, context, candidates, epsilon=epsilon, delta=delta, k=k, clients=clients,
                            noise=noise, accountant=accountant, num_shares=num_shares,
                            reconstruction_threshold=reconstruction_threshold)
        results.append({"selected_index": result.selected_index, "round_seconds": time.perf_counter() - start,
                        "privacy": result.report.to_dict()})

    def task_fn(context: Context) -> FixedScoresTask:
        return FixedScoresTask(scores[int(context.node_config["partition-id"])], maximize)

    with tempfile.TemporaryDirectory() as folder:
        client_app = make_client_app(task_fn, candidates, mods=[_byte_counter(folder)] if count_bytes else [])
        start = time.perf_counter()
        with _PeakMemory() as memory:
            run_simulation(server_app=server, client_app=client_app,
                           num_supernodes=clients,
                           backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
        wall = time.perf_counter() - start
        if not results:
            raise RuntimeError("the Flower simulation ended without a DP-Hype result")
        out: dict[str, Any] = {**results[0], "clients": clients, "simulation_seconds": wall,
                               "peak_memory_mb": memory.peak_kb / 1024, "flwr_version": flwr.__version__}
        if count_bytes:
            received, sent = [], []
            for path in Path(folder).glob("*.txt"):
                rows = np.loadtxt(path, ndmin=2)
                received.append(rows[:, 0].sum())
                sent.append(rows[:, 1].sum())
            out["nodes_measured"] = len(sent)
            out["upload_bytes_per_client"] = float(np.mean(sent)) if sent else float("nan")
            out["download_bytes_per_client"] = float(np.mean(received)) if received else float("nan")
    return out


def replay_picks(scores: np.ndarray, *, k: int, epsilon: float, delta: float, maximize: bool = True,
                 noise: str = "skellam", accountant: str | None = None, repetitions: int = 2000,
                 seed: int = 0) -> np.ndarray:
    """How often the harness's replay picks each candidate for the same clients' scores and release.

    The reference distribution a single Flower run is compared with (same votes, same calibration;
    Flower's defaults: Skellam noise, RDP accountant).
    """
    from simulations import harness

    votes = harness.client_votes(scores, k, maximize=maximize).sum(axis=0)
    sigma = harness.sigma_for(epsilon, delta, k, num_candidates=scores.shape[1], accountant=accountant, noise=noise)
    noisy = harness.noisy_sums(votes, sigma=sigma, clients=scores.shape[0], repetitions=repetitions,
                               rng=np.random.default_rng(seed), kind=noise)
    return np.bincount(harness.select_rows(noisy), minlength=scores.shape[1]) / repetitions


def flower_check(fed: Any, candidates: Any, scores: np.ndarray, accuracy: np.ndarray, *, k: int, epsilon: float,
                 delta: float) -> dict[str, Any]:
    """The ``--flower`` record of a data-driven study: one real release on the study's cached local scores,
    with the replay's probability of the same pick and the replay's expected accuracy for comparison."""
    eps = epsilon if np.isfinite(epsilon) else 1e6  # Flower needs a finite budget; 1e6 ~ no noise
    out = vote_through_flower(scores, candidates, epsilon=eps, delta=delta, k=k, maximize=True)
    picks = replay_picks(scores, k=k, epsilon=eps, delta=delta)
    out.update({"dataset": fed.dataset, "clients": fed.clients, "partition": fed.label, "epsilon": eps,
                "selected": candidates[out["selected_index"]],
                "selected_accuracy": float(accuracy[out["selected_index"]]),
                "replay_probability_of_selected": float(picks[out["selected_index"]]),
                "replay_expected_accuracy": float(picks @ accuracy)})
    return json.loads(json.dumps(out, default=str))
