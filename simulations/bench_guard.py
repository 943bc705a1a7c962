"""Benchmark: what the client privacy guard adds to one vote, per call (microseconds, median of repeats).

A client at ``--clients`` (default 50, Skellam noise, epsilon 1, k 5, Table III's 100 candidates, dropout
0.1) runs, in a DP-Hype vote:

* ``policy_from_node_config_us``: :meth:`dphype.policy.NodePolicy.from_node_config`;
* ``check_vote_request_us``: :func:`dphype.policy.check_vote_request` (pre-flight and again at the vote);
* ``ledger_check_us`` / ``ledger_spend_us``: :meth:`dphype.ledger.Ledger.check` / ``spend`` on a ledger
  that already holds ``--entries`` votes (default 10; ``spend`` includes the fsync'd atomic write; each
  spend is followed by a restore of the ledger, not timed);
* ``secagg_stage0_us`` .. ``secagg_stage3_us``: the checks of :mod:`dphype.secagg_guard` with Flower's
  neighbourhood at that n (``share_num`` of :func:`dphype.secagg_params.secure_parameters`);
* ``secure_share_us`` vs ``pcg64_share_us``: one client's noise share of 100 entries from
  :func:`dphype.noise.client_noise_share` (fresh ChaCha20 keyed from the OS) vs numpy's default PCG64.

``guard_total_ms`` sums what one vote adds (two request checks, a ledger check and a spend, the four
SecAgg+ checks, the secure share minus the PCG64 one). The ledger lives in a temporary directory; the
disk's fsync latency dominates ``ledger_spend_us``.

Run: ``.venv/bin/python -m simulations.bench_guard [--clients N] [--entries E] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dphype.candidates import table_iii_grid
from dphype.config import DPHypeConfig
from dphype.ledger import Ledger
from dphype.noise import client_noise_share, min_survivors, noise_share
from dphype.policy import NodePolicy, check_vote_request
from dphype.protocol import make_vote_request
from dphype.secagg_guard import (
    DPHYPE_ENCODING,
    SecAggSetup,
    check_neighbours,
    check_setup,
    check_share_sources,
    check_unmask,
)
from dphype.secagg_params import secure_parameters


def _median_us(fn: Callable[[], Any], repeats: int, after: Callable[[], Any] | None = None) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        if after is not None:
            after()
    return statistics.median(times) * 1e6


def run(clients: int, entries: int, repeats: int) -> dict[str, Any]:
    config = DPHypeConfig(epsilon=1.0, delta=1e-5, k=5, clients=clients, dropout=0.1, noise="skellam")
    candidates = table_iii_grid()
    request = make_vote_request(config, candidates)
    sigma = request.sigma
    out: dict[str, Any] = {"clients": clients, "entries": entries}
    with tempfile.TemporaryDirectory() as tmp:
        node_config = {"dphype-max-epsilon": 1.0, "dphype-lifetime-epsilon": 1000.0,
                       "dphype-ledger": str(Path(tmp) / "ledger.json")}
        out["policy_from_node_config_us"] = _median_us(lambda: NodePolicy.from_node_config(node_config), repeats)
        policy = NodePolicy.from_node_config(node_config)
        out["check_vote_request_us"] = _median_us(lambda: check_vote_request(request, policy), repeats)
        guarantee = check_vote_request(request, policy)
        ledger = Ledger(policy.ledger)
        for _ in range(entries):
            ledger.spend(guarantee, policy, "bench")
        saved = policy.ledger.read_bytes()
        out["ledger_check_us"] = _median_us(lambda: ledger.check(guarantee, policy), repeats)
        out["ledger_spend_us"] = _median_us(lambda: ledger.spend(guarantee, policy, "bench"), repeats,
                                            after=lambda: policy.ledger.write_bytes(saved))

    share_num = secure_parameters(clients).num_shares
    share_num += share_num < clients and share_num % 2 == 0
    setup = SecAggSetup(clients, share_num, max(round(0.6 * share_num), 2), **DPHYPE_ENCODING)
    holders = list(range(share_num))
    keys = {i: (b"%032d" % i, b"%032d" % (i + 10**6)) for i in holders}
    alive = holders[: max(setup.threshold, min_survivors(clients, 0.1) - (clients - share_num))]
    dead = holders[len(alive):]
    out["secagg_stage0_us"] = _median_us(lambda: check_setup(setup, clients=clients), repeats)
    out["secagg_stage1_us"] = _median_us(
        lambda: check_neighbours(setup, 0, keys, clients=clients, dropout=0.1, min_neighbours=4), repeats)
    out["secagg_stage2_us"] = _median_us(
        lambda: check_share_sources(0, holders[1:], holders, threshold=setup.threshold), repeats)
    out["secagg_stage3_us"] = _median_us(
        lambda: check_unmask(0, alive, dead, holders, threshold=setup.threshold, clients=clients, dropout=0.1),
        repeats)

    share = {"size": len(candidates), "sigma": sigma, "clients": clients, "dropout": 0.1, "kind": "skellam"}
    out["secure_share_us"] = _median_us(lambda: client_noise_share(**share), repeats)
    out["pcg64_share_us"] = _median_us(lambda: noise_share(**share, rng=np.random.default_rng()), repeats)
    added = (2 * out["check_vote_request_us"] + out["ledger_check_us"] + out["ledger_spend_us"]
             + sum(out[f"secagg_stage{i}_us"] for i in range(4)) + out["secure_share_us"] - out["pcg64_share_us"])
    out["guard_total_ms"] = added / 1e3
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--entries", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.clients, args.entries, args.repeats)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value:.1f}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()
