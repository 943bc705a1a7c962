"""Nothing outlives its release: every MPyC party ends by its job's deadline, or at once when its anchor dies.

Each test leaves two of three parties waiting for a peer that never starts (MPyC's ``mpc.start()`` retries its
connections forever), so only the lifetime bound (`dphype.secure.tally_party.bound_lifetime`) ends them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import alive

from dphype.secure.committee import loopback_addresses, send_job, spawn_party
from dphype.secure.tally_party import ORPHANED, WATCH_INTERVAL

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")

#: Three tallies' jobs for one ballot (Python source: the launcher of the last test makes them too).
JOBS = textwrap.dedent("""
    import numpy as np
    from dphype.secure.committee import Tally, client_sealed_shares, voter_id
    from dphype.selection.ballots import BallotForm
    tallies = [Tally(j) for j in range(3)]
    for t in tallies:
        t.open_round("req-1", 5, 1, form=BallotForm.top_k(1), noise=np.zeros(5, dtype=np.int64))
    sealed = client_sealed_shares("req-1", np.eye(5, dtype=np.int64)[2], [t.public for t in tallies], voter_id(0, "a"))
    for t, share in zip(tallies, sealed):
        t.receive("a", share)
    jobs = [t.job() for t in tallies]
""")


def _jobs():
    scope: dict = {}
    exec(JOBS, scope)  # noqa: S102 - this module's own constant
    return scope["jobs"]


def _connected(address: str, seconds: float = 60.0) -> None:
    """Wait until party 1 listens at ``address`` and party 0 is connected to it (Linux ``/proc/net/tcp*``): both have
    read their jobs and bound their lifetimes (MPyC connects only after that) and wait for party 2."""
    port = f"{int(address.rsplit(':', 1)[1]):04X}"
    start = time.monotonic()
    while True:
        rows = [line.split() for name in ("tcp", "tcp6") if Path(f"/proc/net/{name}").exists()
                for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]]
        listening = any(row[1].endswith(f":{port}") and row[3] == "0A" for row in rows)
        if listening and any(row[2].endswith(f":{port}") and row[3] == "01" for row in rows):
            return
        assert time.monotonic() - start < seconds, f"parties 0 and 1 not connected at {address} after {seconds} s"
        time.sleep(0.05)


def _gone_within(pids, seconds: float) -> float:
    """Seconds until every process of ``pids`` has ended; fails after ``seconds``."""
    start = time.monotonic()
    while any(alive(pid) for pid in pids):
        assert time.monotonic() - start < seconds, f"still running after {seconds} s: {pids}"
        time.sleep(0.05)
    return time.monotonic() - start


def test_parties_whose_peer_never_starts_end_at_their_jobs_deadline():
    """A tally that never starts its party: the other two wait for it, and the kernel ends them at the deadline."""
    jobs, addresses = _jobs(), loopback_addresses(3)
    procs = [spawn_party(j, addresses) for j in (0, 1)]
    try:
        start = time.monotonic()
        for j, proc in zip((0, 1), procs, strict=True):
            send_job(proc, jobs[j], deadline=1.5, anchor=os.getpid())
        for proc in procs:
            assert proc.wait(timeout=30) == -signal.SIGALRM
        assert 1.5 <= time.monotonic() - start < 15
    finally:
        for proc in procs:
            proc.kill()


@linux_only
def test_parties_end_when_their_tally_nodes_process_dies_whatever_became_of_their_parent():
    """A deployed tally node: the ClientApp process that starts the party exits at once (the party is then an
    orphan), the node's own process (the party's anchor) lives on; killing the node ends the parties within the
    watch interval, long before their deadline."""
    jobs, addresses = _jobs(), loopback_addresses(3)
    node, procs = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]), []
    try:
        procs = [spawn_party(j, addresses) for j in (0, 1)]
        for j, proc in zip((0, 1), procs, strict=True):
            send_job(proc, jobs[j], deadline=120, anchor=node.pid)
        _connected(addresses[1])
        assert all(proc.poll() is None for proc in procs)  # waiting for the peer that never starts
        node.kill()
        node.wait()
        for proc in procs:
            assert proc.wait(timeout=20 * WATCH_INTERVAL + 5) == ORPHANED
    finally:
        for proc in [node, *procs]:
            proc.kill()


@linux_only
def test_parties_of_a_killed_loopback_committee_die_with_the_process_that_waits_for_them():
    """``run_loopback_committee`` anchors its parties to itself: SIGKILL it and the kernel kills them
    (``PR_SET_PDEATHSIG``), even those waiting for a peer."""
    script = JOBS + textwrap.dedent("""
        import time
        from dphype.secure.committee import loopback_addresses, start_party
        addresses = loopback_addresses(3)
        print(*[start_party(j, addresses, jobs[j], deadline=120).pid for j in (0, 1)], addresses[1], flush=True)
        time.sleep(120)
    """)
    launcher, pids = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True), []
    try:
        assert launcher.stdout is not None
        *found, address = launcher.stdout.readline().split()
        pids += [int(pid) for pid in found]
        _connected(address)
        assert all(alive(pid) for pid in pids)
        launcher.kill()
        launcher.wait()
        assert _gone_within(pids, 5.0) < 5.0
    finally:
        launcher.kill()
        for pid in filter(alive, pids):
            os.kill(pid, signal.SIGKILL)
