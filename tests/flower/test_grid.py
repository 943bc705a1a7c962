"""One round trip over a grid (dphype.flower.grid.send_and_receive): replies, missing replies, the timeout, the
retries of a transient SuperLink error."""

from __future__ import annotations

import os
from collections import Counter

import grpc
import httpx
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

import dphype.flower.grid as grid_module
from dphype.flower.grid import RETRIES, SIMULATION_IN_FLIGHT, in_flight_limit, node_ids, send_and_receive, transient
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


class FlakyGrid(LocalGrid):
    """A LocalGrid whose first ``fail`` calls of each of push, pull and get_node_ids raise ``error()`` (a SuperLink
    that answered an error); ``calls`` counts every call."""

    def __init__(self, *args, fail: int, error, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fail, self.error, self.calls = fail, error, Counter()

    def _maybe_fail(self, name: str) -> None:
        self.calls[name] += 1
        if self.calls[name] <= self.fail:
            raise self.error()

    def push_messages(self, messages):
        self._maybe_fail("push")
        return super().push_messages(messages)

    def pull_messages(self, message_ids):
        self._maybe_fail("pull")
        return super().pull_messages(message_ids)

    def get_node_ids(self):
        self._maybe_fail("nodes")
        return super().get_node_ids()


def http_error(status: int):
    """The error Flower's HTTP grid raises for a SuperLink answer with ``status`` (500: its store was locked)."""
    request = httpx.Request("POST", "https://superlink:9091/push")
    return lambda: httpx.HTTPStatusError(f"Server error '{status}'", request=request,
                                         response=httpx.Response(status, request=request))


class Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("error", [http_error(500), http_error(503), Unavailable])
def test_a_transient_superlink_error_is_retried_and_every_reply_comes_back(monkeypatch, caplog, error):
    monkeypatch.setattr(grid_module, "RETRY_DELAY", 0.001)
    grid = FlakyGrid(echo_app(), 4, fail=1, error=error)
    messages = [Message(RecordDict({"ping": ConfigRecord({"node": node_id(i)})}), dst_node_id=node_id(i),
                        message_type="query") for i in range(4)]
    replies = ClientGrid(grid, []).send_and_receive(messages, timeout=None)
    assert sources(replies) == [node_id(i) for i in range(4)]
    assert grid.calls["push"] == 2 and grid.calls["pull"] >= 2 and len(grid.sent) == 4
    assert node_ids(grid) == [node_id(i) for i in range(4)] and grid.calls["nodes"] == 2
    assert "the SuperLink failed to store messages" in caplog.text


def test_a_superlink_error_that_is_not_transient_fails_at_once_and_a_lasting_one_after_the_retries(monkeypatch):
    monkeypatch.setattr(grid_module, "RETRY_DELAY", 0.001)
    grid = FlakyGrid(echo_app(), 2, fail=1, error=http_error(400))
    with pytest.raises(httpx.HTTPStatusError, match="400"):
        send_and_receive(grid, pings(LocalGrid(echo_app(), 2)), timeout=None)
    assert grid.calls["push"] == 1 and grid.sent == []
    lasting = FlakyGrid(echo_app(), 2, fail=10**6, error=http_error(500))
    with pytest.raises(httpx.HTTPStatusError, match="500"):
        node_ids(lasting)
    assert lasting.calls["nodes"] == RETRIES + 1
    assert not transient(ValueError("database is locked")) and transient(http_error(502)())
