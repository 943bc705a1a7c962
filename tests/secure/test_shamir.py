"""Fast Shamir sharing (dphype.secure.shamir) against Flower's and PyCryptodome's implementation."""

from __future__ import annotations

import os
import random

import pytest
from Crypto.Protocol.SecretSharing import _Element
from flwr.common.secure_aggregation.crypto import shamir as flower

from dphype.secure import shamir


def test_field_arithmetic_matches_pycryptodome():
    rng = random.Random(0)
    for _ in range(50):
        a, b = rng.getrandbits(128), rng.getrandbits(128)
        assert shamir.gf_mul(a, b) == int(_Element(a) * _Element(b))
        assert shamir.gf_mul(a, shamir.gf_inverse(a)) == 1
    with pytest.raises(ValueError, match="non-zero"):
        shamir.gf_inverse(0)


@pytest.mark.parametrize("secret_size", [0, 16, 32, 306])  # 32: mask seed, 306: a P-384 key in PEM
@pytest.mark.parametrize(("threshold", "num"), [(2, 3), (5, 9), (9, 20)])
def test_shares_are_interchangeable_with_flowers(secret_size, threshold, num):
    rng = random.Random(secret_size * 100 + num)
    secret = os.urandom(secret_size)
    ours = shamir.create_shares(secret, threshold, num)
    assert len(ours) == num and all(len(s) == 4 + 16 * (secret_size // 16 + 1) for s in ours)
    assert flower.combine_shares(rng.sample(ours, threshold)) == secret
    theirs = flower.create_shares(secret, threshold, num)
    assert shamir.combine_shares(rng.sample(theirs, threshold), threshold) == secret
    assert shamir.combine_shares(rng.sample(ours, num), threshold) == secret  # any threshold of them


def test_several_secrets_in_one_pass():
    seed, key = os.urandom(32), os.urandom(306)
    seed_shares, key_shares = shamir.create_shares_of([seed, key], 4, 7)
    assert flower.combine_shares(seed_shares[3:]) == seed
    assert flower.combine_shares(key_shares[:4]) == key
    assert [s[:4] for s in seed_shares] == [s[:4] for s in key_shares]  # same indices 1..7


def test_many_secrets_combined_at_once_match_flowers():
    """Secrets with the same chosen indices are combined in one pass; each must equal Flower's reconstruction."""
    rng = random.Random(7)
    threshold, num = 5, 9
    secrets = [os.urandom(size) for size in (32, 32, 32, 306, 0, 32)]
    shares = [shamir.create_shares(secret, threshold, num) for secret in secrets]
    held = [rng.sample(s, num) for s in shares[:4]]  # all holders answered: indices 1..5 for each, any order
    held += [rng.sample(s, threshold + 1) for s in shares[4:]]  # a few holders: other index sets
    combined = shamir.combine_shares_of(held, threshold)
    assert combined == secrets
    assert combined == [flower.combine_shares(h) for h in held]  # Flower's interpolates every share it is given
    assert shamir.combine_shares_of([], threshold) == []


def test_the_shares_of_smallest_indices_are_used():
    shares = shamir.create_shares(b"secret", 3, 5)
    wrong = shares[4][:4] + bytes(a ^ 1 for a in shares[4][4:])  # index 5, another value
    assert shamir.combine_shares([wrong, shares[2], shares[0], shares[1]], 3) == b"secret"


def test_too_few_or_wrong_shares_are_refused():
    shares = shamir.create_shares(b"secret", 3, 5)
    with pytest.raises(ValueError, match="at least threshold=3"):
        shamir.combine_shares(shares[:2], 3)
    with pytest.raises(ValueError, match="distinct"):
        shamir.combine_shares([shares[0], shares[0], shares[1]], 3)
    with pytest.raises(ValueError, match="4 \\+ 16 m bytes"):
        shamir.combine_shares([shares[0], shares[1], shares[2][:-1]], 3)
    good = shamir.create_shares(b"another", 3, 5)
    with pytest.raises(ValueError, match="at least threshold=3"):  # one secret short refuses them all
        shamir.combine_shares_of([good, shares[:2]], 3)
    with pytest.raises(ValueError, match="1 <= threshold <= num"):
        shamir.create_shares(b"secret", 6, 5)
    # t - 1 shares of a degree t - 1 polynomial interpolate to something else, almost surely not a padded secret
    other = shamir.create_shares(os.urandom(32), 3, 5)
    mixed = [shares[0], shares[1], other[2]]
    assert _combined_or_none(mixed) != b"secret"


def _combined_or_none(shares: list[bytes]) -> bytes | None:
    try:
        return shamir.combine_shares(shares, 3)
    except ValueError:
        return None
