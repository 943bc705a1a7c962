"""Where a secure vote's time goes: one SecAgg+ round in process, broken down by component (issue 10).

The round runs through the real Flower server workflow and client mods, but on the in-process grid of
``tests/local_grid.py`` (synchronous, no Ray, no SuperLink), so the protocol's own cost is separated from
the simulation runtime's. Each client sends a 100-entry integer vector; the sum is checked to be exact.

``--variant flower`` runs Flower 1.41's stock ``SecAggPlusWorkflow`` and ``secaggplus_mod`` (the "before"),
``--variant dphype`` the product's path (:class:`dphype.secure_sum.ExactSumWorkflow` on
:mod:`dphype.flower.secagg_fast`). ``--params`` picks the graph: ``secure`` (:func:`dphype.secagg_params.
secure_parameters` for ``--dropout`` and ``--corrupt-fraction``), ``paper`` (shares 0.3 n, threshold all
shares) or ``legacy`` (the former default: shares ``max(7, n/5)``, threshold 0.6).

The breakdown wraps the crypto and serialization functions the two paths call (in this process only, for
the duration of the round) and adds up their wall time: Shamir sharing and reconstruction, key agreement
(ECDH + HKDF), key parsing (PEM), encryption, mask generation, key generation, the SecAgg+ state each
client stores in ``context.state`` between stages, and the grid's per-message copy (a transport stand-in).
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
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from simulations import harness

VARIANTS = ("flower", "dphype")
PARAMS = ("secure", "paper", "legacy")
SIZE = 100

#: component -> (module, function names) wrapped to time that component, per variant.
_FLOWER_MOD = "flwr.client.mod.secure_aggregation.secaggplus_mod"
_FLOWER_WORKFLOW = "flwr.server.workflow.secure_aggregation.secaggplus_workflow"
_FAST = "dphype.flower.secagg_fast"
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
    },
    "dphype": {
        "shamir share": [(_FAST, "create_shares_of")],
        "shamir reconstruct": [(_FAST, "combine_shares")],
        "key agreement": [(_FAST, "generate_shared_key")],
        "key parsing": [(_FAST, "bytes_to_private_key"), (_FAST, "bytes_to_public_key")],
        "encryption": [(_FAST, "encrypt"), (_FAST, "decrypt")],
        "mask generation": [(_FAST, "pseudo_rand_gen")],
        "key generation": [(_FLOWER_MOD, "generate_key_pairs")],
    },
}
STAGES = ("setup_stage", "share_keys_stage", "collect_masked_vectors_stage", "unmask_stage")


@contextlib.contextmanager
def _timed(totals: dict[str, float], label: str, owner: Any, name: str) -> Iterator[None]:
    """Replace ``owner.name`` by a wrapper that adds its wall time to ``totals[label]``; restore it after."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[label] += time.perf_counter() - start

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, original)


def graph(clients: int, params: str, dropout: float, corrupt_fraction: float) -> tuple[int | float, int | float]:
    """Flower's ``(num_shares, reconstruction_threshold)`` for ``--params``."""
    from dphype import secagg_params
    from dphype.secure_sum import default_num_shares

    if params == "secure":
        chosen = secagg_params.secure_parameters(clients, dropout=dropout, corrupt_fraction=corrupt_fraction)
        return chosen.num_shares, chosen.threshold
    if params == "paper":
        return secagg_params.PAPER_NUM_SHARES, secagg_params.PAPER_THRESHOLD
    return default_num_shares(clients), 0.6


def profile_round(clients: int, *, variant: str, num_shares: float, threshold: float,
                  seed: int = 0) -> dict[str, Any]:
    """One in-process SecAgg+ round of ``clients`` 100-entry vectors: wall time, components, sizes."""
    from flwr.app import Context, RecordDict
    from flwr.client import NumPyClient
    from flwr.clientapp import ClientApp
    from flwr.common.serde import recorddict_to_proto
    from flwr.server import ServerConfig
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    from dphype import secure_sum as ss
    from dphype.flower.secagg_fast import ScalableSecAggPlusWorkflow
    from tests.local_grid import LocalGrid  # the in-process grid of the protocol tests

    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    vectors = np.random.default_rng([seed, clients]).integers(-50, 51, size=(clients, SIZE))

    class VectorClient(NumPyClient):
        def __init__(self, pid: int) -> None:
            self.pid = pid

        def fit(self, parameters: Any, config: Any) -> Any:
            return [ss.encode(vectors[self.pid], "skellam")], 1, {}

    flower_mod = importlib.import_module(_FLOWER_MOD)
    mod = flower_mod.secaggplus_mod if variant == "flower" else ss.secure_vote_mod
    app = ClientApp(client_fn=lambda ctx: VectorClient(int(ctx.node_config["partition-id"])).to_client(), mods=[mod])
    grid = LocalGrid(app, clients)
    strategy = ss.SecureSumStrategy(clients=clients, size=SIZE, noise="skellam", min_survivors=clients,
                                    fit_config={ss.PHASE_KEY: ss.VOTE_PHASE})
    clip = ss.clipping_range_for(clients)
    kwargs = {"max_weight": ss.MAX_WEIGHT, "clipping_range": float(clip), "quantization_range": 2 * clip,
                  "modulus_range": ss.MODULUS_RANGE}
    if variant == "flower":
        workflow: SecAggPlusWorkflow = SecAggPlusWorkflow(num_shares, threshold, **kwargs)
    else:
        workflow = ss.ExactSumWorkflow(min_survivors=clients, num_shares=num_shares,
                                       reconstruction_threshold=threshold, clipping_range=clip)
    context = LegacyContext(Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                            config=ServerConfig(num_rounds=1), strategy=strategy)
    totals: dict[str, float] = defaultdict(float)
    stage_class = SecAggPlusWorkflow if variant == "flower" else ScalableSecAggPlusWorkflow
    wraps: list[tuple[str, Any, str]] = [
        (label, importlib.import_module(module), name)
        for label, targets in COMPONENTS[variant].items() for module, name in targets
    ]
    wraps += [("state (de)serialization", flower_mod.SecAggPlusState, "__init__"),
              ("state (de)serialization", flower_mod.SecAggPlusState, "to_dict"),
              ("transport copy", importlib.import_module("tests.local_grid").copy, "deepcopy")]
    wraps += [(f"stage: {stage}", stage_class if stage == "unmask_stage" else SecAggPlusWorkflow, stage)
              for stage in STAGES]
    with contextlib.ExitStack() as stack:
        for label, owner, name in wraps:
            stack.enter_context(_timed(totals, label, owner, name))
        start, cpu_start = time.perf_counter(), time.process_time()
        DefaultWorkflow(fit_workflow=workflow)(grid, context)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if strategy.total is None or not np.array_equal(strategy.total, vectors.sum(axis=0)):
        raise RuntimeError("the secure sum was not released or is not exact")
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
    from dphype.secagg_params import CORRUPT_FRACTION

    clients = [harness.check_clients(n) for n in args.clients]
    gamma = CORRUPT_FRACTION if args.corrupt_fraction is None else args.corrupt_fraction
    settings = [(n, graph(n, args.params, args.dropout, gamma)) for n in clients]  # bad input fails here
    rows: list[dict[str, Any]] = []
    with harness.progress_bar(len(settings) * len(args.variant), "secagg-profile") as bar:
        for n, (shares, threshold) in settings:
            for variant in args.variant:
                rows.append(profile_round(n, variant=variant, num_shares=shares, threshold=threshold, seed=args.seed))
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
