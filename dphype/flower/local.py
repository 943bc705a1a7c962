"""Run a Flower app with ``flwr run`` on a private, local simulation SuperLink (``dphype run``, ``dphype demo``).

Flower deprecates in-process simulation (``run_simulation``) in favour of ``flwr run``. ``flwr run`` with the
default ``local`` connection starts a detached SuperLink on a fixed port that outlives the run, so
`LocalSuperLink` starts its own ``flower-superlink --simulation`` on free loopback ports instead, with a
private ``FLWR_HOME`` naming it as the default connection, submits runs to it, and stops it with every
process it started when done. Nothing is downloaded (runtime dependency installation, telemetry and update
checks are off). `LocalSuperLink.run` returns the run's own outcome (`RunOutcome`: Flower's status of the run
and the ServerApp's exception), because ``flwr run`` exits 0 when the ServerApp raises.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import weakref
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from uuid import uuid4

from click import ClickException
from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.config import flatten_dict, parse_config_args
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp.grid import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from dphype.flower.federation import federation_set, simulated_federation, tally_name, voter_name
from dphype.flower.tally_node import TALLY_ID, TALLY_KEY_FILE, load_tally_key
from dphype.selection.candidates import CandidateList

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


def check_partition(partition_id: Any, num_partitions: Any, prefix: str = "") -> None:
    """A voter's data shard (``partition-id``, ``num-partitions``): integers with ``0 <= I < N``.

    Args:
        partition_id: ``I``.
        num_partitions: ``N``.
        prefix: Put before both names in the message (``"--"``: a start script's options).

    Raises:
        ValueError: If either is not an integer or ``I`` is outside ``[0, N - 1]``, naming both.
    """
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (partition_id, num_partitions)):
        raise ValueError(f"{prefix}partition-id and {prefix}num-partitions must be integers, got {partition_id!r} and "
                         f"{num_partitions!r}\n(this node's shard of the data and the number of shards)")
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"{prefix}partition-id must be in [0, {num_partitions - 1}] for {prefix}num-partitions "
                         f"{num_partitions}, got {partition_id}")


def node_config_string(values: Mapping[str, Any]) -> str:
    """``values`` as space-separated ``key=value`` pairs with TOML values (`toml_value`), for ``--node-config``."""
    return " ".join(f"{key}={toml_value(value)}" for key, value in values.items())


def app_run_config(folder: str | Path) -> dict[str, Any]:
    """The run config the app in ``folder`` declares (``[tool.flwr.app.config]``, flattened as ``flwr run`` does)."""
    with (Path(folder) / "pyproject.toml").open("rb") as fh:
        return dict(flatten_dict(tomllib.load(fh).get("tool", {}).get("flwr", {}).get("app", {}).get("config", {})))


def app_candidates(folder: str | Path, run_config: Mapping[str, Any]) -> CandidateList | None:
    """The public candidate list of the app in ``folder``: its ServerApp module's ``candidates``, or ``None``.

    ``candidates`` is the list itself (`dphype.selection.candidates.CandidateList`, what ``dphype new`` writes),
    or a function of the run config that returns it (an app whose run config names its candidates, as the bundled
    one's does, and checks its other keys on the way). The module is imported as Flower imports it, with
    ``folder`` first on the path, and forgotten afterwards; ``None`` when it has no such attribute (an app that
    builds its list inside ``main``: its ``k`` is checked only when the ServerApp runs).

    Args:
        folder: The Flower app's folder.
        run_config: The run config with its overrides.

    Returns:
        The candidate list, or ``None``.

    Raises:
        ValueError: If the module does not import, or its ``candidates`` refuses the run config.
    """  # noqa: DOC502
    with (Path(folder) / "pyproject.toml").open("rb") as fh:
        app = tomllib.load(fh).get("tool", {}).get("flwr", {}).get("app", {})
    reference = str(app.get("components", {}).get("serverapp", ""))
    module_name = reference.partition(":")[0]
    if not module_name:
        return None
    found = _module_attribute(Path(folder), module_name, "candidates")
    if inspect.isfunction(found):
        found = found(run_config)
    return found if isinstance(found, CandidateList) else None


def _module_attribute(folder: Path, module_name: str, attribute: str) -> Any:
    """``attribute`` of the app module ``module_name`` imported from ``folder`` (``None``: none), then forgotten.

    Raises:
        ValueError: If the module does not import.
    """
    package = module_name.partition(".")[0]

    def ours() -> list[str]:
        return [name for name in sys.modules if name == package or name.startswith(f"{package}.")]

    shadowed = {name: sys.modules.pop(name) for name in ours()}
    sys.path.insert(0, str(folder))
    try:
        return getattr(importlib.import_module(module_name), attribute, None)
    except Exception as err:
        raise ValueError(f"the app's ServerApp module {module_name} (in {folder}) fails to import: "
                         f"{type(err).__name__}: {err}") from None
    finally:
        sys.path.remove(str(folder))
        for name in ours():
            del sys.modules[name]
        sys.modules.update(shadowed)


def parse_run_config(text: str | None) -> dict[str, Any]:
    """``--run-config`` overrides in ``flwr run``'s syntax (``"k=2 release='argmax'"``, TOML values) or a TOML file.

    Args:
        text: The overrides; ``None`` or empty for none.

    Returns:
        The keys and their values.

    Raises:
        ValueError: If ``text`` is not in that syntax (naming ``--run-config``).
    """
    if not text:
        return {}
    try:
        return dict(parse_config_args([text]))
    except (ValueError, OSError, ClickException) as err:  # Flower's parser raises click's exception
        raise ValueError(f"--run-config must be key=value pairs with TOML values (strings quoted) or a .toml file, "
                         f"got {text!r}\n{err}; e.g. \"release='argmax' k=2\"") from None


def is_flower_app(folder: str | Path) -> bool:
    """Whether ``folder`` holds a Flower app (a pyproject.toml with a ``[tool.flwr.app]`` table)."""
    path = Path(folder) / "pyproject.toml"
    if not path.is_file():
        return False
    with path.open("rb") as fh:
        return "app" in tomllib.load(fh).get("tool", {}).get("flwr", {})


#: The line of ``flwr run`` that names the run it started.
_STARTED = re.compile(r"Successfully started run (\d+)")


def _kill_group(pid: int) -> None:
    """Kill the process group of ``pid`` (a ``flwr run`` past its timeout)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def descendants(pid: int) -> list[int]:
    """The ids of every living process below ``pid`` (children, grandchildren, ...), read from Linux's ``/proc``.

    Processes that started their own session (Flower's SuperExec, Ray's daemons) are included: they stay below
    the process that started them until it exits. Empty where ``/proc`` is not readable.

    Args:
        pid: The ancestor's process id.

    Returns:
        Their process ids, parents before their children.
    """
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":  # a zombie is already gone
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    queue = list(children.get(pid, []))
    while queue:
        child = queue.pop(0)
        found.append(child)
        queue.extend(children.get(child, []))
    return found


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _signal(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids`` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


@dataclass(frozen=True)
class RunOutcome:
    """What became of one `LocalSuperLink.run`: Flower's own status of the run, not ``flwr run``'s exit status.

    Attributes:
        exit_code: ``flwr run``'s exit status (0 also when the ServerApp raised).
        run_id: The run's id, ``None`` when no run was started.
        status: Flower's status of the run (``"finished:completed"``, ``"finished:failed"``, ...); empty when no
            run was started.
        details: Flower's status details (for a failed run, the ServerApp's exception).
        tail: The last lines ``flwr run`` printed.
        timed_out: Whether the timeout passed before the run finished.
    """

    exit_code: int
    run_id: int | None
    status: str
    details: str
    tail: tuple[str, ...]
    timed_out: bool = False

    @property
    def completed(self) -> bool:
        """Whether the run finished and its ServerApp returned (``finished:completed``)."""
        return self.status == "finished:completed" and not self.timed_out

    def cause(self) -> str:
        """One line naming why the run did not complete (empty if it did).

        Returns:
            The cause: the ServerApp's exception, the timeout, or ``flwr run``'s last line when it started no run.
        """
        if self.completed:
            return ""
        if self.run_id is None:
            last = next((line.strip() for line in reversed(self.tail) if line.strip()), "no output")
            return f"flwr run started no run (exit status {self.exit_code}): {last}"
        if self.timed_out and not self.status.startswith("finished"):
            return f"run {self.run_id} did not finish in time (status {self.status or 'unknown'})"
        details = " ".join(self.details.split()) or "no details"
        return f"run {self.run_id} ended {self.status}: {details}"


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
        # Ray's session folders (the simulation's) go to a folder of their own, which close removes: beside the home,
        # with a short name, as Ray's Unix socket paths below it (ray/session_<date>_<pid>/sockets/plasma_store, 67
        # bytes) must fit AF_UNIX's 107
        self._ray = tempfile.TemporaryDirectory(prefix="r", ignore_cleanup_errors=True)
        self.env = {**os.environ, **OFFLINE_ENV, **(env or {}), "FLWR_HOME": str(self.home),
                    "RAY_TMPDIR": self._ray.name,
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        self._log = open(log if log is not None else self.home / "superlink.log", "w")  # noqa: SIM115
        self.process = subprocess.Popen(
            ["flower-superlink", "--insecure", "--simulation", "--isolation", "subprocess", "--host", "127.0.0.1",
             "--port", str(self.port), "--health-server-address", f"127.0.0.1:{free_port()}",
             "--database", str(self.home / "state.db")],
            env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        started = False
        try:
            self._wait_until_listening(startup_timeout)
            started = True
        finally:
            if not started:  # a signal (KeyboardInterrupt) during the start-up too: nothing stays behind
                self.close()

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
            stdout: Any = None, timeout: float | None = None) -> RunOutcome:
        """``flwr run APP --stream`` with ``run_config`` overrides on ``supernodes`` simulated nodes, and its outcome.

        ``flwr run`` exits 0 when the ServerApp raises, and its stream may end before the run does; the outcome is
        the run's own status in the SuperLink (``flwr ls``), waited for until it is finished.

        Args:
            app: The Flower app's folder.
            run_config: The run-config overrides (bool, int, finite float or str values).
            supernodes: How many simulated nodes.
            client_cpus: CPUs each ClientApp actor holds (1: as many parallel clients as cores).
            stdout: Receives the streamed logs (any object with ``write``); ``None``: this process's stdout.
            timeout: Seconds before the run is given up (``flwr run`` killed); ``None``: no limit.

        Returns:
            The run's outcome (`RunOutcome`: ``timed_out`` when ``timeout`` passed first).

        Raises:
            ValueError: If a run-config value is not a bool, int, finite float or str (`toml_value`).
        """  # noqa: DOC502
        overrides = self.home / "run-config.toml"
        overrides.write_text("".join(f"{key} = {toml_value(value)}\n" for key, value in run_config.items()))
        command = ["flwr", "run", str(app), "--stream", "--run-config", str(overrides),
                   "--federation-config",
                   f"num-supernodes={int(supernodes)} client-resources-num-cpus={int(client_cpus)}"]
        out = sys.stdout if stdout is None else stdout
        deadline = None if timeout is None else time.monotonic() + timeout
        tail: deque[str] = deque(maxlen=40)
        run_id = None
        killed = threading.Event()  # set when the timeout killed flwr run

        def kill(pid: int) -> None:
            killed.set()
            _kill_group(pid)

        with subprocess.Popen(command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace", start_new_session=True) as flwr:
            timer = None if timeout is None else threading.Timer(timeout, kill, (flwr.pid,))
            if timer is not None:
                timer.start()
            finished = False
            try:
                assert flwr.stdout is not None
                for line in flwr.stdout:
                    out.write(line)
                    out.flush()
                    tail.append(line.rstrip())
                    started = _STARTED.search(line)
                    if started and run_id is None:
                        run_id = int(started.group(1))
                code = flwr.wait()
                finished = True
            finally:
                if not finished:  # stopped (a signal, KeyboardInterrupt): flwr run runs in its own session
                    _kill_group(flwr.pid)
                if timer is not None:
                    timer.cancel()
        status, details = ("", "") if run_id is None else self._status(run_id, deadline)
        timed_out = killed.is_set() or (deadline is not None and bool(status) and not status.startswith("finished"))
        return RunOutcome(code, run_id, status, details, tuple(tail), timed_out)

    def _status(self, run_id: int, deadline: float | None) -> tuple[str, str]:
        """The run's status and details (``flwr ls``), polled until it is finished or ``deadline`` passes.

        An unreadable answer returns at once (empty status, ``flwr ls``'s output as the details).
        """
        while True:
            done = subprocess.run(["flwr", "ls", "--run-id", str(run_id), "--format", "json"], env=self.env,
                                  capture_output=True, text=True, check=False)
            try:
                runs = json.loads(done.stdout)["runs"]
                status, details = str(runs[0]["status"]), str(runs[0]["status-details"])
            except (ValueError, KeyError, IndexError, TypeError):
                status, details = "", f"flwr ls failed: {(done.stdout + done.stderr).strip()[-300:]}"
            if not status or status.startswith("finished") or (deadline is not None and time.monotonic() >= deadline):
                return status, details
            time.sleep(1.0)

    def close(self) -> None:
        """Stop the SuperLink and everything it started, then remove the private home.

        Everything it started: its process group and every process below it (`descendants`: the SuperExec and
        Ray's processes start sessions of their own), found before any is stopped, so none escapes to ``init``.
        """
        family = descendants(self.process.pid)
        if self.process.poll() is None:
            for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.process.pid, sig)
                except ProcessLookupError:
                    break
                _signal(family, sig)
                try:
                    self.process.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:  # children that outlived the SuperLink in its group
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + 5.0
        while any(_alive(pid) for pid in family) and time.monotonic() < deadline:
            _signal((pid for pid in family if _alive(pid)), signal.SIGKILL)
            time.sleep(0.1)
        self._log.close()
        self._home.cleanup()
        self._ray.cleanup()

    def __enter__(self) -> LocalSuperLink:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        try:
            self.close()
        except KeyboardInterrupt:  # a stop during the clean-up (`dphype.cli.Stopped`): finish it first
            self.close()
            raise


# ------------------------------------------------------------------------------------------ in process
def node_id(partition_id: int) -> int:
    """The node ID that `LocalGrid` gives the node with ``partition_id``: ``1000 + partition_id``."""
    return 1000 + partition_id


class LocalGrid(Grid):
    """Deliver each message synchronously to ``client_app`` on one of ``num_nodes`` nodes.

    A grid for tests and in-process runs: node ``i`` (ID `node_id` ``(i)``) has its own ``Context``; a ``silent``
    node never replies. With ``federation`` its nodes join a roster of their own
    (`dphype.flower.federation.simulated_federation`) in a temporary folder made at the first delivery: nodes with
    ``dphype-tally-id`` are its tallies, the others voters; a node whose node config sets its own federation keeps
    it. It records ``contexts``, ``sent``, ``replies``, ``timeouts`` and ``folder`` (the roster's).

    Args:
        client_app: The ClientApp every node runs.
        num_nodes: How many nodes.
        run_config: Every node's run config.
        silent: The partition IDs of the nodes that never reply.
        node_config: Further node-config entries of every node.
        run_id: The run's ID.
        federation: Whether to make the nodes members of a roster of their own (above).
    """

    def __init__(
        self,
        client_app: ClientApp,
        num_nodes: int,
        run_config: dict | None = None,
        silent: Iterable[int] = (),
        node_config: dict | None = None,
        run_id: int = 1,
        federation: bool = True,
    ):
        self.client_app = client_app
        self._federation = federation
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
        self.folder: Path | None = None
        self.sent: list[Message] = []
        self.replies: list[Message] = []
        self._pending: dict[str, Message] = {}
        self.timeouts: list[float | None] = []

    def set_run(self, run: Run) -> None:
        """Set the run this grid belongs to (Flower's ``Grid`` interface)."""
        self._run = run

    @property
    def run(self) -> Run:
        """The run this grid belongs to (Flower's ``Grid`` interface)."""
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        """A message to ``dst_node_id`` (Flower's ``Grid`` interface)."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """The IDs of all nodes, silent ones included (Flower's ``Grid`` interface)."""
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message now and return their IDs; a reply waits for `pull_messages`."""
        ids = []
        for msg in messages:
            reply = self._deliver(msg)
            ids.append(msg.metadata.message_id)
            if reply is not None:
                self._pending[msg.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies to ``message_ids`` that are waiting, each returned once (Flower's ``Grid`` interface)."""
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

    def federate(self) -> None:
        """Make the nodes members of this grid's roster now (class docstring); once, and only with ``federation``.

        The first delivered message does it; a test that changes a node's roster before any message calls it.
        """
        if not self._federation:
            return
        self._federation = False
        folder = tempfile.mkdtemp(prefix="dphype-localgrid-")  # private (0700), this grid's own
        self.folder = Path(folder)
        weakref.finalize(self, shutil.rmtree, folder, True)  # removed with the grid, or at exit
        tallies = sorted((int(c.node_config[TALLY_ID]), c) for c in self.contexts.values() if TALLY_ID in c.node_config)
        voters = [c for _, c in sorted((int(c.node_config["partition-id"]), c) for c in self.contexts.values()
                                       if TALLY_ID not in c.node_config)]
        committee = [load_tally_key(str(c.node_config[TALLY_KEY_FILE])).public for _, c in tallies]
        members = [(voter_name(i), c) for i, c in enumerate(voters)] + [(tally_name(j), c) for j, c in tallies]
        for name, context in members:
            if not federation_set(context.node_config):
                context.node_config.update(simulated_federation(folder, context.run_id, name, len(voters), committee))

    def _deliver(self, msg: Message) -> Message | None:
        """Hand ``msg`` to its node's ClientApp; the reply (an error reply if the app raised), or None."""
        self.federate()
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
