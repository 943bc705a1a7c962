"""Every test runs with a private ``FLWR_HOME`` (so no node ledger is written into the real home) and without
an inherited ``DPHYPE_NODE_POLICY`` (so node policies come only from what a test sets); the session runs with a
private temporary folder (``TMPDIR``, its subprocesses' too) and fails when it ends with a ``dphype-*`` folder
left there or a process of its own still running (`nothing_left_behind`); ``recorded_votes`` records the vectors
DP-Hype clients hand to SecAgg+; ``flower_log`` holds what Flower's logger writes."""

from __future__ import annotations

import gc
import io
import logging
import multiprocessing.util
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from dphype.node.policy import POLICY_ENV
from dphype.runs import RUNS_ENV

#: multiprocessing's helper processes (started once per interpreter, stopped at its exit).
INTERPRETER_SERVERS = ("forkserver", "resource_tracker")


def session_processes() -> list[str]:
    """The command lines (cut to 120 characters) of the processes below this one, but for multiprocessing's
    forkserver and resource tracker, which serve the interpreter and end with it."""
    from dphype.flower.local import descendants

    commands = []
    for pid in descendants(os.getpid()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it ended meanwhile
            continue
        if not any(f"from multiprocessing.{server} import main" in command for server in INTERPRETER_SERVERS):
            commands.append(command[:120])
    return commands


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind(tmp_path_factory):
    """The session's own temporary folder (``tempfile`` and ``TMPDIR``; pytest's ``tmp_path`` stays where it
    is); at its end no ``dphype-*`` folder may be left in it and no process started by the session may run."""
    from dphype.flower.local import LocalGrid

    tmp_path_factory.getbasetemp()  # pytest's folders first, outside the private one
    multiprocessing.util.get_temp_dir()  # and multiprocessing's, which it removes itself at the interpreter's exit
    private = tempfile.mkdtemp(prefix="session-tmp-")
    before = (tempfile.tempdir, os.environ.get("TMPDIR"))
    tempfile.tempdir, os.environ["TMPDIR"] = private, private
    try:
        yield
        gc.collect()  # the grids that no test holds any more remove their folders
        held = {grid.folder for grid in gc.get_objects() if isinstance(grid, LocalGrid)}  # theirs go at exit
        left = sorted(path.name for path in Path(private).glob("dphype-*") if path not in held)
        deadline = time.monotonic() + 10.0  # a child that is stopping gets the time to exit
        while (commands := session_processes()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left and not commands, f"the tests left temporary folders {left} and processes {commands}"
    finally:
        tempfile.tempdir = before[0]
        if before[1] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before[1]
        shutil.rmtree(private, ignore_errors=True)


@pytest.fixture(autouse=True)
def private_flwr_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("flwr-home")
    monkeypatch.setenv("FLWR_HOME", str(home))
    monkeypatch.delenv(POLICY_ENV, raising=False)
    monkeypatch.setenv(RUNS_ENV, str(home / "runs"))  # an in-process ServerApp's run folders: not in the checkout
    return home


@pytest.fixture
def record_returns(monkeypatch):
    """``record_returns(owner, name)`` replaces ``owner.name`` (for the test) by a wrapper that appends what each
    call returns to the list it returns."""

    def record(owner, name):
        returned = []
        original = getattr(owner, name)

        def recording(*args, **kwargs):
            returned.append(original(*args, **kwargs))
            return returned[-1]

        monkeypatch.setattr(owner, name, recording)
        return returned

    return record


@pytest.fixture
def recorded_votes(record_returns):
    """Every encoded vector a DP-Hype client hands to SecAgg+ (its noise comes from the secure generator, so a
    test that checks that the released sum is exact compares it with these)."""
    from dphype.release import SumRelease

    return record_returns(SumRelease, "ballot")


@pytest.fixture
def flower_log():
    """What Flower's logger (``flwr``) writes while the test runs, as a ``StringIO``."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    yield stream
    logger.removeHandler(handler)
