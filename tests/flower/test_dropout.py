"""A node cut off mid-run: a voter is a dropout of the selection (it goes on while the protocol's threshold allows,
else it fails closed naming what is missing, without waiting again); a tally stops the committee's release
(the committee needs all its parties), naming the tally, and nothing is released."""

from __future__ import annotations

import time

import pytest
from helpers import CANDS, CLIENTS, argmax_grid
from helpers import argmax_config as config

from dphype.flower import DPHype, PreflightError, connected_committee
from dphype.flower.local import node_id
from dphype.flower.server.readiness import remaining_nodes
from dphype.secure.committee import TallyError


class Nodes:
    """A grid whose only use is its connected node IDs."""

    def __init__(self, ids):
        self.ids = list(ids)

    def get_node_ids(self):
        return self.ids


def cut(grid, *partitions):
    """Cut the nodes of ``partitions`` off: they never answer and, like the SuperLink after their heartbeats stop,
    the grid no longer lists them."""
    gone = {node_id(i) for i in partitions}
    grid.silent.update(gone)
    listed = [n for n in grid.get_node_ids() if n not in gone]
    grid.get_node_ids = lambda: listed


def test_remaining_nodes_samples_goes_on_with_fewer_down_to_the_floor_and_never_waits():
    sample = remaining_nodes(Nodes(range(10)), {0, 1}, 5, 4)
    assert sample == sorted(set(sample)) and len(sample) == 5 and set(sample) <= set(range(2, 10))
    assert remaining_nodes(Nodes([3, 1, 2, 7]), {7}, 4, 3) == [1, 2, 3]  # one cut off: a dropout
    start = time.monotonic()
    with pytest.raises(PreflightError, match=r"only 2 of clients=4 voters are still connected, fewer than the 3 the "
                                             r"selection needs\n\(2 cut off after the run counted them\); nothing "
                                             r"was sent and nothing was released"):
        remaining_nodes(Nodes([1, 2, 7]), {7}, 4, 3)
    assert time.monotonic() - start < 1.0  # no second wait for nodes the run already counted


def _committee(grid, cfg):
    return connected_committee(grid, cfg, candidates=CANDS, connect_timeout=5, timeout=5)


def test_a_voter_cut_off_after_the_committee_was_found_is_a_dropout_and_the_selection_completes(tmp_path):
    grid, keys = argmax_grid(tmp_path)
    cfg = config(dropout=0.25)  # 6 voters, at least 5 must take part
    committee = _committee(grid, cfg)
    cut(grid, 2)
    result = DPHype(CANDS, cfg, tallies=committee.keys).start(grid, timeout=5, connect_timeout=600,
                                                              committee_nodes=committee.nodes)
    assert result.report.survivors == CLIENTS - 1 and result.selected_index in range(len(CANDS))
    assert not [m for m in grid.sent if m.metadata.dst_node_id == node_id(2)
                and m.metadata.message_type != "query.dphype_tally"]  # only the committee's hello reached it


def test_too_many_voters_cut_off_fail_closed_at_once_naming_what_is_missing(tmp_path):
    grid, keys = argmax_grid(tmp_path)
    cfg = config(dropout=0.25)
    committee = _committee(grid, cfg)
    cut(grid, 1, 4)
    sent = len(grid.sent)
    start = time.monotonic()
    with pytest.raises(PreflightError, match=r"only 4 of clients=6 voters are still connected, fewer than the 5 "):
        DPHype(CANDS, cfg, tallies=committee.keys).start(grid, timeout=5, connect_timeout=600,
                                                         committee_nodes=committee.nodes)
    assert time.monotonic() - start < 30 and len(grid.sent) == sent  # no wait for the lost nodes, nothing sent


def test_a_voter_cut_off_mid_vote_is_named_and_left_out(tmp_path, monkeypatch):
    grid, keys = argmax_grid(tmp_path)
    cfg = config(dropout=0.25)
    committee = _committee(grid, cfg)
    deliver = grid.push_messages

    def cut_at_the_vote(messages):  # ready in the pre-flight, gone before it sends its shares
        messages = list(messages)
        if any(m.metadata.message_type == "train.dphype_committee" for m in messages):
            cut(grid, 3)
        return deliver(messages)

    monkeypatch.setattr(grid, "push_messages", cut_at_the_vote)
    # the in-process grid answers when a message is pushed: the timeout is only waited out for the cut-off node
    result = DPHype(CANDS, cfg, tallies=committee.keys).start(grid, timeout=1, connect_timeout=600,
                                                              committee_nodes=committee.nodes)
    assert f"node {node_id(3)} (no shares)" in result.report.unattributed and result.report.survivors == CLIENTS - 1


def test_a_tally_cut_off_mid_run_stops_the_release_naming_it(tmp_path):
    grid, keys = argmax_grid(tmp_path)
    cfg = config(dropout=0.25)
    committee = _committee(grid, cfg)
    cut(grid, CLIENTS + 1)  # tally 1, gone before the voters are asked
    with pytest.raises(TallyError, match=r"committee node .* is not connected; nothing was sent to the clients"):
        DPHype(CANDS, cfg, tallies=committee.keys).start(grid, timeout=5, connect_timeout=600,
                                                         committee_nodes=committee.nodes)
    grid, keys = argmax_grid(tmp_path, run_id=2)
    committee = _committee(grid, cfg)
    grid.silent.add(node_id(CLIENTS + 2))  # tally 2 still listed, never answers again: cut off mid-run
    with pytest.raises(TallyError, match=r"tally 2 did not answer the collect stage in time \(unreachable or cut "
                                         r"off: the committee needs all 3 tallies\); nothing released; the 6 voters"):
        # the in-process grid answers when a message is pushed: the timeout is only waited out for tally 2
        DPHype(CANDS, cfg, tallies=committee.keys).start(grid, timeout=1, connect_timeout=600,
                                                         committee_nodes=committee.nodes)
