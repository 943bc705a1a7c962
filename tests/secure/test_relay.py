"""dphype.secure.relay: known answers, tampering, wrong contexts, mask uniformity."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from scipy import stats

from dphype.secure import relay
from dphype.secure.relay import KeyPair, RelayError, SigningKey

# expand_mask(bytes(range(32)), 6, 2**32, context=b"known-answer"), computed once; the test also checks it
# against the plain-integer reference below.
KNOWN_MASK = [4201128786, 83801231, 4146511174, 3799040513, 725602868, 4189036556]
# RFC 8439, appendix A.1, test vectors #1 and #2: ChaCha20 block function, all-zero key and nonce,
# block counter 0 and 1.
RFC8439_A1_BLOCK0 = bytes.fromhex(
    "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
    "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586"
)
RFC8439_A1_BLOCK1 = bytes.fromhex(
    "9f07e7be5551387a98ba977c732d080dcb0f29a048e3656912c6533e32ee7aed"
    "29b721769ce64e43d57133b074d839d531ed1f28510afb45ace10a1f4b794d6f"
)


def _reference_mask(key: bytes, size: int, modulus: int, context: bytes) -> list[int]:
    """expand_mask's definition in plain Python integers: keystream words, rejection, reduction."""
    nonce = hashlib.sha256(b"dphype-mask-v1" + context).digest()[:12]
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(4) + nonce), mode=None).encryptor()
    limit = 2**64 - (2**64 % modulus)
    out: list[int] = []
    while len(out) < size:
        word = int.from_bytes(encryptor.update(bytes(8)), "little")
        if word < limit:
            out.append(word % modulus)
    return out


def test_chacha20_keystream_layout_matches_rfc8439() -> None:
    # The mask generator relies on cryptography's 16-byte ChaCha20 "nonce" being counter (LE) || nonce.
    stream = Cipher(algorithms.ChaCha20(bytes(32), bytes(16)), mode=None).encryptor().update(bytes(128))
    assert stream[:64] == RFC8439_A1_BLOCK0
    assert stream[64:] == RFC8439_A1_BLOCK1


def test_expand_mask_known_answer_and_reference() -> None:
    key = bytes(range(32))
    context = b"known-answer"
    mask = relay.expand_mask(key, 6, 2**32, context=context)
    # Computed once with this implementation and checked against _reference_mask below.
    assert mask.tolist() == KNOWN_MASK
    for modulus in (2, 3, 1000, 2**32, 2**32 + 15, 2**61 + 1, 2**62):
        got = relay.expand_mask(key, 300, modulus, context=context)
        assert got.dtype == np.int64
        assert got.tolist() == _reference_mask(key, 300, modulus, context)


def test_expand_mask_depends_on_every_key_bit_and_context() -> None:
    key = bytes(range(32))
    base = relay.expand_mask(key, 64, 2**32, context=b"c")
    for byte in (0, 15, 31):
        for bit in (0, 7):
            flipped = bytearray(key)
            flipped[byte] ^= 1 << bit
            assert not np.array_equal(relay.expand_mask(bytes(flipped), 64, 2**32, context=b"c"), base)
    assert not np.array_equal(relay.expand_mask(key, 64, 2**32, context=b"d"), base)
    # A longer mask extends the shorter one (one keystream per key and context).
    assert np.array_equal(relay.expand_mask(key, 1000, 2**32, context=b"c")[:64], base)


def test_expand_mask_is_uniform() -> None:
    modulus = 12
    values = relay.expand_mask(bytes(32), 120_000, modulus, context=b"u")
    counts = np.bincount(values, minlength=modulus)
    assert stats.chisquare(counts).pvalue > 1e-4
    assert values.min() >= 0 and values.max() < modulus


@pytest.mark.parametrize(
    ("size", "modulus", "match"),
    [(-1, 10, "size"), (3, 1, "modulus"), (3, 2**62 + 1, "modulus"), (3, True, "modulus"), (2.0, 10, "size")],
)
def test_expand_mask_rejects_bad_arguments(size: object, modulus: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        relay.expand_mask(bytes(32), size, modulus, context=b"")  # type: ignore[arg-type]


@pytest.mark.parametrize("modulus", [2**32, 2**62, 2**32 - 5])
def test_expand_masks_equals_expand_mask_key_by_key(modulus: int) -> None:
    keys = [hashlib.sha256(bytes([i])).digest() for i in range(5)]
    masks = relay.expand_masks(keys, 37, modulus, context=b"ctx")
    assert masks.shape == (5, 37) and masks.dtype == np.int64
    for key, row in zip(keys, masks, strict=True):
        assert np.array_equal(row, relay.expand_mask(key, 37, modulus, context=b"ctx"))
    assert relay.expand_masks([], 37, modulus, context=b"ctx").shape == (0, 37)
    with pytest.raises(RelayError):
        relay.expand_masks([keys[0][:31]], 37, modulus, context=b"ctx")


def test_expand_mask_rejects_short_key() -> None:
    with pytest.raises(RelayError, match="key must be 32 bytes"):
        relay.expand_mask(bytes(16), 3, 10, context=b"")


def test_agree_is_symmetric_and_info_bound() -> None:
    alice, bob, carol = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    assert len(alice.public) == 32
    key = alice.agree(bob.public, info=b"x")
    assert len(key) == 32 and key == bob.agree(alice.public, info=b"x")
    assert key != alice.agree(bob.public, info=b"y")
    assert key != alice.agree(carol.public, info=b"x")


def test_agree_rejects_low_order_point() -> None:
    with pytest.raises(RelayError, match="key agreement failed"):
        KeyPair.generate().agree(bytes(32), info=b"x")


def test_seal_round_trip_and_failures() -> None:
    recipient, other = KeyPair.generate(), KeyPair.generate()
    sealed = relay.seal(recipient.public, b"secret share", context=b"round-1")
    assert relay.open_sealed(recipient, sealed, context=b"round-1") == b"secret share"
    assert sealed != relay.seal(recipient.public, b"secret share", context=b"round-1")  # fresh ephemeral
    with pytest.raises(RelayError, match="failed to authenticate"):
        relay.open_sealed(recipient, sealed, context=b"round-2")
    with pytest.raises(RelayError, match="failed to authenticate"):
        relay.open_sealed(other, sealed, context=b"round-1")
    for position in (0, 40, len(sealed) - 1):
        tampered = bytearray(sealed)
        tampered[position] ^= 1
        with pytest.raises(RelayError):
            relay.open_sealed(recipient, bytes(tampered), context=b"round-1")
    with pytest.raises(RelayError, match="too short"):
        relay.open_sealed(recipient, sealed[:40], context=b"round-1")


def test_encrypt_round_trip_and_failures() -> None:
    key = KeyPair.generate().agree(KeyPair.generate().public, info=b"k")
    ciphertext = relay.encrypt(key, b"payload", context=b"c")
    assert len(ciphertext) == 12 + len(b"payload") + 16
    assert relay.decrypt(key, ciphertext, context=b"c") == b"payload"
    assert ciphertext[:12] != relay.encrypt(key, b"payload", context=b"c")[:12]  # random nonce
    with pytest.raises(RelayError, match="failed to authenticate"):
        relay.decrypt(key, ciphertext, context=b"d")
    with pytest.raises(RelayError, match="failed to authenticate"):
        relay.decrypt(bytes(32), ciphertext, context=b"c")
    for position in (0, 12, len(ciphertext) - 1):
        tampered = bytearray(ciphertext)
        tampered[position] ^= 0x80
        with pytest.raises(RelayError, match="failed to authenticate"):
            relay.decrypt(key, bytes(tampered), context=b"c")
    with pytest.raises(RelayError, match="too short"):
        relay.decrypt(key, ciphertext[:20], context=b"c")
    with pytest.raises(RelayError, match="key must be 32 bytes"):
        relay.encrypt(key[:31], b"payload", context=b"c")


def test_signatures() -> None:
    signer = SigningKey.generate()
    signature = signer.sign(b"survivors")
    assert relay.verify(signer.public, signature, b"survivors")
    assert not relay.verify(signer.public, signature, b"survivor")
    assert not relay.verify(SigningKey.generate().public, signature, b"survivors")
    assert not relay.verify(signer.public, signature[:-1] + bytes([signature[-1] ^ 1]), b"survivors")
    assert not relay.verify(signer.public[:31], signature, b"survivors")
    assert not relay.verify(signer.public, "sig", b"survivors")  # type: ignore[arg-type]


def test_private_keys_round_trip() -> None:
    pair, peer = KeyPair.generate(), KeyPair.generate()
    again = KeyPair.from_private(pair.private_bytes())
    assert again.public == pair.public
    assert again.agree(peer.public, info=b"i") == pair.agree(peer.public, info=b"i")
    signer = SigningKey.generate()
    copy = SigningKey.from_private(signer.private_bytes())
    assert copy.public == signer.public and relay.verify(signer.public, copy.sign(b"m"), b"m")
