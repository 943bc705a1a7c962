"""One tally's MPyC party: ``python dphype/secure/tally_party.py -I i -P host:port -P host:port -P host:port``.

Run as a script (not ``-m``) it imports only the standard library, numpy and MPyC, not the dphype package: it
starts in a fraction of a second.

Reads one JSON job from stdin (`dphype.secure.committee.Tally.job`: every contributor's share row of its ballot's bits,
the ballot form, the committee's noise sampler or this tally's noise share, the field modulus, the request digest,
the contributors and the positions of those its tally did not take, the fewest valid ballots, what to open; and its
lifetime from `dphype.secure.committee.send_job`: a ``deadline`` in seconds and an ``anchor`` process, `bound_lifetime`:
the party never outlives either), runs
the checked, noisy secure argmax (or sum) with the other parties and writes ``{"value": v, "excluded": [labels],
"excluded_at": [positions], "seconds": {...}, "bytes sent": b, "peak memory": m}`` (``v`` the index, or the noisy sum
as a list; or ``{"error": reason, "excluded": [...], "opened": false}``, stopped before anything but the ballots'
validity was opened;
``seconds``: importing numpy and MPyC, connecting to the other parties, the ballot checks, the noise and the argmax;
the bytes this party sent to the others; its peak resident memory in bytes) as one JSON line to stdout. The party
imports MPyC before it reads the job, so a tally can start it early (while it opens its shares,
`dphype.secure.committee.spawn_party`) and hand it the job later. The MPyC options (``-I``, ``-P``, ``--no-log``, ...)
are MPyC's own command line (MPyC reads them when ``mpyc.runtime`` is imported, hence the separate process);
`dphype.secure.committee.run_loopback_committee` starts the parties on one machine, a deployment starts one per tally
host with the same command.

With MPyC's ``--ssl`` every peer's certificate must be its own party's (`wrong_parties`). The MPC (honest majority,
MPyC's semi-honest model) agrees on the job, checks every ballot, draws or inputs the noise and opens only what the
job names; step by step: docs/design/committee.md.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import json
import os
import resource
import secrets
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

launched = time.perf_counter()


def _agreement_error(mine: tuple[Any, ...], everyone: list[Any], minimum: int) -> str | None:
    """Why the parties may not compute (``None`` when they may)."""
    names = ("request digest", "contributor set", "contributor count", "row length", "ballot form",
             "committee size", "value to open", "noise sampler")
    for pos, name in enumerate(names):
        values = {json.dumps(tuple(v)[pos]) for v in everyone}
        if len(values) != 1:
            return f"tallies disagree on the {name}"
    if mine[2] < minimum:
        return f"only {mine[2]} contributors, fewer than the committee's minimum {minimum}"
    return None


#: Exit status of a party whose anchor process died (its tally node's job is gone).
ORPHANED = 5
#: Seconds between two looks at the anchor process.
WATCH_INTERVAL = 0.2
#: Linux's ``prctl`` option that sends a signal to this process when its parent (thread) exits.
PR_SET_PDEATHSIG = 1


def _started(pid: int) -> str | None:
    """Process ``pid``'s start time (Linux ``/proc``), ``""`` where unknown, ``None`` when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    except OSError:
        fields = []
    if fields and fields[0] in ("Z", "X"):
        return None
    if not fields:  # no /proc: alive as far as kill(0) can tell
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ""
    return fields[19]  # starttime: a reused pid reads another


def bound_lifetime(deadline: float, anchor: int) -> None:
    """End this process when its job's ``deadline`` (seconds from now) passes or its ``anchor`` process dies.

    Three mechanisms, none of which needs this process's own event loop (MPyC may be blocked in a connect):
    ``SIGALRM`` after ``deadline`` with its default action (the kernel terminates the process); a daemon thread
    that looks at ``anchor`` every `WATCH_INTERVAL` seconds and exits with `ORPHANED` once it is gone, a zombie, or
    its pid is reused (its start time changed); and, when the anchor is this process's parent on Linux,
    ``PR_SET_PDEATHSIG`` with ``SIGKILL`` (the kernel kills it the moment the parent exits).

    Args:
        deadline: Seconds this party may still run, ``> 0``.
        anchor: The process whose life bounds this party's: its tally node's (`dphype.flower.tally_node`), or the
            process that waits for its answer (`dphype.secure.committee.run_loopback_committee`).
    """
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, max(float(deadline), 1e-3))
    if anchor == os.getppid() and sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    stamp = _started(anchor)
    if stamp is None:  # gone before the watch began
        os._exit(ORPHANED)

    def watch() -> None:
        while _started(anchor) == stamp:
            time.sleep(WATCH_INTERVAL)
        os._exit(ORPHANED)

    threading.Thread(target=watch, name="anchor-watch", daemon=True).start()


#: The subject common name of party ``J``'s certificate (MPyC's ``--ssl`` connects to party ``J`` under this server
#: name; `dphype.node.pki` issues it).
PARTY_NAME = "MPyC party {}"


def wrong_parties(parties: Any, pid: int) -> list[str]:
    """Every peer whose verified TLS certificate is not its own party's, described; empty when all are.

    MPyC's ``--ssl`` checks that each peer's certificate chains to the committee's CA (``mpyc_ca.crt``) and, where
    this party connects, the listening party's name; a party that connects states its index itself. So every
    peer's certificate, as Python's ``ssl`` verified it in the handshake, must name exactly the party it speaks for:
    subject common name `PARTY_NAME` of its index and no other DNS name.

    Args:
        parties: MPyC's parties after ``mpc.start()`` (``mpc.parties``: each with its ``pid`` and ``protocol``).
        pid: This party's index.

    Returns:
        ``"party J presented NAMES"`` for each peer whose certificate names another party (``"party J is not
        connected"`` for one whose connection is gone), or none.
    """
    wrong = []
    for peer in parties:
        if peer.pid == pid:
            continue
        transport = getattr(peer.protocol, "transport", None)
        if transport is None:  # its connection is gone already (a party that refused closes its connections)
            wrong.append(f"party {peer.pid} is not connected")
            continue
        cert = transport.get_extra_info("peercert") or {}
        names = [value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"]
        dns = [value for key, value in cert.get("subjectAltName", ()) if key == "DNS"]
        expected = PARTY_NAME.format(peer.pid)
        if names != [expected] or any(name != expected for name in dns):
            wrong.append(f"party {peer.pid} presented {', '.join(names + dns) or 'no certificate'}")
    return wrong


def _coefficients(seed: bytes, count: int) -> list[int]:
    """``count`` public check coefficients, uniform in ``[0, 2^62)``, expanded from ``seed`` by SHAKE-256."""
    # lazy import: the party's script times its own imports (numpy, MPyC) after it starts
    import numpy as np  # noqa: PLC0415

    raw = np.frombuffer(hashlib.shake_256(seed).digest(8 * count), dtype="<u8") >> np.uint64(2)
    return raw.tolist()


def sample_discrete_laplace(mpc: Any, secint: Any, sampler: dict[str, Any]) -> Any:
    """``sampler["size"]`` discrete Laplace draws as a secure array, sampled jointly (`dphype.privacy.winner`).

    Digit ``i`` of each of two geometrics per draw is ``[U < c_i]`` for a secret uniform ``U`` of ``M`` secure random
    bits: from the lowest bit ``j`` up, ``lt = (1 - u_j) c_j + lt (u_j c_j + (1 - u_j)(1 - c_j))`` (below ``c`` on
    the bits so far), one secure multiplication per bit for all digits at once.

    Args:
        mpc: MPyC's runtime, started.
        secint: The secure integer type (its field holds the counts and the noise).
        sampler: ``{"size": p, "digits": L, "precision": M, "thresholds": [c_0 .. c_{L-1}]}``.

    Returns:
        The ``(p,)`` secure array of draws.
    """
    # lazy import: the party's script times its own imports (numpy, MPyC) after it starts
    import numpy as np  # noqa: PLC0415

    size, digits, precision = int(sampler["size"]), int(sampler["digits"]), int(sampler["precision"])
    thresholds = [int(c) for c in sampler["thresholds"]]
    count = 2 * size * digits  # digit i of geometric g sits at g * digits + i
    c = np.array(thresholds * (2 * size), dtype=object)
    field = secint.field
    u = mpc.np_random_bits(secint, count * precision).reshape(precision, count)
    lt = (1 - u[0]) * field.array(c & 1)  # bit 0 alone: u_0 = 0 < c_0 = 1
    for j in range(1, precision):
        cj = (c >> j) & 1
        uj = u[j]
        below = (1 - uj) * field.array(cj)  # bit j decides: u_j = 0 < c_j = 1
        same = uj * field.array(2 * cj - 1) + field.array(1 - cj)  # equal on bit j: the lower bits decide
        lt = below + mpc.np_multiply(lt, same)
    weights = np.array([1 << i for i in range(digits)], dtype=object)
    geometric = lt.reshape(2 * size, digits) @ weights
    return geometric[:size] - geometric[size:]


def main() -> int:
    """Run this party: read the job from stdin, check the ballots, compute the noisy secure argmax, print the result.

    Returns:
        The exit status: 0 with the opened value, 3 when the parties refused or failed to compute (the line says why),
        4 when the tally handed over no job.
    """
    # lazy import: the party's script times its own imports (numpy, MPyC) after it starts
    import numpy as np  # noqa: PLC0415
    from mpyc.runtime import mpc  # noqa: PLC0415 - reads MPyC's command line (the party's own process)

    imported = time.perf_counter()
    line = sys.stdin.readline()
    if not line:
        return 4  # the tally gave up before handing over a job
    job = json.loads(line)
    bound_lifetime(float(job["deadline"]), int(job["anchor"]))

    modulus, size, parties = int(job["modulus"]), int(job["size"]), int(job["parties"])
    form = (int(job["form"]["max_entry"]), int(job["form"]["min_total"]), int(job["form"]["max_total"]))
    bits = form[0].bit_length()
    labels = [str(c) for c in job["contributors"]]
    count, width = len(labels), size * bits
    rows = np.frombuffer(base64.b64decode(job["shares"]), dtype="<u8")
    sampler = job.get("sampler")
    noise = None if sampler is not None else [int(v) for v in job["noise"]]
    digest = hashlib.sha256(json.dumps(labels).encode()).hexdigest()
    mine = (str(job["request"]), digest, count, width, list(form), parties, str(job["opens"]),
            json.dumps(sampler, sort_keys=True))

    started = time.perf_counter()

    async def run() -> dict[str, Any]:
        await mpc.start()
        connected = time.perf_counter()
        wrong = wrong_parties(mpc.parties, mpc.pid) if mpc.options.ssl else []
        if wrong:  # before anything of this party's is sent: drop every connection and refuse
            for peer in mpc.parties:
                if peer.pid != mpc.pid and peer.protocol is not None:
                    peer.protocol.transport.close()
            return {"error": f"the parties' certificates do not check out ({'; '.join(wrong)}): only party J's "
                             f"certificate ({PARTY_NAME.format('J')}) may speak for party J", "excluded": [],
                    "opened": False}
        everyone = await mpc.transfer(list(mine))
        error = _agreement_error(mine, everyone, int(job["min_contributors"]))
        if error is None and mpc.threshold != int(job["threshold"]):
            error = f"MPyC threshold {mpc.threshold} is not the clients' Shamir degree {job['threshold']}"
        noise_size = int(sampler["size"]) if sampler is not None else len(noise or [])
        if error is None and (rows.size != count * width or noise_size != size or len(mpc.parties) != parties):
            error = "the job's shares, noise or committee do not match its sizes"
        if error is not None:
            await mpc.shutdown()
            return {"error": error, "excluded": [], "opened": False}
        secint = mpc.SecInt(int(job["bit_length"]), p=modulus)
        field = secint.field
        # this party's Shamir shares of every contributor's ballot bits: a secure (n, p * bits) array as is
        x = secint.array(field.array(rows.astype(object).reshape(count, width)))
        # the committee's randomness, drawn after every input is fixed
        seeds = await mpc.transfer(secrets.token_bytes(32))
        coeffs = _coefficients(b"".join(seeds), count * width + count)
        r_ = np.array(coeffs[:count * width], dtype=object).reshape(count, width)
        s_ = np.array(coeffs[count * width:], dtype=object)
        # every contributor's shares lie on one polynomial of degree t: its random combination, masked by the
        # parties' random inputs, opened from all parties and from t + 1 of them, must read the same
        masks = mpc.input(secint.array(field.array(np.array([secrets.randbelow(modulus) for _ in range(count)],
                                                            dtype=object))))
        combined = (x * field.array(r_)).sum(axis=1)
        for mask in masks:
            combined = combined + mask
        full = await mpc.output(combined, threshold=2 * mpc.threshold)
        partial = await mpc.output(combined)
        invalid = {int(i) for i in job["invalid"]}  # what this party's tally did not take (its reasons: its log)
        skewed = await mpc.transfer([bool(a != b) or i in invalid
                                     for i, (a, b) in enumerate(zip(full, partial, strict=True))])
        keep = ~np.any(np.array(skewed, dtype=bool), axis=0)  # invalid at any one party: left out at all
        # the form of every ballot that is a sharing, in one check
        r = field.array(r_ * keep.astype(object)[:, None])
        s = field.array(s_ * keep.astype(object))
        weights = np.array([1 << b for b in range(bits)], dtype=object)
        entries = x.reshape(count * size, bits) @ weights if bits > 1 else x
        entries = entries.reshape(count, size)
        totals = entries.sum(axis=1)
        if form[1] == form[2]:
            deviation = totals - form[1]
        else:
            deviation = (totals < form[1]) + (totals > form[2])
        weighted = x * r
        check = weighted.reshape(count * width) @ (x - 1).reshape(count * width) + deviation @ s
        if await mpc.is_zero_public(check):
            valid = keep
        else:  # someone cast an invalid ballot: find whose, opening only which per-ballot values are zero
            per_ballot = mpc.np_multiply(weighted, x - 1).sum(axis=1) + deviation * s
            valid = keep & np.asarray(await mpc.np_is_zero_public(per_ballot), dtype=bool)
        positions = [int(i) for i in np.flatnonzero(~valid)]
        excluded = [labels[i] for i in positions]
        checked = time.perf_counter()
        if int(valid.sum()) < int(job["min_contributors"]):
            await mpc.shutdown()
            return {"error": f"only {int(valid.sum())} valid ballots, fewer than the committee's minimum "
                             f"{job['min_contributors']} ({len(excluded)} invalid)", "excluded": excluded,
                    "excluded_at": positions, "opened": False}
        counts = valid.astype(object) @ entries
        if sampler is not None:  # one discrete Laplace per count, sampled jointly: no party knows any of it
            counts = counts + sample_discrete_laplace(mpc, secint, sampler)
        else:
            for share in mpc.input(secint.array(np.array(noise, dtype=object))):
                counts = counts + share
        await mpc.barrier("noise")
        noised = time.perf_counter()
        if job["opens"] == "sum":  # the whole noisy sum of the valid ballots
            opened: Any = [int(v) for v in await mpc.output(counts)]
        else:  # only the winner's index
            opened = int(await mpc.output(mpc.np_argmax(counts)))
        done = time.perf_counter()
        sent = sum(peer.protocol.nbytes_sent for peer in mpc.parties if peer.pid != mpc.pid)
        await mpc.shutdown()
        return {"value": opened, "excluded": excluded, "excluded_at": positions,
                "seconds": {"import": imported - launched, "connect": connected - started,
                            "check": checked - connected, "noise": noised - checked, "argmax": done - noised},
                "bytes sent": sent, "peak memory": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

    result = mpc.run(run())
    print(json.dumps(result), flush=True)
    return 0 if "value" in result else 3


if __name__ == "__main__":
    sys.exit(main())
