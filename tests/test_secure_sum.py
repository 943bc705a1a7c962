"""Exact integer summation over Flower SecAgg+ (dphype.secure_sum)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.common import FitIns, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.compat.common import recorddict_compat as compat
from local_grid import LocalGrid

from dphype import secure_sum as ss

C = ss.CLIPPING_RANGE


def _vector_client_app(vectors: np.ndarray, noise: str = "skellam", drop: dict | None = None,
                       secure_mod=ss.secure_vote_mod):
    """ClientApp whose node with partition-id i sends ``vectors[i]`` through ``secure_mod``.

    ``drop`` maps partition-id -> SecAgg+ stage at which that node crashes.
    """
    drop = drop or {}

    class VectorClient(NumPyClient):
        def __init__(self, pid: int) -> None:
            self.pid = pid

        def fit(self, parameters, config):
            return [ss.encode(vectors[self.pid], noise)], 1, {}

    def crash_mod(msg: Message, ctxt: Context, call_next):
        stage = msg.content.config_records[RECORD_KEY_CONFIGS][Key.STAGE]
        if drop.get(int(ctxt.node_config["partition-id"])) == stage:
            raise ConnectionError(f"node lost during {stage}")
        return call_next(msg, ctxt)

    return ClientApp(
        client_fn=lambda ctx: VectorClient(int(ctx.node_config["partition-id"])).to_client(),
        mods=[crash_mod, secure_mod],
    )


def _run(vectors, *, noise="skellam", drop=None, min_survivors=None, size=None):
    n = len(vectors)
    grid = LocalGrid(_vector_client_app(vectors, noise, drop), n)
    strategy = ss.SecureSumStrategy(
        clients=n,
        size=size or vectors.shape[1],
        noise=noise,
        min_survivors=min_survivors or n,
        fit_config={ss.PHASE_KEY: ss.VOTE_PHASE},
    )
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    total = ss.run_secure_sum(grid, context, strategy)
    return total, strategy, grid


def _stages_sent(grid: LocalGrid) -> list[str]:
    return [
        m.content.config_records[RECORD_KEY_CONFIGS][Key.STAGE]
        for m in grid.sent
        if RECORD_KEY_CONFIGS in m.content.config_records
    ]


@pytest.mark.parametrize("clients", [2, 3, 50, 1000, 1023, 1024, 4097, ss.MAX_CLIENTS])
def test_range_is_the_largest_that_cannot_wrap(clients):
    c = ss.clipping_range_for(clients)
    assert c & (c - 1) == 0  # a power of two; Q = 2C makes the quantizer exactly one
    # The largest possible sum (every entry at +C, i.e. Q after the shift) fits below 2**32 ...
    assert clients * 2 * c <= ss.MODULUS_RANGE - 1
    # ... and twice the range would wrap around, so C(n) is the largest such power of two.
    assert clients * 4 * c > ss.MODULUS_RANGE - 1
    assert 2 * c < 2**31  # Flower quantizes to int32


def test_range_matches_the_former_fixed_one_up_to_1023_clients():
    assert ss.clipping_range_for(1023) == ss.CLIPPING_RANGE == 2**21
    assert ss.clipping_range_for(1024) == 2**20
    assert ss.clipping_range_for(10_000) == 2**17


def test_announced_ranges_are_checked():
    ss.check_ranges(clients=1000, clipping_range=2.0**21, quantization_range=2**22, modulus_range=2**32)
    for wrong in [(2.0**20, 2**21, 2**32), (2.0**21, 2**23, 2**32), (2.0**21, 2**22, 2**31)]:
        with pytest.raises(ValueError, match="SecAgg\\+ ranges must be clipping_range=2097152"):
            ss.check_ranges(clients=1000, clipping_range=wrong[0], quantization_range=wrong[1],
                            modulus_range=wrong[2])


@pytest.mark.parametrize("clients", [0, 1, ss.MAX_CLIENTS + 1, 50_000])
def test_client_count_refused(clients):
    with pytest.raises(ValueError, match="clients must be"):
        ss.check_clients(clients)


def test_client_count_accepted_at_bounds():
    ss.check_clients(2)
    ss.check_clients(ss.MAX_CLIENTS)


def test_encode_refuses_what_secagg_would_clip():
    with pytest.raises(ValueError, match="clip"):
        ss.encode(np.array([C + 1, 0]), "skellam")
    with pytest.raises(ValueError, match="integers"):
        ss.encode(np.array([0.5, 1.0]), "skellam")
    with pytest.raises(ValueError, match="clip"):
        ss.encode(np.array([C / ss.GAUSSIAN_SCALE + 1.0]), "gaussian")
    with pytest.raises(ValueError, match="finite"):
        ss.encode(np.array([np.nan]), "gaussian")
    with pytest.raises(ValueError, match="noise"):
        ss.encode(np.array([1]), "laplace")


def test_gaussian_fixed_point_encoding():
    enc = ss.encode(np.array([1.2345, -0.0004, 3.0]), "gaussian")
    np.testing.assert_array_equal(enc, [1264.0, -0.0, 3072.0])  # round(x * 1024)


def test_decode_checks_integrality():
    with pytest.raises(ss.SecureSumError, match="not integral"):
        ss.decode_sum(np.array([0.3]), 3, "skellam")
    np.testing.assert_array_equal(ss.decode_sum(np.array([-7 / 3, 2 / 3]), 3, "skellam"), [-7, 2])
    assert ss.decode_sum(np.array([1.0]), 3, "skellam").dtype == np.int64
    np.testing.assert_allclose(ss.decode_sum(np.array([512.0]), 2, "gaussian"), [1.0])


def test_clip_probability_refuses_huge_noise():
    # Realistic DP-Hype noise (sigma ~ 13 at epsilon 1) is nowhere near the range.
    assert ss.clip_probability(size=100, sigma=12.84, clients=2, dropout=0.0, noise="skellam") < 1e-300
    ss.check_range(size=100, sigma=1000.0, clients=2, dropout=0.0, noise="skellam")
    # At n = 1000 the range is 2**21: a share std of ~2**20 reaches it easily.
    n = 1000
    with pytest.raises(ValueError, match="clipping range"):
        ss.check_range(size=100, sigma=2.0**20 * math.sqrt(n), clients=n, dropout=0.0, noise="skellam")
    # Gaussian values are scaled by 2**10, so the limit is 2**11 votes.
    with pytest.raises(ValueError, match="clipping range"):
        ss.check_range(size=100, sigma=1000.0 * math.sqrt(n), clients=n, dropout=0.0, noise="gaussian")
    # Just inside / outside the limit: share std 200 passes, share std 400 puts 2046 votes at
    # ~5 std and is refused.
    ss.check_range(size=100, sigma=200.0 * math.sqrt(n), clients=n, dropout=0.0, noise="gaussian")
    with pytest.raises(ValueError, match="clipping range"):
        ss.check_range(size=100, sigma=400.0 * math.sqrt(n), clients=n, dropout=0.0, noise="gaussian")


@pytest.mark.parametrize("noise", ["skellam", "gaussian"])
def test_clip_probability_against_a_monte_carlo_of_the_shares(noise):
    """The range bound vs the frequency with which some share of some client leaves it (a tight range)."""
    from dphype.noise import noise_share

    clients, size, reps = 4, 5, 40_000
    clipping_range = 8 * ss.fixed_point_scale(noise)  # shares are refused beyond 8 - 2 = 6 votes
    sigma = 2.2 * math.sqrt(clients)  # share std 2.2: a share exceeds 6 with probability ~0.6%
    bound = ss.clip_probability(size=size, sigma=sigma, clients=clients, dropout=0.0, noise=noise,
                                clipping_range=clipping_range)
    shares = noise_share((reps, clients, size), sigma=sigma, clients=clients, dropout=0.0, kind=noise,
                         rng=np.random.default_rng(8))
    limit = clipping_range / ss.fixed_point_scale(noise) - 2
    frequency = np.mean(np.any(np.abs(shares) > limit, axis=(1, 2)))
    assert 0.05 < frequency <= bound + 3 * math.sqrt(bound / reps)  # a real event, and bounded
    if noise == "gaussian":  # exact tails: only the union bound (and its sum term) loosen it
        assert bound < 1.6 * frequency


def test_secagg_sum_is_exact_with_negative_and_extreme_values():
    rng = np.random.default_rng(1)
    vectors = rng.integers(-C, C + 1, size=(6, 100))
    vectors[0, :3] = [C, -C, 0]
    vectors[1, :3] = [C, -C, -1]
    total, strategy, _ = _run(vectors)
    assert total.dtype == np.int64
    np.testing.assert_array_equal(total, vectors.sum(axis=0))
    assert strategy.survivors == 6


def test_secagg_sum_gaussian_fixed_point():
    rng = np.random.default_rng(2)
    noisy = rng.integers(0, 2, size=(4, 50)) + rng.normal(0.0, 5.0, size=(4, 50))
    total, _, _ = _run(noisy, noise="gaussian")
    expected = sum(ss.encode(v, "gaussian") for v in noisy) / ss.GAUSSIAN_SCALE
    np.testing.assert_array_equal(total, expected)
    assert np.max(np.abs(total - noisy.sum(axis=0))) <= 4 / (2 * ss.GAUSSIAN_SCALE)


def test_dropout_before_masked_vector_is_survived():
    vectors = np.arange(5 * 10).reshape(5, 10) - 20
    total, strategy, grid = _run(
        vectors, drop={3: Stage.COLLECT_MASKED_VECTORS}, min_survivors=4
    )
    np.testing.assert_array_equal(total, np.delete(vectors, 3, axis=0).sum(axis=0))
    assert strategy.survivors == 4
    assert Stage.UNMASK in _stages_sent(grid)


@pytest.mark.parametrize("stage", [Stage.SETUP, Stage.SHARE_KEYS])
def test_dropout_before_key_sharing_ends_is_survived(stage):
    # A node lost in stage 0 or 1 never masked with anyone: the others' sum is unmasked.
    vectors = np.arange(5 * 10).reshape(5, 10) - 20
    total, strategy, grid = _run(vectors, drop={2: stage}, min_survivors=4)
    np.testing.assert_array_equal(total, np.delete(vectors, 2, axis=0).sum(axis=0))
    assert strategy.survivors == 4
    configs = [m.content.config_records[RECORD_KEY_CONFIGS] for m in grid.sent]
    unmask = [c for c in configs if c[Key.STAGE] == Stage.UNMASK]
    assert unmask and all(not c[Key.DEAD_NODE_ID_LIST] for c in unmask)  # nothing to unmask for it


def test_dropout_during_unmasking_keeps_the_contribution():
    vectors = np.arange(5 * 10).reshape(5, 10) - 20
    total, strategy, _ = _run(vectors, drop={1: Stage.UNMASK}, min_survivors=5)
    # The node sent its masked vector before crashing: its mask is rebuilt from shares.
    np.testing.assert_array_equal(total, vectors.sum(axis=0))
    assert strategy.survivors == 5


def test_too_many_dropouts_release_nothing():
    vectors = np.ones((5, 10), dtype=np.int64)
    drop = {0: Stage.COLLECT_MASKED_VECTORS, 4: Stage.COLLECT_MASKED_VECTORS}
    n = len(vectors)
    grid = LocalGrid(_vector_client_app(vectors, drop=drop), n)
    strategy = ss.SecureSumStrategy(
        clients=n, size=10, noise="skellam", min_survivors=4, fit_config={}
    )
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(ss.TooFewSurvivorsError, match="only 3 of 5 .* nothing was released"):
        ss.run_secure_sum(grid, context, strategy)
    assert strategy.total is None
    # The server never asked for the key shares that would unmask the sum.
    assert Stage.UNMASK not in _stages_sent(grid)


def test_protocol_halt_is_an_error():
    vectors = np.ones((5, 10), dtype=np.int64)
    drop = {i: Stage.SETUP for i in range(3)}
    with pytest.raises(ss.SecureSumError, match="halted"):
        _run(vectors, drop=drop, min_survivors=2)


def test_wrong_length_sum_is_refused():
    vectors = np.ones((3, 11), dtype=np.int64)
    with pytest.raises(ss.SecureSumError, match="length 10"):
        _run(vectors, size=10)


def test_strategy_waits_for_clients_then_gives_up():
    strategy = ss.SecureSumStrategy(
        clients=4, size=3, noise="skellam", min_survivors=4, fit_config={}, connect_timeout=0.6
    )
    grid = LocalGrid(_vector_client_app(np.ones((3, 3))), 3)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(ss.SecureSumError, match="only 3 of 4 clients connected"):
        ss.run_secure_sum(grid, context, strategy)


def _fit_message(config: dict) -> Message:
    content = compat.fitins_to_recorddict(FitIns(ndarrays_to_parameters([]), config), True)
    return Message(content, 1, MessageType.TRAIN, group_id="1")


def test_plaintext_vote_request_is_refused():
    class PlainClient(NumPyClient):
        def fit(self, parameters, config):
            return [np.ones(3)], 1, {}

    app = ClientApp(client_fn=lambda ctx: PlainClient().to_client())
    grid = LocalGrid(app, 1)  # sets the task identity Message needs
    context = grid.contexts[1000]
    with pytest.raises(PermissionError, match="plaintext"):
        ss.secure_vote_mod(_fit_message({ss.PHASE_KEY: ss.VOTE_PHASE}), context, app)
    # Requests for other phases (e.g. FedAvg training) pass through unchanged.
    reply = ss.secure_vote_mod(_fit_message({ss.PHASE_KEY: "train"}), context, app)
    assert reply.has_content()


def test_default_num_shares():
    assert ss.default_num_shares(2) == 1.0
    assert ss.default_num_shares(7) == 1.0
    assert round(ss.default_num_shares(10) * 10) == 7
    assert round(ss.default_num_shares(50) * 50) == 10


@pytest.mark.slow
def test_secagg_sum_through_flower_simulation_with_a_dropout():
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
        strategy = ss.SecureSumStrategy(
            clients=5, size=100, noise="skellam", min_survivors=4, fit_config={}
        )
        out["total"] = ss.run_secure_sum(grid, context, strategy)
        out["survivors"] = strategy.survivors

    client_app = _vector_client_app(vectors, drop={2: Stage.COLLECT_MASKED_VECTORS})
    run_simulation(
        server_app,
        client_app,
        num_supernodes=5,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    assert out["survivors"] == 4
    np.testing.assert_array_equal(out["total"], np.delete(vectors, 2, axis=0).sum(axis=0))


# --------------------------------------------------------------- SecAgg+ at scale (dphype.flower.secagg_fast)
def _run_with(vectors, workflow, mod, *, drop=None):
    """One round with an explicit server workflow and client mods; returns the strategy's total."""
    from flwr.server import ServerConfig
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.workflow import DefaultWorkflow

    n = len(vectors)
    grid = LocalGrid(_vector_client_app(vectors, drop=drop, secure_mod=mod), n)
    strategy = ss.SecureSumStrategy(clients=n, size=vectors.shape[1], noise="skellam", min_survivors=1,
                                    fit_config={})
    context = LegacyContext(Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                            config=ServerConfig(num_rounds=1), strategy=strategy)
    DefaultWorkflow(fit_workflow=workflow)(grid, context)
    return strategy.total


def test_scalable_sides_work_with_flowers_stock_sides():
    from flwr.client.mod import secaggplus_mod
    from flwr.server.workflow import SecAggPlusWorkflow

    from dphype.flower.secagg_fast import scalable_secaggplus_mod

    vectors = np.random.default_rng(4).integers(-100, 100, size=(9, 20))
    ranges = {"max_weight": 1.0, "clipping_range": float(C), "quantization_range": 2 * C, "modulus_range": 2**32}
    stock_server = SecAggPlusWorkflow(5, 3, **ranges)
    ours = ss.ExactSumWorkflow(min_survivors=9, num_shares=5, reconstruction_threshold=3)
    for workflow, mod in [(stock_server, scalable_secaggplus_mod), (ours, secaggplus_mod)]:
        np.testing.assert_array_equal(_run_with(vectors, workflow, mod), vectors.sum(axis=0))


def test_a_value_beyond_the_range_is_refused_not_clipped():
    from dphype.flower.secagg_fast import scalable_secaggplus_mod

    vectors = np.ones((5, 4), dtype=np.int64)
    vectors[2, 0] = 5000  # beyond the round's clipping range of 1000
    workflow = ss.ExactSumWorkflow(min_survivors=4, num_shares=1.0, reconstruction_threshold=3,
                                   clipping_range=1000)
    total = _run_with(vectors, workflow, scalable_secaggplus_mod)
    np.testing.assert_array_equal(total, np.delete(vectors, 2, axis=0).sum(axis=0))  # the client dropped out


def test_dropouts_in_stage_0_and_stage_2_release_the_exact_sum():
    # Issue 8, item 8: Flower removes a dropped client's masks with every neighbour, including one lost
    # before it sent keys (KeyError); only masks with neighbours whose vectors are in the sum are there.
    vectors = np.arange(6 * 8).reshape(6, 8) - 20
    total, strategy, _ = _run(vectors, drop={1: Stage.SETUP, 3: Stage.COLLECT_MASKED_VECTORS}, min_survivors=4)
    np.testing.assert_array_equal(total, np.delete(vectors, [1, 3], axis=0).sum(axis=0))
    assert strategy.survivors == 4


def test_drops_up_to_xi_at_every_stage_with_secure_parameters():
    from dphype.secagg_params import secure_parameters

    n, xi = 40, 0.1
    params = secure_parameters(n, dropout=xi)
    assert params.neighbours < n - 1  # a sparse graph, not SecAgg's complete one
    vectors = np.random.default_rng(5).integers(-30, 30, size=(n, 10))
    drop = {3: Stage.SETUP, 11: Stage.SHARE_KEYS, 17: Stage.COLLECT_MASKED_VECTORS, 25: Stage.UNMASK}
    grid = LocalGrid(_vector_client_app(vectors, drop=drop), n)
    strategy = ss.SecureSumStrategy(clients=n, size=10, noise="skellam", min_survivors=math.ceil((1 - xi) * n),
                                    fit_config={})
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    total = ss.run_secure_sum(grid, context, strategy, **params.flower_arguments())
    # the client lost while unmasking had sent its vector: it is in the sum
    np.testing.assert_array_equal(total, np.delete(vectors, [3, 11, 17], axis=0).sum(axis=0))


@pytest.mark.slow
def test_exact_sum_of_1000_clients_in_process():
    """n = 1000 through the real workflow and mods (a ring of 2 neighbours: 4 key agreements per client).

    Slow: 1000 clients' key generation and agreement alone take several seconds on 2 cores; the range
    arithmetic behind the exact sum at n = 1000 is checked fast by test_range_is_the_largest_that_cannot_wrap.
    """
    n = 1000
    vectors = np.random.default_rng(6).integers(-C, C + 1, size=(n, 5))
    vectors[:, 0] = C  # every client at the top of the range: the largest possible sum still fits
    grid = LocalGrid(_vector_client_app(vectors), n)
    strategy = ss.SecureSumStrategy(clients=n, size=5, noise="skellam", min_survivors=n, fit_config={})
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    total = ss.run_secure_sum(grid, context, strategy, num_shares=3, reconstruction_threshold=2)
    np.testing.assert_array_equal(total, vectors.sum(axis=0))


@pytest.mark.slow
def test_exact_sum_of_1000_clients_with_secure_parameters_and_dropouts():
    from dphype.secagg_params import secure_parameters

    n, xi = 1000, 0.01
    params = secure_parameters(n, dropout=xi)
    vectors = np.random.default_rng(7).integers(-50, 51, size=(n, 100))
    drop = {i: stage for i, stage in zip(range(0, 1000, 100), [Stage.SETUP, Stage.SHARE_KEYS,
                                                                Stage.COLLECT_MASKED_VECTORS, Stage.UNMASK] * 3)}
    grid = LocalGrid(_vector_client_app(vectors, drop=drop), n)
    strategy = ss.SecureSumStrategy(clients=n, size=100, noise="skellam", min_survivors=math.ceil((1 - xi) * n),
                                    fit_config={})
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    total = ss.run_secure_sum(grid, context, strategy, **params.flower_arguments())
    lost = [i for i, stage in drop.items() if stage != Stage.UNMASK]
    np.testing.assert_array_equal(total, np.delete(vectors, lost, axis=0).sum(axis=0))
