"""The SecAgg+ checks against Flower 1.41's real SecAgg+ messages, in process: an honest round (with
dropouts) passes every check at every stage, a tampering server is refused before anything secret leaves.

Each node answers through :func:`dphype.flower.secagg.secure_vote_reply`, which runs this client's checks
of every stage (:func:`dphype.flower.secagg.check_stage`, the pure checks of :mod:`dphype.secure.guard`)
before Flower's SecAgg+ client answers it. The same attacks through the whole DP-Hype client (policy,
ledger) are in ``tests/test_client_guard.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

from dphype.flower.local import LocalGrid
from dphype.flower.secagg import run_secure_sum, secure_vote_reply
from dphype.protocol import Refusal
from dphype.secure import secure_sum as ss


def guarded_app(vectors: np.ndarray, dropout: float, drop: dict | None = None, refusals: list | None = None):
    drop = drop or {}
    refusals = [] if refusals is None else refusals
    app = ClientApp()

    @app.train("dphype")
    def vote(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        stage = msg.content.config_records[RECORD_KEY_CONFIGS][Key.STAGE]
        if drop.get(pid) == stage:
            raise ConnectionError("node lost")
        try:
            return secure_vote_reply(msg, context, lambda config, clipping_range: ss.encode(vectors[pid], "skellam"),
                                     clients=len(vectors), dropout=dropout, min_neighbours=4)
        except Refusal as refusal:
            refusals.append((pid, stage, refusal.code))
            raise

    return app


class TamperingGrid(LocalGrid):
    """A server that rewrites the SecAgg+ configs of one stage before they are delivered."""

    def __init__(self, app, n, stage, tamper, **kwargs):
        super().__init__(app, n, **kwargs)
        self.stage, self.tamper = stage, tamper

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        for msg in messages:
            configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
            if configs is not None and configs[Key.STAGE] == self.stage:
                self.tamper(msg.metadata.dst_node_id, configs)
        return super().send_and_receive(messages, timeout=timeout)


# Losses in stage 0 or 1 together with one in stage 2 halted Flower 1.41's server (issue 8, item 8); the
# scalable workflow prunes them, and the clients' checks accept the pruned lists.
@pytest.mark.parametrize("n,dropout,drop", [(12, 0.0, {}), (12, 0.25, {2: Stage.SETUP, 5: Stage.SHARE_KEYS}),
                                            (12, 0.25, {7: Stage.COLLECT_MASKED_VECTORS, 9: Stage.UNMASK}),
                                            (12, 0.25, {2: Stage.SETUP, 7: Stage.COLLECT_MASKED_VECTORS})])
def test_honest_rounds_pass_every_check_and_sum_exactly(n, dropout, drop):
    vectors = np.arange(n * 5).reshape(n, 5) - 7
    refusals: list = []
    grid = LocalGrid(guarded_app(vectors, dropout, drop, refusals), n)
    lost = [pid for pid, stage in drop.items() if stage != Stage.UNMASK]
    out = run_secure_sum(grid, grid.get_node_ids(), {}, size=5, noise="skellam", min_survivors=n - len(lost))
    assert refusals == []
    np.testing.assert_array_equal(out.total, np.delete(vectors, lost, axis=0).sum(axis=0))
    stages = {m.content.config_records[RECORD_KEY_CONFIGS][Key.STAGE] for m in grid.sent}
    assert stages == {Stage.SETUP, Stage.SHARE_KEYS, Stage.COLLECT_MASKED_VECTORS, Stage.UNMASK}


def _secret_replies(grid, stage):
    """Replies that carry key shares (stage 1) or secret shares (stage 3) instead of an error."""
    sent_ids = {m.metadata.message_id for m in grid.sent
                if m.content.config_records.get(RECORD_KEY_CONFIGS, {}).get(Key.STAGE) == stage}
    return [r for r in grid.replies if r.metadata.reply_to_message_id in sent_ids and not r.has_error()]


def test_issue_8_fake_round_threshold_1_without_neighbours_is_refused_at_setup():
    n = 12
    vectors = np.ones((n, 5), dtype=np.int64)
    refusals: list = []

    def threshold_1(node, configs):
        configs[Key.THRESHOLD] = 1

    grid = TamperingGrid(guarded_app(vectors, 0.0, refusals=refusals), n, Stage.SETUP, threshold_1)
    with pytest.raises(ss.SecureSumError):
        run_secure_sum(grid, grid.get_node_ids(), {}, size=5, noise="skellam", min_survivors=n)
    assert {code for _, stage, code in refusals} == {"secagg_setup"} and len(refusals) == n
    assert _secret_replies(grid, Stage.SHARE_KEYS) == []  # no key share ever left a client

    def only_own_key(node, configs):  # stage 1 of the same attack: no neighbours
        for key in [k for k in configs if k not in (Key.STAGE, str(node))]:
            del configs[key]

    refusals.clear()
    grid = TamperingGrid(guarded_app(vectors, 0.0, refusals=refusals), n, Stage.SHARE_KEYS, only_own_key)
    with pytest.raises(ss.SecureSumError):
        run_secure_sum(grid, grid.get_node_ids(), {}, size=5, noise="skellam", min_survivors=n)
    assert {code for _, _, code in refusals} == {"secagg_neighbours"} and len(refusals) == n
    assert _secret_replies(grid, Stage.SHARE_KEYS) == []


def test_issue_8_overlapping_active_and_dead_lists_are_refused_at_unmask():
    n = 12
    vectors = np.ones((n, 5), dtype=np.int64)
    refusals: list = []

    def overlap(node, configs):  # call a neighbour dead although it is listed active
        active = list(configs[Key.ACTIVE_NODE_ID_LIST])
        configs[Key.DEAD_NODE_ID_LIST] = [next(a for a in active if a != node)]

    grid = TamperingGrid(guarded_app(vectors, 0.0, refusals=refusals), n, Stage.UNMASK, overlap)
    with pytest.raises(ss.SecureSumError):
        run_secure_sum(grid, grid.get_node_ids(), {}, size=5, noise="skellam", min_survivors=n)
    assert {code for _, _, code in refusals} == {"secagg_unmask"} and len(refusals) == n
    assert _secret_replies(grid, Stage.UNMASK) == []  # no client handed out a share
