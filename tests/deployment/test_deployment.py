"""Deployment on loopback: one flower-superlink, five flower-supernode processes, `flwr run` of the sum release,
each started with its operator's script (server/start-superlink.sh, clients/start-voter.sh), one of them killed
once the run has started. The argmax release with three tally SuperNodes (clients/start-tally.sh) and every node
present is the deployment guide's recipe, run as written by tests/deployment/test_readme_deployment.py."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import BIN, FIVE_SHARD_CANDIDATES, REPO, descendants, offline_env, parse_result, stop

from dphype.ml.reference import majority_of_test_split
from simulations.deployment_profile import (
    free_port,
    node_ready,
    superlink_args,
    supernode_args,
    wait_for_port,
    write_node_config,
)

NUM_NODES = 5
#: Seconds one SecAgg+ stage or FedAvg round may wait for the SuperNodes (run config).
ROUND_TIMEOUT = 120


def log_tails(logs: Path, chars: int = 1500) -> str:
    """The end of every process log, for a failure message."""
    files = sorted(logs.glob("*.log"))
    return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-chars:]}" for f in files)


@dataclass
class Federation:
    """A SuperLink on 127.0.0.1 and the SuperNodes started on it, each by its script; every process is stopped by PID
    at the end, with what it started."""

    tmp_path: Path
    env: dict[str, str]
    link_port: int
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def logs(self) -> Path:
        return self.tmp_path / "logs"

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        out = open(self.logs / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        self.procs.append(subprocess.Popen(args, env=self.env, stdout=out, stderr=subprocess.STDOUT))
        return self.procs[-1]

    def start_supernodes(self, nodes: dict[str, tuple[str, list[str], str]]) -> list[subprocess.Popen]:
        """One SuperNode per ``name: (role, options, executor)``, started by ``clients/start-<role>.sh`` with
        ``options`` on a free port, its tasks started by ``executor``
        (:func:`simulations.deployment_profile.supernode_args`: ``forkserver``, a ``dphype superexec`` beside a
        ``flower-supernode --isolation process``; ``subprocess``, Flower's own). Returns, once every SuperNode has
        registered with the SuperLink and every SuperExec has started its fork server, each node's script process
        (the SuperNode and its SuperExec are its children). A node whose script exits, e.g. because its port was
        taken again before it bound it, is restarted up to twice."""

        def start_node(name: str, attempt: int) -> tuple[subprocess.Popen, Path]:
            log = name + (f"-retry{attempt}" if attempt else "")
            role, options, executor = nodes[name]
            return self.start(log, supernode_args(self.link_port, role, options, executor)), self.logs / f"{log}.log"

        names = list(nodes)
        started = [start_node(name, 0) for name in names]
        attempts = [0] * len(names)
        deadline = time.monotonic() + 180
        while not all(node_ready(log.read_text(errors="replace"), nodes[name][2])
                      for name, (_, log) in zip(names, started, strict=True)):
            for i, (proc, _) in enumerate(started):
                if proc.poll() is not None:
                    attempts[i] += 1
                    if attempts[i] > 2:
                        pytest.fail(f"{names[i]} exited three times\n{log_tails(self.logs)}")
                    self.stop([proc])
                    started[i] = start_node(names[i], attempts[i])
            if time.monotonic() > deadline:
                pytest.fail(f"not all SuperNodes registered within 180 s\n{log_tails(self.logs)}")
            time.sleep(0.5)
        return [proc for proc, _ in started]

    def stop(self, procs: list[subprocess.Popen]) -> None:
        """Stop ``procs`` and their children (SIGTERM, then SIGKILL after 10 s)."""
        stop([d for p in procs for d in reversed(descendants(p.pid))] + [p.pid for p in reversed(procs)])
        for proc in procs:
            proc.wait(timeout=15)


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[tuple[Federation, list[subprocess.Popen]]]:
    """A SuperLink and NUM_NODES voter SuperNodes on 127.0.0.1, the last one's tasks on Flower's own SuperExec;
    the federation and the voters' processes."""
    flwr_home = tmp_path / "flwr-home"
    flwr_home.mkdir()
    (tmp_path / "logs").mkdir()
    # Five ClientApp processes share this machine's cores: one torch thread each.
    fed = Federation(tmp_path, {**offline_env(flwr_home), "OMP_NUM_THREADS": "1"}, free_port())
    try:
        # the SuperLink's script also names it `deploy` in the fresh FLWR_HOME's config.toml
        fed.start("superlink", superlink_args(fed.link_port, tmp_path / "state.db"))
        wait_for_port(fed.link_port)
        # each operator's own limits: a vote at epsilon 20 among 5 clients (4 if one vanishes), within a lifetime
        # budget of 40, in a SecAgg+ graph of 2 neighbours (the secure one for 4 or 5 clients)
        policy = write_node_config(tmp_path / "policy.toml", {
            "dphype-max-epsilon": 20, "dphype-min-clients": 4, "dphype-min-neighbours": 2,
            "dphype-lifetime-epsilon": 40, "dphype-allow-unauthenticated": True})  # the guide's recipe: a roster
        # the last voter's tasks on Flower's own SuperExec, so that both ways of serving tasks run (the guide's
        # recipe, tests/deployment/test_readme_deployment.py, runs every node on the warm one)
        nodes = {f"supernode-{i}": ("voter", ["--partition-id", str(i), "--num-partitions", str(NUM_NODES),
                                              "--node-config", str(policy)],
                                    "subprocess" if i == NUM_NODES - 1 else "forkserver") for i in range(NUM_NODES)}
        yield fed, fed.start_supernodes(nodes)
    finally:
        fed.stop(fed.procs)


def flwr_run(fed: Federation, run_config: str, *, kill: subprocess.Popen | None = None) -> dict:
    """``flwr run . deploy`` with ``run_config``; returns the run summary.

    ``kill``: a SuperNode process killed (with its ClientApps) once the run has started.
    """
    logs = fed.logs
    command = [str(BIN / "flwr"), "run", ".", "deploy", "--stream", "--run-config", run_config]
    with subprocess.Popen(
        command, cwd=REPO, env=fed.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    ) as proc:
        if kill is not None:
            deadline = time.monotonic() + 120
            while "Started task" not in (logs / "superlink.log").read_text(errors="replace"):
                assert time.monotonic() < deadline, "the run did not start\n" + log_tails(logs)
                time.sleep(0.2)
            # the node's script, its SuperNode and SuperExec, and every task they started
            stop([*reversed(descendants(kill.pid)), kill.pid], timeout=0.0)
        # The app bounds each message round (SecAgg+ stage, FedAvg round) by
        # round-timeout; this is only the backstop for a stuck CLI.
        try:
            output, _ = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
            tail = output[-3000:].decode(errors="replace")
            pytest.fail(f"flwr run did not finish in 600 s\n{tail}\n{log_tails(logs)}")
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:] + "\n" + log_tails(logs)
    return parse_result(text)


@pytest.mark.slow
@pytest.mark.deployment
def test_deployment_on_loopback_survives_a_vanished_supernode(federation, five_shard_accuracies):
    """A SuperNode killed once the run starts counts as a dropout (xi = 0.2).

    The other four nodes' noisy vote sum is released with the full noise, the pick is a working candidate, and
    FedAvg trains on the four; the node whose tasks Flower's own SuperExec starts serves them to the end.
    """
    fed, voters = federation
    flowers_own = voters[-1]  # the subprocess executor's node
    result = flwr_run(
        fed,
        f"release='sum' k=5 clients={NUM_NODES} dropout=0.2 epsilon=20.0 candidates='{FIVE_SHARD_CANDIDATES}' "
        f"local-epochs=1 fedavg-rounds=1 fraction-evaluate=0.0 round-timeout={ROUND_TIMEOUT} "
        "min-success=0.0 private-evaluation=false "  # 5 nodes, one killed: plumbing, not a useful selection
        f"runs-dir='{fed.tmp_path / 'runs'}'",  # the run folder: the test's, not the checkout's
        kill=voters[0],  # a node of the warm SuperExec
    )
    assert result["clients"] == NUM_NODES
    privacy = result["privacy"]
    assert privacy["clients"] == NUM_NODES and privacy["survivors"] == NUM_NODES - 1
    # Flower's SuperExec served the node's tasks to the end: it survived and answered the FedAvg round
    assert flowers_own.poll() is None and descendants(flowers_own.pid)
    assert "Sending: train message" in (fed.logs / f"supernode-{NUM_NODES - 1}.log").read_text(errors="replace")
    # Four survivors each added sigma^2 / 4 of the noise: epsilon is on target.
    assert privacy["epsilon"] == pytest.approx(20.0, rel=1e-6)
    accuracies = five_shard_accuracies  # NUM_NODES shards
    # a working candidate: within 10 points of Opt (the diverged ones sit 60 points below it); the noisy pick among
    # the working ones is the release's business, measured by the benchmarks, not asserted on one noisy run
    assert accuracies[result["selected_index"]] >= accuracies.max() - 0.10
    # FedAvg trained the pick on the four remaining shards: above the majority baseline, and near what the pick
    # reaches on all five (a working pick may itself sit only a few points above the baseline)
    assert result["accuracy"] > majority_of_test_split("adult")
    assert result["accuracy"] == pytest.approx(accuracies[result["selected_index"]], abs=0.05)
