"""Run a Flower app with ``flwr run`` on a private, local simulation SuperLink (for ``dphype demo``).

Flower deprecates in-process simulation (``run_simulation``) in favour of ``flwr run``. ``flwr run`` with the
default ``local`` connection starts a detached SuperLink on a fixed port that outlives the run, so
`LocalSuperLink` starts its own ``flower-superlink --simulation`` on free loopback ports instead, with a
private ``FLWR_HOME`` naming it as the default connection, submits runs to it, and stops it with every
process it started when done. Nothing is downloaded (runtime dependency installation, telemetry and update
checks are off).
"""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp.grid import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

#: Environment that keeps the Flower CLI offline and quiet.
OFFLINE_ENV: dict[str, str] = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    # Ray's FutureWarning about GPU visibility with num_gpus=0: opt in to the future behaviour now.
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}


def free_port() -> int:
    """A currently unused TCP port on 127.0.0.1.

    Returns:
        The port number.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def toml_value(value: Any) -> str:
    """``value`` as a TOML literal (run-config overrides).

    Args:
        value: A bool, int, finite float or str.

    Returns:
        The TOML literal.

    Raises:
        ValueError: If ``value`` is of another type, or a float that is not finite.
    """
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
    """``values`` in ``--node-config`` / ``--run-config`` syntax: ``key=value`` pairs with TOML values.

    Args:
        values: The keys and their values (bool, int, finite float or str).

    Returns:
        The pairs, separated by spaces.

    Raises:
        ValueError: If a value is not a bool, int, finite float or str (`toml_value`).
    """  # noqa: DOC502
    return " ".join(f"{key}={toml_value(value)}" for key, value in values.items())


def is_flower_app(folder: str | Path) -> bool:
    """Whether ``folder`` holds a Flower app (a pyproject.toml with a ``[tool.flwr.app]`` table).

    Args:
        folder: The folder to look in.

    Returns:
        ``True`` if its pyproject.toml has a ``[tool.flwr.app]`` table.
    """
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
    included), e.g. their node policy under `dphype.node.policy.POLICY_ENV`. Its ``home`` is the private
    ``FLWR_HOME`` (removed by `close`), ``port`` the SuperLink's loopback port, ``env`` the environment the
    SuperLink and ``flwr run`` get, ``process`` the SuperLink's process.

    Args:
        log: The file that receives the SuperLink's output; ``None``: ``superlink.log`` in its private home.
        startup_timeout: Seconds to wait for the SuperLink to listen.
        env: Variables added to the environment of the SuperLink and of everything it starts.
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
        """Wait until the SuperLink listens on its port, or stop it and raise ``RuntimeError``."""  # noqa: DOC501
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
        """``flwr run APP --stream`` with ``run_config`` overrides on ``supernodes`` simulated nodes.

        Args:
            app: The Flower app's folder.
            run_config: The run-config overrides (bool, int, finite float or str values).
            supernodes: How many simulated nodes.
            client_cpus: CPUs each ClientApp actor holds (1: as many parallel clients as cores).
            stdout: Receives the streamed logs; ``None``: inherited.
            timeout: Seconds before the run is killed; ``None``: no limit.

        Returns:
            ``flwr run``'s exit status.

        Raises:
            ValueError: If a run-config value is not a bool, int, finite float or str (`toml_value`).
            subprocess.TimeoutExpired: If the run takes longer than ``timeout``.
        """  # noqa: DOC502
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


# ------------------------------------------------------------------------------------------ in process
def node_id(partition_id: int) -> int:
    """The node ID that `LocalGrid` gives the node with ``partition_id``.

    Args:
        partition_id: The node's ``partition-id``.

    Returns:
        Its node ID, ``1000 + partition_id``.
    """
    return 1000 + partition_id


class LocalGrid(Grid):
    """Deliver each message synchronously to ``client_app`` on one of ``num_nodes`` nodes.

    A grid for tests and in-process runs: node ``i`` (ID `node_id` ``(i)``) has its own ``Context`` whose node
    config holds ``partition-id``, ``num-partitions`` and ``node_config``; a ``silent`` node never replies. It
    records what passed: ``contexts`` (node ID -> its ``Context``), ``sent`` (every message, in order), ``replies``
    (every reply, in order) and ``timeouts`` (the ``timeout`` of every `send_and_receive` call).

    Args:
        client_app: The ClientApp every node runs.
        num_nodes: How many nodes.
        run_config: Every node's run config.
        silent: The partition IDs of the nodes that never reply.
        node_config: Further node-config entries of every node.
        run_id: The run's ID.
    """

    def __init__(
        self,
        client_app: ClientApp,
        num_nodes: int,
        run_config: dict | None = None,
        silent: Iterable[int] = (),
        node_config: dict | None = None,
        run_id: int = 1,
    ):
        self.client_app = client_app
        self.silent = {node_id(i) for i in silent}
        # Messages take their source from the process-wide task identity (as in run_simulation).
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SUPERLINK_NODE_ID
        self._run = Run.create_empty(run_id=run_id)
        self.contexts = {
            node_id(i): Context(
                run_id=run_id,
                node_id=node_id(i),
                node_config={"partition-id": i, "num-partitions": num_nodes, **(node_config or {})},
                state=RecordDict(),
                run_config=dict(run_config or {}),
            )
            for i in range(num_nodes)
        }
        self.sent: list[Message] = []
        self.replies: list[Message] = []
        self._pending: dict[str, Message] = {}
        self.timeouts: list[float | None] = []

    def set_run(self, run: Run) -> None:
        """Set the run this grid belongs to (Flower's ``Grid`` interface).

        Args:
            run: The run.
        """
        self._run = run

    @property
    def run(self) -> Run:
        """The run this grid belongs to (Flower's ``Grid`` interface)."""
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        """A message to ``dst_node_id`` (Flower's ``Grid`` interface).

        Args:
            content: The message's ``RecordDict``.
            message_type: Its type.
            dst_node_id: The node it goes to.
            group_id: Its group ID.
            ttl: Its time to live in seconds; ``None``: Flower's default.

        Returns:
            The message.
        """
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """The IDs of all nodes, silent ones included (Flower's ``Grid`` interface).

        Returns:
            The node IDs.
        """
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message now; its reply waits for `pull_messages` (a silent node never replies).

        Args:
            messages: The messages to deliver.

        Returns:
            The messages' IDs.
        """
        ids = []
        for msg in messages:
            reply = self._deliver(msg)
            ids.append(msg.metadata.message_id)
            if reply is not None:
                self._pending[msg.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies to ``message_ids`` that are waiting, each returned once (Flower's ``Grid`` interface).

        Args:
            message_ids: The IDs `push_messages` returned.

        Returns:
            The waiting replies.
        """
        return [self._pending.pop(i) for i in list(message_ids) if i in self._pending]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        """Deliver each message and return the replies (Flower's ``Grid`` interface); ``timeout`` is recorded.

        Args:
            messages: The messages to deliver.
            timeout: The caller's wait limit (recorded in `timeouts`; a silent node then counts as dropped).

        Returns:
            The replies of the nodes that are not silent (error replies where a ClientApp raised).

        Raises:
            RuntimeError: If a message goes to a silent node without a ``timeout`` (the server would wait forever).
        """
        replies = []
        self.timeouts.append(timeout)
        for msg in messages:
            if msg.metadata.dst_node_id in self.silent and timeout is None:
                raise RuntimeError(
                    f"node {msg.metadata.dst_node_id} never answers: without a timeout "
                    "the server would wait forever"
                )
            reply = self._deliver(msg)
            if reply is not None:
                replies.append(reply)
        return replies

    def _deliver(self, msg: Message) -> Message | None:
        """Hand ``msg`` to its node's ClientApp; the reply (an error reply if the app raised), or None."""
        msg.metadata.__dict__["_message_id"] = str(uuid4())
        self.sent.append(msg)
        if msg.metadata.dst_node_id in self.silent:
            return None
        delivered = copy.deepcopy(msg)  # a transport hands each node its own copy
        try:
            reply = self.client_app(delivered, self.contexts[msg.metadata.dst_node_id])
        except Exception as exc:  # noqa: BLE001 - mirrors the runtime's error replies
            reply = Message(
                Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"{type(exc).__name__}: {exc}"),
                reply_to=delivered,
            )
        self.replies.append(reply)
        return reply
