"""Exact integer summation of DP-Hype vote vectors under secure aggregation: the encoding and its limits.

DP-Hype releases the sum over clients of ``votes + noise share`` (Algorithm 1, line 11, "SecSum"). Its SecAgg+
(`dphype.secure.secagg`) sums integer vectors modulo ``M = 2**32`` (`MODULUS_RANGE`); this module holds the
encoding into that group and its limits:

* a client sends its noisy votes on the fixed-point grid of `fixed_point_scale`, shifted by the round's range
  ``C``, so every entry lies in ``[0, 2C]``. ``C(m)`` (`clipping_range_for`) is the largest power of two with
  ``m * 2 C(m) <= M - 1``: no sum of up to ``m`` encoded vectors can wrap, and the residue minus
  ``|survivors| C`` is the exact sum (`decode`);
* values outside ``[-C, C]`` cannot be sent. The noise is unbounded, so `check_range` refuses, before anything is
  sent, a configuration in which some client's noisy entry leaves the range with probability above
  `CLIP_PROBABILITY_LIMIT` (`clip_probability`), and a client whose value still leaves it refuses to send
  (`encode`) instead of clipping, counting as a dropout. The refusal depends on the vote, so it is a privacy
  failure event: the release is ``(epsilon, delta + clip_probability)``-DP.

An integer noise kind's shares (Skellam) are sent as they are: the released sum is exactly the mechanism (Agarwal,
Kairouz & Liu 2021). A real kind's (Gaussian) are rounded to the grid ``1 / fixed_point_scale`` with ``votes +
noise``, adding at most ``m / (2 * fixed_point_scale)`` per entry, so its guarantee is only approximate (Kairouz,
Liu & Steinke 2021 discretise the noise for this reason); Skellam is the default.

Individual vote vectors never leave a client in plaintext: only inside the masked vectors of the secure sum.
"""

from __future__ import annotations

import numpy as np

from dphype.checks import check_clients
from dphype.privacy.noise import client_noise_std, noise_tail_bound
from dphype.privacy.noise_kinds import noise_kind

#: The secure sum's modulus ``M``: vectors are summed in the integers modulo ``M``.
MODULUS_RANGE: int = 2**32
#: C(n) for federations of up to 1023 clients (the range used when ``n`` is not known).
CLIPPING_RANGE: int = 2**21
#: Largest accepted probability that any noisy entry of any client reaches +-C.
CLIP_PROBABILITY_LIMIT: float = 1e-9


class SecureSumError(RuntimeError):
    """The secure sum could not be computed or decoded; nothing was released."""


class TooFewSurvivorsError(SecureSumError):
    """Fewer clients than ``ceil((1 - xi) n)`` survived: releasing would break DP."""


def fixed_point_scale(noise: str) -> int:
    """The kind's ``fixed_point_scale``: ``x`` is sent as ``round(x * scale)``; `ValueError` for an unknown kind."""
    return noise_kind(noise).fixed_point_scale


def clipping_range_for(clients: int) -> int:
    """``C(n)``, the largest power of two with ``n * 2 C(n) <= M - 1``; `ValueError` for ``n`` out of range."""
    check_clients(clients)
    return 2 ** (((MODULUS_RANGE - 1) // (2 * clients)).bit_length() - 1)


def clip_probability(
    *, size: int, sigma: float, clients: int, dropout: float, noise: str, clipping_range: int | None = None,
    largest_value: float = 1.0,
) -> float:
    """Bound on P(some client's encoded entry leaves +-C).

    An entry stays within +-C while every noise share has ``|z| <= t = C / scale - largest_value - 1`` (the
    value, and one unit for rounding); the bound is `dphype.privacy.noise.noise_tail_bound`'s union bound at
    ``num_sigmas = t / client_std``.

    Args:
        size: The number of entries per vote vector ``p``.
        sigma: The total noise std.
        clients: The number of clients ``n``.
        dropout: The tolerated dropout fraction ``xi``.
        noise: The noise kind's name.
        clipping_range: The range ``C``; ``None``: `clipping_range_for` ``(clients)``.
        largest_value: The largest ``|entry|`` before the noise (a vote's 1; the evaluation's grid scale).

    Returns:
        The bound on the probability.
    """
    limit_range = clipping_range_for(clients) if clipping_range is None else clipping_range
    limit = limit_range / fixed_point_scale(noise) - largest_value - 1.0
    std = client_noise_std(sigma, clients, dropout)
    bound = noise_tail_bound(
        sigma, clients, dropout, kind=noise, size=size, num_sigmas=limit / std
    )
    return bound.failure_probability


def check_range(*, size: int, sigma: float, clients: int, dropout: float, noise: str,
                largest_value: float = 1.0) -> None:
    """Refuse a release whose noise shares could leave SecAgg+'s range ``C(n)``.

    Args:
        size: The number of entries per vote vector ``p``.
        sigma: The total noise std.
        clients: The number of clients ``n``.
        dropout: The tolerated dropout fraction ``xi``.
        noise: The noise kind's name.
        largest_value: The largest ``|entry|`` before the noise (`clip_probability`).

    Raises:
        ValueError: `clip_probability` exceeds `CLIP_PROBABILITY_LIMIT`.
    """
    p = clip_probability(size=size, sigma=sigma, clients=clients, dropout=dropout, noise=noise,
                         largest_value=largest_value)
    if p > CLIP_PROBABILITY_LIMIT:
        raise ValueError(
            f"sigma={sigma:g} is too large for secure summation with {clients} clients: use more clients or a "
            f"larger epsilon\n(noise={noise}): a noise share exceeds SecAgg+'s clipping range "
            f"+-{clipping_range_for(clients) // fixed_point_scale(noise)} with probability up to {p:.2e} "
            f"(allowed {CLIP_PROBABILITY_LIMIT:g})"
        )


def encode(noisy_votes: np.ndarray, noise: str, clipping_range: int = CLIPPING_RANGE) -> np.ndarray:
    """Client side: ``votes + noise share`` on the kind's grid; values beyond ``clipping_range`` are refused.

    Args:
        noisy_votes: The ``(p,)`` vector ``votes + noise share``.
        noise: The noise kind's name.
        clipping_range: The round's range ``C`` (`clipping_range_for` of its size).

    Returns:
        The ``(p,)`` integer-valued float64 vector on the fixed-point grid (not yet shifted by ``C``).

    Raises:
        ValueError: ``noisy_votes`` is not a finite 1-d vector, not integers for an integer kind, or beyond
            ``+-clipping_range``.
    """
    kind = noise_kind(noise)
    scale = kind.fixed_point_scale
    values = np.asarray(noisy_votes, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"noisy_votes must be a 1-d vector, got shape {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError("noisy_votes must be finite")
    scaled = values if kind.integer else np.rint(values * scale)
    if kind.integer and not np.array_equal(scaled, np.rint(scaled)):
        raise ValueError(f"noisy_votes must be integers for {kind.label} noise")
    if np.any(np.abs(scaled) > clipping_range):
        raise ValueError(
            f"noisy_votes exceed the secure-sum range +-{clipping_range / scale:g}: they cannot be summed exactly"
        )
    return scaled


def decode(total: np.ndarray, noise: str) -> np.ndarray:
    """Server side: the released sum from the exact integer sum (int64, or float64 on a real kind's grid)."""
    kind = noise_kind(noise)
    exact = np.asarray(total, dtype=np.int64)
    return exact if kind.integer else exact / kind.fixed_point_scale
