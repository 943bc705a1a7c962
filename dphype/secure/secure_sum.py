"""Exact integer summation of DP-Hype vote vectors over Flower SecAgg+: the encoding and its limits.

DP-Hype releases one thing: the sum over clients of ``votes + noise share``
(Algorithm 1, line 11, "SecSum"). Flower 1.41 offers SecAgg+ (Bell et al.,
CCS 2020) only on its legacy path, as a *weighted-mean* workflow for model
weights. This module derives how to make it compute an exact integer sum and
holds the framework-free part (encoding, decoding, range checks); the Flower
adapter that runs the protocol is :mod:`dphype.flower.secagg`.

How Flower's SecAgg+ treats a client vector ``x`` (read from
``flwr.client.mod.secure_aggregation.secaggplus_mod`` and
``flwr.server.workflow.secure_aggregation.secaggplus_workflow``):

* the client multiplies ``x`` by ``ratio = num_examples / max_weight``, clips it to
  ``[-C, C]`` (C = ``clipping_range``), maps it to ``(x + C) * Q / (2C)``
  (Q = ``quantization_range``) with stochastic rounding, prepends the integer
  weight ``round(ratio * Q)``, masks everything and reduces it modulo
  M = ``modulus_range``;
* the server unmasks the modular sum over the ``m`` surviving clients and
  returns the weighted mean ``sum(x) / m``.

With ``num_examples = 1``, ``max_weight = 1`` and ``Q = 2C`` the ratio is 1 and the
quantizer ``Q / (2C)`` is 1, so an integer ``x`` with ``|x| <= C`` is mapped to the
integer ``x + C`` without any rounding: the sum is exact and ``round(mean * m)``
recovers it. Two limits follow:

* every quantized entry lies in ``[0, Q]`` and the weight entry is ``Q``, so the
  sum over ``m`` clients stays below the modulus iff ``m * Q <= M - 1``. The range is
  therefore sized per run (:func:`clipping_range_for`): ``C(n)`` is the largest power
  of two with ``n * 2 C(n) <= M - 1`` -- ``2**21`` up to 1023 clients, ``2**17`` at
  10,000 -- so no sum of up to ``n`` encoded vectors can wrap, whatever the values;
* values outside ``[-C, C]`` would be clipped *silently* by Flower. A vote entry
  is 0 or 1 and a noise share has std ``sigma / sqrt((1 - xi) n)``, far below
  ``C(n)`` (a few units against 131072 at n = 10,000), so the range costs nothing
  in practice, but the noise is unbounded: :func:`check_range` refuses, before
  anything is sent, a configuration in which some client's noisy entry leaves
  ``[-C(n), C(n)]`` with probability above :data:`CLIP_PROBABILITY_LIMIT`
  (:func:`clip_probability`: Gaussian tails, Skellam Chernoff bounds, a union bound), and a
  client whose value would still leave the range refuses to send it
  (:func:`encode`, and the SecAgg+ client mod) instead of clipping it. Such a client
  counts as a dropout. As the refusal depends (a little) on the client's vote, it is
  a privacy failure event of probability at most :func:`clip_probability`: the
  release is ``(epsilon, delta + clip_probability)``-DP, and the check keeps that
  addition below ``1e-9``.

Noise kinds. Skellam shares are integers, so the released sum is exactly the
Skellam mechanism (Agarwal, Kairouz, Liu 2021). Gaussian shares are real: each
client rounds ``votes + noise`` to the fixed-point grid ``1 / GAUSSIAN_SCALE``
before sending, and the server divides the sum by the scale. The released sum
is then the Gaussian mechanism plus a rounding error of at most
``m / (2 * GAUSSIAN_SCALE)`` per entry, so its privacy guarantee is only
approximate (Kairouz, Liu & Steinke, ICML 2021, discretise the noise for this reason);
Skellam is the default for this reason.

Individual vote vectors never leave a client in plaintext: they travel only
inside the masked SecAgg+ vectors (metrics in a fit result are *not* masked,
so the client sends none), and the client adapter answers vote requests only
inside the SecAgg+ protocol.
"""

from __future__ import annotations

import numpy as np

from dphype.checks import check_clients, check_noise
from dphype.privacy.noise import client_noise_std, noise_tail_bound

#: Flower SecAgg+ ``modulus_range`` M (its maximum).
MODULUS_RANGE: int = 2**32
#: Flower SecAgg+ ``max_weight``; every DP-Hype client reports ``num_examples = 1``.
MAX_WEIGHT: float = 1.0
#: C(n) for federations of up to 1023 clients (the range used when ``n`` is not known).
CLIPPING_RANGE: int = 2**21
#: Fixed-point scale for Gaussian noise shares: values are sent as round(x * scale).
GAUSSIAN_SCALE: int = 2**10
#: Largest accepted probability that any noisy entry of any client reaches +-C.
CLIP_PROBABILITY_LIMIT: float = 1e-9
#: Tolerance when checking that ``mean * survivors`` is integral.
INTEGRALITY_TOLERANCE: float = 1e-3


class SecureSumError(RuntimeError):
    """The secure sum could not be computed or decoded; nothing was released."""


class TooFewSurvivorsError(SecureSumError):
    """Fewer clients than ``ceil((1 - xi) n)`` survived: releasing would break DP."""


def fixed_point_scale(noise: str) -> int:
    """Integer grid on which a client's noisy votes are sent: 1 for Skellam, 2**10 for Gaussian."""
    return 1 if check_noise(noise) == "skellam" else GAUSSIAN_SCALE


def clipping_range_for(clients: int) -> int:
    """SecAgg+ clipping range ``C(n)``: the largest power of two with ``n * 2 C(n) <= M - 1``.

    With ``Q = 2 C(n)`` (quantizer exactly 1) the modular sum of up to ``n`` encoded
    vectors and of their weights ``Q`` cannot wrap around ``M = 2**32``.
    """
    check_clients(clients)
    return 2 ** (((MODULUS_RANGE - 1) // (2 * clients)).bit_length() - 1)


def check_ranges(*, clients: int, clipping_range: float, quantization_range: int, modulus_range: int) -> None:
    """Refuse SecAgg+ ranges other than the exact-sum ones for ``n`` clients (a client's check of the setup).

    ``C = C(n)``, ``Q = 2C`` (quantizer exactly 1) and ``M = 2**32``; anything else would round, clip or
    let the sum wrap.
    """
    expected = clipping_range_for(clients)
    if (clipping_range, quantization_range, modulus_range) != (expected, 2 * expected, MODULUS_RANGE):
        raise ValueError(
            f"SecAgg+ ranges must be clipping_range={expected}, quantization_range={2 * expected}, "
            f"modulus_range={MODULUS_RANGE} for clients={clients}, got {clipping_range:g}, "
            f"{quantization_range}, {modulus_range}"
        )


def clip_probability(
    *, size: int, sigma: float, clients: int, dropout: float, noise: str, clipping_range: int | None = None
) -> float:
    """Bound on P(some client's encoded entry leaves the clipping range +-C).

    ``C`` is ``clipping_range`` or :func:`clipping_range_for` ``(clients)``. A vote entry
    is 0 or 1, so an encoded entry stays within +-C as long as every noise share
    satisfies ``|z| <= t`` with ``t = C / scale - 2`` (one unit for the vote, one for
    fixed-point rounding). The probability that some share of some client exceeds
    ``t`` is :func:`dphype.privacy.noise.noise_tail_bound`'s union bound (exact Gaussian tail,
    Chernoff bound for Skellam) at ``num_sigmas = t / client_std``.
    """
    limit_range = clipping_range_for(clients) if clipping_range is None else clipping_range
    limit = limit_range / fixed_point_scale(noise) - 2.0
    std = client_noise_std(sigma, clients, dropout)
    bound = noise_tail_bound(
        sigma, clients, dropout, kind=noise, size=size, num_sigmas=limit / std
    )
    return bound.failure_probability


def check_range(*, size: int, sigma: float, clients: int, dropout: float, noise: str) -> None:
    """Refuse a release whose noise shares could leave SecAgg+'s range ``C(n)`` (see the module docstring)."""
    p = clip_probability(size=size, sigma=sigma, clients=clients, dropout=dropout, noise=noise)
    if p > CLIP_PROBABILITY_LIMIT:
        raise ValueError(
            f"sigma={sigma:g} is too large for secure summation with {clients} clients "
            f"(noise={noise}): a noise share exceeds SecAgg+'s clipping range "
            f"+-{clipping_range_for(clients) // fixed_point_scale(noise)} with probability up to {p:.2e} "
            f"(allowed {CLIP_PROBABILITY_LIMIT:g}); use more clients or a larger epsilon"
        )


def encode(noisy_votes: np.ndarray, noise: str, clipping_range: int = CLIPPING_RANGE) -> np.ndarray:
    """Client side: turn ``votes + noise share`` into the vector handed to SecAgg+.

    Skellam values must already be integers; Gaussian values are rounded to the
    grid ``1 / GAUSSIAN_SCALE``. The result is an integer-valued float64 vector
    (Flower multiplies it by the weight ratio 1.0). Values SecAgg+ would clip (beyond
    ``clipping_range``, :func:`clipping_range_for` ``(n)``) are refused, never clipped.
    """
    scale = fixed_point_scale(noise)
    values = np.asarray(noisy_votes, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"noisy_votes must be a 1-d vector, got shape {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError("noisy_votes must be finite")
    scaled = np.rint(values * scale) if scale != 1 else values
    if scale == 1 and not np.array_equal(scaled, np.rint(scaled)):
        raise ValueError("noisy_votes must be integers for Skellam noise")
    if np.any(np.abs(scaled) > clipping_range):
        raise ValueError(
            f"noisy_votes exceed the secure-sum range +-{clipping_range / scale:g}: "
            "SecAgg+ would clip them silently"
        )
    return scaled


def decode_sum(mean: np.ndarray, survivors: int, noise: str) -> np.ndarray:
    """Server side: exact sum of the survivors' encoded vectors from SecAgg+'s mean.

    Returns int64 votes for Skellam and float64 (grid ``1 / GAUSSIAN_SCALE``) for
    Gaussian noise. Raises :class:`SecureSumError` if ``mean * survivors`` is not
    integral within :data:`INTEGRALITY_TOLERANCE` (a client sent a non-integer
    vector or a weight other than 1). Wrap-around of the modulus is impossible by
    the choice of :func:`clipping_range_for`.
    """
    if survivors < 1:
        raise ValueError(f"survivors must be >= 1, got {survivors}")
    scale = fixed_point_scale(noise)
    total = np.asarray(mean, dtype=np.float64) * survivors
    rounded = np.rint(total)
    error = float(np.max(np.abs(total - rounded))) if total.size else 0.0
    if error > INTEGRALITY_TOLERANCE:
        raise SecureSumError(
            f"secure sum is not integral (max deviation {error:.3g}): the SecAgg+ "
            "configuration or a client's encoding is wrong; nothing released"
        )
    if scale == 1:
        return rounded.astype(np.int64)
    return rounded / scale
