"""Shamir secret sharing over GF(2^128), byte-compatible with Flower's SecAgg+ shares, but fast.

Flower's SecAgg+ (``flwr.common.secure_aggregation.crypto.shamir``) splits a secret into 16-byte
chunks (PKCS#7 padded) and shares each chunk with PyCryptodome's ``Shamir`` over GF(2^128) (modulus
``x^128 + x^7 + x^2 + x + 1``; an element is the big-endian integer of its 16 bytes, bit ``i`` the
coefficient of ``x^i``; share ``j`` of polynomial ``p`` is ``p(j)``). A share is ``j`` as 4 little-endian
bytes followed by the chunks' 16-byte shares. PyCryptodome multiplies field elements in pure Python,
building two 128-character strings per bit, and
Flower hands ``combine`` every share it received instead of ``t``; at the SecAgg+ sizes DP-Hype needs
(a client's two secrets are 23 chunks, ``t`` in the tens) sharing and reconstruction dominated a
voting round (results/speed.md, "The secure vote at scale").

Hand-written (PyCryptodome's field arithmetic is the only one in our dependencies, and no maintained
package shares over this field in this byte format) and checked both ways against Flower's functions in
``tests/secure/test_shamir.py``. What makes it fast:

* **all chunks at once**: the chunks of a secret are packed into one Python integer, one 256-bit lane
  each, so a product by the share index or by a Lagrange coefficient is a handful of shifts and XORs
  on one integer (a lane has room for the 255-bit carry-less product and is reduced lane-wise);
* **exactly ``t`` shares** are interpolated, those of the smallest indices, and the Lagrange coefficients at 0
  (which depend only on the share indices) are computed once per index set with one field inversion each;
* **many secrets at once** (`combine_shares_of`): the secrets whose chosen shares have the same indices and
  length (at the SecAgg+ server, every survivor's seed when its share holders all answered) are packed into
  one integer per share index, so each Lagrange coefficient multiplies all of them in one product.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import numpy as np
from Crypto.Util.Padding import pad, unpad

_BITS = 128
_MASK = (1 << _BITS) - 1
#: x^128 + x^7 + x^2 + x + 1, the field modulus shared with PyCryptodome's Shamir.
_MODULUS = (1 << _BITS) | 0x87
_LANE = 256  # a lane holds a 255-bit carry-less product before reduction
_CHUNK = 16  # bytes per field element
_INDEX_BYTES = 4


def _lane_mask(lanes: int) -> int:
    """Ones in the low 128 bits of each of ``lanes`` 256-bit lanes."""
    return int.from_bytes((b"\x00" * _CHUNK + b"\xff" * _CHUNK) * lanes, "big")


def _reduce(packed: int, low: int) -> int:
    """Reduce each lane modulo ``x^128 + x^7 + x^2 + x + 1``: fold the high half as ``h^h<<1^h<<2^h<<7``, twice."""
    for _ in range(2):
        high = (packed >> _BITS) & low
        packed = (packed & low) ^ high ^ (high << 1) ^ (high << 2) ^ (high << 7)
    return packed


def _times(packed: int, factor: int) -> int:
    """Unreduced lane-wise carry-less product of packed elements and one element ``factor`` (4-bit windows)."""
    table = [0, packed]
    for i in range(2, 16):
        table.append(table[i >> 1] << 1 if i % 2 == 0 else table[i - 1] ^ packed)
    product = 0
    for shift in range(factor.bit_length() // 4 * 4, -4, -4):
        product = (product << 4) ^ table[(factor >> shift) & 15]
    return product


def _times_small(packed: int, factor: int) -> int:
    """Unreduced lane-wise carry-less product by a small factor (a share index): one shift per set bit."""
    product = 0
    while factor:
        lowest = factor & -factor
        product ^= packed << (lowest.bit_length() - 1)
        factor ^= lowest
    return product


def gf_mul(a: int, b: int) -> int:
    """Product of two GF(2^128) elements (integers below ``2**128``)."""
    return _reduce(_times(a, b), _MASK)


def gf_inverse(a: int) -> int:
    """Inverse of a non-zero GF(2^128) element: extended Euclid over GF(2)[x] (Menezes et al., HAC 2.226).

    Args:
        a: A non-zero field element, an integer below ``2**128``.

    Returns:
        ``a^-1`` in GF(2^128).

    Raises:
        ValueError: ``a`` is zero or not a field element.
    """
    if not 0 < a <= _MASK:
        raise ValueError("only non-zero field elements have an inverse")
    u, v, g1, g2 = a, _MODULUS, 1, 0
    while u != 1:
        shift = u.bit_length() - v.bit_length()
        if shift < 0:
            u, v, g1, g2 = v, u, g2, g1
            shift = -shift
        u ^= v << shift
        g1 ^= g2 << shift
    return g1


def _pack(data: bytes) -> int:
    """The 16-byte chunks of ``data`` as lanes of one integer, chunk 0 in the lowest lane."""
    chunks = np.frombuffer(data, dtype=np.uint8).reshape(-1, _CHUNK)
    lanes = np.zeros((len(chunks), _LANE // 8), dtype=np.uint8)
    lanes[:, _CHUNK:] = chunks  # big-endian: each lane's high 16 bytes are zero
    return int.from_bytes(lanes[::-1].tobytes(), "big")


def _unpack(packed: int, lanes: int) -> bytes:
    """Inverse of `_pack` for reduced lanes."""
    data = np.frombuffer(packed.to_bytes(lanes * _LANE // 8, "big"), dtype=np.uint8).reshape(lanes, _LANE // 8)
    return data[::-1, _CHUNK:].tobytes()


def create_shares(secret: bytes, threshold: int, num: int) -> list[bytes]:
    """Shares ``1..num`` of ``secret``, any ``threshold`` of which reconstruct it (`create_shares_of`'s format)."""
    return create_shares_of([secret], threshold, num)[0]


def create_shares_of(secrets: list[bytes], threshold: int, num: int) -> list[list[bytes]]:
    """`create_shares` for several secrets at once (SecAgg+ shares two with the same ``t`` and ``num``).

    Each chunk of each secret gets its own random polynomial of degree ``threshold - 1`` with the chunk
    as constant term (coefficients from the OS's CSPRNG); all chunks are evaluated together by Horner's
    rule, reducing only when a lane could overflow (each step by an index adds at most 16 bits).

    Args:
        secrets: The secrets.
        threshold: The number of shares that reconstruct a secret, in ``[1, num]``.
        num: The number of shares per secret, below 65536.

    Returns:
        For each secret, its ``num`` shares: share ``j`` is ``j`` as 4 little-endian bytes followed by its 16-byte
        chunk shares (Flower's byte format).

    Raises:
        ValueError: ``threshold`` or ``num`` is out of its range.
    """
    if not 1 <= threshold <= num < 2**16:
        raise ValueError(f"threshold and num must satisfy 1 <= threshold <= num < 65536, got {threshold}, {num}")
    padded = [pad(secret, _CHUNK) for secret in secrets]
    sizes = [len(p) // _CHUNK for p in padded]
    data = b"".join(padded)
    lanes = len(data) // _CHUNK
    low = _lane_mask(lanes)
    coefficients = [_pack(os.urandom(len(data))) for _ in range(threshold - 1)]
    coefficients.append(_pack(data))
    steps_between_reductions = (_LANE - _BITS) // num.bit_length() - 1
    shares: list[list[bytes]] = [[] for _ in secrets]
    for index in range(1, num + 1):
        value = 0
        for step, coefficient in enumerate(coefficients):
            if step % steps_between_reductions == 0:
                value = _reduce(value, low)
            value = _times_small(value, index) ^ coefficient
        body = _unpack(_reduce(value, low), lanes)
        head = index.to_bytes(_INDEX_BYTES, "little")
        start = 0
        for out, size in zip(shares, sizes, strict=True):
            out.append(head + body[start * _CHUNK : (start + size) * _CHUNK])
            start += size
    return shares


@functools.lru_cache(maxsize=4096)
def lagrange_at_zero(indices: tuple[int, ...]) -> tuple[int, ...]:
    """Lagrange coefficients ``l_j = prod_{m != j} x_m / (x_j + x_m)`` at 0 for distinct share indices.

    Written as ``P / (x_j prod_{m != j} (x_j + x_m))`` with ``P = prod x_m``: the denominator is a
    product of small field elements, so each ``l_j`` costs one inversion.

    Args:
        indices: Distinct share indices ``x_j >= 1``.

    Returns:
        The coefficients ``l_j``, in the order of ``indices``.

    Raises:
        ValueError: The indices are not distinct or not ``>= 1``.
    """
    if len(set(indices)) != len(indices) or min(indices) < 1:
        raise ValueError(f"share indices must be distinct and >= 1, got {indices}")
    everything = 1
    for x in indices:
        everything = _reduce(_times_small(everything, x), _MASK)
    coefficients = []
    for x_j in indices:
        denominator = x_j
        for x_m in indices:
            if x_m != x_j:
                denominator = _reduce(_times_small(denominator, x_j ^ x_m), _MASK)
        coefficients.append(gf_mul(everything, gf_inverse(denominator)))
    return tuple(coefficients)


def combine_shares(shares: list[bytes], threshold: int) -> bytes:
    """Reconstruct a secret from ``threshold`` of ``shares`` (Flower's byte format): `combine_shares_of` of one.

    Args:
        shares: At least ``threshold`` shares of one secret (as `create_shares` makes them).
        threshold: The number of shares that reconstruct it.

    Returns:
        The secret.

    Raises:
        ValueError: As `combine_shares_of`.
    """  # noqa: DOC502
    return combine_shares_of([shares], threshold)[0]


def combine_shares_of(secrets: Sequence[Sequence[bytes]], threshold: int) -> list[bytes]:
    """Reconstruct several secrets, each from the ``threshold`` of its shares with the smallest indices.

    Any ``threshold`` shares of a secret interpolate to it; taking the smallest indices makes secrets whose holders
    all answered share one index set, hence one set of Lagrange coefficients (`lagrange_at_zero`). The secrets with
    the same chosen indices and share length are combined together: share ``j`` of each is one lane group of a
    packed integer, multiplied once by ``l_j``.

    Args:
        secrets: For each secret, at least ``threshold`` of its shares (as `create_shares` makes them), in any order.
        threshold: The number of shares that reconstruct a secret.

    Returns:
        The secrets, in the order of ``secrets``.

    Raises:
        ValueError: Fewer than ``threshold`` shares of a secret, shares of one secret of different lengths, repeated
            indices among the chosen ones, or a result that is not a padded secret (wrong shares).
    """
    groups: dict[tuple[tuple[int, ...], int], list[int]] = {}
    chosen: list[list[bytes]] = []
    for position, shares in enumerate(secrets):
        if threshold < 1 or len(shares) < threshold:
            raise ValueError(f"need at least threshold={threshold} shares, got {len(shares)}")
        used = sorted(shares, key=_index)[:threshold]
        size = len(used[0])
        if (size - _INDEX_BYTES) % _CHUNK or size <= _INDEX_BYTES or any(len(s) != size for s in used):
            raise ValueError("shares must all be 4 + 16 m bytes long")
        chosen.append(used)
        groups.setdefault((tuple(_index(s) for s in used), size), []).append(position)
    out: list[bytes] = [b""] * len(secrets)
    for (indices, size), members in groups.items():
        lanes = (size - _INDEX_BYTES) // _CHUNK
        total = 0
        for j, coefficient in enumerate(lagrange_at_zero(indices)):
            total ^= _times(_pack(b"".join(chosen[m][j][_INDEX_BYTES:] for m in members)), coefficient)
        body = _unpack(_reduce(total, _lane_mask(lanes * len(members))), lanes * len(members))
        for i, m in enumerate(members):
            try:
                out[m] = unpad(body[i * lanes * _CHUNK : (i + 1) * lanes * _CHUNK], _CHUNK)
            except ValueError:
                raise ValueError("failed to combine shares (they do not belong to one secret)") from None
    return out


def _index(share: bytes) -> int:
    """A share's index ``j`` (its first 4 bytes, little-endian)."""
    return int.from_bytes(share[:_INDEX_BYTES], "little")
