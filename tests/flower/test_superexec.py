"""The warm SuperExec (:mod:`dphype.flower.superexec`): forked tasks share no randomness, bad options are refused
before anything starts. Its end-to-end use (a SuperNode in process isolation serving a whole selection) is the
voters' setup in ``tests/deployment/test_deployment.py``."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest
from helpers import REPO

from dphype.cli import main as cli_main
from dphype.flower.superexec import RUNTIME_MODULES, ForkserverExecutor, check_preload, fresh_process_state, serve


def _draws(queue: multiprocessing.Queue, reseed: bool) -> None:
    """In a forked child: what a task would draw from numpy's legacy global generator and from the client's
    secure generator."""
    import numpy as np

    from dphype.privacy.noise import client_noise_share

    if reseed:
        fresh_process_state()
    noise = client_noise_share(8, sigma=10.0, clients=4, dropout=0.0, kind="skellam")
    queue.put((int(np.random.randint(2**31)), tuple(int(v) for v in noise)))


def test_tasks_forked_from_the_warm_process_draw_independent_noise():
    executor = ForkserverExecutor()
    executor.start()
    context = multiprocessing.get_context("forkserver")
    queue = context.Queue()

    def draws(reseed: bool) -> list[tuple[int, tuple[int, ...]]]:
        children = [context.Process(target=_draws, args=(queue, reseed)) for _ in range(3)]
        for child in children:
            child.start()
        out = [queue.get(timeout=60) for _ in children]
        for child in children:
            child.join(timeout=30)
            assert child.exitcode == 0
        return out

    copied = draws(reseed=False)
    # the hazard is real: numpy's legacy global state is the fork server's copy in every child ...
    assert len({legacy for legacy, _ in copied}) == 1
    # ... but the vote noise never came from it: every child's share is its own
    assert len({share for _, share in copied}) == 3
    fresh = draws(reseed=True)  # what every task does first
    assert len({legacy for legacy, _ in fresh}) == 3
    assert len({share for _, share in fresh}) == 3


def test_preload_names_a_module_that_cannot_be_imported():
    assert check_preload(["json"]) == (*RUNTIME_MODULES, "json")
    with pytest.raises(ValueError, match="preload: module 'no_such_module_here'"):
        check_preload(["no_such_module_here"])
    with pytest.raises(ValueError, match="preload: module 'dphype.no_such_package.module'"):
        check_preload(["dphype.no_such_package.module"])  # a missing parent package, not a traceback
    with pytest.raises(ValueError, match="poll_interval must be in"):
        serve("127.0.0.1:1", insecure=True, poll_interval=0.0)


@pytest.mark.parametrize("argv, message", [
    (["--runtime-api-address", "nohost"], "--runtime-api-address must be HOST:PORT"),
    (["--runtime-api-address", "127.0.0.1:9094"], "--root-certificates is required unless --insecure"),
    (["--runtime-api-address", "127.0.0.1:9094", "--insecure", "--preload", "no_such_module_here"],
     "preload: module"),
    (["--runtime-api-address", "127.0.0.1:9094", "--insecure", "--poll-interval", "0"], "poll_interval must be in"),
])
def test_the_command_refuses_bad_options_before_it_starts(argv, message, capsys):
    assert cli_main(["superexec", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("names", "loaded"), [("adult", 1), (" adult , ", 1), ("", 0)])
def test_the_fork_servers_warm_module_parses_the_named_data_sets_once_for_every_task(names, loaded):
    # what `dphype superexec --preload dphype.app.warm` does in the fork server (clients/start-voter.sh)
    probe = ("import dphype.app.warm\n"
             "from dphype.ml.torch_task import _load_cached, load_cached\n"
             "print(_load_cached.cache_info().currsize)\n"
             "load_cached('adult')\n"  # what a task's make_task asks: found, not parsed again
             "print(_load_cached.cache_info().misses)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO), "DPHYPE_WARM_DATA": names}).stdout.split()
    assert out == [str(loaded), "1"]


@pytest.mark.slow
def test_a_stopped_superexec_stops_its_tasks_and_its_fork_server(tmp_path):
    """SIGTERM (what clients/start-voter.sh sends it when its node stops): the running task and the fork server end
    with it (the fork server, still importing, outlived it by seconds; a task waited on the SuperNode).
    Its Runtime API here is a closed port: it keeps retrying until stopped."""
    import signal
    import time

    from helpers import descendants, free_ports_in_a_row, running

    script = ("import time; from dphype.flower.superexec import ForkserverExecutor, serve\n"
              "start = ForkserverExecutor.start\n"  # one long task, as soon as the fork server is up
              "def started(self):\n"
              "    start(self); task = self._context.Process(target=time.sleep, args=(600,)); task.start()\n"
              "    self._children.append(task); print('task', task.pid, flush=True)\n"
              "ForkserverExecutor.start = started\n"
              f"serve('127.0.0.1:{free_ports_in_a_row(1)}', insecure=True)\n")
    superexec = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    try:
        assert superexec.stdout is not None and superexec.stdout.readline().startswith("task ")
        family = descendants(superexec.pid)
        assert len(family) >= 3  # the fork server, the task and multiprocessing's resource tracker
        superexec.send_signal(signal.SIGTERM)
        superexec.wait(timeout=30)
        deadline = time.monotonic() + 10
        while [pid for pid in family if running(pid)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in family if running(pid)]
    finally:
        if superexec.poll() is None:
            os.killpg(superexec.pid, signal.SIGKILL)
