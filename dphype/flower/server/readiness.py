"""Which nodes take part in a selection: :func:`wait_for_nodes` (enough connected nodes) and :func:`run_preflight`
(``query.dphype``: every client checks the request against its own candidate list, task and limits, scores the
candidates and answers ready or a reason); too few of either: :class:`PreflightError`, and nothing is sent in
the vote round.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import log
from flwr.serverapp.grid import Grid

from dphype.flower.grid import send_and_receive
from dphype.flower.wire import PREFLIGHT_TYPE, RECORD_KEY, STAGE_KEY
from dphype.node.policy import REMEDIES
from dphype.protocol import VoteRequest
from dphype.refusal import REFUSAL_CODES


class PreflightError(RuntimeError):
    """Too few clients are ready to vote; nothing was sent in the vote round and nothing was released."""


def wait_for_nodes(grid: Grid, clients: int, timeout: float | None, every: float = 5.0) -> list[int]:
    """``clients`` connected node IDs (a random sample when more are connected), logging how many are connected
    every ``every`` seconds while it waits (it looks every 0.5 s, or every ``every`` s when that is shorter)."""
    start = time.monotonic()
    last_log = start
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= clients:
            return sorted(random.sample(nodes, clients))
        waited = time.monotonic() - start
        if timeout is not None and waited > timeout:
            raise PreflightError(f"only {len(nodes)} of clients={clients} nodes connected within {timeout:g} s; "
                                 "nothing was sent: start more SuperNodes, or run with clients <= the nodes you have")
        if time.monotonic() - last_log >= every:
            log(logging.INFO, "DP-Hype: waiting for nodes: %d of clients=%d connected after %.0f s%s", len(nodes),
                clients, waited, "" if timeout is None else f" (giving up after {timeout:g} s)")
            last_log = time.monotonic()
        time.sleep(min(0.5, every))


def run_preflight(grid: Grid, request: VoteRequest, nodes: list[int], timeout: float | None,
                  advertise: ConfigRecord | None = None) -> tuple[dict[int, dict[str, Any]], tuple[str, ...]]:
    """Send ``request`` to ``nodes``, with the secure vote's first stage ``advertise`` if given
    (:func:`dphype.flower.server.secagg.advertise_record`); return the nodes that answered ready, each with its
    answer to ``advertise`` (its round keys; empty without), and the notes for the result, or raise
    :class:`PreflightError`."""
    content = RecordDict({RECORD_KEY: ConfigRecord(request.to_record())})
    if advertise is not None:
        content[STAGE_KEY] = advertise
    messages = [Message(content, dst_node_id=nid, message_type=PREFLIGHT_TYPE) for nid in nodes]
    log(logging.INFO, "DP-Hype pre-flight: sending the request to %d clients (each checks it and scores "
        "the %d candidates)", len(nodes), len(request.candidates))
    replies = send_and_receive(grid, messages, timeout=timeout, what="DP-Hype pre-flight")
    ready: dict[int, dict[str, Any]] = {}
    reasons: Counter[str] = Counter()
    per_run = 0
    for reply in replies:
        answer = _answer(reply)
        if answer == "ready":
            ready[reply.metadata.src_node_id] = dict(reply.content.config_records.get(STAGE_KEY, {}))
            per_run += reply.content.config_records[RECORD_KEY].get("ledger") == "per-run"
        else:
            reasons[answer] += 1
    reasons["no answer within the timeout"] += len(nodes) - len(replies)
    reasons = +reasons  # drop zero counts
    log(logging.INFO, "DP-Hype pre-flight: %d of %d clients ready%s", len(ready), len(nodes),
        "" if not reasons else "; " + _describe(reasons))
    if len(ready) < request.min_survivors:
        raise PreflightError(
            f"{len(nodes) - len(ready)} of {len(nodes)} clients are not ready: {_describe(reasons)}; "
            f"at least {request.min_survivors} must take part (clients={request.config.clients}, "
            f"dropout={request.config.dropout:g}); the vote was not started and nothing was released")
    notes: tuple[str, ...] = ()
    if per_run:
        note = (f"{per_run} of {len(ready)} nodes are simulated with a per-run ledger: their lifetime budget "
                "restarts with every run (an operator who names dphype-ledger keeps one across runs)")
        log(logging.INFO, "DP-Hype: %s", note)
        notes = (note,)
    return ready, notes


def _answer(reply: Message) -> str:
    """``"ready"``, or the refusal reason of one pre-flight reply."""
    if reply.has_error():
        return f"client error ({(reply.error.reason or '')[:200]})"
    record = reply.content.config_records.get(RECORD_KEY)
    if record is None:
        return "malformed reply"
    if record.get("status") == "ready":
        return "ready"
    code = str(record.get("code"))
    known = code if code in REFUSAL_CODES else "unknown code"
    remedy = f"; to resolve: {REMEDIES[known]}" if known in REMEDIES else ""
    return f"refused: {known} ({str(record.get('detail', ''))[:200]}{remedy})"


def _describe(reasons: Counter[str]) -> str:
    return "; ".join(f"{count} x {reason}" for reason, count in reasons.most_common())
