"""DP-Hype's SecAgg+ round driven from the server, the server half of the Message-API adapter of the secure sum.

The protocol is `dphype.secure.secagg`; the nodes' half of the adapter is `dphype.flower.client.secagg_client`; this
module only carries its messages. `run_secure_sum` drives `dphype.secure.secagg.run_round`, one round trip per
stage (`dphype.flower.grid.send_and_receive`), each a `dphype.flower.wire.VOTE_TYPE` message with the stage under
`dphype.flower.wire.STAGE_KEY`; a node whose reply is an error or late counts as dropped. It never unmasks fewer
than ``min_survivors`` vectors. The first ``advertise`` rides on the pre-flight message (`advertise_record`).

Flower's legacy ``SecAggPlusWorkflow`` is not used: it is not on the Message API, and its mask generator seeds
NumPy's ``RandomState`` with 32 bits of the agreed key.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import log
from flwr.serverapp.grid import Grid

from dphype.flower.grid import check_timeout, send_and_receive
from dphype.flower.wire import STAGE_KEY, VOTE_TYPE
from dphype.secure import secagg as protocol
from dphype.secure.secagg_params import CORRUPT_FRACTION, SecAggParameters, check_parameters, secure_parameters
from dphype.secure.secure_sum import SecureSumError, TooFewSurvivorsError, clipping_range_for, decode


@dataclass(frozen=True)
class SecureSum:
    """The exact sum of the contributors' encoded vectors, with the graph it ran on and its timings.

    Attributes:
        total: The ``(p,)`` released sum (int64 votes for Skellam, float64 for Gaussian noise).
        survivors: How many nodes' vectors are in the sum.
        seconds: The whole round's wall-clock seconds.
        secagg: The SecAgg+ graph the round ran on, with the failure bounds it achieves.
        clipping_range: The range ``C`` (`dphype.secure.secure_sum.clipping_range_for`) of the nodes that
            advertised keys.
        stage_seconds: Each stage's seconds (``consistency`` is the consistency round; ``unmask`` includes the
            signature checks).
    """

    total: np.ndarray
    survivors: int
    seconds: float
    secagg: SecAggParameters
    clipping_range: int
    stage_seconds: dict[str, float] = field(default_factory=dict)


def secagg_graph(clients: int, min_survivors: int, num_shares: float | None,
                 reconstruction_threshold: float | None, corrupt_fraction: float) -> SecAggParameters:
    """The round's SecAgg+ graph: the secure one by default, an explicit choice only if it is as secure.

    The tolerated dropout is ``(n - min_survivors) / n``; either way the threshold exceeds half the shares
    (`dphype.secure.secagg_params.check_share_threshold`, which every node checks).

    Args:
        clients: The nodes ``n`` in the round.
        min_survivors: The fewest contributors the release needs.
        num_shares: The explicit number of shares (Flower's int or fraction of ``n``); ``None`` with
            ``reconstruction_threshold`` ``None`` takes the secure graph.
        reconstruction_threshold: The explicit threshold (an int or a fraction of the shares), given with
            ``num_shares``.
        corrupt_fraction: The fraction of clients that may collude with the server.

    Returns:
        The graph's parameters and the failure bounds they achieve.

    Raises:
        ValueError: If only one of ``num_shares`` and ``reconstruction_threshold`` is given, or the explicit
            choice is less secure than the default (`dphype.secure.secagg_params.check_parameters`).
    """  # noqa: DOC502
    dropout = (clients - min_survivors) / clients
    if num_shares is None and reconstruction_threshold is None:
        return secure_parameters(clients, dropout=dropout, corrupt_fraction=corrupt_fraction, majority=True)
    if num_shares is None or reconstruction_threshold is None:
        raise ValueError("num_shares and reconstruction_threshold must be given together (or neither: secure)")
    return check_parameters(clients, num_shares, reconstruction_threshold, dropout=dropout,
                            corrupt_fraction=corrupt_fraction, majority=True)


def _send(grid: Grid, stage: str, messages: dict[int, dict[str, Any]], timeout: float | None,
          failures: Counter[str], message_type: str = VOTE_TYPE) -> dict[int, dict[str, Any]]:
    """One stage: every node its message (shared contents as one record), the replies within ``timeout``."""
    records: dict[int, ConfigRecord] = {}
    out = []
    for node, content in messages.items():
        if id(content) not in records:
            records[id(content)] = ConfigRecord(content)
        out.append(Message(RecordDict({STAGE_KEY: records[id(content)]}), dst_node_id=node,
                           message_type=message_type))
    replies: dict[int, dict[str, Any]] = {}
    for reply in send_and_receive(grid, out, timeout=timeout, what=f"DP-Hype secure vote {stage}"):
        if reply.has_error():
            failures[(reply.error.reason or "")[:300]] += 1
            continue
        record = reply.content.config_records.get(STAGE_KEY)
        if record is not None:
            replies[reply.metadata.src_node_id] = dict(record)
    return replies


def advertise_record(request: str) -> tuple[bytes, ConfigRecord]:
    """A fresh round id and the ``advertise`` record the pre-flight carries for the request with this digest."""
    round_id = protocol.new_round_id()
    return round_id, ConfigRecord(protocol.message("advertise", round=round_id, request=request))


def run_secure_sum(
    grid: Grid,
    node_ids: Iterable[int],
    request: str,
    *,
    size: int,
    noise: str,
    min_survivors: int,
    num_shares: float | None = None,
    reconstruction_threshold: float | None = None,
    corrupt_fraction: float = CORRUPT_FRACTION,
    timeout: float | None = None,
    advertised: protocol.Advertised | None = None,
    message_type: str = VOTE_TYPE,
) -> SecureSum:
    """One secure-sum round over ``node_ids`` for the approved request, on `secagg_graph`'s graph.

    Args:
        grid: The ServerApp's grid.
        node_ids: The nodes that approved the request (duplicates count once).
        request: The approved request's digest.
        size: The length ``p`` of every node's encoded vector.
        noise: ``"gaussian"`` or ``"skellam"``: how the exact sum is decoded (`dphype.secure.secure_sum.decode`).
        min_survivors: The fewest vectors the server may unmask, ``1 <= min_survivors <= len(node_ids)``.
        num_shares: An explicit number of shares (Flower's int or fraction); ``None``: the secure graph.
        reconstruction_threshold: An explicit threshold, given with ``num_shares``; ``None``: the secure graph.
        corrupt_fraction: The fraction of clients that may collude with the server.
        timeout: Seconds each stage waits for the replies; ``None`` waits for every reply.
        advertised: The round's ``advertise`` stage as it ran in the pre-flight; ``None`` starts with it.
        message_type: The stages' message type: the vote's `dphype.flower.wire.VOTE_TYPE`, or the private
            evaluation's `dphype.flower.wire.EVALUATION_TYPE`.

    Returns:
        The exact sum of the contributors' vectors, with the graph, the range ``C`` and the timings.

    Raises:
        TooFewSurvivorsError: If fewer than ``min_survivors`` nodes remain (nothing is unmasked; nothing is sent
            if there are too few nodes to start with).
        SecureSumError: If the round cannot be completed (with a summary of the client failures).
        ValueError: If ``timeout`` or the explicit graph is invalid (`secagg_graph`).
    """  # noqa: DOC502, DOC503
    nodes = sorted(set(node_ids))
    timeout = check_timeout("timeout", timeout)
    if not 1 <= min_survivors <= len(nodes):
        raise TooFewSurvivorsError(
            f"only {len(nodes)} clients can take part, fewer than the {min_survivors} required; nothing was sent")
    secagg_graph(len(nodes), min_survivors, num_shares, reconstruction_threshold, corrupt_fraction)  # refuse early
    graphs: dict[int, SecAggParameters] = {}

    def graph_for(m: int) -> tuple[int, int]:
        graphs[m] = secagg_graph(m, min_survivors, num_shares, reconstruction_threshold, corrupt_fraction)
        return graphs[m].neighbours, graphs[m].threshold

    failures: Counter[str] = Counter()
    timings: dict[str, float] = {}
    start = time.perf_counter()
    try:
        result, server = protocol.run_round(
            nodes, lambda stage, messages: _send(grid, stage, messages, timeout, failures, message_type),
            request=request, size=size, min_survivors=min_survivors, graph_for=graph_for, timings=timings,
            advertised=advertised)
    except SecureSumError as err:
        raise type(err)(f"{err}. Client failures: {_failure_summary(failures)}") from None
    log(logging.INFO, "DP-Hype secure vote: %d of %d clients contributed (%s)", len(result.survivors), len(nodes),
        ", ".join(f"{stage} {seconds:.2f} s" for stage, seconds in timings.items()))
    return SecureSum(decode(result.total, noise), len(result.survivors), time.perf_counter() - start,
                     graphs[len(server.keys)], clipping_range_for(len(server.keys)), timings)


def _failure_summary(failures: Counter[str]) -> str:
    return "; ".join(f"{count} x {reason}" for reason, count in failures.most_common())[:2000] or "none reported"
