"""The noise in what a client actually sends: real DP-Hype clients (``register_dphype``: pre-flight, the vote
path with its secure noise share) run the secure sum in process; each masked vector is then unmasked with the
sending node's own secrets, the known top-k votes are subtracted, and the noise shares left are compared with
their exact distribution (Skellam or Gaussian of variance ``sigma^2 / ((1 - xi) n)``). Tight enough to fail
on a 10% error in the share's std (halving it, splitting it over more clients, ignoring ``xi``)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.clientapp import ClientApp
from scipy import stats

from dphype.config import DPHypeConfig
from dphype.flower import DPHype, register_dphype
from dphype.flower.local import LocalGrid
from dphype.flower.wire import SECAGG_STATE, STAGE_KEY
from dphype.ml.torch_task import FixedScoresTask
from dphype.node.ledger import admitting_policy
from dphype.privacy.noise import client_noise_std
from dphype.secure import relay
from dphype.secure import secagg as sa
from dphype.secure.secure_sum import MODULUS_RANGE, clipping_range_for, fixed_point_scale
from dphype.selection.candidates import table_iii_grid
from dphype.selection.voting import top_k_votes

N, XI, K = 40, 0.2, 5


class SnapshotGrid(LocalGrid):
    """Keeps each node's round state as it stood after the masked-input stage (its secrets included)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.after_masking: dict[int, dict] = {}

    def push_messages(self, messages):
        messages = list(messages)
        if any(m.content.config_records.get(STAGE_KEY, {}).get("stage") == "consistency" for m in messages):
            self.after_masking = {node: dict(ctx.state.config_records[SECAGG_STATE])
                                  for node, ctx in self.contexts.items() if SECAGG_STATE in ctx.state.config_records}
        return super().push_messages(messages)


def unmask_each(grid: SnapshotGrid, size: int) -> dict[int, np.ndarray]:
    """Every node's sent vector ``x_u`` (encoded), unmasked with its own self-mask seed and mask key."""
    sent = {r.metadata.src_node_id: dict(r.content.config_records[STAGE_KEY]) for r in grid.replies
            if not r.has_error() and r.content.config_records.get(STAGE_KEY, {}).get("stage") == "masked_input"}
    out = {}
    for node, reply in sent.items():
        state = sa.NodeRound.from_record(grid.after_masking[node])
        masked = np.frombuffer(reply["masked"], dtype="<u4").astype(np.int64)
        value = masked - sa._self_mask(state.seed, size, state.digest, node)
        own = relay.KeyPair.from_private(state.s_private)
        s_of = state.peer_keys(state.s_keys)
        for v in state.graph().neighbourhood(node):
            mask = sa._pair_masks([sa._pair_key(own, s_of[v], state.digest, node, v, b"pair")], size, state.digest)[0]
            value = value - mask if node < v else value + mask
        value %= MODULUS_RANGE
        out[node] = value - clipping_range_for(len(state.nodes))
    return out


@pytest.mark.parametrize("noise", ["skellam", "gaussian"])
def test_noise_shares_in_the_sent_vectors_have_the_exact_distribution(noise):
    candidates = table_iii_grid()
    p = len(candidates)
    scores = np.random.default_rng(11).random((N, p))
    config = DPHypeConfig(epsilon=1.0, delta=1e-5, k=K, clients=N, dropout=XI, noise=noise, rule="max-votes")
    selection = DPHype(candidates, config)
    app = register_dphype(ClientApp(), lambda ctx: FixedScoresTask(scores[int(ctx.node_config["partition-id"])]))
    grid = SnapshotGrid(app, N, node_config=admitting_policy(selection.request))
    result = selection.start(grid)
    sent = unmask_each(grid, p)
    assert len(sent) == N == result.report.survivors
    scale = fixed_point_scale(noise)
    shares = np.concatenate([sent[1000 + i] / scale - top_k_votes(scores[i], K) for i in range(N)])
    # the unmasked vectors add up to the released sum: they are what was summed
    np.testing.assert_allclose(sum(sent.values()) / scale, result.noisy_sum)
    std = client_noise_std(selection.request.sigma, N, XI)
    assert std == pytest.approx(selection.request.sigma / np.sqrt((1 - XI) * N))
    # the std within 5% (4.5 standard errors with these 4000 shares; a 10% error is 9 standard errors away)
    assert abs(shares.std() / std - 1) < 0.05
    assert abs(shares.mean()) < 4 * std / np.sqrt(shares.size)
    if noise == "skellam":
        assert np.array_equal(shares, np.rint(shares))
        mu = std**2 / 2  # Skellam(mu, mu) has variance 2 mu
        values, counts = np.unique(shares.astype(np.int64), return_counts=True)
        edges = np.arange(-int(4 * std), int(4 * std) + 1)
        expected = stats.skellam.pmf(edges, mu, mu) * shares.size
        observed = np.array([counts[values == v].sum() for v in edges])
        keep = expected > 5
        tail = shares.size - observed[keep].sum()
        chi2 = stats.chisquare(np.append(observed[keep], tail),
                               np.append(expected[keep], shares.size - expected[keep].sum()))
        assert chi2.pvalue > 1e-4
    else:
        # shares rounded to the 1/1024 grid: negligible against std ~ 2
        assert stats.kstest(shares, "norm", args=(0.0, std)).pvalue > 1e-4


def test_the_std_check_would_catch_a_10_percent_error():
    """The same std check on 4000 shares whose std is 10% off fails, whatever the seed (what a halved share,
    one split over more clients, or one that ignores xi = 0.2 -- 10.6% too narrow -- would give)."""
    std = 2.0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        for factor in (0.9, 1.1):
            assert abs(rng.normal(0.0, factor * std, size=4000).std() / std - 1) >= 0.05
