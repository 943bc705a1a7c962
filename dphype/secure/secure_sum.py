"""Exact integer summation of DP-Hype vote vectors under secure aggregation: the encoding and its limits.

DP-Hype releases one thing: the sum over clients of ``votes + noise share``
(Algorithm 1, line 11, "SecSum"). DP-Hype's own SecAgg+ (`dphype.secure.secagg`) sums vectors of
integers modulo ``M = 2**32`` (`MODULUS_RANGE`); this module holds the encoding into that group and
its limits:

* a client sends the integer vector ``x`` (its noisy votes on the fixed-point grid of
  `fixed_point_scale`) shifted by the round's range ``C``: every entry lies in ``[0, 2C]``. ``C(m)``
  (`clipping_range_for`) is the largest power of two with ``m * 2 C(m) <= M - 1`` for a round of
  ``m`` clients -- ``2**21`` up to 1023 clients, ``2**17`` at 10,000 -- so no sum of up to ``m`` encoded
  vectors can wrap, whatever the values, and the residue modulo ``M`` minus ``|survivors| C`` is the exact
  sum (`decode`);
* values outside ``[-C, C]`` cannot be sent. A vote entry is 0 or 1 and a noise share has std
  ``sigma / sqrt((1 - xi) n)``, far below ``C(n)`` (a few units against 131072 at n = 10,000), so the
  range costs nothing in practice, but the noise is unbounded: `check_range` refuses, before
  anything is sent, a configuration in which some client's noisy entry leaves ``[-C(n), C(n)]`` with
  probability above `CLIP_PROBABILITY_LIMIT` (`clip_probability`: Gaussian tails, Skellam
  Chernoff bounds, a union bound), and a client whose value would still leave the range refuses to send
  it (`encode`) instead of clipping it. Such a client counts as a dropout. As the refusal depends (a
  little) on the client's vote, it is a privacy failure event of probability at most
  `clip_probability`: the release is ``(epsilon, delta + clip_probability)``-DP, and the check keeps
  that addition below ``1e-9``.

Noise kinds (`dphype.privacy.noise_kinds`). An integer kind's shares (Skellam) are sent as they are, so the
released sum is exactly the mechanism (Agarwal, Kairouz, Liu 2021). A real kind's shares (Gaussian) are not: each
client rounds ``votes + noise`` to the kind's fixed-point grid ``1 / fixed_point_scale`` before sending, and the
server divides the sum by the scale. The released sum is then the mechanism plus a rounding error of at most
``m / (2 * fixed_point_scale)`` per entry, so its privacy guarantee is only approximate (Kairouz, Liu & Steinke,
ICML 2021, discretise the noise for this reason); Skellam is the default for this reason.

Individual vote vectors never leave a client in plaintext: they travel only inside the masked
vectors of the secure sum, and the client adapter answers vote requests only inside that protocol.
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
    """Integer grid on which a client's noisy votes are sent: the kind's ``fixed_point_scale`` (1 for Skellam).

    Args:
        noise: The noise kind's name (`dphype.privacy.noise_kinds`).

    Returns:
        The scale: a value ``x`` is sent as ``round(x * scale)``.

    Raises:
        ValueError: ``noise`` is unknown.
    """  # noqa: DOC502
    return noise_kind(noise).fixed_point_scale


def clipping_range_for(clients: int) -> int:
    """The range ``C(n)``: the largest power of two with ``n * 2 C(n) <= M - 1``.

    So the modular sum of up to ``n`` encoded vectors (entries in ``[0, 2C]``) cannot wrap around ``M = 2**32``.

    Args:
        clients: The number of clients ``n`` in the round, in ``[2, MAX_CLIENTS]``.

    Returns:
        ``C(n)``.

    Raises:
        ValueError: ``clients`` is out of its range.
    """  # noqa: DOC502
    check_clients(clients)
    return 2 ** (((MODULUS_RANGE - 1) // (2 * clients)).bit_length() - 1)


def clip_probability(
    *, size: int, sigma: float, clients: int, dropout: float, noise: str, clipping_range: int | None = None
) -> float:
    """Bound on P(some client's encoded entry leaves the clipping range +-C).

    ``C`` is ``clipping_range`` or `clipping_range_for` ``(clients)``. A vote entry
    is 0 or 1, so an encoded entry stays within +-C as long as every noise share
    satisfies ``|z| <= t`` with ``t = C / scale - 2`` (one unit for the vote, one for
    fixed-point rounding). The probability that some share of some client exceeds
    ``t`` is `dphype.privacy.noise.noise_tail_bound`'s union bound (the kind's tail bound,
    `dphype.privacy.noise_kinds.NoiseKind.tail`) at ``num_sigmas = t / client_std``.

    Args:
        size: The number of entries per vote vector ``p``.
        sigma: The total noise std.
        clients: The number of clients ``n``.
        dropout: The tolerated dropout fraction ``xi``.
        noise: The noise kind's name.
        clipping_range: The range ``C``; ``None``: `clipping_range_for` ``(clients)``.

    Returns:
        The bound on the probability.
    """
    limit_range = clipping_range_for(clients) if clipping_range is None else clipping_range
    limit = limit_range / fixed_point_scale(noise) - 2.0
    std = client_noise_std(sigma, clients, dropout)
    bound = noise_tail_bound(
        sigma, clients, dropout, kind=noise, size=size, num_sigmas=limit / std
    )
    return bound.failure_probability


def check_range(*, size: int, sigma: float, clients: int, dropout: float, noise: str) -> None:
    """Refuse a release whose noise shares could leave SecAgg+'s range ``C(n)`` (see the module docstring).

    Args:
        size: The number of entries per vote vector ``p``.
        sigma: The total noise std.
        clients: The number of clients ``n``.
        dropout: The tolerated dropout fraction ``xi``.
        noise: The noise kind's name.

    Raises:
        ValueError: `clip_probability` exceeds `CLIP_PROBABILITY_LIMIT`.
    """
    p = clip_probability(size=size, sigma=sigma, clients=clients, dropout=dropout, noise=noise)
    if p > CLIP_PROBABILITY_LIMIT:
        raise ValueError(
            f"sigma={sigma:g} is too large for secure summation with {clients} clients "
            f"(noise={noise}): a noise share exceeds SecAgg+'s clipping range "
            f"+-{clipping_range_for(clients) // fixed_point_scale(noise)} with probability up to {p:.2e} "
            f"(allowed {CLIP_PROBABILITY_LIMIT:g}); use more clients or a larger epsilon"
        )


def encode(noisy_votes: np.ndarray, noise: str, clipping_range: int = CLIPPING_RANGE) -> np.ndarray:
    """Client side: turn ``votes + noise share`` into the vector handed to the secure sum.

    An integer kind's values must already be integers; a real kind's are rounded to its grid
    ``1 / fixed_point_scale``. Values beyond the round's ``clipping_range`` are refused, never clipped.

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
    """Server side: the released sum from the exact integer sum of the encoded vectors.

    Args:
        total: The ``(p,)`` exact integer sum of the encoded vectors.
        noise: The noise kind's name.

    Returns:
        The ``(p,)`` released sum: int64 votes for an integer kind, float64 on the grid ``1 / fixed_point_scale``
        for a real one.
    """
    kind = noise_kind(noise)
    exact = np.asarray(total, dtype=np.int64)
    return exact if kind.integer else exact / kind.fixed_point_scale
