"""DP-Hype's SecAgg+ on the Message API (dphype.flower.server.secagg_server, client.secagg), against real ClientApps in
process."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from dphype.flower.client.secagg_client import secure_vote_reply
from dphype.flower.local import LocalGrid, node_id
from dphype.flower.server.secagg_server import run_secure_sum
from dphype.flower.wire import ACTION, STAGE_KEY, VOTE_TYPE
from dphype.secure import secure_sum as ss
from dphype.secure.secagg import Approval

C = ss.CLIPPING_RANGE
REQUEST = "0f" * 32


def vector_app(vectors: np.ndarray, noise: str = "skellam", drop: dict | None = None,
               min_survivors: int | None = None) -> ClientApp:
    """A ClientApp whose node with partition-id i sends ``vectors[i]`` in the vote round.

    ``drop`` maps partition-id -> the stage at which that node crashes. Every node runs the protocol's
    checks for a request of ``n = len(vectors)`` clients of which ``min_survivors`` (default all) must
    contribute, with at least one neighbour.
    """
    drop = drop or {}
    n = len(vectors)
    approval = Approval(request=REQUEST, clients=n, survivors=min_survivors or n, size=vectors.shape[1],
                        min_neighbours=1)
    app = ClientApp()

    @app.train(ACTION)
    def vote(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        stage = msg.content.config_records.get(STAGE_KEY, {}).get("stage")
        if stage is not None and drop.get(pid) == stage:
            raise ConnectionError("node lost")
        return secure_vote_reply(msg, context, approval, lambda clipping_range: ss.encode(vectors[pid], noise,
                                                                                          clipping_range))

    @app.train()
    def train(msg: Message, context: Context) -> Message:  # the user's own handler
        return Message(msg.content, reply_to=msg)

    return app


def run(vectors, *, noise="skellam", drop=None, min_survivors=None, size=None, grid=None, **kwargs):
    n = len(vectors)
    grid = grid or LocalGrid(vector_app(vectors, noise, drop, min_survivors), n)
    out = run_secure_sum(grid, grid.get_node_ids(), REQUEST, size=size or vectors.shape[1], noise=noise,
                         min_survivors=min_survivors or n, **kwargs)
    return out, grid


def stages_sent(grid: LocalGrid) -> list[str]:
    return [m.content.config_records[STAGE_KEY]["stage"] for m in grid.sent
            if STAGE_KEY in m.content.config_records]


def test_sum_is_exact_with_negative_and_extreme_values():
    rng = np.random.default_rng(1)
    vectors = rng.integers(-C, C + 1, size=(6, 100))
    vectors[0, :3] = [C, -C, 0]
    vectors[1, :3] = [C, -C, -1]
    out, grid = run(vectors)
    assert out.total.dtype == np.int64
    np.testing.assert_array_equal(out.total, vectors.sum(axis=0))
    assert out.survivors == 6
    # every message of the round is DP-Hype's own type: the user's train handler never sees it
    assert {m.metadata.message_type for m in grid.sent} == {VOTE_TYPE}
    assert {m.metadata.message_type for m in grid.replies} == {VOTE_TYPE}


def test_sum_gaussian_fixed_point():
    rng = np.random.default_rng(2)
    noisy = rng.integers(0, 2, size=(4, 50)) + rng.normal(0.0, 5.0, size=(4, 50))
    out, _ = run(noisy, noise="gaussian")
    expected = sum(ss.encode(v, "gaussian") for v in noisy) / ss.fixed_point_scale("gaussian")
    np.testing.assert_array_equal(out.total, expected)
    assert np.max(np.abs(out.total - noisy.sum(axis=0))) <= 4 / (2 * ss.fixed_point_scale("gaussian"))


def test_dropout_before_masked_vector_is_survived():
    vectors = np.arange(5 * 10).reshape(5, 10) - 20
    out, grid = run(vectors, drop={3: "masked_input"}, min_survivors=4)
    np.testing.assert_array_equal(out.total, np.delete(vectors, 3, axis=0).sum(axis=0))
    assert out.survivors == 4
    assert "unmask" in stages_sent(grid)


@pytest.mark.parametrize("stage", ["advertise", "share_keys"])
def test_dropout_before_key_sharing_ends_is_survived(stage):
    # A node lost before its shares arrived: the round restarts over the others (nothing was masked yet).
    vectors = np.arange(5 * 10).reshape(5, 10) - 20
    out, grid = run(vectors, drop={2: stage}, min_survivors=4)
    np.testing.assert_array_equal(out.total, np.delete(vectors, 2, axis=0).sum(axis=0))
    assert out.survivors == 4
    assert stages_sent(grid).count("advertise") == (9 if stage == "share_keys" else 5)


def test_dropout_during_unmasking_keeps_the_contribution():
    vectors = np.arange(5 * 10).reshape(5, 10) - 20
    out, _ = run(vectors, drop={1: "unmask"}, min_survivors=5)
    # The node sent its masked vector before crashing: its mask is rebuilt from shares.
    np.testing.assert_array_equal(out.total, vectors.sum(axis=0))
    assert out.survivors == 5


def test_too_many_dropouts_release_nothing():
    vectors = np.ones((5, 10), dtype=np.int64)
    grid = LocalGrid(vector_app(vectors, drop={0: "masked_input", 4: "masked_input"},
                                min_survivors=4), 5)
    with pytest.raises(ss.TooFewSurvivorsError, match="(?s)only 3 of 5 .* nothing was unmasked or released"):
        run(vectors, min_survivors=4, grid=grid)
    # The server never asked for the key shares that would unmask the sum.
    assert "unmask" not in stages_sent(grid)


def test_fewer_nodes_than_survivors_send_nothing():
    vectors = np.ones((3, 4), dtype=np.int64)
    grid = LocalGrid(vector_app(vectors), 3)
    with pytest.raises(ss.TooFewSurvivorsError, match="nothing was sent"):
        run_secure_sum(grid, grid.get_node_ids(), REQUEST, size=4, noise="skellam", min_survivors=4)
    assert grid.sent == []


def test_protocol_halt_is_an_error():
    # 2 clients lost while unmasking leave fewer than the threshold of shares for some secret
    vectors = np.ones((6, 10), dtype=np.int64)
    with pytest.raises(ss.SecureSumError, match="could not be unmasked .* nothing was released"):
        run(vectors, drop={0: "unmask", 1: "unmask", 2: "unmask"}, min_survivors=5)


def test_vectors_of_another_length_are_never_unmasked():
    # the length is part of the round digest: the nodes' graph differs from the server's (it rejects their
    # shares), or, when the two rings happen to give the same neighbourhoods, it drops every masked vector of
    # the wrong length; either way before anything is unmasked
    vectors = np.ones((4, 11), dtype=np.int64)
    with pytest.raises(ss.TooFewSurvivorsError, match="only 0 of 4 clients completed the (share-keys|masked-input) "
                                                      "stage"):
        run(vectors, size=10)


class VanishingGrid(LocalGrid):
    """A LocalGrid whose node with partition-id ``node`` never answers again from the stage ``stage`` on."""

    def __init__(self, app: ClientApp, n: int, node: int, stage: str) -> None:
        super().__init__(app, n)
        self.node, self.stage = node, stage

    def push_messages(self, messages):
        messages = list(messages)
        if any(m.content.config_records[STAGE_KEY].get("stage") == self.stage for m in messages):
            self.silent.add(node_id(self.node))
        return super().push_messages(messages)


@pytest.mark.parametrize(("stage", "in_sum"), [("advertise", False), ("share_keys", False), ("masked_input", False),
                                               ("consistency", True), ("unmask", True)])
def test_a_node_that_vanishes_in_any_stage_counts_as_a_dropout_at_the_timeout(stage, in_sum):
    # every stage is bounded (without the timeout the round would wait for node 2 forever); its vector is in the
    # sum iff the server got its masked input
    vectors = np.arange(4 * 6).reshape(4, 6)
    grid = VanishingGrid(vector_app(vectors, min_survivors=3), 4, node=2, stage=stage)
    out = run_secure_sum(grid, grid.get_node_ids(), REQUEST, size=6, noise="skellam", min_survivors=3, timeout=0.2)
    summed = vectors if in_sum else np.delete(vectors, 2, axis=0)
    assert out.survivors == len(summed)
    np.testing.assert_array_equal(out.total, summed.sum(axis=0))
    to_node_2 = [m.content.config_records[STAGE_KEY]["stage"] for m in grid.sent
                 if m.metadata.dst_node_id == node_id(2)]
    assert to_node_2[-1] == stage  # asked nothing after it vanished


def test_a_vote_outside_secagg_is_refused():
    app = vector_app(np.ones((1, 3)))
    grid = LocalGrid(app, 1)
    plain = Message(RecordDict(), 1000, VOTE_TYPE)
    (reply,) = grid.send_and_receive([plain])
    assert reply.has_error() and "plaintext" in reply.error.reason
    assert not reply.has_content()


@pytest.mark.slow
def test_sum_through_flower_simulation_with_a_dropout():
    """The real Flower simulation runtime (Ray): exact sum of the 4 survivors out of 5."""
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    rng = np.random.default_rng(3)
    vectors = rng.integers(-1000, 1000, size=(5, 100))
    vectors[0, 0] = -C
    out: dict = {}
    server_app = ServerApp()

    @server_app.main()
    def _main(grid, context):
        nodes = []
        while len(nodes) < 5:
            nodes = list(grid.get_node_ids())
        out["sum"] = run_secure_sum(grid, nodes, REQUEST, size=100, noise="skellam", min_survivors=4)

    run_simulation(server_app, vector_app(vectors, drop={2: "masked_input"}, min_survivors=4),
                   num_supernodes=5,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    assert out["sum"].survivors == 4
    np.testing.assert_array_equal(out["sum"].total, np.delete(vectors, 2, axis=0).sum(axis=0))


# ------------------------------------------------------------------------------------------- the graph
def test_the_default_graph_is_the_secure_one():
    from dphype.secure.secagg_params import secure_parameters

    vectors = np.arange(12 * 5).reshape(12, 5)
    out, _ = run(vectors, min_survivors=11)
    assert out.secagg == secure_parameters(12, dropout=1 / 12)
    np.testing.assert_array_equal(out.total, vectors.sum(axis=0))


def test_an_insecure_explicit_graph_is_refused_before_anything_is_sent():
    vectors = np.ones((50, 3), dtype=np.int64)
    grid = LocalGrid(vector_app(vectors), 50)
    with pytest.raises(ValueError, match="num_shares must be in \\[19, 50\\]"):
        run_secure_sum(grid, grid.get_node_ids(), REQUEST, size=3, noise="skellam", min_survivors=50,
                       num_shares=0.2, reconstruction_threshold=0.6)  # 11 shares, fewer than the graph needs
    assert grid.sent == []


def test_the_papers_fractions_are_accepted_against_no_collusion():
    vectors = np.arange(20 * 3).reshape(20, 3)
    grid = LocalGrid(vector_app(vectors), 20)
    out = run_secure_sum(grid, grid.get_node_ids(), REQUEST, size=3, noise="skellam", min_survivors=20,
                         num_shares=0.3, reconstruction_threshold=1.0, corrupt_fraction=0.0)
    assert (out.secagg.num_shares, out.secagg.threshold) == (7, 7)  # 0.3 n made odd, every share needed
    np.testing.assert_array_equal(out.total, vectors.sum(axis=0))


def test_a_value_beyond_the_range_is_refused_not_clipped(monkeypatch):
    from dphype.flower.server import secagg_server
    from dphype.secure import secagg as protocol

    monkeypatch.setattr(secagg_server, "clipping_range_for", lambda clients: 1000)  # the server's range ...
    monkeypatch.setattr(protocol, "clipping_range_for", lambda clients: 1000)  # ... and the one clients use
    vectors = np.ones((5, 4), dtype=np.int64)
    vectors[2, 0] = 5000  # beyond the round's clipping range of 1000
    out, _ = run(vectors, min_survivors=4)
    np.testing.assert_array_equal(out.total, np.delete(vectors, 2, axis=0).sum(axis=0))  # the client dropped out


def test_dropouts_in_stage_0_and_stage_2_release_the_exact_sum():
    vectors = np.arange(6 * 8).reshape(6, 8) - 20
    out, _ = run(vectors, drop={1: "advertise", 3: "masked_input"}, min_survivors=4)
    np.testing.assert_array_equal(out.total, np.delete(vectors, [1, 3], axis=0).sum(axis=0))
    assert out.survivors == 4


def test_drops_up_to_xi_at_every_stage_release_the_exact_sum():
    n, xi = 40, 0.1
    vectors = np.random.default_rng(5).integers(-30, 30, size=(n, 10))
    drop = {3: "advertise", 11: "share_keys", 17: "masked_input", 25: "unmask"}
    out, _ = run(vectors, drop=drop, min_survivors=math.ceil((1 - xi) * n))
    assert out.secagg.neighbours < n - 1  # a sparse graph, not SecAgg's complete one
    # the client lost while unmasking had sent its vector: it is in the sum
    np.testing.assert_array_equal(out.total, np.delete(vectors, [3, 11, 17], axis=0).sum(axis=0))


@pytest.mark.slow
def test_exact_sum_of_255_clients_at_the_top_of_their_range_in_process():
    """n = 255 through the real adapter and handlers, every client at the top of the round's range ``C(n)`` (the
    largest possible sum, 255/256 of the modulus, still fits; the range arithmetic up to the largest n is checked
    in tests/secure/test_secure_sum.py); a ring of 2 neighbours (secure only against no collusion) keeps it short."""
    n = 255
    top = ss.clipping_range_for(n)
    vectors = np.random.default_rng(6).integers(-top, top + 1, size=(n, 5))
    vectors[:, 0] = top
    grid = LocalGrid(vector_app(vectors), n)
    out = run_secure_sum(grid, grid.get_node_ids(), REQUEST, size=5, noise="skellam", min_survivors=n, num_shares=3,
                         reconstruction_threshold=2, corrupt_fraction=0.0)
    np.testing.assert_array_equal(out.total, vectors.sum(axis=0))
