"""A warm SuperExec for SuperNodes: every ClientApp task forked from a process that has imported its code once.

Flower's SuperNode serves each message in a new ``flwr-clientapp`` process that ``flower-superexec`` starts as a
fresh interpreter, which spends seconds of CPU on imports before it reads the message (``python -m
simulations.clientapp_costs`` measures it).

`ForkserverExecutor` implements the SuperExec's ``Executor`` protocol by starting each ClientApp task as a child
of Python's fork server, which imported Flower's ClientApp runtime and the ``preload`` modules once. The child
runs Flower's own ``run_clientapp`` for the task's token, as ``flwr-clientapp --token`` would: one task, one
process; only the interpreter start and the imports are shared. `serve` is Flower's SuperExec loop with this
executor (``dphype superexec``, beside a ``flower-supernode --isolation process``).

A forked task shares with its siblings only module code and constants: nothing secret exists at import time in
`dphype` (every noise share, key and mask is drawn from ``os.urandom`` when a message is served), and NumPy's
legacy global generator is reseeded per task (`fresh_process_state`). It uses the SuperExec pieces of Flower
1.41 and 1.42 (``AutoExecPlugin``, ``RuntimeHttpClient``, ``AcquireTaskRequest``, ``run_clientapp``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import signal
import time
from collections.abc import Sequence
from logging import INFO, WARNING
from multiprocessing import forkserver
from typing import Any

from flwr.supercore.constant import TaskType
from flwr.supercore.superexec.executor import ExecutionSpec, LaunchResult
from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor

#: Modules every fork-server child has imported: Flower's ClientApp runtime and DP-Hype's protocol handlers.
RUNTIME_MODULES: tuple[str, ...] = ("flwr.supernode.runtime.run_clientapp", "flwr.clientapp", "dphype.flower.client")
#: Seconds between two task requests to the SuperNode (Flower's SuperExec waits 1 s); the idle CPU cost is
#: measured by ``python -m simulations.deployment_profile --idle 30``.
DEFAULT_POLL_INTERVAL = 0.5
#: Seconds the running tasks and the fork server get to exit on SIGTERM when the SuperExec stops, before SIGKILL.
STOP_GRACE = 5.0


def check_preload(preload: Sequence[str]) -> tuple[str, ...]:
    """The fork server's modules: `RUNTIME_MODULES` plus ``preload``, each checked to be importable here.

    Args:
        preload: Installed libraries your ClientApp imports, e.g. ``torch``; not modules of the app's FAB, which
            Flower's loader would then never re-import.

    Returns:
        The modules, without repeats, `RUNTIME_MODULES` first.

    Raises:
        ValueError: If a module cannot be imported in this environment.
    """
    modules = tuple(dict.fromkeys((*RUNTIME_MODULES, *preload)))
    for name in modules:
        try:
            found = bool(name) and importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a missing parent package
            found = False
        if not found:
            raise ValueError(f"preload: module {name!r} cannot be imported in this environment")
    return modules


def fresh_process_state() -> None:
    """Reseed NumPy's legacy global generator, copied from the fork server (DP-Hype's randomness is drawn fresh)."""
    import numpy as np  # lazy import: the SuperExec's own loop never needs numpy

    np.random.seed()


def _run_task(runtime_api_address: str, token: str, insecure: bool, root_certificates_path: str | None,
              parent_pid: int | None, runtime_dependency_install: bool) -> None:
    """In the forked child: what ``flwr-clientapp --token`` does, without starting an interpreter."""
    # lazy import: Flower's ClientApp runtime, in the forked child only (the fork server preloads it)
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    fresh_process_state()
    run_clientapp(runtime_api_address=runtime_api_address, token=token, insecure=insecure,
                  certificates=validate_and_resolve_root_certificates(root_certificates_path, insecure),
                  parent_pid=parent_pid, runtime_dependency_install=runtime_dependency_install)


class ForkserverExecutor:
    """Flower's SuperExec ``Executor`` that forks ClientApp tasks from a warm fork server.

    Other task types (a SuperNode sends none) go to Flower's `SubprocessExecutor`. ``start()`` starts
    the fork server (importing `RUNTIME_MODULES` and ``preload``) before the first task arrives. Its ``modules``
    are the modules the fork server imports.

    Args:
        preload: Further installed modules for the fork server to import (`check_preload` raises
            ``ValueError`` for one that cannot be imported).
    """

    def __init__(self, preload: Sequence[str] = ()) -> None:
        self.modules = check_preload(preload)
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(list(self.modules))
        self._fallback = SubprocessExecutor()
        self._children: list[Any] = []

    def start(self) -> None:
        """Start the fork server now (its imports take the seconds every task would otherwise spend)."""
        forkserver.ensure_running()

    def get_eligible_capacity(self, supported_task_types: set[TaskType], *, insecure: bool = False,
                              root_certificates_path: str | None = None) -> tuple[set[TaskType], set[str]]:
        """``supported_task_types`` and no FAB hashes: a forked task needs no extra capacity (``Executor``)."""
        del insecure, root_certificates_path
        return supported_task_types, set()

    def wait_for_capacity(self, task_type: TaskType | None = None, *, fab_hash: str | None = None,
                          insecure: bool = False, root_certificates_path: str | None = None) -> None:
        """Return at once: a forked task needs no capacity to wait for (the ``Executor`` protocol)."""
        del task_type, fab_hash, insecure, root_certificates_path

    def launch(self, spec: ExecutionSpec) -> LaunchResult:
        """Start one task: a ClientApp task as a child of the fork server, any other by Flower's `SubprocessExecutor`.

        Args:
            spec: The task to run.

        Returns:
            Accepted, or failed with the reason if the fork server cannot start the child.
        """
        if spec.task_type != TaskType.CLIENT_APP:
            return self._fallback.launch(spec)
        child = self._context.Process(
            target=_run_task, name=f"flwr-clientapp-task-{spec.task_id}",
            args=(spec.runtime_api_address, spec.token, spec.insecure, spec.root_certificates_path, spec.parent_pid,
                  spec.runtime_dependency_install))
        try:
            child.start()
        except OSError as err:
            return LaunchResult.failed(f"fork server could not start the task: {err}")
        self._children.append(child)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap finished tasks (``is_alive`` joins a child that has exited)."""
        self._children = [child for child in self._children if child.is_alive()]

    def close(self) -> None:
        """Stop everything this executor started, as the SuperExec stops: the running tasks, then the fork server.

        A task gets SIGTERM and, after `STOP_GRACE` seconds, SIGKILL: left running, it would wait on a SuperNode
        that is stopping too. The fork server gets SIGTERM at once: busy with its ``preload`` imports, it would
        notice the SuperExec's exit only seconds later.
        """
        deadline = time.monotonic() + STOP_GRACE
        for child in self._children:
            child.terminate()
        for child in self._children:
            child.join(max(0.0, deadline - time.monotonic()))
            if child.is_alive():
                child.kill()
                child.join(1.0)
        self._children = []
        # multiprocessing stops its fork server only through these private members (its own tests' way); _stop
        # closes the server's pipe, reaps it and forgets it, so that a later start begins a new one
        server: Any = forkserver._forkserver
        pid = getattr(server, "_forkserver_pid", None)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            server._stop()


def serve(runtime_api_address: str, *, insecure: bool, root_certificates_path: str | None = None,
          preload: Sequence[str] = (), poll_interval: float = DEFAULT_POLL_INTERVAL,
          parent_pid: int | None = None) -> None:
    """Flower's SuperExec loop with `ForkserverExecutor`.

    Asks the SuperNode's Runtime API for a task every ``poll_interval`` seconds and launches it. Runs until stopped
    (SIGINT/SIGTERM, or ``parent_pid`` exiting).

    Args:
        runtime_api_address: The SuperNode's Runtime API, ``host:port``.
        insecure: Connect without TLS.
        root_certificates_path: The CA certificates for TLS; ``None``: the system's.
        preload: Further installed modules for the fork server to import (`check_preload`).
        poll_interval: Seconds between two task requests, in ``[0.01, 60]``.
        parent_pid: A process whose exit stops the loop; ``None``: none.

    Raises:
        ValueError: If ``poll_interval`` is outside ``[0.01, 60]`` or a ``preload`` module cannot be imported.
    """
    # lazy import: the loop's Flower modules, only when it serves (not for `dphype superexec --help`)
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore import log
    from flwr.supercore.app_utils import start_parent_process_monitor
    from flwr.supercore.exit import register_signal_handlers
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.superexec.plugin import AutoExecPlugin
    from flwr.supercore.telemetry import EventType
    from flwr.supercore.tls import validate_and_resolve_root_certificates

    if not 0.01 <= poll_interval <= 60:
        raise ValueError(f"poll_interval must be in [0.01, 60] seconds, got {poll_interval!r}")
    executor = ForkserverExecutor(preload)
    client = RuntimeHttpClient.from_server_address(
        server_address=runtime_api_address, insecure=insecure,
        root_certificates=validate_and_resolve_root_certificates(root_certificates_path, insecure),
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
        retry_invoker=make_simple_http_retry_invoker())
    # before the fork server starts: a stop from now on stops it too
    register_signal_handlers(event_type=EventType.RUN_SUPEREXEC_LEAVE, exit_message="DP-Hype SuperExec stopped.",
                             exit_handlers=[client.close, executor.close])
    started = time.perf_counter()
    executor.start()
    log(INFO, "DP-Hype SuperExec: fork server ready in %.1f s (preloaded %s); polling %s every %g s",
        time.perf_counter() - started, ", ".join(executor.modules), runtime_api_address, poll_interval)
    if parent_pid is not None:
        start_parent_process_monitor(parent_pid)
    plugin = AutoExecPlugin(runtime_api_address=runtime_api_address, insecure=insecure,
                            root_certificates_path=root_certificates_path, executor=executor)
    try:
        while True:
            executor.reconcile()
            types, fab_hashes = executor.get_eligible_capacity(set(plugin.supported_task_types))
            reply = client.AcquireTask(AcquireTaskRequest(supported_task_types=types,
                                                          agentapp_fab_hashes=fab_hashes))
            if reply.HasField("task") and reply.token:
                result = plugin.launch_task(token=reply.token, task=reply.task)
                if result.status != "accepted":
                    log(WARNING, "DP-Hype SuperExec: task %d not launched (%s): %s", reply.task.task_id,
                        result.status, result.message)
                continue  # another task may be waiting: ask again at once
            time.sleep(poll_interval)
    finally:
        client.close()
        executor.close()
