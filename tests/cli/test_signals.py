"""Stopping a command: SIGTERM or SIGINT ends `dphype demo` with one line and no traceback, and leaves none of its
processes (SuperLink, SuperExec, ``flwr run``, the simulation, Ray) running and none of its folders behind;
`dphype.cli.stop_on_signals` restores the handlers it replaced."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import REPO

from dphype.cli import Stopped, stop_on_signals, stop_signal
from dphype.flower.local import descendants


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_inside_the_block_raises_stopped_and_the_handlers_come_back(sig):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(Stopped) as stopped, stop_on_signals():
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the handler raises before this ends
    assert stopped.value.signum == sig and isinstance(stopped.value, KeyboardInterrupt)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_stop_that_surfaces_as_an_import_error_is_still_reported_as_the_stop():
    """A signal that interrupts a C extension's import (scipy's, imported lazily by the calibration) surfaces as
    "ImportError: initialization failed": the command still ends as stopped by that signal, not with a traceback.
    Outside a stopped block an exception is not a stop."""
    with pytest.raises(ImportError) as caught, stop_on_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
        except Stopped as err:
            raise ImportError("initialization failed") from err  # what the interrupted module init raises
    assert stop_signal(caught.value) == signal.SIGTERM
    with stop_on_signals():
        assert stop_signal(ImportError("initialization failed")) is None
    assert stop_signal(KeyboardInterrupt()) == signal.SIGINT


def living(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
def test_a_stopped_demo_leaves_nothing_running_or_lying_around(tmp_path):
    """SIGTERM (what a service manager or ``timeout`` sends; with no handler the process would die with -15, not
    exit 143); SIGINT takes the same handler, `stop_on_signals`, whose mapping of both signals to `Stopped` the
    test above checks in process."""
    # the demo's temporary folder, short: Ray's socket paths below it must fit AF_UNIX's 107 bytes
    tmp = Path(tempfile.mkdtemp(prefix="sig", dir="/tmp"))
    try:
        _stop_a_demo(tmp_path, tmp, signal.SIGTERM)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _stop_a_demo(tmp_path: Path, tmp: Path, sig: int) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DPHYPE_")}, "TMPDIR": str(tmp),
           "PYTHONPATH": str(REPO)}
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        demo = subprocess.Popen([sys.executable, "-c", "import sys; from dphype.cli import main; sys.exit(main())",
                                 "demo", "--clients", "10", "--fedavg-rounds", "1", "--local-epochs", "1"],
                                env=env, stdout=stdout, stderr=stderr, cwd=tmp_path)
        try:
            deadline = time.monotonic() + 300
            while "DP-Hype" not in out.read_text() and demo.poll() is None and time.monotonic() < deadline:
                time.sleep(1)  # until the ServerApp runs: the simulation and its Ray workers have started
            family = descendants(demo.pid)
            assert demo.poll() is None and any("flower-superlink" in command_of(pid) for pid in family), \
                out.read_text()[-2000:] + err.read_text()[-2000:]
            assert list(tmp.glob("dphype-flwr-home-*"))
            demo.send_signal(sig)
            code = demo.wait(timeout=120)
        finally:
            if demo.poll() is None:
                demo.kill()
    name = signal.Signals(sig).name
    assert code == 128 + sig
    lines = err.read_text().strip().splitlines()
    assert lines[-1] == (f"dphype demo: stopped by {name}: every process it started is stopped and its temporary "
                         "folders are removed")
    assert "Traceback" not in err.read_text() and "Traceback" not in out.read_text()
    survivors = [command_of(pid)[:100] for pid in family if living(pid)]
    assert not survivors
    assert not list(tmp.glob("dphype-*")) and not list(tmp.glob("ray/session_*"))


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "to_group"), [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_a_stopped_bench_says_so_in_one_line_and_leaves_no_process(tmp_path, sig, to_group):
    """Ctrl-C (SIGINT to the terminal's process group: `dphype` and the study it runs in a child) and SIGTERM to
    `dphype` alone (which passes it on): exit status 128 + the signal, one line, no traceback, no process left."""
    err = tmp_path / "err.txt"
    with err.open("w") as stderr:
        bench = subprocess.Popen([sys.executable, "-c", "import sys; from dphype.cli import main; sys.exit(main())",
                                  "bench", "synthetic", "--out", str(tmp_path / "out")], cwd=REPO,
                                 stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "PYTHONPATH": str(REPO)},
                                 start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while "synthetic:" not in err.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)  # until the study's progress bar shows: it is working
            family = descendants(bench.pid)
            assert family and bench.poll() is None, err.read_text()[-2000:]
            (os.killpg if to_group else os.kill)(bench.pid, sig)
            code = bench.wait(timeout=60)
        finally:
            if bench.poll() is None:
                os.killpg(bench.pid, signal.SIGKILL)
    text = err.read_text()
    assert code == 128 + sig and "Traceback" not in text, text[-2000:]
    assert text.strip().splitlines()[-1] == f"dphype bench synthetic: stopped by {signal.Signals(sig).name}"
    time.sleep(0.5)
    assert not [command_of(pid) for pid in family if living(pid)]
