"""The Flower helpers both of DP-Hype's sides share: one round trip over a ``Grid`` and the wait limits.

`send_and_receive` pushes the messages and pulls the replies every `POLL_INTERVAL` s; `check_timeout` checks a
wait limit.

Flower 1.41's ``Grid.send_and_receive`` of a deployment (``flwr.superlink.grid.http_grid``) pulls the replies
every 3 s, so every round trip of a deployed run waits up to 3 s after its last reply arrived.
`send_and_receive` is the same round trip with a short poll interval: every stage of DP-Hype's
selection (the pre-flight, the SecAgg+ stages, the argmax mode's stages) and
`dphype.flower.server.committee_server.ClientGrid` use it.

In Flower's simulation (the ServerApp's grid is an ``InMemoryGrid``) it pulls every
`SIMULATION_POLL_INTERVAL` s, keeps at most `in_flight_limit` messages outstanding and pushes the
next ones as replies arrive. The simulation
engine (``flwr.server.superlink.fleet.vce.vce_api.add_messages_to_queue``) asks the in-memory LinkState for
every node's next message every 0.1 s, and each of those lookups scans every stored message
(``InMemoryLinkState.get_message_ins``) under the state's lock: with all ``n`` messages of a stage stored at
once a sweep costs ``n^2`` checks (a million at n = 1,000), which starves the engine's own worker threads and
the ServerApp of the one interpreter they share. The simulated nodes run a few at a time anyway (one per Ray
actor), so the window costs no parallelism. A deployment's grid pushes everything at once, as before.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from typing import Any

from flwr.app import Message
from flwr.common import log
from flwr.serverapp.grid import Grid
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

from dphype.checks import check_positive

#: Seconds between two pulls of the replies still missing.
POLL_INTERVAL = 0.2
#: The same in Flower's simulation, where a pull is an in-memory lookup and the window (below) is refilled at
#: each pull: measured at n = 250 (quiet machine, window 16), the secure vote's four stages took 13.9-15.1 s
#: with 0.05 s against 18.4-20.8 s with 0.2 s, and the whole selection 30.2-31.5 against 35.0-41.2 s.
SIMULATION_POLL_INTERVAL = 0.05
#: Messages outstanding at once in Flower's simulation (module docstring), at least: twice the machine's cores
#: where that is more (Flower runs one Ray actor per core by default), so that the actors never wait for the
#: next poll to refill the window. Measured with ``dphype bench resources`` (2 cores, n = 1,000): a window of 16
#: took the selection from 134.7 to 112.2 s; at n = 250 the difference was within the run-to-run spread.
SIMULATION_IN_FLIGHT = 16


def check_timeout(name: str, seconds: Any) -> float | None:
    """Return a wait limit in seconds: ``None`` (no limit) or a finite number > 0.

    A deployed SuperNode that vanishes never answers, so without a limit the server would wait for it
    forever; with one, the round goes on with the nodes that answered and the survivor check decides
    whether anything is released.

    Args:
        name: The limit's name, for the error message.
        seconds: The limit: ``None`` or a number.

    Returns:
        ``None`` or ``seconds`` as a finite float ``> 0``.

    Raises:
        ValueError: If ``seconds`` is neither ``None`` nor a finite number ``> 0``.
    """  # noqa: DOC502
    return None if seconds is None else check_positive(name, seconds)


def in_flight_limit(grid: Grid) -> int | None:
    """How many messages `send_and_receive` keeps outstanding on ``grid``.

    Args:
        grid: The ServerApp's grid.

    Returns:
        In Flower's simulation `SIMULATION_IN_FLIGHT` or twice the cores if more, elsewhere ``None`` (all at once).
    """
    if not isinstance(grid, InMemoryGrid):
        return None
    return max(SIMULATION_IN_FLIGHT, 2 * (os.cpu_count() or 1))


def send_and_receive(grid: Grid, messages: Iterable[Message], *, timeout: float | None, what: str | None = None,
                     every: float = 10.0, in_flight: int | None = None) -> list[Message]:
    """Push ``messages`` through ``grid`` and return the replies that arrived within ``timeout`` seconds.

    As ``Grid.send_and_receive`` does; a reply still missing at the timeout
    is left out (its node counts as dropped where the caller says so; so does a message not yet pushed then).
    At most ``in_flight`` messages are outstanding at once (default `in_flight_limit`; ``None``: all).
    With ``what`` it logs how many replies arrived every ``every`` seconds while it waits (local scoring can
    take minutes).

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
    pending = set(grid.push_messages(queue[:window]))
    sent = min(window, total)
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    last_log = start
    replies: list[Message] = []
    while True:
        arrived = list(grid.pull_messages(pending))
        replies.extend(arrived)
        pending.difference_update(reply.metadata.reply_to_message_id for reply in arrived)
        if sent < total and len(pending) < window:
            more = queue[sent:sent + window - len(pending)]
            pending.update(grid.push_messages(more))
            sent += len(more)
        now = time.monotonic()
        if (not pending and sent >= total) or (deadline is not None and now >= deadline):
            return replies
        if what is not None and now - last_log >= every:
            log(logging.INFO, "%s: %d of %d clients answered after %.0f s", what, len(replies), total, now - start)
            last_log = now
        time.sleep(poll if deadline is None else min(poll, deadline - now))
