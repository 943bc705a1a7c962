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

With ``num_examples = 1``, ``max_weight = 1``, ``C = 2**21`` and ``Q = 2**22``
the ratio is 1 and the quantizer ``Q / (2C)`` is 1, so an integer ``x`` with
``|x| <= C`` is mapped to the integer ``x + C`` without any rounding: the sum is
exact and ``round(mean * m)`` recovers it. Two limits follow:

* every quantized entry lies in ``[0, Q]`` and the weight entry is ``Q``, so the
  sum over ``m`` clients stays below the modulus iff ``m * Q <= M - 1``: at most
  :data:`MAX_CLIENTS` = ``(M - 1) // Q`` = 1023 clients;
* values outside ``[-C, C]`` are clipped *silently* by Flower. :func:`encode`
  therefore refuses them, and :func:`check_range` refuses, before anything is
  sent, a configuration in which a noise share could reach the clipping range
  with more than negligible probability.

Noise kinds. Skellam shares are integers, so the released sum is exactly the
Skellam mechanism (Agarwal, Kairouz, Liu 2021). Gaussian shares are real: each
client rounds ``votes + noise`` to the fixed-point grid ``1 / GAUSSIAN_SCALE``
before sending, and the server divides the sum by the scale. The released sum
is then the Gaussian mechanism plus a rounding error of at most
``m / (2 * GAUSSIAN_SCALE)`` per entry, so its privacy guarantee is only
approximate (dp-facts.md, "Distributed noise under secure aggregation");
Skellam is the default for this reason.

Individual vote vectors never leave a client in plaintext: they travel only
inside the masked SecAgg+ vectors (metrics in a fit result are *not* masked,
so the client sends none), and the client adapter answers vote requests only
inside the SecAgg+ protocol.
"""

from __future__ import annotations

import math

import numpy as np

from dphype.accounting import check_clients as _check_client_count
from dphype.accounting import check_noise
from dphype.noise import client_noise_std, noise_tail_bound

#: Flower SecAgg+ ``clipping_range`` C: inputs must lie in [-C, C].
CLIPPING_RANGE: int = 2**21
#: Flower SecAgg+ ``quantization_range`` Q = 2C, which makes the quantizer exactly 1.
QUANTIZATION_RANGE: int = 2**22
#: Flower SecAgg+ ``modulus_range`` M (its maximum).
MODULUS_RANGE: int = 2**32
#: Flower SecAgg+ ``max_weight``; every DP-Hype client reports ``num_examples = 1``.
MAX_WEIGHT: float = 1.0
#: Largest number of clients whose sum cannot wrap around the modulus: m * Q <= M - 1.
MAX_CLIENTS: int = (MODULUS_RANGE - 1) // QUANTIZATION_RANGE
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


def check_clients(clients: int) -> None:
    """Refuse a client count that SecAgg+ cannot sum exactly (2 <= n <= MAX_CLIENTS)."""
    _check_client_count(clients)
    if clients > MAX_CLIENTS:
        raise ValueError(
            f"clients must be in [2, {MAX_CLIENTS}] (modulus 2**32 / quantization range 2**22 "
            f"allow at most {MAX_CLIENTS} exact summands), got {clients}"
        )


def clip_probability(
    *, size: int, sigma: float, clients: int, dropout: float, noise: str
) -> float:
    """Bound on P(some client's encoded entry leaves SecAgg+'s clipping range +-C).

    A vote entry is 0 or 1, so an encoded entry stays within +-C as long as every
    noise share satisfies ``|z| <= t`` with ``t = C / scale - 2`` (one unit for the
    vote, one for fixed-point rounding). The probability that some share of some
    client exceeds ``t`` is :func:`dphype.noise.noise_tail_bound`'s union bound
    (exact Gaussian / Skellam tails) at ``num_sigmas = t / client_std``.
    """
    limit = CLIPPING_RANGE / fixed_point_scale(noise) - 2.0
    std = client_noise_std(sigma, clients, dropout)
    bound = noise_tail_bound(
        sigma, clients, dropout, kind=noise, size=size, num_sigmas=limit / std
    )
    return bound.failure_probability


def check_range(*, size: int, sigma: float, clients: int, dropout: float, noise: str) -> None:
    """Refuse a release whose noise shares could be clipped silently by SecAgg+."""
    p = clip_probability(size=size, sigma=sigma, clients=clients, dropout=dropout, noise=noise)
    if p > CLIP_PROBABILITY_LIMIT:
        raise ValueError(
            f"sigma={sigma:g} is too large for secure summation with {clients} clients "
            f"(noise={noise}): a noise share exceeds SecAgg+'s clipping range "
            f"+-{CLIPPING_RANGE // fixed_point_scale(noise)} with probability up to {p:.2e} "
            f"(allowed {CLIP_PROBABILITY_LIMIT:g}); use more clients or a larger epsilon"
        )


def encode(noisy_votes: np.ndarray, noise: str) -> np.ndarray:
    """Client side: turn ``votes + noise share`` into the vector handed to SecAgg+.

    Skellam values must already be integers; Gaussian values are rounded to the
    grid ``1 / GAUSSIAN_SCALE``. The result is an integer-valued float64 vector
    (Flower multiplies it by the weight ratio 1.0). Values SecAgg+ would clip are
    refused, never clipped.
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
    if np.any(np.abs(scaled) > CLIPPING_RANGE):
        raise ValueError(
            f"noisy_votes exceed the secure-sum range +-{CLIPPING_RANGE / scale:g}: "
            "SecAgg+ would clip them silently"
        )
    return scaled


def decode_sum(mean: np.ndarray, survivors: int, noise: str) -> np.ndarray:
    """Server side: exact sum of the survivors' encoded vectors from SecAgg+'s mean.

    Returns int64 votes for Skellam and float64 (grid ``1 / GAUSSIAN_SCALE``) for
    Gaussian noise. Raises :class:`SecureSumError` if ``mean * survivors`` is not
    integral within :data:`INTEGRALITY_TOLERANCE` (a client sent a non-integer
    vector or a weight other than 1). Wrap-around of the modulus is prevented up
    front by :func:`check_clients` and :func:`check_range`.
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


def default_num_shares(clients: int) -> float:
    """SecAgg+ ``num_shares`` as a fraction of the clients: ``min(n, max(7, n / 5)) / n``.

    Each client secret-shares its keys with this many neighbours. All clients
    for n <= 7; about a fifth beyond 35 clients (measured on a 2-core machine,
    Ray simulation, 100 candidates, 50 clients: the four SecAgg+ stages take
    3.4 s with 11 shares instead of 22 s with all-to-all sharing).
    """
    return min(clients, max(7, math.ceil(clients / 5))) / clients
