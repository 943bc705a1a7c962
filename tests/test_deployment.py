"""Deployment on loopback: one flower-superlink, five flower-supernode processes, `flwr run`."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_flwr_run import BIN, REPO, descendants, offline_env, parse_result, stop

NUM_NODES = 5


def free_port() -> int:
    """A currently unused TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A SuperLink and NUM_NODES SuperNodes on 127.0.0.1, each started and stopped by PID."""
    flwr_home = tmp_path / "flwr-home"
    flwr_home.mkdir()
    # Five ClientApp processes share this machine's cores: one torch thread each.
    env = {**offline_env(flwr_home), "OMP_NUM_THREADS": "1"}
    link_port = free_port()
    (flwr_home / "config.toml").write_text(
        '[superlink]\ndefault = "deploy"\n\n'
        f'[superlink.deploy]\naddress = "127.0.0.1:{link_port}"\ninsecure = true\n'
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []

    def start(name: str, args: list[str]) -> None:
        out = open(logs / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        procs.append(subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT))

    try:
        start(
            "superlink",
            [
                str(BIN / "flower-superlink"),
                "--insecure",
                "--disable-runtime-dependency-installation",
                "--database",
                str(tmp_path / "state.db"),
                "--host",
                "127.0.0.1",
                "--port",
                str(link_port),
            ],
        )
        wait_for_port(link_port)
        for i in range(NUM_NODES):
            start(
                f"supernode-{i}",
                [
                    str(BIN / "flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{link_port}",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    f"partition-id={i} num-partitions={NUM_NODES}",
                ],
            )
        yield tmp_path, env
    finally:
        pids = [p.pid for p in procs]
        stop([d for pid in pids for d in reversed(descendants(pid))] + list(reversed(pids)))
        for proc in procs:
            proc.wait(timeout=15)


@pytest.mark.slow
def test_deployment_on_loopback(federation):
    tmp_path, env = federation
    done = subprocess.run(
        [
            str(BIN / "flwr"),
            "run",
            ".",
            "deploy",
            "--stream",
            "--run-config",
            f"clients={NUM_NODES} epsilon=20.0 candidates='table3:random:10:0' local-epochs=1 fedavg-rounds=1",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    result = parse_result(output)
    assert result["clients"] == NUM_NODES
    assert result["privacy"]["survivors"] == NUM_NODES
    assert result["accuracy"] > 0.7
