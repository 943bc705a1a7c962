"""Cryptographic building blocks of DP-Hype's secure computation, all from ``cryptography``.

Nothing here is a hand-written primitive: X25519 (RFC 7748), HKDF-SHA256 (RFC 5869), ChaCha20-Poly1305
(RFC 8439), Ed25519 (RFC 8032), and the raw ChaCha20 keystream keyed with the *full* 32-byte key as mask
generator. This module fixes how they are combined, with a ``context`` (protocol, round, purpose) bound into
every derivation or as associated data, so nothing made for one purpose can be replayed for another.

* `KeyPair` -- an X25519 key pair; `KeyPair.agree` gives ``HKDF-SHA256(X25519(a, B), info)``,
  32 bytes, the same on both sides (the pairwise keys of SecAgg+, Bell et al. CCS 2020, Algorithm 2).
* `seal` / `open_sealed` -- public-key encryption to a recipient's X25519 key: a fresh
  ephemeral key pair, ``HKDF-SHA256(X25519(e, R), salt = E || R, info = "dphype-seal-v1" || context)``,
  ChaCha20-Poly1305 with ``context`` as associated data. Format ``E (32 bytes) || ciphertext || tag``. The
  key is used once, so the nonce is fixed to zero.
* `encrypt` / `decrypt` -- ChaCha20-Poly1305 under a shared key, a random 96-bit nonce
  prepended, ``context`` as associated data. Format ``nonce (12) || ciphertext || tag (16)``.
* `expand_mask` -- ``size`` integers uniform in ``[0, modulus)`` from a 32-byte key: the ChaCha20
  keystream under that key (nonce ``SHA-256("dphype-mask-v1" || context)[:12]``, block counter 0) read as
  little-endian 64-bit words; a word ``w`` is kept iff ``w < 2**64 - (2**64 mod modulus)`` and mapped to
  ``w mod modulus`` (rejection sampling, so no modulo bias; for a power-of-two modulus nothing is
  rejected). All 256 key bits seed the generator. `expand_masks` expands several keys under one context at once.
* `SigningKey` / `verify` -- Ed25519 signatures (the consistency round of Bonawitz et al.,
  CCS 2017). A verdict is a pure function of its three byte strings, so each is computed once per process: nodes
  that share a process (a simulation's workers) check a signature they all receive once, a deployed node as before.

Every failure to authenticate raises `RelayError` (a ``ValueError``) saying what failed.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: Length of every symmetric key, public key and agreed key, in bytes.
KEY_BYTES: int = 32
#: Length of an AEAD nonce (96 bits) and of the Poly1305 tag, in bytes.
NONCE_BYTES: int = 12
TAG_BYTES: int = 16
#: Largest modulus `expand_mask` accepts (its outputs are int64).
MAX_MODULUS: int = 2**62

_SEAL_INFO = b"dphype-seal-v1"
_MASK_NONCE_LABEL = b"dphype-mask-v1"


class RelayError(ValueError):
    """A ciphertext, key or signature failed to authenticate or is malformed."""


def _check_bytes(name: str, value: object, length: int | None = None) -> bytes:
    if not isinstance(value, bytes):
        raise RelayError(f"{name} must be bytes, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise RelayError(f"{name} must be {length} bytes, got {len(value)}")
    return value


def _hkdf(secret: bytes, *, info: bytes, salt: bytes | None = None) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=info).derive(secret)


def _exchange(private: X25519PrivateKey, peer_public: bytes) -> bytes:
    _check_bytes("peer_public", peer_public, KEY_BYTES)
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as err:  # low-order point: the shared secret would be all zeros
        raise RelayError(f"X25519 key agreement failed for the given public key: {err}") from err


@dataclass(frozen=True)
class KeyPair:
    """An X25519 key pair.

    Attributes:
        public: The 32-byte raw public key.
    """

    _private: X25519PrivateKey = field(repr=False)
    public: bytes

    @classmethod
    def generate(cls) -> KeyPair:
        """A fresh key pair from the operating system's CSPRNG."""
        private = X25519PrivateKey.generate()
        return cls(private, private.public_key().public_bytes_raw())

    @classmethod
    def from_private(cls, private: bytes) -> KeyPair:
        """The key pair of a 32-byte raw private key (`private_bytes`); `RelayError` for another length."""
        key = X25519PrivateKey.from_private_bytes(_check_bytes("private", private, KEY_BYTES))
        return cls(key, key.public_key().public_bytes_raw())

    def private_bytes(self) -> bytes:
        """The 32-byte raw private key (a secret)."""
        return self._private.private_bytes_raw()

    def agree(self, peer_public: bytes, *, info: bytes) -> bytes:
        """``HKDF-SHA256(X25519(self, peer_public), info)``; `RelayError` for a malformed or low-order key."""
        return _hkdf(_exchange(self._private, peer_public), info=_check_bytes("info", info))


def seal(recipient_public: bytes, plaintext: bytes, *, context: bytes) -> bytes:
    """Encrypt ``plaintext`` to ``recipient_public`` under ``context``; `RelayError` for a malformed key."""
    _check_bytes("plaintext", plaintext)
    _check_bytes("context", context)
    ephemeral = X25519PrivateKey.generate()
    ephemeral_public = ephemeral.public_key().public_bytes_raw()
    secret = _exchange(ephemeral, recipient_public)
    key = _hkdf(secret, salt=ephemeral_public + recipient_public, info=_SEAL_INFO + context)
    return ephemeral_public + ChaCha20Poly1305(key).encrypt(bytes(NONCE_BYTES), plaintext, context)


def open_sealed(recipient: KeyPair, sealed: bytes, *, context: bytes) -> bytes:
    """Decrypt what `seal` made for ``recipient`` under ``context``.

    Args:
        recipient: The recipient's key pair.
        sealed: What `seal` returned.
        context: The context it was sealed under.

    Returns:
        The plaintext.

    Raises:
        RelayError: ``sealed`` is too short, tampered with, or sealed to another key or context.
    """
    _check_bytes("sealed", sealed)
    _check_bytes("context", context)
    if len(sealed) < KEY_BYTES + TAG_BYTES:
        raise RelayError(f"sealed message too short ({len(sealed)} bytes, at least {KEY_BYTES + TAG_BYTES})")
    ephemeral_public = sealed[:KEY_BYTES]
    secret = _exchange(recipient._private, ephemeral_public)
    key = _hkdf(secret, salt=ephemeral_public + recipient.public, info=_SEAL_INFO + context)
    try:
        return ChaCha20Poly1305(key).decrypt(bytes(NONCE_BYTES), sealed[KEY_BYTES:], context)
    except InvalidTag as err:
        raise RelayError("sealed message failed to authenticate (tampered, wrong key or wrong context)") from err


def encrypt(key: bytes, plaintext: bytes, *, context: bytes) -> bytes:
    """ChaCha20-Poly1305 under the 32-byte ``key`` (else `RelayError`), a random nonce prepended."""
    _check_bytes("key", key, KEY_BYTES)
    _check_bytes("plaintext", plaintext)
    _check_bytes("context", context)
    nonce = os.urandom(NONCE_BYTES)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, context)


def decrypt(key: bytes, ciphertext: bytes, *, context: bytes) -> bytes:
    """Invert `encrypt`; `RelayError` if too short, tampered with, or made under another key or context."""
    _check_bytes("key", key, KEY_BYTES)
    _check_bytes("ciphertext", ciphertext)
    _check_bytes("context", context)
    if len(ciphertext) < NONCE_BYTES + TAG_BYTES:
        raise RelayError(f"ciphertext too short ({len(ciphertext)} bytes, at least {NONCE_BYTES + TAG_BYTES})")
    try:
        return ChaCha20Poly1305(key).decrypt(ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:], context)
    except InvalidTag as err:
        raise RelayError("ciphertext failed to authenticate (tampered, wrong key or wrong context)") from err


def mask_nonce(context: bytes) -> bytes:
    """The 96-bit ChaCha20 nonce `expand_mask` uses for ``context``."""
    return hashlib.sha256(_MASK_NONCE_LABEL + _check_bytes("context", context)).digest()[:NONCE_BYTES]


def expand_mask(key: bytes, size: int, modulus: int, *, context: bytes) -> np.ndarray:
    """``size`` int64 values uniform on ``[0, modulus)`` from the ChaCha20 keystream under the full 32-byte ``key``.

    Deterministic in ``(key, size, modulus, context)``.

    Args:
        key: The 32-byte mask key.
        size: The number of values, ``>= 0``.
        modulus: An integer in ``[2, 2**62]``.
        context: The mask's context (its nonce, `mask_nonce`).

    Returns:
        The ``(size,)`` int64 mask.

    Raises:
        ValueError: ``size`` or ``modulus`` is out of its range.
    """  # noqa: DOC502
    _check_bytes("key", key, KEY_BYTES)
    size, modulus = _mask_shape(size, modulus)
    # Block counter 0 (little-endian, first 4 bytes) followed by the 96-bit nonce: RFC 8439's layout.
    stream = Cipher(algorithms.ChaCha20(key, bytes(4) + mask_nonce(context)), mode=None).encryptor()
    limit = 2**64 - (2**64 % modulus)
    out = np.empty(size, dtype=np.int64)
    filled = 0
    while filled < size:
        need = size - filled
        words = np.frombuffer(stream.update(bytes(8 * (need + need // 64 + 8))), dtype="<u8")
        if limit < 2**64:  # a power-of-two modulus divides 2**64: nothing to reject
            words = words[words < np.uint64(limit)]
        take = min(need, words.size)
        out[filled : filled + take] = (words[:take] % np.uint64(modulus)).astype(np.int64)
        filled += take
    return out


def _mask_shape(size: object, modulus: object) -> tuple[int, int]:
    """``(size, modulus)`` as ints; `ValueError` unless ``size >= 0`` and ``2 <= modulus <= MAX_MODULUS``."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise ValueError(f"size must be an integer >= 0, got {size!r}")
    if isinstance(modulus, bool) or not isinstance(modulus, (int, np.integer)) or not 2 <= modulus <= MAX_MODULUS:
        raise ValueError(f"modulus must be an integer in [2, 2**62], got {modulus!r}")
    return int(size), int(modulus)


def expand_masks(keys: Sequence[bytes], size: int, modulus: int, *, context: bytes) -> np.ndarray:
    """`expand_mask` of each key under one ``context``: the ``(len(keys), size)`` int64 masks, row ``i`` of ``keys[i]``.

    For a power-of-two modulus (nothing is rejected) every keystream is read into one array at once.

    Args:
        keys: The 32-byte mask keys.
        size: The number of values per key, ``>= 0``.
        modulus: An integer in ``[2, 2**62]``.
        context: The masks' context (their nonce, `mask_nonce`).

    Returns:
        The masks, equal row by row to `expand_mask`'s.

    Raises:
        ValueError: ``size`` or ``modulus`` is out of its range.
    """  # noqa: DOC502
    size, modulus = _mask_shape(size, modulus)
    if modulus & (modulus - 1):
        return np.array([expand_mask(key, size, modulus, context=context) for key in keys],
                        dtype=np.int64).reshape(len(keys), size)
    nonce, zeros = bytes(4) + mask_nonce(context), bytes(8 * size)
    streams = b"".join(Cipher(algorithms.ChaCha20(_check_bytes("key", key, KEY_BYTES), nonce), mode=None)
                       .encryptor().update(zeros) for key in keys)
    words = np.frombuffer(streams, dtype="<u8").reshape(len(keys), size)
    return (words % np.uint64(modulus)).astype(np.int64)


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 signing key.

    Attributes:
        public: The 32-byte raw verification key.
    """

    _private: Ed25519PrivateKey = field(repr=False)
    public: bytes

    @classmethod
    def generate(cls) -> SigningKey:
        """A fresh signing key from the operating system's CSPRNG."""
        private = Ed25519PrivateKey.generate()
        return cls(private, private.public_key().public_bytes_raw())

    @classmethod
    def from_private(cls, private: bytes) -> SigningKey:
        """The signing key of a 32-byte raw private key (`private_bytes`); `RelayError` for another length."""
        key = Ed25519PrivateKey.from_private_bytes(_check_bytes("private", private, KEY_BYTES))
        return cls(key, key.public_key().public_bytes_raw())

    def private_bytes(self) -> bytes:
        """The 32-byte raw private key (kept in the node's round state only)."""
        return self._private.private_bytes_raw()

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message``."""
        return self._private.sign(_check_bytes("message", message))


def verify(public: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is ``public``'s Ed25519 signature of ``message``; False (never raises) if malformed."""
    if not (isinstance(public, bytes) and isinstance(signature, bytes) and isinstance(message, bytes)):
        return False
    if len(public) != KEY_BYTES or len(signature) != 64:
        return False
    return _verdict(public, signature, message)


@functools.lru_cache(maxsize=1 << 16)
def _verdict(public: bytes, signature: bytes, message: bytes) -> bool:
    """Ed25519's verdict on well-formed inputs, cached (module docstring)."""
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True
