"""Where a secure vote's time goes: one SecAgg+ round in process, broken down by component (issue 10).

The round runs through the real Flower server workflow and client mods, but on the in-process grid of
``dphype.flower.local.LocalGrid`` (synchronous, no Ray, no SuperLink), so the protocol's own cost is separated from
the simulation runtime's. Each client sends a 100-entry integer vector; the sum is checked to be exact.

Both variants run :func:`dphype.flower.secagg.run_secure_sum`: ``--variant dphype`` as it is (on
:mod:`dphype.flower.secagg_fast`), ``--variant flower`` with Flower 1.41's stock ``secaggplus_mod`` and
unmask stage swapped back in (the "before"). ``--params`` picks the graph: ``secure``
(:func:`dphype.secure.secagg_params.secure_parameters` for ``--dropout`` and ``--corrupt-fraction``) or ``paper``
(shares 0.3 n, threshold all shares; checked against no colluding client, the only setting it is secure
for at small n).

The breakdown wraps the crypto and serialization functions the two paths call (in this process only, for
the duration of the round) and adds up their wall time: Shamir sharing and reconstruction, key agreement
(ECDH + HKDF), key parsing (PEM), encryption, mask generation, key generation, the clients' checks of every
stage (:func:`dphype.flower.secagg.check_stage`), the SecAgg+ state each client stores in ``context.state``
between stages, and the grid's per-message copy (a transport stand-in).
``other`` is the rest (Flower's records and messages, the server's loops, numpy). ``cpu_seconds`` is the
round's CPU time (steadier than wall time on a shared machine). Message and state sizes are the serialized
protobuf sizes.
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

VARIANTS = ("flower", "dphype")
PARAMS = ("secure", "paper")
SIZE = 100

#: component -> (module, function names) wrapped to time that component, per variant.
_FLOWER_MOD = "flwr.client.mod.secure_aggregation.secaggplus_mod"
_FLOWER_WORKFLOW = "flwr.server.workflow.secure_aggregation.secaggplus_workflow"
_FAST = "dphype.flower.secagg_fast"
_ADAPTER = "dphype.flower.secagg"  # the client's stage checks (issue 8) run on both variants
COMPONENTS: dict[str, dict[str, list[tuple[str, str]]]] = {
    "flower": {
        "shamir share": [(_FLOWER_MOD, "create_shares")],
        "shamir reconstruct": [(_FLOWER_WORKFLOW, "combine_shares")],
        "key agreement": [(_FLOWER_MOD, "generate_shared_key"), (_FLOWER_WORKFLOW, "generate_shared_key")],
        "key parsing": [(_FLOWER_MOD, "bytes_to_private_key"), (_FLOWER_MOD, "bytes_to_public_key"),
                        (_FLOWER_WORKFLOW, "bytes_to_private_key"), (_FLOWER_WORKFLOW, "bytes_to_public_key")],
        "encryption": [(_FLOWER_MOD, "encrypt"), (_FLOWER_MOD, "decrypt")],
        "mask generation": [(_FLOWER_MOD, "pseudo_rand_gen"), (_FLOWER_WORKFLOW, "pseudo_rand_gen")],
        "key generation": [(_FLOWER_MOD, "generate_key_pairs")],
        "client checks": [(_ADAPTER, "check_stage")],
    },
    "dphype": {
        "shamir share": [(_FAST, "create_shares_of")],
        "shamir reconstruct": [(_FAST, "combine_shares")],
        "key agreement": [(_FAST, "generate_shared_key")],
        "key parsing": [(_FAST, "bytes_to_private_key"), (_FAST, "bytes_to_public_key")],
        "encryption": [(_FAST, "encrypt"), (_FAST, "decrypt")],
        "mask generation": [(_FAST, "pseudo_rand_gen")],
        "key generation": [(_FLOWER_MOD, "generate_key_pairs")],
        "client checks": [(_ADAPTER, "check_stage")],
    },
}
STAGES = ("setup_stage", "share_keys_stage", "collect_masked_vectors_stage", "unmask_stage")


def graph(clients: int, params: str, dropout: float, corrupt_fraction: float) -> tuple[int | float, int | float]:
    """Flower's ``(num_shares, reconstruction_threshold)`` for ``--params``: the graph a DP-Hype round picks
    (:func:`dphype.flower.secagg.secagg_graph`), or the paper's fractions."""
    from dphype.flower.secagg import secagg_graph
    from dphype.privacy.noise import min_survivors
    from dphype.secure import secagg_params

    if params == "secure":
        chosen = secagg_graph(clients, min_survivors(clients, dropout), None, None, corrupt_fraction)
        return chosen.num_shares, chosen.threshold
    return secagg_params.PAPER_NUM_SHARES, secagg_params.PAPER_THRESHOLD


def vector_app(vectors: np.ndarray) -> Any:
    """A ClientApp whose node with partition-id i answers the vote round with ``vectors[i]``."""
    from flwr.clientapp import ClientApp

    from dphype.flower.secagg import secure_vote_reply
    from dphype.secure import secure_sum as ss

    app = ClientApp()

    @app.train("dphype")
    def vote(msg: Any, context: Any) -> Any:
        pid = int(context.node_config["partition-id"])
        return secure_vote_reply(msg, context, lambda config, clipping_range: ss.encode(vectors[pid], "skellam"),
                                 clients=len(vectors), dropout=0.0, min_neighbours=1)

    return app


def profile_round(clients: int, *, variant: str, num_shares: float, threshold: float, corrupt_fraction: float,
                  seed: int = 0) -> dict[str, Any]:
    """One in-process SecAgg+ round of ``clients`` 100-entry vectors: wall time, components, sizes.

    ``variant="flower"`` swaps Flower's own client mod and unmask stage back into the adapter for the round.
    """
    from flwr.common.serde import recorddict_to_proto
    from flwr.server.workflow import SecAggPlusWorkflow

    from dphype.flower import secagg
    from dphype.flower.local import LocalGrid
    from dphype.flower.secagg_fast import ScalableSecAggPlusWorkflow

    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    vectors = np.random.default_rng([seed, clients]).integers(-50, 51, size=(clients, SIZE))
    grid = LocalGrid(vector_app(vectors), clients)
    flower_mod = importlib.import_module(_FLOWER_MOD)
    totals: dict[str, float] = defaultdict(float)
    wraps: list[tuple[str, Any, str]] = [
        (label, importlib.import_module(module), name)
        for label, targets in COMPONENTS[variant].items() for module, name in targets
    ]
    wraps += [("state (de)serialization", flower_mod.SecAggPlusState, "__init__"),
              ("state (de)serialization", flower_mod.SecAggPlusState, "to_dict"),
              ("transport copy", importlib.import_module("dphype.flower.local").copy, "deepcopy")]
    wraps += [(f"stage: {stage}", SecAggPlusWorkflow, stage) for stage in STAGES[:3]]
    wraps += [("stage: unmask_stage", ScalableSecAggPlusWorkflow, "unmask_stage")]
    with contextlib.ExitStack() as stack:
        if variant == "flower":
            stack.enter_context(harness.swapped(secagg, "scalable_secaggplus_mod", flower_mod.secaggplus_mod))
            stack.enter_context(
                harness.swapped(ScalableSecAggPlusWorkflow, "unmask_stage", SecAggPlusWorkflow.unmask_stage))
        for label, owner, name in wraps:
            stack.enter_context(harness.timed(totals, label, owner, name))
        start, cpu_start = time.perf_counter(), time.process_time()
        out = secagg.run_secure_sum(grid, grid.get_node_ids(), {}, size=SIZE, noise="skellam",
                                    min_survivors=clients, num_shares=num_shares, reconstruction_threshold=threshold,
                                    corrupt_fraction=corrupt_fraction)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if not np.array_equal(out.total, vectors.sum(axis=0)):
        raise RuntimeError("the secure sum is not exact")
    components = {k: v for k, v in totals.items() if not k.startswith("stage: ")}
    stages = {k[len("stage: "):]: v for k, v in totals.items() if k.startswith("stage: ")}
    return {
        "variant": variant, "clients": clients, "num_shares": num_shares, "threshold": threshold,
        "seconds": wall, "cpu_seconds": cpu, "components": {**components, "other": wall - sum(components.values())},
        "stages": stages,
        "download_bytes_per_client": sum(recorddict_to_proto(m.content).ByteSize() for m in grid.sent) / clients,
        "upload_bytes_per_client": sum(recorddict_to_proto(m.content).ByteSize()
                                       for m in grid.replies if m.has_content()) / clients,
        "state_bytes_per_client": float(np.mean([recorddict_to_proto(c.state).ByteSize()
                                                 for c in grid.contexts.values()])),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, nargs="+", default=[50, 100, 250], help="n (default 50 100 250)")
    parser.add_argument("--variant", choices=VARIANTS, nargs="+", default=list(VARIANTS),
                        help="flower: stock SecAgg+; dphype: the product's path (default both)")
    parser.add_argument("--params", choices=PARAMS, default="secure", help="SecAgg+ graph (default secure)")
    parser.add_argument("--dropout", type=float, default=0.0, help="tolerated dropout xi for --params secure")
    parser.add_argument("--corrupt-fraction", type=float, default=None,
                        help="clients colluding with the server, for --params secure (default 1/3)")


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    from dphype.secure.secagg_params import CORRUPT_FRACTION

    clients = [harness.check_clients(n) for n in args.clients]
    gamma = CORRUPT_FRACTION if args.corrupt_fraction is None else args.corrupt_fraction
    settings = [(n, graph(n, args.params, args.dropout, gamma)) for n in clients]  # bad input fails here
    gamma_checked = gamma if args.params == "secure" else 0.0  # the paper's graph is checked against no collusion
    rows: list[dict[str, Any]] = []
    with harness.progress_bar(len(settings) * len(args.variant), "secagg-profile") as bar:
        for n, (shares, threshold) in settings:
            for variant in args.variant:
                rows.append(profile_round(n, variant=variant, num_shares=shares, threshold=threshold,
                                          corrupt_fraction=gamma_checked, seed=args.seed))
                bar.update(1)
    study.write_csv("secagg_profile.csv", [_flat(r) for r in rows])
    target = study.path("secagg_profile.txt")
    target.write_text(table(rows) + "\n")
    study.outputs.append(str(target))
    return study.result(params=args.params, dropout=args.dropout, corrupt_fraction=gamma, rounds=rows)


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """One CSV row: scalars, then ``component: <name>`` and ``stage: <name>`` seconds."""
    out = {k: v for k, v in row.items() if not isinstance(v, dict)}
    out.update({f"component: {k}": round(v, 4) for k, v in sorted(row["components"].items())})
    out.update({f"stage: {k}": round(row["stages"].get(k, 0.0), 4) for k in STAGES})
    return out


def table(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text breakdown (one column per round) for the README."""
    names = sorted({k for r in rows for k in r["components"]},
                   key=lambda k: -max(r["components"].get(k, 0.0) for r in rows))
    lines = [" | ".join(["seconds"] + [f"{r['variant']} n={r['clients']}" for r in rows])]
    lines.append(" | ".join(["round (wall)"] + [f"{r['seconds']:.2f}" for r in rows]))
    for name in names:
        lines.append(" | ".join([name] + [f"{r['components'].get(name, 0.0):.2f}" for r in rows]))
    return "\n".join(lines)
