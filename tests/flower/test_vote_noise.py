"""The noise in what a client actually sends, through the real vote path (:meth:`dphype.release.SumRelease.ballot`,
and the client handler under :class:`dphype.flower.local.LocalGrid`), against the exact law of a share (DP-Hype
Appendix A: variance ``sigma^2 / ((1 - xi) n)``; Skellam shares ``Pois(mu) - Pois(mu)``, Agarwal, Kairouz & Liu 2021).

Each test draws tens of thousands of entries, so a share whose std is off by 10% (variance off by about 20%) lies
many standard errors outside the tolerance, while a correct share lies inside it except with probability far
below 1e-6: the variance is checked to within ``VARIANCE_RTOL`` and the whole law by a chi-square (Skellam) or
Kolmogorov-Smirnov (Gaussian) test at level 1e-6. The expected variance is computed here from the formula, not
from the library.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.clientapp import ClientApp
from helpers import PERMISSIVE, TableTask
from scipy.stats import chi2, kstest, norm, skellam

from dphype.config import DPHypeConfig
from dphype.flower import DPHype, register_dphype
from dphype.flower.local import LocalGrid
from dphype.protocol import make_vote_request
from dphype.secure import secure_sum as ss
from dphype.selection.candidates import candidate_grid

#: Level of the goodness-of-fit tests: a correct implementation fails one with probability 1e-6.
LEVEL = 1e-6


def decoded(vectors: np.ndarray, noise: str) -> np.ndarray:
    """Encoded vectors back to vote units (Gaussian shares travel on a 1/1024 grid)."""
    return np.asarray(vectors, dtype=np.float64) / ss.fixed_point_scale(noise)


def check_law(noise: str, samples: np.ndarray, variance: float, variance_rtol: float) -> None:
    """``samples`` are iid draws of a share of ``variance`` (Gaussian, or symmetric Skellam ``mu = variance/2``)."""
    n = samples.size
    # sample variance about the known mean 0: relative std error sqrt((2 + excess kurtosis) / n)
    assert abs(np.mean(samples**2) / variance - 1.0) < variance_rtol
    assert abs(np.mean(samples)) < 6.0 * math.sqrt(variance / n)
    if noise == "gaussian":
        # the 1/1024 grid moves the CDF by < 1e-4, far below the test's resolution at these sizes
        assert kstest(samples, norm(0.0, math.sqrt(variance)).cdf).pvalue > LEVEL
        return
    assert np.array_equal(samples, np.rint(samples))
    mu = variance / 2.0
    values, counts = np.unique(samples.astype(np.int64), return_counts=True)
    expected = n * skellam.pmf(values, mu, mu)
    keep = expected >= 5  # pool the tails into one cell
    tail_observed = n - counts[keep].sum()
    tail_expected = n - expected[keep].sum()
    stat = float(np.sum((counts[keep] - expected[keep]) ** 2 / expected[keep]))
    stat += (tail_observed - tail_expected) ** 2 / tail_expected
    assert stat < chi2.isf(LEVEL, int(keep.sum()))


# ----------------------------------------------------------------------------------- SumRelease.ballot
P = 400
CANDS = candidate_grid(a=list(range(P)))
SCORES = np.arange(P, dtype=np.float64)  # maximize: the top 3 are the last three candidates


@pytest.mark.parametrize("noise", ["skellam", "gaussian"])
def test_sum_ballot_adds_a_share_of_variance_sigma2_over_1_minus_xi_n(noise):
    clients, dropout = 10, 0.3
    request = make_vote_request(DPHypeConfig(epsilon=1.0, delta=1e-5, k=3, clients=clients, dropout=dropout,
                                             noise=noise), CANDS)
    votes = np.zeros(P)
    votes[-3:] = 1
    sent = np.stack([request.mode.ballot(request, SCORES, maximize=True, clipping_range=ss.CLIPPING_RANGE)
                     for _ in range(250)])
    shares = decoded(sent, noise) - votes  # 100,000 entries: relative std error of the variance ~0.5%
    variance = request.sigma**2 / ((1 - dropout) * clients)
    check_law(noise, shares.ravel(), variance, variance_rtol=0.04)
    # the fewest survivors, ceil(0.7 * 10) = 7, carry exactly sigma^2 between them
    survivor_sums = shares[:245].reshape(35, 7, P).sum(axis=1).ravel()
    check_law(noise, survivor_sums, request.sigma**2, variance_rtol=0.1)


# ----------------------------------------------------------------- the client handler, through the Flower adapter
BIG = candidate_grid(a=list(range(1000)))


@pytest.mark.parametrize("noise", ["skellam", "gaussian"])
def test_what_clients_send_and_the_release_carry_the_calibrated_noise(noise, recorded_votes):
    # 10 clients tolerating xi = 0.3; three refuse, so the fewest allowed (7) send their votes over SecAgg+
    clients, dropout, runs = 10, 0.3, 4
    rows = [np.arange(len(BIG), dtype=np.float64)] * 7 + [RuntimeError("refuses")] * 3
    app = ClientApp()
    register_dphype(app, lambda ctx: TableTask(rows[int(ctx.node_config["partition-id"])]))
    config = DPHypeConfig(epsilon=1.0, delta=1e-5, k=3, clients=clients, dropout=dropout, noise=noise, rule="max-votes")
    selection = DPHype(BIG, config)
    sigma = selection.request.sigma  # the announced total std; the shares must add up to it
    votes = np.zeros(len(BIG))
    votes[-3:] = 1
    released = []
    for run in range(1, runs + 1):  # one vote per request and run: each release in a run of its own
        result = selection.start(LocalGrid(app, clients, node_config=PERMISSIVE, run_id=run))
        assert result.report.survivors == 7
        released.append(result.noisy_sum - 7 * votes)  # the server's decoded sum, in vote units
    assert len(recorded_votes) == 7 * runs
    # each client's vector: its top-3 votes plus a share of variance sigma^2 / (0.7 * 10) (28,000 entries)
    shares = decoded(np.stack(recorded_votes), noise) - votes
    check_law(noise, shares.ravel(), sigma**2 / ((1 - dropout) * clients), variance_rtol=0.06)
    # what the server releases: 7 shares, exactly sigma^2 (4,000 entries: relative std error ~2.2%)
    check_law(noise, np.ravel(released), sigma**2, variance_rtol=0.12)
