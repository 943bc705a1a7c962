"""Exact integer summation under secure aggregation: the encoding and its limits (dphype.secure.secure_sum)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dphype.checks import MAX_CLIENTS, check_clients
from dphype.secure import secure_sum as ss

C = ss.CLIPPING_RANGE


@pytest.mark.parametrize("clients", [2, 3, 50, 1000, 1023, 1024, 4097, MAX_CLIENTS])
def test_range_is_the_largest_that_cannot_wrap(clients):
    c = ss.clipping_range_for(clients)
    assert c & (c - 1) == 0  # a power of two
    # The largest possible sum (every entry at +C, i.e. Q after the shift) fits below 2**32 ...
    assert clients * 2 * c <= ss.MODULUS_RANGE - 1
    # ... and twice the range would wrap around, so C(n) is the largest such power of two.
    assert clients * 4 * c > ss.MODULUS_RANGE - 1


def test_range_matches_the_former_fixed_one_up_to_1023_clients():
    assert ss.clipping_range_for(1023) == ss.CLIPPING_RANGE == 2**21
    assert ss.clipping_range_for(1024) == 2**20
    assert ss.clipping_range_for(10_000) == 2**17


@pytest.mark.parametrize("clients", [0, 1, MAX_CLIENTS + 1, 50_000])
def test_client_count_refused(clients):
    with pytest.raises(ValueError, match="clients must be"):
        check_clients(clients)


def test_client_count_accepted_at_bounds():
    check_clients(2)
    check_clients(MAX_CLIENTS)


def test_encode_refuses_what_the_sum_cannot_hold():
    with pytest.raises(ValueError, match="secure-sum range"):
        ss.encode(np.array([C + 1, 0]), "skellam")
    with pytest.raises(ValueError, match="integers"):
        ss.encode(np.array([0.5, 1.0]), "skellam")
    with pytest.raises(ValueError, match="secure-sum range"):
        ss.encode(np.array([C / ss.fixed_point_scale("gaussian") + 1.0]), "gaussian")
    with pytest.raises(ValueError, match="finite"):
        ss.encode(np.array([np.nan]), "gaussian")
    with pytest.raises(ValueError, match="noise"):
        ss.encode(np.array([1]), "laplace")


def test_gaussian_fixed_point_encoding():
    enc = ss.encode(np.array([1.2345, -0.0004, 3.0]), "gaussian")
    np.testing.assert_array_equal(enc, [1264.0, -0.0, 3072.0])  # round(x * 1024)


def test_decode_scales_the_exact_sum():
    np.testing.assert_array_equal(ss.decode(np.array([-7, 2]), "skellam"), [-7, 2])
    assert ss.decode(np.array([1]), "skellam").dtype == np.int64
    np.testing.assert_array_equal(ss.decode(np.array([512, -1536]), "gaussian"), [0.5, -1.5])


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
    from dphype.privacy.noise import noise_share

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
