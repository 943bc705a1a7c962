"""Where a secure vote's time goes: one round of DP-Hype's SecAgg+ in process, by stage and component.

The round runs through the real server adapter (:func:`dphype.flower.server.secagg_server.run_secure_sum`) and client
handler (:func:`dphype.flower.client.secagg_client.secure_vote_reply`) on the in-process grid of
``dphype.flower.local.LocalGrid`` (synchronous, no Ray, no SuperLink), so the protocol's own cost is separated from
the simulation runtime's. Each client sends a 100-entry integer vector; the sum is checked to be exact.
``--params`` picks the graph: ``secure`` (:func:`dphype.secure.secagg_params.secure_parameters` for ``--dropout``
and ``--corrupt-fraction``) or ``paper`` (shares 0.3 n, threshold all shares; checked against no colluding
client, the only setting it is secure for at small n).

Per stage (``stages``): the seconds each stage took, the nodes' work and the transport included
(:func:`dphype.secure.secagg.run_round`); ``consistency`` is the consistency round (each node checks its noise-share
bound and signs the survivor set) and the signature checks it requires happen at the start of ``unmask``
(``signature checks`` below). Per component (``components``): the wall time inside the functions that do the crypto
and the bookkeeping, summed over all nodes and the server: Shamir sharing and reconstruction, key agreement (X25519
+ HKDF), authenticated encryption, mask expansion (ChaCha20), key generation, Ed25519 signing and signature checks,
the roster's identity signature checks (each verdict once per process, `dphype.secure.roster`: here once for all
nodes, in a deployment once per node), the public graph, the node state's (de)serialization and the grid's
per-message copy (a transport stand-in). ``other`` is the rest (Flower's records and messages, the loops, numpy).
``cpu_seconds`` is the round's CPU time (steadier than wall time on a shared machine). Message and state sizes are
the serialized protobuf sizes. The nodes are members of a roster of their own (as in a simulation or a deployment,
where every key-list entry carries its member's identity signature and every node checks them all);
``--no-roster`` runs the unauthenticated round an operator must opt into.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from simulations import harness

PARAMS = ("secure", "paper")
SIZE = 100
REQUEST = "00" * 32

_PROTOCOL = "dphype.secure.secagg"
_RELAY = "dphype.secure.relay"
#: component -> functions wrapped to time it
COMPONENTS: dict[str, list[tuple[str, str]]] = {
    "shamir share": [(_PROTOCOL, "create_shares_of")],
    "shamir reconstruct": [(_PROTOCOL, "combine_shares_of")],
    "key agreement": [(_PROTOCOL, "_pair_key")],
    "encryption": [(_RELAY, "encrypt"), (_RELAY, "decrypt")],
    "mask expansion": [(_PROTOCOL, "_pair_masks"), (_PROTOCOL, "_self_mask")],
    "signature checks": [(_RELAY, "verify")],
    "roster signature checks": [("dphype.secure.roster", "verify")],
    "public graph": [(_PROTOCOL, "public_graph")],
    "node state (de)serialization": [(_PROTOCOL + ".NodeRound", "to_record"),
                                     (_PROTOCOL + ".NodeRound", "from_record")],
    "transport copy": [("dphype.flower.local.copy", "deepcopy")],
}
STAGES = ("advertise", "share_keys", "masked_input", "consistency", "unmask", "finish")


def graph(clients: int, params: str, dropout: float, corrupt_fraction: float) -> tuple[int | float, int | float]:
    """Flower-style ``(num_shares, reconstruction_threshold)`` for ``--params``: the graph a DP-Hype round picks
    (:func:`dphype.flower.server.secagg_server.secagg_graph`), or the paper's fractions."""
    from dphype.flower.server.secagg_server import secagg_graph
    from dphype.privacy.noise import min_survivors
    from dphype.secure import secagg_params

    if params == "secure":
        chosen = secagg_graph(clients, min_survivors(clients, dropout), None, None, corrupt_fraction)
        return chosen.num_shares, chosen.threshold
    return secagg_params.PAPER_NUM_SHARES, secagg_params.PAPER_THRESHOLD


def vector_app(vectors: np.ndarray, roster: bool = True) -> Any:
    """A ClientApp whose node with partition-id i answers the vote round with ``vectors[i]``; with ``roster``, node
    i is the member ``node-i`` of a roster of all of them (its approval carries its membership)."""
    from flwr.clientapp import ClientApp

    from dphype.flower.client.secagg_client import secure_vote_reply
    from dphype.flower.wire import ACTION
    from dphype.secure import secure_sum as ss
    from dphype.secure.roster import IdentityKey, Member, Roster
    from dphype.secure.secagg import Approval

    app = ClientApp()
    n = len(vectors)
    keys = [IdentityKey.generate() for _ in range(n)] if roster else []
    federation = Roster("profile", tuple(Member(f"node-{i}", "voter", key.public) for i, key in enumerate(keys)))
    approvals = [Approval(request=REQUEST, clients=n, survivors=n, size=SIZE, min_neighbours=1,
                          membership=federation.membership(keys[i]) if roster else None) for i in range(n)]

    @app.train(ACTION)
    def vote(msg: Any, context: Any) -> Any:
        pid = int(context.node_config["partition-id"])
        return secure_vote_reply(msg, context, approvals[pid],
                                 lambda clipping_range: ss.encode(vectors[pid], "skellam", clipping_range))

    return app


def _owner(path: str) -> Any:
    module, _, attribute = path.rpartition(".")
    if path.endswith(".NodeRound") or path.endswith(".copy"):
        return getattr(importlib.import_module(module), attribute)
    return importlib.import_module(path)


def profile_round(clients: int, *, num_shares: float, threshold: float, corrupt_fraction: float,
                  seed: int = 0, roster: bool = True) -> dict[str, Any]:
    """One in-process round of ``clients`` 100-entry vectors (nodes of a roster with ``roster``): wall time,
    stages, components, sizes."""
    from flwr.common.serde import recorddict_to_proto

    from dphype.flower.local import LocalGrid
    from dphype.flower.server import secagg_server

    vectors = np.random.default_rng([seed, clients]).integers(-50, 51, size=(clients, SIZE))
    grid = LocalGrid(vector_app(vectors, roster), clients, federation=False)
    totals: dict[str, float] = defaultdict(float)
    with contextlib.ExitStack() as stack:
        for label, targets in COMPONENTS.items():
            for owner, name in targets:
                stack.enter_context(harness.timed(totals, label, _owner(owner), name))
        start, cpu_start = time.perf_counter(), time.process_time()
        out = secagg_server.run_secure_sum(grid, grid.get_node_ids(), REQUEST, size=SIZE, noise="skellam",
                                    min_survivors=clients, num_shares=num_shares, reconstruction_threshold=threshold,
                                    corrupt_fraction=corrupt_fraction)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if not np.array_equal(out.total, vectors.sum(axis=0)):
        raise RuntimeError("the secure sum is not exact")
    return {
        "clients": clients, "roster": roster, "num_shares": out.secagg.num_shares, "threshold": out.secagg.threshold,
        "seconds": wall, "cpu_seconds": cpu, "components": {**totals, "other": wall - sum(totals.values())},
        "stages": dict(out.stage_seconds),
        "download_bytes_per_client": sum(recorddict_to_proto(m.content).ByteSize() for m in grid.sent) / clients,
        "upload_bytes_per_client": sum(recorddict_to_proto(m.content).ByteSize()
                                       for m in grid.replies if m.has_content()) / clients,
        "state_bytes_per_client": float(np.mean([recorddict_to_proto(c.state).ByteSize()
                                                 for c in grid.contexts.values()])),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, nargs="+", default=[50, 100, 250], help="n (default 50 100 250)")
    parser.add_argument("--params", choices=PARAMS, default="secure", help="SecAgg+ graph (default secure)")
    parser.add_argument("--dropout", type=float, default=0.0, help="tolerated dropout xi for --params secure")
    parser.add_argument("--corrupt-fraction", type=float, default=None,
                        help="clients colluding with the server, for --params secure (default 1/3)")
    parser.add_argument("--no-roster", dest="roster", action="store_false",
                        help="nodes of no roster (an unauthenticated federation; default: a roster of all of them)")


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    from dphype.secure.secagg_params import CORRUPT_FRACTION

    clients = [harness.check_clients(n) for n in args.clients]
    gamma = CORRUPT_FRACTION if args.corrupt_fraction is None else args.corrupt_fraction
    settings = [(n, graph(n, args.params, args.dropout, gamma)) for n in clients]  # bad input fails here
    gamma_checked = gamma if args.params == "secure" else 0.0  # the paper's graph is checked against no collusion
    rows: list[dict[str, Any]] = []
    with harness.progress_bar(len(settings), "secagg-profile") as bar:
        for n, (shares, threshold) in settings:
            rows.append(profile_round(n, num_shares=shares, threshold=threshold, corrupt_fraction=gamma_checked,
                                      seed=args.seed, roster=args.roster))
            bar.update(1)
    study.write_csv("secagg_profile.csv", [_flat(r) for r in rows])
    target = study.path("secagg_profile.txt")
    target.write_text(table(rows) + "\n")
    study.outputs.append(str(target))
    return study.result(params=args.params, dropout=args.dropout, corrupt_fraction=gamma, roster=args.roster,
                        rounds=rows)


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """One CSV row: scalars, then ``component: <name>`` and ``stage: <name>`` seconds."""
    out = {k: v for k, v in row.items() if not isinstance(v, dict)}
    out.update({f"component: {k}": round(v, 4) for k, v in sorted(row["components"].items())})
    out.update({f"stage: {k}": round(row["stages"].get(k, 0.0), 4) for k in STAGES})
    return out


def table(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text breakdown, one column per round."""
    names = sorted({k for r in rows for k in r["components"]},
                   key=lambda k: -max(r["components"].get(k, 0.0) for r in rows))
    lines = [" | ".join(["seconds"] + [f"n={r['clients']}" for r in rows])]
    lines.append(" | ".join(["round (wall)"] + [f"{r['seconds']:.2f}" for r in rows]))
    for stage in STAGES:
        lines.append(" | ".join([f"stage {stage}"] + [f"{r['stages'].get(stage, 0.0):.2f}" for r in rows]))
    for name in names:
        lines.append(" | ".join([name] + [f"{r['components'].get(name, 0.0):.2f}" for r in rows]))
    return "\n".join(lines)
