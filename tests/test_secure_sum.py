"""Exact integer summation over SecAgg+: the framework-free encoding and its limits (dphype.secure_sum)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dphype import secure_sum as ss

C = ss.CLIPPING_RANGE


def test_modulus_bound_is_exact():
    assert ss.MAX_CLIENTS == 1023
    # The largest possible sum (every entry at +C, i.e. Q after the shift) fits below 2**32 ...
    assert ss.MAX_CLIENTS * ss.QUANTIZATION_RANGE <= ss.MODULUS_RANGE - 1
    # ... and one more client would wrap around.
    assert (ss.MAX_CLIENTS + 1) * ss.QUANTIZATION_RANGE > ss.MODULUS_RANGE - 1
    # Quantizer Q / (2C) is exactly one.
    assert ss.QUANTIZATION_RANGE == 2 * ss.CLIPPING_RANGE


@pytest.mark.parametrize("clients", [0, 1, ss.MAX_CLIENTS + 1, 5000])
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
    # A share std of ~2**20 reaches 2**21 easily.
    with pytest.raises(ValueError, match="clipping range"):
        ss.check_range(size=100, sigma=2.0**20, clients=2, dropout=0.0, noise="skellam")
    # Gaussian values are scaled by 2**10, so the limit is 2**11 votes.
    with pytest.raises(ValueError, match="clipping range"):
        ss.check_range(size=100, sigma=1000.0, clients=2, dropout=0.0, noise="gaussian")
    # Just inside / outside the limit: share std 200 (sigma 200 sqrt 2 over 2 clients) passes,
    # share std 400 puts 2046 votes at ~5 std and is refused.
    ss.check_range(size=100, sigma=200.0 * math.sqrt(2), clients=2, dropout=0.0, noise="gaussian")
    with pytest.raises(ValueError, match="clipping range"):
        ss.check_range(size=100, sigma=400.0 * math.sqrt(2), clients=2, dropout=0.0, noise="gaussian")


def test_default_num_shares():
    assert ss.default_num_shares(2) == 1.0
    assert ss.default_num_shares(7) == 1.0
    assert round(ss.default_num_shares(10) * 10) == 7
    assert round(ss.default_num_shares(50) * 50) == 10
