"""One tally's MPyC party: ``python dphype/secure/tally_party.py -I i -P host:port -P host:port -P host:port``.

Run as a script (not ``-m``) it imports only json, numpy and MPyC, not the dphype package: it starts in a
fraction of a second.

Reads one JSON job from stdin (its summed share vector, the field modulus, the request digest, the digest and
size of its contributor set, the minimum number of contributors), runs the secure argmax with the other
parties and writes ``{"index": i, "seconds": {...}}`` (or ``{"error": reason}``; ``seconds``: importing
numpy and MPyC, connecting to the other parties, the agreement check plus the argmax) as one JSON line to
stdout. The party imports MPyC before it reads the job, so a tally can start it early (while it opens and
sums its shares, `dphype.secure.tally.spawn_party`) and hand it the job later. The MPyC options
(``-I``, ``-P``, ``--no-log``, ...) are MPyC's own command line (MPyC reads them when ``mpyc.runtime`` is
imported, hence the separate process); `dphype.secure.tally.secure_argmax` starts the parties on one
machine, a deployment starts one per tally host with the same command.

The MPC (honest majority, Shamir sharing with threshold ``t = (parties - 1) // 2``, MPyC's security model:
semi-honest parties, private channels assumed): every party's share vector is its Shamir share (x-coordinate
``index + 1``, degree ``t``: the clients split with MPyC's ``np_random_split``) of the noisy count vector in
the field ``GF(modulus)`` of ``SecInt``, so it is used as a secure array directly; ``mpc.np_argmax`` (secure
comparisons, vectorised; ties go to the lowest index, as ``np.argmax``, checked in tests/secure/test_tally.py) gives
the winner, and only that index is opened. Before any input the parties exchange (publicly: none of these is
secret) the request digest, the contributor-set digest, its size and the vector length with ``mpc.transfer``;
any difference, or fewer contributors than the minimum, aborts without computing anything.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

launched = time.perf_counter()


def _agreement_error(mine: tuple[Any, ...], everyone: list[Any], minimum: int) -> str | None:
    """Why the parties may not compute (``None`` when they may)."""
    names = ("request digest", "contributor set", "contributor count", "vector length")
    for pos, name in enumerate(names):
        values = {tuple(v)[pos] for v in everyone}
        if len(values) != 1:
            return f"tallies disagree on the {name}"
    if mine[2] < minimum:
        return f"only {mine[2]} contributors, fewer than the minimum survivors {minimum}"
    return None


def main() -> int:
    """Run this party: read the job from stdin, compute the secure argmax, print the result line.

    Returns:
        The exit status: 0 with the index, 3 when the parties refused or failed to compute (the line says why),
        4 when the tally handed over no job.
    """
    import numpy as np  # noqa: PLC0415
    from mpyc.runtime import mpc  # noqa: PLC0415 - reads MPyC's command line (the party's own process)

    imported = time.perf_counter()
    line = sys.stdin.readline()
    if not line:
        return 4  # the tally gave up before handing over a job
    job = json.loads(line)

    modulus, share = int(job["modulus"]), [int(v) for v in job["share"]]
    mine = (str(job["request"]), str(job["contributors"]), int(job["count"]), len(share))

    started = time.perf_counter()

    async def run() -> dict[str, Any]:
        await mpc.start()
        connected = time.perf_counter()
        everyone = await mpc.transfer(list(mine))
        error = _agreement_error(mine, everyone, int(job["min_contributors"]))
        if error is not None:
            await mpc.shutdown()
            return {"error": error}
        secint = mpc.SecInt(int(job["bit_length"]), p=modulus)
        if mpc.threshold != int(job["threshold"]):
            await mpc.shutdown()
            return {"error": f"MPyC threshold {mpc.threshold} is not the clients' Shamir degree {job['threshold']}"}
        # this party's Shamir share of every noisy count (the clients' shares summed): a secure array as is
        counts = secint.array(secint.field.array(np.array(share, dtype=object)))
        opened = await mpc.output(mpc.np_argmax(counts))
        done = time.perf_counter()
        await mpc.shutdown()
        return {"index": int(opened), "seconds": {"import": imported - launched, "connect": connected - started,
                                                  "argmax": done - connected}}

    result = mpc.run(run())
    print(json.dumps(result), flush=True)
    return 0 if "index" in result else 3


if __name__ == "__main__":
    sys.exit(main())
