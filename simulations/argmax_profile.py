"""Where an argmax-mode selection's time goes, and how it compares with the sum mode.

Part by part, for ``--candidates`` candidates (default 100) and each ``n`` of ``--clients``:

* the committee's parts (:func:`simulations.committee.committee_round`, as ``dphype bench committee``): one
  client's ballot (:meth:`dphype.release.ArgmaxRelease.ballot`: top-k votes checked against the form, Shamir shares
  of its bits mod MPyC's prime, one sealed ciphertext per tally) and what it uploads, the 3 tallies opening their
  ciphertexts and drawing their noise, and the MPC (3 MPyC parties on loopback ports: start, agreement, ballot
  checks, noise, argmax) with each party's own split, traffic and memory; the opened index is checked to lie
  within the committee noise's reach of the top count (nobody knows the noise it sampled);
* with ``--whole``, a whole selection in process (:class:`dphype.flower.local.LocalGrid`, random scores, the
  real client handlers): argmax mode (3 tally nodes) and sum mode (SecAgg+), wall time of ``DPHype.start``.

Repeated ``--repetitions`` times; medians reported. The machine is shared: ``load`` is the 1-minute load
average at the start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from simulations import harness
from simulations.committee import committee_round, request_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50, 250], help="n values (default 10 50 250)")
    parser.add_argument("--candidates", type=int, default=100, help="number of candidates p (default 100)")
    parser.add_argument("--k", type=int, default=5, help="votes per client (default 5)")
    parser.add_argument("--repetitions", type=int, default=3, help="rounds per n (default 3; medians reported)")
    parser.add_argument("--whole", action="store_true",
                        help="also time a whole selection in process in both release modes")


def _whole(p: int, k: int, clients: int, release: str, rng: np.random.Generator) -> float:
    """Seconds of one ``DPHype.start`` in process (LocalGrid), random scores."""
    from flwr.clientapp import ClientApp

    from dphype.flower import DPHype, register_dphype
    from dphype.flower.local import LocalGrid, node_id
    from dphype.flower.tally_node import load_tally_key
    from dphype.release import release_mode
    from dphype.secure.committee import loopback_addresses

    scores = rng.random((clients + 3, p))

    class Table:
        maximize = True

        def __init__(self, row: np.ndarray) -> None:
            self.row = row

        def score(self, candidates: Any) -> np.ndarray:
            return self.row

    app = ClientApp()
    register_dphype(app, lambda ctx: Table(scores[int(ctx.node_config["partition-id"])]))
    policy = {"dphype-max-epsilon": 10.0, "dphype-min-clients": 2, "dphype-min-neighbours": 1,
              "dphype-lifetime-epsilon": 1e6}
    tallies = 3 if release_mode(release).uses_committee else 0
    with tempfile.TemporaryDirectory() as home:
        os.environ["FLWR_HOME"] = home
        grid = LocalGrid(app, clients + tallies, node_config=policy)
        keys: list[bytes] = []
        addresses = ",".join(loopback_addresses(3))
        for j in range(tallies):
            path = Path(home) / f"tally-{j}.key"
            grid.contexts[node_id(clients + j)].node_config.update(
                {"dphype-tally-id": j, "dphype-tally-parties": addresses, "dphype-tally-key": str(path)})
            keys.append(load_tally_key(path).public)
        request = request_for(p, k, clients, tuple(keys), release)
        server = DPHype(request.candidates, request.config, tallies=tuple(keys))
        start = time.perf_counter()
        server.start(grid, timeout=600)
        return time.perf_counter() - start


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    clients = [harness.check_int("clients", n, 2) for n in args.clients]
    p = harness.check_int("candidates", args.candidates, 2)
    k = harness.check_int("k", args.k, 1)
    reps = harness.check_int("repetitions", args.repetitions, 1)
    if k > p:
        raise ValueError(f"k must be in [1, {p}] (candidates), got {k}")
    load = os.getloadavg()[0]
    rows = []
    rng = np.random.default_rng(args.seed)
    for n in clients:
        runs = [committee_round(p, k, n, rng) for _ in range(reps)]
        row: dict[str, Any] = {"clients": n, "candidates": p}
        row |= {key: round(statistics.median(r[key] for r in runs), 4) for key in runs[0]}
        if args.whole:
            for release in ("argmax", "sum"):
                row[f"whole {release} s"] = round(statistics.median(_whole(p, k, n, release, rng)
                                                                    for _ in range(reps)), 3)
        rows.append(row)
    study.write_csv("argmax_profile.csv", rows)
    return study.result(load_average=load, repetitions=reps, k=k, rows=rows)
