"""Run a Flower app with ``flwr run`` on a private, local simulation SuperLink (for ``dphype demo``).

Flower deprecates in-process simulation (``run_simulation``) in favour of ``flwr run``. ``flwr run`` with the
default ``local`` connection starts a detached SuperLink on a fixed port that outlives the run, so
:class:`LocalSuperLink` starts its own ``flower-superlink --simulation`` on free loopback ports instead, with a
private ``FLWR_HOME`` naming it as the default connection, submits runs to it, and stops it with every
process it started when done. Nothing is downloaded (runtime dependency installation, telemetry and update
checks are off).
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

#: Environment that keeps the Flower CLI offline and quiet.
OFFLINE_ENV: dict[str, str] = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    # Ray's FutureWarning about GPU visibility with num_gpus=0: opt in to the future behaviour now.
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}


def free_port() -> int:
    """A currently unused TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def toml_value(value: Any) -> str:
    """``value`` as a TOML literal (run-config overrides)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"run-config values must be finite, got {value!r}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    raise ValueError(f"run-config values must be bool, int, float or str, got {type(value).__name__}")


def node_config_string(values: Mapping[str, Any]) -> str:
    """``values`` in ``--node-config`` / ``--run-config`` syntax: ``key=value`` pairs with TOML values."""
    return " ".join(f"{key}={toml_value(value)}" for key, value in values.items())


def is_flower_app(folder: str | Path) -> bool:
    """Whether ``folder`` holds a Flower app (a pyproject.toml with a ``[tool.flwr.app]`` table)."""
    import tomllib

    path = Path(folder) / "pyproject.toml"
    if not path.is_file():
        return False
    with path.open("rb") as fh:
        return "app" in tomllib.load(fh).get("tool", {}).get("flwr", {})


class LocalSuperLink:
    """A ``flower-superlink --simulation`` of this process on free loopback ports; a context manager.

    ``log`` receives the SuperLink's own output. ``run`` submits an app and streams its logs. ``env`` adds
    variables to the environment of the SuperLink and of everything it starts (the simulated nodes' ClientApps
    included), e.g. their node policy under :data:`dphype.policy.POLICY_ENV`.
    """

    def __init__(self, *, log: Path | None = None, startup_timeout: float = 60.0,
                 env: Mapping[str, str] | None = None) -> None:
        self._home = tempfile.TemporaryDirectory(prefix="dphype-flwr-home-")
        self.home = Path(self._home.name)
        self.port = free_port()
        (self.home / "config.toml").write_text(
            '[superlink]\ndefault = "dphype-local"\n\n'
            f'[superlink.dphype-local]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n')
        self.env = {**os.environ, **OFFLINE_ENV, **(env or {}), "FLWR_HOME": str(self.home),
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        self._log = open(log if log is not None else self.home / "superlink.log", "w")  # noqa: SIM115
        self.process = subprocess.Popen(
            ["flower-superlink", "--insecure", "--simulation", "--isolation", "subprocess", "--host", "127.0.0.1",
             "--port", str(self.port), "--health-server-address", f"127.0.0.1:{free_port()}",
             "--database", str(self.home / "state.db")],
            env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_until_listening(startup_timeout)

    def _wait_until_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.close()
                raise RuntimeError(f"flower-superlink exited with code {self.process.returncode} at start-up")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"flower-superlink did not listen on 127.0.0.1:{self.port} within {timeout:g} s")

    def run(self, app: str | Path, *, run_config: Mapping[str, Any], supernodes: int, client_cpus: int = 1,
            stdout: Any = None, timeout: float | None = None) -> int:
        """``flwr run APP --stream`` with ``run_config`` overrides on ``supernodes`` simulated nodes, each
        ClientApp actor holding ``client_cpus`` CPUs (1: as many parallel clients as cores); returns the exit
        status. ``stdout`` receives the streamed logs (default: inherited)."""
        overrides = self.home / "run-config.toml"
        overrides.write_text("".join(f"{key} = {toml_value(value)}\n" for key, value in run_config.items()))
        command = ["flwr", "run", str(app), "--stream", "--run-config", str(overrides),
                   "--federation-config",
                   f"num-supernodes={int(supernodes)} client-resources-num-cpus={int(client_cpus)}"]
        try:
            stdout.fileno() if stdout is not None else None
            target = stdout
        except (AttributeError, OSError, ValueError):  # a stream without a file (e.g. captured by a test)
            target = subprocess.PIPE
        done = subprocess.run(command, env=self.env, stdout=target, stderr=subprocess.STDOUT, timeout=timeout,
                              check=False, text=True)
        if target is subprocess.PIPE:
            stdout.write(done.stdout)
        return done.returncode

    def close(self) -> None:
        """Stop the SuperLink and everything it started (its process group), then remove the private home."""
        if self.process.poll() is None:
            for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.process.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:  # children that outlived the SuperLink in its group
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._log.close()
        self._home.cleanup()

    def __enter__(self) -> LocalSuperLink:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
