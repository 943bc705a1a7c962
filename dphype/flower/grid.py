"""The Flower helpers both of DP-Hype's sides share: one round trip over a ``Grid`` and the wait limits.

`send_and_receive` pushes the messages and pulls the replies every `POLL_INTERVAL` s; `check_timeout` checks a
wait limit; `node_ids` lists the connected nodes.

Every call to the SuperLink here (`push`, `pull`, `node_ids`) is retried `RETRIES` times, `RETRY_DELAY` s apart
(doubling), when it fails with a transient SuperLink error (`transient`: an HTTP 500, 502, 503 or 504 from the
SuperLink's API, e.g. its SQLite store "database is locked" under load, or gRPC ``UNAVAILABLE`` / ``INTERNAL``);
any other error, and the last transient one, is raised at once.

`send_and_receive` is ``Grid.send_and_receive``'s round trip with a shorter poll interval than a deployed
grid's; every stage of DP-Hype's selection and `dphype.flower.server.committee_server.ClientGrid` use it.

In Flower's simulation (an ``InMemoryGrid``) it keeps at most `in_flight_limit` messages outstanding and pushes
the next ones as replies arrive: the simulation engine's in-memory LinkState scans every stored message for every
node's lookup under one lock, so storing all ``n`` messages of a stage at once costs ``n^2`` checks per sweep and
starves the interpreter the engine and the ServerApp share. A deployment's grid pushes everything at once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import grpc
import httpx
from flwr.app import Message
from flwr.common import log
from flwr.serverapp.grid import Grid
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

from dphype.checks import check_positive

#: Seconds between two pulls of the replies still missing.
POLL_INTERVAL = 0.2
#: The same in Flower's simulation, where a pull is an in-memory lookup and the window (below) is refilled at
#: each pull.
SIMULATION_POLL_INTERVAL = 0.05
#: Messages outstanding at once in Flower's simulation, at least: twice the machine's cores where that is more
#: (one Ray actor per core), so that the actors never wait for the next poll to refill the window.
SIMULATION_IN_FLIGHT = 16
#: Retries of a SuperLink call that failed with a transient error (`transient`), and the first pause between two.
RETRIES, RETRY_DELAY = 4, 0.5
#: The SuperLink's HTTP answers that mean "try again": its internal error (a locked store) and the gateway ones.
TRANSIENT_HTTP = frozenset({500, 502, 503, 504})
#: The same for a gRPC SuperLink.
TRANSIENT_GRPC = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL})

_T = TypeVar("_T")


def transient(err: BaseException) -> bool:
    """Whether ``err`` is a SuperLink error worth retrying (`TRANSIENT_HTTP`, `TRANSIENT_GRPC`)."""
    if isinstance(err, httpx.HTTPStatusError):
        return err.response.status_code in TRANSIENT_HTTP
    if isinstance(err, grpc.RpcError) and callable(getattr(err, "code", None)):
        return err.code() in TRANSIENT_GRPC
    return False


def retried(call: Callable[[], _T], what: str) -> _T:
    """``call()``, retried up to `RETRIES` times with a doubling pause while it fails with a `transient` error.

    Args:
        call: The SuperLink call.
        what: What it does, for the warning logged before each retry.

    Returns:
        What ``call`` returned.

    Raises:
        Exception: The call's error when it is not transient, or still transient after the last retry.
    """  # noqa: DOC502, DOC503
    delay = RETRY_DELAY
    for attempt in range(RETRIES):
        try:
            return call()
        except Exception as err:
            if not transient(err):
                raise
            log(logging.WARNING, "DP-Hype: the SuperLink failed to %s (%s); retry %d of %d in %.1f s", what,
                (str(err).splitlines() or [type(err).__name__])[0][:200], attempt + 1, RETRIES, delay)
            time.sleep(delay)
            delay *= 2
    return call()


def push(grid: Grid, messages: list[Message]) -> list[str]:
    """``grid.push_messages(messages)``, `retried`: the pushed messages' ids."""
    return retried(lambda: list(grid.push_messages(messages)), "store messages")


def pull(grid: Grid, message_ids: Iterable[str]) -> list[Message]:
    """``grid.pull_messages(message_ids)``, `retried`: the replies that have arrived."""
    ids = list(message_ids)
    return retried(lambda: list(grid.pull_messages(ids)), "return replies")


def node_ids(grid: Grid) -> list[int]:
    """The connected nodes' ids (``grid.get_node_ids()``, `retried`)."""
    return retried(lambda: list(grid.get_node_ids()), "list the connected nodes")


def check_timeout(name: str, seconds: Any) -> float | None:
    """A wait limit named ``name``: ``None`` (no limit) or a finite float > 0; else `ValueError`."""
    return None if seconds is None else check_positive(name, seconds)


def in_flight_limit(grid: Grid) -> int | None:
    """Messages outstanding at once on ``grid``: in simulation the larger of `SIMULATION_IN_FLIGHT` and 2 x cores."""
    if not isinstance(grid, InMemoryGrid):
        return None
    return max(SIMULATION_IN_FLIGHT, 2 * (os.cpu_count() or 1))


def send_and_receive(grid: Grid, messages: Iterable[Message], *, timeout: float | None, what: str | None = None,
                     every: float = 10.0, in_flight: int | None = None) -> list[Message]:
    """Push ``messages`` through ``grid`` and return the replies that arrived within ``timeout`` seconds.

    A reply still missing at the timeout (or a message not yet pushed then) is left out.

    Args:
        grid: The ServerApp's grid.
        messages: The messages to send.
        timeout: Seconds to wait for the replies; ``None`` waits for every reply.
        what: What the round is, for the progress log; ``None`` logs nothing.
        every: Seconds between two progress lines.
        in_flight: Most messages outstanding at once; ``None`` takes `in_flight_limit`'s.

    Returns:
        The replies that arrived, in arrival order.

    Raises:
        ValueError: If ``in_flight`` is given and is not a positive integer.
    """
    if in_flight is not None and (isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1):
        raise ValueError(f"in_flight must be a positive integer, got {in_flight!r}")
    queue = list(messages)
    total = len(queue)
    if not queue:  # nothing to send (a strategy that samples no node for a round)
        return []
    limit = in_flight_limit(grid) if in_flight is None else in_flight
    window = total if limit is None else limit
    poll = SIMULATION_POLL_INTERVAL if isinstance(grid, InMemoryGrid) else POLL_INTERVAL
    pending = set(push(grid, queue[:window]))
    sent = min(window, total)
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    last_log = start
    replies: list[Message] = []
    while True:
        arrived = pull(grid, pending)
        replies.extend(arrived)
        pending.difference_update(reply.metadata.reply_to_message_id for reply in arrived)
        if sent < total and len(pending) < window:
            more = queue[sent:sent + window - len(pending)]
            pending.update(push(grid, more))
            sent += len(more)
        now = time.monotonic()
        if (not pending and sent >= total) or (deadline is not None and now >= deadline):
            return replies
        if what is not None and now - last_log >= every:
            log(logging.INFO, "%s: %d of %d clients answered after %.0f s", what, len(replies), total, now - start)
            last_log = now
        time.sleep(poll if deadline is None else min(poll, deadline - now))
