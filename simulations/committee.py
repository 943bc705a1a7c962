"""The tally committee's cost with ballot checks and committee noise.

For ``--candidates`` candidates (default 100) and each ``n`` of ``--clients``, one argmax selection's committee
part in process, through the real code (:class:`dphype.release.ArgmaxRelease` for the clients,
:class:`dphype.secure.committee.Tally` and :func:`dphype.secure.committee.run_loopback_committee` for the 3 tallies,
MPyC parties on loopback ports):

* ``client ballot s``: one client's ballot (top-k, checked against the form, Shamir shares of its bits, sealed to the
  3 tallies), mean over the clients; ``upload bytes``: what one client sends;
* ``seconds``: the committee's wall time from the sealed shares to the opened index: the 3 tallies open their
  shares (``collect s``, all 3), then the MPC (``mpc s``: parties' start, agreement, ballot checks, the noise sampled
  jointly, argmax; each party's own split in ``party <step> s``, the slowest party's);
* per tally (the largest of the 3): ``tally traffic bytes``, what its MPyC party sent to the other two;
  ``tally peak MiB``, its party's peak resident memory; ``tally rows MiB``, the share rows it holds.

With ``--invalid m`` the last ``m`` clients cast a boosted ballot (30 votes for one candidate, shared without the
client's own check), which the committee must name and leave out: the per-ballot fallback is timed too. Nobody knows
the noise, so the opened index is checked to lie within the noise's reach of the valid ballots' top count.
Repeated ``--repetitions`` times; medians. The machine is shared: ``load`` is the 1-minute load average at the start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np

from simulations import harness


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000], help="n values (default 100 1000)")
    parser.add_argument("--candidates", type=int, default=100, help="number of candidates p (default 100)")
    parser.add_argument("--k", type=int, default=5, help="votes per client (default 5)")
    parser.add_argument("--invalid", type=int, default=0, help="clients casting an invalid ballot (default 0)")
    parser.add_argument("--repetitions", type=int, default=1, help="rounds per n (default 1; medians reported)")


def request_for(p: int, k: int, clients: int, keys: tuple[bytes, ...], release: str = "argmax") -> Any:
    """A ``release`` request of ``clients`` clients, top-k ballots of ``k`` votes, ``p`` learning-rate candidates, at
    epsilon 1 (the ballot pinned: the argmax release's default, ``"auto"``, would choose its own ``k``)."""
    from dphype.config import DPHypeConfig
    from dphype.protocol import make_vote_request
    from dphype.selection.candidates import candidate_grid

    config = DPHypeConfig(epsilon=1.0, delta=1e-5, k=k, clients=clients, release=release, ballot="top-k")
    return make_vote_request(config, candidate_grid(lr=[10.0 ** (-i / 10) for i in range(p)]), tallies=keys)


def committee_round(p: int, k: int, clients: int, rng: np.random.Generator, invalid: int = 0) -> dict[str, Any]:
    """One committee round of ``clients`` ballots (the last ``invalid`` of them boosted); the measures by name."""
    from dphype.secure.committee import (
        Tally,
        field_modulus,
        run_loopback_committee,
        share_context,
        split_shares,
        voter_id,
    )
    from dphype.secure.relay import seal

    tallies = [Tally(j) for j in range(3)]
    request = request_for(p, k, clients, tuple(t.public for t in tallies))
    cfg = request.config
    honest = clients - invalid
    scores = rng.random((honest, p))
    start = time.perf_counter()
    sealed = {str(c): request.mode.ballot(request, row, maximize=True, voter=voter_id(0, c))
              for c, row in enumerate(scores)}
    client = (time.perf_counter() - start) / max(honest, 1)
    boost = np.zeros(p, dtype=np.int64)
    boost[-1] = 30  # a modified client: 30 votes for the last candidate
    for c in range(honest, clients):
        shares = split_shares(boost, 3, field_modulus())
        sealed[str(c)] = [seal(t.public, np.asarray(share, dtype=np.uint64).tobytes(),
                               context=share_context(request.digest(), j, voter_id(0, c)))
                          for j, (t, share) in enumerate(zip(tallies, shares, strict=True))]
    form = request.mode.ballot_form(cfg, len(request.candidates))
    start = time.perf_counter()
    for t in tallies:
        t.open_round(request.digest(), p, request.min_survivors - invalid, form=form,
                     noise=request.mode.tally_noise(request), opens=request.mode.opens)
        for label, blobs in sealed.items():
            t.receive(label, blobs[t.index])
    jobs = [t.job() for t in tallies]
    collect = time.perf_counter() - start
    measures: list[dict[str, float]] = []
    start = time.perf_counter()
    opened = run_loopback_committee(jobs, timings=measures, timeout=600)
    mpc = time.perf_counter() - start
    votes = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    counts = np.bincount(votes.reshape(-1), minlength=p)
    # nobody knows the committee's noise: the opened candidate's count must lie within the noise's reach of the
    # top count (two draws apart by more than `reach` have probability below 1e-9 over all pairs)
    t = request.mode.tally_noise(request).t
    reach = int(np.ceil(np.log(1e-9 / p**2) / np.log(t)))
    if not (isinstance(opened.value, int) and counts[opened.value] >= counts.max() - reach) or (
            opened.excluded != tuple(sorted(map(str, range(honest, clients))))):
        raise RuntimeError(f"the committee opened {opened}: not within {reach} votes of the top count "
                           f"{counts.max()} of the valid ballots, or not naming the {invalid} invalid")
    row = {"seconds": collect + mpc, "client ballot s": client, "upload bytes": sum(map(len, sealed["0"])),
           "collect s": collect, "mpc s": mpc}
    row |= {f"party {key}": max(m[key] for m in measures) for key in measures[0] if key.endswith(" s")}
    row |= {"tally traffic bytes": max(m["bytes sent"] for m in measures),
            "tally peak MiB": max(m["peak memory"] for m in measures) / 2**20,
            "tally rows MiB": clients * p * form.bits * 8 / 2**20}
    return row


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    clients = [harness.check_int("clients", n, 2) for n in args.clients]
    p = harness.check_int("candidates", args.candidates, 2)
    k = harness.check_int("k", args.k, 1)
    reps = harness.check_int("repetitions", args.repetitions, 1)
    invalid = harness.check_int("invalid", args.invalid, 0)
    if k > p:
        raise ValueError(f"k must be in [1, {p}] (candidates), got {k}")
    if any(n - invalid < 1 for n in clients):
        raise ValueError(f"invalid must leave at least one honest client (it is {invalid}, clients {min(clients)})")
    load = os.getloadavg()[0]
    rows = []
    rng = np.random.default_rng(args.seed)
    for n in clients:
        runs = [committee_round(p, k, n, rng, invalid) for _ in range(reps)]
        row: dict[str, Any] = {"clients": n, "candidates": p, "invalid": invalid}
        row |= {key: round(statistics.median(r[key] for r in runs), 4) for key in runs[0]}
        rows.append(row)
    study.write_csv("committee.csv", rows)
    return study.result(load_average=load, repetitions=reps, k=k, rows=rows)
