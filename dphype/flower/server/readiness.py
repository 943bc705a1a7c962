"""Which nodes take part in a selection: enough connected nodes, then the clients that are ready.

`wait_for_nodes` waits for enough connected nodes (`remaining_nodes` takes those still connected, without a
second wait, once a run has counted them) and `run_preflight` sends the pre-flight
(``query.dphype``: every client checks the request against its own candidate list, task and limits, scores the
candidates and answers ready or a reason); too few of either: `PreflightError`, and nothing is sent in
the vote round.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Collection
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import log
from flwr.serverapp.grid import Grid

from dphype.flower.grid import node_ids, send_and_receive
from dphype.flower.wire import PREFLIGHT_TYPE, RECORD_KEY, STAGE_KEY
from dphype.node.policy import REMEDIES
from dphype.protocol import VoteRequest
from dphype.refusal import REFUSAL_CODES


class PreflightError(RuntimeError):
    """Too few clients are ready to vote; nothing was sent in the vote round and nothing was released."""


def wait_for_nodes(grid: Grid, clients: int, timeout: float | None, every: float = 5.0) -> list[int]:
    """``clients`` connected node IDs (a random sample when more are connected), logging progress while it waits.

    Args:
        grid: The ServerApp's grid.
        clients: How many nodes the selection needs.
        timeout: Seconds to wait for them; ``None`` waits forever.
        every: Seconds between two progress lines.

    Returns:
        ``clients`` node IDs, sorted.

    Raises:
        PreflightError: If fewer than ``clients`` nodes are connected after ``timeout`` seconds (nothing was sent).
    """
    start = time.monotonic()
    last_log = start
    while True:
        nodes = sorted(node_ids(grid))
        if len(nodes) >= clients:
            return sorted(random.sample(nodes, clients))
        waited = time.monotonic() - start
        if timeout is not None and waited > timeout:
            raise PreflightError(f"only {len(nodes)} of clients={clients} nodes connected within {timeout:g} s; "
                                 "nothing was sent: start more SuperNodes\nor run with clients <= the nodes you "
                                 "have")
        if time.monotonic() - last_log >= every:
            log(logging.INFO, "DP-Hype: waiting for nodes: %d of clients=%d connected after %.0f s%s", len(nodes),
                clients, waited, "" if timeout is None else f" (giving up after {timeout:g} s)")
            last_log = time.monotonic()
        time.sleep(min(0.5, every))


def remaining_nodes(grid: Grid, exclude: Collection[int], clients: int, fewest: int) -> list[int]:
    """``clients`` connected nodes outside ``exclude`` (a random sample), or all of them when fewer are left.

    For a run that has counted its nodes already (its committee was found among them): a node no longer connected
    was cut off mid-run and is a dropout of the selection, not waited for again.

    Args:
        grid: The ServerApp's grid.
        exclude: Node IDs that are not candidates (the tallies).
        clients: How many nodes the selection asks.
        fewest: The fewest nodes the selection can go on with (the request's ``min_survivors``).

    Returns:
        The node IDs, sorted: ``clients`` of them, or every one left when that is between ``fewest`` and ``clients``.

    Raises:
        PreflightError: If fewer than ``fewest`` are left (nothing was sent).
    """
    nodes = sorted(n for n in node_ids(grid) if n not in exclude)
    if len(nodes) >= clients:
        return sorted(random.sample(nodes, clients))
    if len(nodes) < fewest:
        raise PreflightError(f"only {len(nodes)} of clients={clients} voters are still connected, fewer than the "
                             f"{fewest} the selection needs\n({clients - len(nodes)} cut off after the run counted "
                             "them); nothing was sent and nothing was released: run again")
    log(logging.WARNING, "DP-Hype: %d of clients=%d voters are still connected; the %d cut off since the run "
        "counted them are dropouts (at least %d must take part)", len(nodes), clients, clients - len(nodes), fewest)
    return nodes


def run_preflight(grid: Grid, request: VoteRequest, nodes: list[int], timeout: float | None,
                  advertise: ConfigRecord | None = None) -> tuple[dict[int, dict[str, Any]], tuple[str, ...], str]:
    """Send ``request`` to ``nodes`` and keep the nodes that answer ready.

    With the secure vote's first stage ``advertise`` if given (`dphype.flower.server.secagg_server.advertise_record`).
    A note for the result says how many ready nodes are simulated with a per-run ledger.

    Args:
        grid: The ServerApp's grid.
        request: The vote request every client checks.
        nodes: The node IDs to ask (`wait_for_nodes`).
        timeout: Seconds to wait for the answers; ``None`` waits for every answer.
        advertise: The secure vote's first stage, sent with the request; ``None`` sends none.

    Returns:
        The nodes that answered ready (node ID -> its answer to ``advertise``: its round keys; empty without),
        the notes for the result, and the federation the ready nodes named (``"roster <fingerprint> (N members)"``
        or ``"unauthenticated"``, `dphype.secure.roster.Roster.describe`).

    Raises:
        PreflightError: If fewer than the request's ``min_survivors`` clients are ready, or the ready nodes name
            different federations (the vote was not started and nothing was released).
    """
    content = RecordDict({RECORD_KEY: ConfigRecord(request.to_record())})
    if advertise is not None:
        content[STAGE_KEY] = advertise
    messages = [Message(content, dst_node_id=nid, message_type=PREFLIGHT_TYPE) for nid in nodes]
    log(logging.INFO, "DP-Hype pre-flight: sending the request to %d clients (each checks it and scores "
        "the %d candidates)", len(nodes), len(request.candidates))
    replies = send_and_receive(grid, messages, timeout=timeout, what="DP-Hype pre-flight")
    ready = ready_nodes(replies, nodes, fewest=request.min_survivors, what="pre-flight",
                        refused=f" (clients={request.config.clients}, dropout={request.config.dropout:g}); the vote "
                        "was not started and nothing was released")
    per_run = 0
    federations: Counter[str] = Counter()
    for reply in replies:
        if reply.metadata.src_node_id in ready:
            per_run += reply.content.config_records[RECORD_KEY].get("ledger") == "per-run"
            federations[str(reply.content.config_records[RECORD_KEY].get("federation", "unauthenticated"))] += 1
    if len(federations) > 1:
        raise PreflightError(f"the ready clients belong to different federations: run every node with the same "
                             f"roster\n({describe_reasons(federations)}; dphype-roster names it, `dphype roster show` "
                             "prints its fingerprint); the vote was not started and nothing was released")
    notes: tuple[str, ...] = ()
    if per_run:
        note = (f"{per_run} of {len(ready)} nodes are simulated with a per-run ledger: their lifetime budget "
                "restarts with every run (an operator who names dphype-ledger keeps one across runs)")
        log(logging.INFO, "DP-Hype: %s", note)
        notes = (note,)
    federation = next(iter(federations), "unauthenticated")
    log(logging.INFO, "DP-Hype pre-flight: federation: %s", federation)
    return ready, notes, federation


def ready_nodes(replies: list[Message], nodes: list[int], *, fewest: int, what: str,
                refused: str) -> dict[int, dict[str, Any]]:
    """The nodes whose pre-flight reply is ``ready``, logged with why the others' is not; too few refuse the release.

    Args:
        replies: The replies that arrived.
        nodes: The nodes asked.
        fewest: The fewest ready nodes the release needs.
        what: The pre-flight's name in the log (``"pre-flight"``, ``"private evaluation pre-flight"``).
        refused: What the error adds after "at least N must take part": what was not done.

    Returns:
        Node ID -> its answer to the first SecAgg+ stage (empty without one), for the ready nodes.

    Raises:
        PreflightError: If fewer than ``fewest`` nodes are ready, counting the others' reasons.
    """
    ready: dict[int, dict[str, Any]] = {}
    reasons: Counter[str] = Counter()
    for reply in replies:
        answer = _answer(reply)
        if answer == "ready":
            ready[reply.metadata.src_node_id] = dict(reply.content.config_records.get(STAGE_KEY, {}))
        else:
            reasons[answer] += 1
    reasons["no answer within the timeout"] += len(nodes) - len(replies)
    reasons = +reasons  # drop zero counts
    log(logging.INFO, "DP-Hype %s: %d of %d clients ready%s", what, len(ready), len(nodes),
        "" if not reasons else "; " + describe_reasons(reasons))
    if len(ready) < fewest:
        raise PreflightError(f"{len(nodes) - len(ready)} of {len(nodes)} clients are not ready: "
                             f"{describe_reasons(reasons)}; at least {fewest} must take part{refused}")
    return ready


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


def describe_reasons(reasons: Counter[str]) -> str:
    """``"3 x reason; 1 x other"``, the most frequent first."""
    return "; ".join(f"{count} x {reason}" for reason, count in reasons.most_common())
