"""One round trip over a grid (dphype.flower.grid.send_and_receive): replies, missing replies, the timeout."""

from __future__ import annotations

import os

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

from dphype.flower.grid import SIMULATION_IN_FLIGHT, in_flight_limit, send_and_receive
from dphype.flower.local import LocalGrid, node_id
from dphype.flower.server.committee_server import ClientGrid


def echo_app() -> ClientApp:
    """Node 3 raises; every other node echoes its partition id."""
    app = ClientApp()

    @app.query()
    def echo(msg: Message, context: Context) -> Message:
        if context.node_config["partition-id"] == 3:
            raise RuntimeError("broken node")
        return Message(RecordDict({"echo": msg.content["ping"]}), reply_to=msg)

    return app


class SlowGrid(LocalGrid):
    """A LocalGrid whose replies become visible only from the ``delay``-th pull on (a remote grid's replies
    arrive some polls later); ``pulls`` counts the pulls."""

    def __init__(self, *args, delay: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.delay, self.pulls = delay, 0

    def pull_messages(self, message_ids):
        self.pulls += 1
        return super().pull_messages(message_ids) if self.pulls >= self.delay else []


def pings(grid: LocalGrid) -> list[Message]:
    return [Message(RecordDict({"ping": ConfigRecord({"node": n})}), dst_node_id=n, message_type="query")
            for n in grid.get_node_ids()]


def sources(replies: list[Message]) -> list[int]:
    return sorted(r.metadata.src_node_id for r in replies)


def test_every_reply_comes_back_error_replies_included():
    grid = LocalGrid(echo_app(), 5)
    replies = send_and_receive(grid, pings(grid), timeout=None)
    assert sources(replies) == [node_id(i) for i in range(5)]
    (failed,) = [r for r in replies if r.has_error()]
    assert failed.metadata.src_node_id == node_id(3) and "broken node" in failed.error.reason
    assert all(r.content["echo"]["node"] == r.metadata.src_node_id for r in replies if not r.has_error())


def test_a_node_that_never_answers_is_left_out_at_the_timeout():
    grid = LocalGrid(echo_app(), 5, silent=[1, 4])
    replies = send_and_receive(grid, pings(grid), timeout=0.3)
    assert sources(replies) == [node_id(i) for i in (0, 2, 3)]
    assert len(grid.sent) == 5  # every node was asked once


def test_it_polls_until_the_last_reply_arrives():
    grid = SlowGrid(echo_app(), 4, delay=4)
    replies = send_and_receive(grid, pings(grid), timeout=None)
    assert sources(replies) == [node_id(i) for i in range(4)] and grid.pulls == 4


def test_a_reply_later_than_the_timeout_is_left_out():
    grid = SlowGrid(echo_app(), 4, delay=10**6)
    assert send_and_receive(grid, pings(grid), timeout=0.05) == []
    assert 1 <= grid.pulls < 10**6


@pytest.mark.parametrize("timeout", [None, 0.3])
def test_client_grid_polls_the_same_way_without_the_tallies(timeout):
    inner = LocalGrid(echo_app(), 5)
    grid = ClientGrid(inner, [node_id(4)])
    replies = grid.send_and_receive(pings(grid), timeout=timeout)
    assert sources(replies) == [node_id(i) for i in range(4)]
    assert inner.timeouts == []  # our round trip, not LocalGrid's own send_and_receive


class CountingGrid(LocalGrid):
    """A LocalGrid that records how many messages were outstanding (pushed, reply not yet pulled) at each push."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.outstanding: set[str] = set()
        self.peak = 0

    def push_messages(self, messages):
        ids = list(super().push_messages(messages))
        self.outstanding.update(ids)
        self.peak = max(self.peak, len(self.outstanding))
        return ids

    def pull_messages(self, message_ids):
        replies = list(super().pull_messages(message_ids))
        self.outstanding.difference_update(r.metadata.reply_to_message_id for r in replies)
        return replies


def test_at_most_in_flight_messages_are_outstanding_and_every_reply_comes_back():
    grid = CountingGrid(echo_app(), 10)
    replies = send_and_receive(grid, pings(grid), timeout=None, in_flight=3)
    assert sources(replies) == [node_id(i) for i in range(10)] and grid.peak == 3
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="in_flight must be a positive integer"):
            send_and_receive(grid, pings(grid), timeout=None, in_flight=bad)


def test_no_messages_is_no_round_trip():
    # FedAvg with fraction-evaluate = 0 sends an empty evaluation round through ClientGrid
    simulated = InMemoryGrid.__new__(InMemoryGrid)  # never touched: nothing is pushed or pulled
    assert send_and_receive(simulated, [], timeout=None) == []
    assert send_and_receive(LocalGrid(echo_app(), 2), [], timeout=0.1, in_flight=3) == []


def test_a_message_still_queued_at_the_timeout_counts_as_missing():
    grid = LocalGrid(echo_app(), 6, silent=[0, 1])  # the first window of 2 never answers
    replies = send_and_receive(grid, pings(grid), timeout=0.3, in_flight=2)
    assert replies == [] and len(grid.sent) == 2  # nodes 2-5 were never asked


def test_only_flowers_simulation_grid_gets_a_window():
    simulated = InMemoryGrid.__new__(InMemoryGrid)  # the ServerApp's grid in Flower's simulation
    assert in_flight_limit(simulated) == max(SIMULATION_IN_FLIGHT, 2 * (os.cpu_count() or 1))
    assert in_flight_limit(LocalGrid(echo_app(), 2)) is None
