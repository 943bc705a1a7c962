"""One round trip over a Flower ``Grid``: push the messages, pull the replies every :data:`POLL_INTERVAL` s.

Flower 1.41's ``Grid.send_and_receive`` of a deployment (``flwr.superlink.grid.http_grid``) pulls the replies
every 3 s, so every round trip of a deployed run waits up to 3 s after its last reply arrived.
:func:`send_and_receive` is the same round trip with a short poll interval: every stage of DP-Hype's
selection (the pre-flight, the SecAgg+ stages, the argmax mode's stages) and :class:`dphype.flower.tally.ClientGrid`
use it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.common import log
from flwr.serverapp.grid import Grid

#: Seconds between two pulls of the replies still missing.
POLL_INTERVAL = 0.2


def send_and_receive(grid: Grid, messages: Iterable[Message], *, timeout: float | None, what: str | None = None,
                     every: float = 10.0) -> list[Message]:
    """Push ``messages`` through ``grid`` and return the replies that arrived within ``timeout`` seconds
    (``None``: wait for every reply), as ``Grid.send_and_receive`` does; a reply still missing at the timeout
    is left out (its node counts as dropped where the caller says so). With ``what`` it logs how many replies
    arrived every ``every`` seconds while it waits (local scoring can take minutes)."""
    pending = set(grid.push_messages(messages))
    total = len(pending)
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    last_log = start
    replies: list[Message] = []
    while True:
        arrived = list(grid.pull_messages(pending))
        replies.extend(arrived)
        pending.difference_update(reply.metadata.reply_to_message_id for reply in arrived)
        now = time.monotonic()
        if not pending or (deadline is not None and now >= deadline):
            return replies
        if what is not None and now - last_log >= every:
            log(logging.INFO, "%s: %d of %d clients answered after %.0f s", what, len(replies), total, now - start)
            last_log = now
        time.sleep(POLL_INTERVAL if deadline is None else min(POLL_INTERVAL, deadline - now))
