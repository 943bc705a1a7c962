"""One DP-Hype release through the real Flower path, for the studies' ``--flower`` checks and Table IV.

The replays of :mod:`simulations.harness` reproduce the release's distribution without Flower. This module
runs a configuration once end to end instead: :class:`dphype.flower.DPHype` in a ServerApp and
:func:`dphype.flower.register_dphype` in every simulated node's ClientApp (pre-flight, top-k votes, its own
noise share, encoding, SecAgg+), all inside ``flwr.simulation.run_simulation`` (deprecated by Flower in favour
of ``flwr run``, but the only in-process simulation entry point for a benchmark that builds its apps in code).
A config with ``release="argmax"`` runs the winner-only release instead: 3 more simulated nodes are the tally
committee, given their roles as the bundled app gives them (:func:`dphype.flower.client.roles.simulated_role`, keys made
first, :func:`dphype.cli.demo.make_tally_keys`), and each client seals shares of its noisy votes to them.
Each client's task returns scores that were already computed by the real task
(:class:`dphype.ml.torch_task.FixedScoresTask`), so the run measures and exercises the voting round itself.

With ``count_bytes=True`` a client mod adds up the serialized size of every message each node receives
and sends (the protobuf ``RecordDict`` content, i.e. the payload on the wire, without transport framing), on every
tally node and on the first `BYTES_SAMPLE` clients by partition: every client of a round gets and sends messages
of the same form (the same graph degree, the same key list), so their mean is the per-client figure, and
serializing all ``n`` clients' messages a second time would add to the very times measured beside it.
``stages`` times the selection stage by stage (:class:`StageClock`): each round trip of the pre-flight, the
SecAgg+ stages or the committee's stages, from its start to the next one's (the server's work between them
included, the last one to the end of the selection), in wall seconds and CPU seconds of this process (the ServerApp
and Flower's simulation engine, one interpreter), of the simulated clients (the Ray actors) and of Ray's other
processes; on a shared machine the CPU seconds are the steadier measure.
``peak_memory_mb`` is the largest resident size of this process and all its descendants (the Ray head and
workers) seen by a sampler every second during the simulation (Linux ``/proc``; each sample reads every
process's ``stat``, so it runs seldom enough to take no noticeable share of the simulation's own interpreter).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.clientapp import ClientApp

from simulations import harness

#: Clients whose messages ``count_bytes`` measures (partitions ``0 .. BYTES_SAMPLE - 1``; every tally node too).
BYTES_SAMPLE = 50


def _byte_counter(folder: str) -> Callable[..., Any]:
    """Client mod: append ``received sent`` payload bytes of every message to ``folder/client-<node>.txt`` on the
    first `BYTES_SAMPLE` clients, or ``folder/tally-<node>.txt`` on a tally node (``dphype-tally-id`` in its node
    config)."""

    def mod(msg: Any, context: Any, call_next: Callable[..., Any]) -> Any:
        from flwr.common.serde import recorddict_to_proto

        from dphype.flower.tally_node import TALLY_ID

        if TALLY_ID not in context.node_config and int(context.node_config["partition-id"]) >= BYTES_SAMPLE:
            return call_next(msg, context)
        received = recorddict_to_proto(msg.content).ByteSize() if msg.has_content() else 0
        reply = call_next(msg, context)
        sent = recorddict_to_proto(reply.content).ByteSize() if reply.has_content() else 0
        role = "tally" if TALLY_ID in context.node_config else "client"
        with open(os.path.join(folder, f"{role}-{context.node_id}.txt"), "a", encoding="utf-8") as fh:
            fh.write(f"{received} {sent}\n")
        return reply

    return mod


def _descendants(root: int) -> dict[int, list[str]]:
    """Process ``root``'s descendants: pid -> the fields of its ``/proc/<pid>/stat`` after the command (Linux)."""
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stats[int(entry)] = fh.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
    tree: dict[int, list[str]] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, fields in stats.items() if fields[1] == str(parent) and pid not in tree]
        tree.update((pid, stats[pid]) for pid in children)
        frontier.extend(children)
    return tree


def _tree_rss_kb(root: int) -> int:
    """Resident kB of process ``root`` and all its descendants (Linux ``/proc``)."""
    total = 0
    for pid in [root, *_descendants(root)]:
        try:
            with open(f"/proc/{pid}/status") as fh:
                total += next((int(line.split()[1]) for line in fh if line.startswith("VmRSS:")), 0)
        except OSError:
            continue
    return total


#: Where the selection's round trips are made (each through ``send_and_receive``, named by its ``what``).
_STAGE_MODULES = ("dphype.flower.server.readiness", "dphype.flower.server.secagg_server",
                  "dphype.flower.server.committee_server")
#: The simulated clients' processes (Flower's Ray actors), by the name Ray gives them.
_CLIENT_PROCESS = b"ray::ClientAppActor"


def _tree_cpu(root: int) -> dict[int, tuple[float, bool]]:
    """CPU seconds (user + system) of each descendant of ``root``, and whether it is a Ray actor (Linux ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid, fields in _descendants(root).items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                client = fh.read().startswith(_CLIENT_PROCESS)
        except OSError:
            continue
        out[pid] = ((int(fields[11]) + int(fields[12])) / tick, client)
    return out


class StageClock:
    """Per-stage wall and CPU seconds of one simulated selection (module docstring): `mark` at each stage's start."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float, float, dict[int, tuple[float, bool]]]] = []

    def mark(self, stage: str) -> None:
        """Start ``stage`` (and end the one before)."""
        self.marks.append((stage, time.perf_counter(), time.process_time(), _tree_cpu(os.getpid())))

    def timed(self, send: Callable[..., Any]) -> Callable[..., Any]:
        """``send_and_receive`` marking the start of its round trip (named by its ``what``)."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.mark(str(kwargs.get("what") or "round trip").removeprefix("DP-Hype ").removeprefix("secure vote "))
            return send(*args, **kwargs)

        return wrapper

    def stages(self) -> list[dict[str, Any]]:
        """One row per stage: ``stage``, ``wall_s``, ``server_cpu_s`` (ServerApp + engine), ``clients_cpu_s``,
        ``ray_cpu_s`` and ``idle_estimate_s``: ``max(server, (server + clients + ray) / cores)``, what the stage would
        take on an idle machine with this process's cores if its CPU time were all it needed (the server's one
        interpreter runs one thread at a time). Under load it runs high: Flower's engine sweeps its store every
        0.1 s while it waits, so the server's CPU grows with the stage's wall time."""
        cores = len(os.sched_getaffinity(0))
        rows = []
        for (stage, wall, server, before), (_, wall_end, server_end, after) in zip(self.marks, self.marks[1:]):
            # a process's CPU in the stage (one that ended during it is left out, one that started counts whole)
            cpu = {"server": server_end - server, "clients": 0.0, "ray": 0.0}
            for pid, (seconds, client) in after.items():
                cpu["clients" if client else "ray"] += seconds - before.get(pid, (0.0, client))[0]
            rows.append({"stage": stage, "wall_s": wall_end - wall, "server_cpu_s": cpu["server"],
                         "clients_cpu_s": cpu["clients"], "ray_cpu_s": cpu["ray"],
                         "idle_estimate_s": max(cpu["server"], sum(cpu.values()) / cores)})
        return rows


class _PeakMemory:
    """Context manager: the peak of :func:`_tree_rss_kb` for this process, sampled every ``interval`` s."""

    def __init__(self, interval: float = 1.0) -> None:
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


def _score_row(path: str, row: int) -> np.ndarray:
    """One node's row of the score table at ``path`` (memory-mapped: a node reads only its own row)."""
    return np.array(np.load(path, mmap_mode="r")[row])


@dataclass(frozen=True)
class _AppSpec:
    """What the simulated nodes' ClientApp is built from: the run's folder, its score table and the nodes' policy."""

    folder: str
    maximize: bool
    voters: int
    tallies: int
    allowed: str  # the admitting policy's node-config keys, as JSON
    count_bytes: bool


class _ShippedApp(ClientApp):  # type: ignore[misc]
    """The benchmark's ClientApp, pickled as its `_AppSpec` and rebuilt once per Ray worker (`_client_app`).

    Flower's simulation pickles the ClientApp into every message to a Ray actor; a plain one carries its handlers by
    value, whose pickling scans every imported module (``cloudpickle``) in the interpreter that also runs the engine
    and the ServerApp, for each of the ``5 n`` messages.
    """

    spec: _AppSpec

    def __reduce__(self) -> tuple[Any, tuple[_AppSpec]]:
        return _client_app, (self.spec,)


@functools.lru_cache(maxsize=4)
def _client_app(spec: _AppSpec) -> _ShippedApp:
    """The simulated nodes' ClientApp (`register_dphype` on every node's fixed scores and admitting policy)."""
    from dphype.flower import register_dphype
    from dphype.flower.client.roles import simulated_role
    from dphype.flower.federation import simulated_federation, voter_name
    from dphype.ml.torch_task import FixedScoresTask
    from dphype.node.policy import IDENTITY_KEY, ROSTER_KEY, NodePolicy

    table, keys = os.path.join(spec.folder, "scores.npy"), Path(spec.folder) / "tallies"
    allowed = json.loads(spec.allowed)

    def task_fn(context: Any) -> FixedScoresTask:
        return FixedScoresTask(_score_row(table, int(context.node_config["partition-id"])), spec.maximize)

    def roles(msg: Any, context: Any, call_next: Callable[..., Any]) -> Any:
        simulated_role(context, spec.voters, spec.tallies, keys)
        return call_next(msg, context)

    def policy(context: Any) -> NodePolicy:
        partition = int(context.node_config["partition-id"])
        ledger = os.path.join(spec.folder, f"ledger-{partition}.json")
        # the run's simulated federation: given by the roles mod in argmax mode, made here in sum mode
        federation = ({key: context.node_config[key] for key in (ROSTER_KEY, IDENTITY_KEY)}
                      if ROSTER_KEY in context.node_config else
                      simulated_federation(spec.folder, context.run_id, voter_name(partition), spec.voters))
        return NodePolicy.from_node_config({**allowed, "dphype-ledger": ledger, **federation})

    mods = ([roles] if spec.tallies else []) + ([_byte_counter(spec.folder)] if spec.count_bytes else [])
    app = _ShippedApp(mods=mods)
    app.spec = spec
    return register_dphype(app, task_fn, policy=policy)


def vote_through_flower(
    scores: np.ndarray,
    candidates: Any,
    config: Any,
    *,
    maximize: bool = True,
    num_shares: float | None = None,
    reconstruction_threshold: float | None = None,
    corrupt_fraction: float | None = None,
    count_bytes: bool = False,
) -> dict[str, Any]:
    """Run DP-Hype once over Flower with ``config.clients = len(scores)`` simulated clients (and, with
    ``config.release = "argmax"``, 3 simulated tally nodes).

    ``config`` is a :class:`dphype.config.DPHypeConfig`. Returns the selected index, the selection's wall
    time measured inside the ServerApp (``round_seconds``: the pre-flight and the SecAgg+ round, or in argmax
    mode finding the committee, the pre-flight, the sealed shares and the tallies' secure argmax), the whole
    simulation's wall time (Ray start-up included) and, with ``count_bytes``, the mean per-client upload /
    download payload in bytes (and in argmax mode the mean per tally node).
    """
    import flwr
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from dphype.cli.demo import make_tally_keys
    from dphype.flower import DPHype
    from dphype.node.ledger import admitting_policy

    scores = np.asarray(scores, dtype=np.float64)
    if config.clients != scores.shape[0]:
        raise ValueError(f"config.clients must equal the number of score rows {scores.shape[0]}, got {config.clients}")
    extra = {} if corrupt_fraction is None else {"corrupt_fraction": corrupt_fraction}
    results: list[dict[str, Any]] = []
    server = ServerApp()

    clock = StageClock()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        start = time.perf_counter()
        clock.mark("set-up (plan, nodes)")
        with contextlib.ExitStack() as stack:
            for name in _STAGE_MODULES:
                module = importlib.import_module(name)
                stack.enter_context(harness.swapped(module, "send_and_receive", clock.timed(module.send_and_receive)))
            result = selection.start(grid)
        clock.mark("end")
        results.append({"selected_index": result.selected_index, "round_seconds": time.perf_counter() - start,
                        "privacy": result.report.to_dict(), "stages": clock.stages()})

    with tempfile.TemporaryDirectory() as folder:
        # Each node reads its own row from a file, as a node reads its local data: the ClientApp that Flower
        # pickles into every message to the Ray actors (`_ShippedApp`) then carries a path, not every client's
        # scores (800 KB at n = 1,000, which would travel through Ray's object store with each of the 5,000 messages).
        table = os.path.join(folder, "scores.npy")
        np.save(table, scores)

        keys = Path(folder) / "tallies"
        tallies = make_tally_keys(keys) if config.mode.uses_committee else ()
        selection = DPHype(candidates, config, num_shares=num_shares,
                           reconstruction_threshold=reconstruction_threshold, tallies=tallies, **extra)
        # The benchmark runs every node: their policy admits this one release, their ledgers are this run's.
        allowed = json.dumps(admitting_policy(selection.request))
        client_app = _client_app(_AppSpec(folder, maximize, config.clients, len(tallies), allowed, count_bytes))
        start = time.perf_counter()
        with _PeakMemory() as memory:
            run_simulation(server_app=server, client_app=client_app, num_supernodes=config.clients + len(tallies),
                           backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
        wall = time.perf_counter() - start
        if not results:
            raise RuntimeError("the Flower simulation ended without a DP-Hype result")
        out: dict[str, Any] = {**results[0], "clients": config.clients, "simulation_seconds": wall,
                               "peak_memory_mb": memory.peak_kb / 1024, "flwr_version": flwr.__version__}
        if count_bytes:
            for role in ("client", "tally") if tallies else ("client",):
                received, sent = [], []
                for path in Path(folder).glob(f"{role}-*.txt"):
                    rows = np.loadtxt(path, ndmin=2)
                    received.append(rows[:, 0].sum())
                    sent.append(rows[:, 1].sum())
                out["nodes_measured" if role == "client" else "tallies_measured"] = len(sent)
                out[f"upload_bytes_per_{role}"] = float(np.mean(sent)) if sent else float("nan")
                out[f"download_bytes_per_{role}"] = float(np.mean(received)) if received else float("nan")
    return out


def replay_picks(scores: np.ndarray, candidates: Any, config: Any, *, maximize: bool = True,
                 repetitions: int = 2000, seed: int = 0) -> np.ndarray:
    """How often the replay picks each candidate for the same clients' scores and release (``config``, a
    :class:`dphype.config.DPHypeConfig`, over ``candidates``): the reference distribution a single Flower run
    is compared with. The same request (:func:`dphype.protocol.make_vote_request`: sigma, dropout, noise), its
    mode's replay (:meth:`dphype.release.ReleaseMode.replay`) and
    the same selection rule as the run."""
    from dphype.protocol import make_vote_request
    from dphype.selection.rules import select_batch

    request = make_vote_request(config, candidates)
    votes = harness.client_votes(scores, config.k, maximize=maximize).sum(axis=0)
    noisy = request.mode.replay(request, votes, repetitions=repetitions, rng=np.random.default_rng(seed))
    picks = select_batch(noisy, candidates.feature_space(), request.sigma, rule=config.rule, clients=config.clients,
                         k=config.k).picks
    return np.bincount(picks, minlength=len(candidates)) / repetitions


def flower_check(fed: Any, candidates: Any, scores: np.ndarray, accuracy: np.ndarray, *, k: int, epsilon: float,
                 delta: float) -> dict[str, Any]:
    """The ``--flower`` record of a data-driven study: one real release on the study's cached local scores,
    with the replay's probability of the same pick and the replay's expected accuracy for comparison."""
    from dphype.config import DPHypeConfig

    eps = epsilon if np.isfinite(epsilon) else 1e6  # Flower needs a finite budget; 1e6 ~ no noise
    config = DPHypeConfig(epsilon=eps, delta=delta, k=k, clients=scores.shape[0])
    out = vote_through_flower(scores, candidates, config, maximize=True)
    picks = replay_picks(scores, candidates, config)
    out.update({"dataset": fed.dataset, "clients": fed.clients, "partition": fed.label, "epsilon": eps,
                "selected": candidates[out["selected_index"]],
                "selected_accuracy": float(accuracy[out["selected_index"]]),
                "replay_probability_of_selected": float(picks[out["selected_index"]]),
                "replay_expected_accuracy": float(picks @ accuracy)})
    return json.loads(json.dumps(out, default=str))
