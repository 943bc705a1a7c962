"""Exact integer summation of DP-Hype vote vectors over Flower SecAgg+.

DP-Hype releases one thing: the sum over clients of ``votes + noise share``
(Algorithm 1, line 11, "SecSum"). Flower 1.41 offers SecAgg+ (Bell et al.,
CCS 2020) only on its legacy path, as a *weighted-mean* workflow for model
weights. This module configures it so that it computes an exact integer sum.

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
approximate (dp-facts.md, "Distributed noise under secure aggregation");
Skellam is the default for this reason.

Individual vote vectors never leave a client in plaintext: they travel only
inside the masked SecAgg+ vectors (metrics in a fit result are *not* masked,
so the client sends none), and :func:`secure_vote_mod` refuses to answer a
vote request that does not arrive through the SecAgg+ protocol.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np
from flwr.app import Context, Message
from flwr.app.message_type import MessageType
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    log,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.server import ServerConfig
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import DefaultWorkflow
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState
from flwr.serverapp.grid import Grid

from dphype.accounting import check_clients as _check_client_count
from dphype.accounting import check_noise, check_positive
from dphype.flower.secagg_fast import (
    ScalableSecAggPlusWorkflow,
    scalable_secaggplus_mod,
)
from dphype.noise import client_noise_std, noise_tail_bound

#: Flower SecAgg+ ``modulus_range`` M (its maximum).
MODULUS_RANGE: int = 2**32
#: Flower SecAgg+ ``max_weight``; every DP-Hype client reports ``num_examples = 1``.
MAX_WEIGHT: float = 1.0
#: Largest federation accepted: the range C(n) is still 2**17 there (:func:`clipping_range_for`).
MAX_CLIENTS: int = 10_000
#: C(n) for federations of up to 1023 clients (the range used when ``n`` is not known).
CLIPPING_RANGE: int = 2**21
#: Fixed-point scale for Gaussian noise shares: values are sent as round(x * scale).
GAUSSIAN_SCALE: int = 2**10
#: Largest accepted probability that any noisy entry of any client reaches +-C.
CLIP_PROBABILITY_LIMIT: float = 1e-9
#: Tolerance when checking that ``mean * survivors`` is integral.
INTEGRALITY_TOLERANCE: float = 1e-3
#: Fit-config key and value that mark a DP-Hype vote request (see :func:`secure_vote_mod`).
PHASE_KEY: str = "dphype.phase"
VOTE_PHASE: str = "vote"


class SecureSumError(RuntimeError):
    """The secure sum could not be computed or decoded; nothing was released."""


class TooFewSurvivorsError(SecureSumError):
    """Fewer clients than ``ceil((1 - xi) n)`` survived: releasing would break DP."""


def fixed_point_scale(noise: str) -> int:
    """Integer grid on which a client's noisy votes are sent: 1 for Skellam, 2**10 for Gaussian."""
    return 1 if check_noise(noise) == "skellam" else GAUSSIAN_SCALE


def check_timeout(name: str, seconds: Any) -> float | None:
    """Return a wait limit in seconds: ``None`` (no limit) or a finite number > 0.

    A deployed SuperNode that vanishes never answers, so without a limit the server
    would wait for it forever; with one, SecAgg+ goes on with the clients that answered
    and the survivor check decides whether anything is released.
    """
    return None if seconds is None else check_positive(name, seconds)


def check_clients(clients: int) -> None:
    """Refuse a client count outside ``[2, MAX_CLIENTS]``."""
    _check_client_count(clients)
    if clients > MAX_CLIENTS:
        raise ValueError(f"clients must be in [2, {MAX_CLIENTS}], got {clients}")


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
    ``t`` is :func:`dphype.noise.noise_tail_bound`'s union bound (exact Gaussian tail,
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


def default_num_shares(clients: int) -> float:
    """SecAgg+ ``num_shares`` as a fraction of the clients: ``min(n, max(7, n / 5)) / n``.

    Each client secret-shares its keys with this many neighbours. All clients
    for n <= 7; about a fifth beyond 35 clients (measured on a 2-core machine,
    Ray simulation, 100 candidates, 50 clients: the four SecAgg+ stages take
    3.4 s with 11 shares instead of 22 s with all-to-all sharing).
    """
    return min(clients, max(7, math.ceil(clients / 5))) / clients


class ExactSumWorkflow(ScalableSecAggPlusWorkflow):
    """SecAgg+ configured for exact integer sums, refusing to unmask too few survivors.

    ``min_survivors`` is checked after the masked vectors are collected and
    *before* the unmasking stage: if fewer clients contributed, the server never
    learns their (under-noised) sum and :class:`TooFewSurvivorsError` is raised.
    """

    def __init__(
        self,
        *,
        min_survivors: int,
        num_shares: float,
        reconstruction_threshold: float = 0.6,
        timeout: float | None = None,
        clipping_range: int = CLIPPING_RANGE,
    ) -> None:
        super().__init__(
            num_shares,
            reconstruction_threshold,
            max_weight=MAX_WEIGHT,
            clipping_range=float(clipping_range),
            quantization_range=2 * clipping_range,
            modulus_range=MODULUS_RANGE,
            timeout=timeout,
        )
        self.min_survivors = min_survivors

    def share_keys_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        """Flower's stage 1, then forget the clients that left before it ended.

        Survivors add pairwise masks only with clients whose key shares reached
        them, i.e. with clients that answered both stage 0 and stage 1. Flower
        1.41 keeps every sampled client in ``sampled_node_ids`` and, in the unmask
        stage, asks the survivors for key shares of a client lost in stage 0 or 1,
        which they never received: every survivor fails and the round halts. A
        client lost that early contributed no mask, so it is simply not part of
        the sum; one lost later is unmasked as usual.
        """
        proceed = super().share_keys_stage(grid, context, state)
        state.sampled_node_ids = set(state.active_node_ids)
        return proceed

    def unmask_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        """Check the survivor count, then unmask the sum (Flower's stage 3)."""
        survivors = len(state.active_node_ids)
        if survivors < self.min_survivors:
            reasons = "; ".join(sorted({str(f) for f in state.failures}))[:2000]
            raise TooFewSurvivorsError(
                f"only {survivors} of {len(state.nid_to_neighbours)} clients submitted a "
                f"masked vote vector, fewer than the {self.min_survivors} required by the "
                f"dropout tolerance; the sum was not unmasked and nothing was released. "
                f"Client failures: {reasons or 'none reported'}"
            )
        log(logging.INFO, "secure sum: %s clients contributed, unmasking", survivors)
        return super().unmask_stage(grid, context, state)


def secure_vote_mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
    """ClientApp mod: run SecAgg+ for secure messages, refuse plaintext vote requests.

    TRAIN messages that carry SecAgg+ stage configs go through Flower's
    ``secaggplus_mod``. Other TRAIN messages (e.g. FedAvg rounds) go straight to
    the client, unless they ask for DP-Hype votes: those are refused, because the
    reply would reveal this client's votes to the server in plaintext.
    """
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, ctxt)
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return scalable_secaggplus_mod(msg, ctxt, call_next)
    fit_config: Any = msg.content.config_records.get("fitins.config", {})
    if fit_config.get(PHASE_KEY) == VOTE_PHASE:
        raise PermissionError(
            "refusing a DP-Hype vote request outside SecAgg+: the votes would reach "
            "the server in plaintext"
        )
    return call_next(msg, ctxt)


class SecureSumStrategy(Strategy):
    """Legacy Flower strategy for one exact secure sum over exactly ``clients`` nodes.

    ``configure_fit`` waits until ``clients`` nodes are connected and sends
    ``fit_config`` to all of them; ``aggregate_fit`` (called by SecAgg+ with the
    unmasked mean) checks the survivor count and decodes the exact sum into
    :attr:`total`. Subclasses post-process it in :meth:`on_sum`. No model is
    trained, no parameters are updated and nothing is evaluated.
    """

    def __init__(
        self,
        *,
        clients: int,
        size: int,
        noise: str,
        min_survivors: int,
        fit_config: dict[str, Scalar],
        connect_timeout: float = 600.0,
    ) -> None:
        check_clients(clients)
        check_noise(noise)
        if not 1 <= min_survivors <= clients:
            raise ValueError(f"min_survivors must be in [1, {clients}], got {min_survivors}")
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.clients = clients
        self.size = size
        self.noise = noise
        self.min_survivors = min_survivors
        self.fit_config = dict(fit_config)
        self.connect_timeout = check_positive("connect_timeout", connect_timeout)
        self.total: np.ndarray | None = None
        self.survivors: int = 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(clients={self.clients}, size={self.size}, noise={self.noise!r})"

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Nothing to initialise: the clients send fresh vectors."""
        return ndarrays_to_parameters([])

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Wait for ``clients`` nodes and send every one of them the fit config."""
        deadline = time.monotonic() + self.connect_timeout
        while client_manager.num_available() < self.clients:
            if time.monotonic() > deadline:
                raise SecureSumError(
                    f"only {client_manager.num_available()} of {self.clients} clients "
                    f"connected within {self.connect_timeout:g} s; nothing was sent"
                )
            time.sleep(0.5)
        proxies = client_manager.sample(num_clients=self.clients, min_num_clients=self.clients)
        return [(proxy, FitIns(parameters, dict(self.fit_config))) for proxy in proxies]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Decode the unmasked SecAgg+ mean of the survivors into the exact sum."""
        survivors = len(results)
        if survivors < self.min_survivors:
            raise TooFewSurvivorsError(
                f"only {survivors} of {self.clients} clients contributed, fewer than the "
                f"{self.min_survivors} required; nothing released"
            )
        arrays = parameters_to_ndarrays(results[0][1].parameters)
        if len(arrays) != 1 or arrays[0].shape != (self.size,):
            shapes = [a.shape for a in arrays]
            raise SecureSumError(
                f"secure sum has shape {shapes}, expected one vector of length {self.size}: "
                "a client sent a wrong-length vector; nothing released"
            )
        self.total = decode_sum(arrays[0], survivors, self.noise)
        self.survivors = survivors
        self.on_sum(self.total, survivors)
        return None, {}

    def on_sum(self, total: np.ndarray, survivors: int) -> None:
        """Hook for subclasses: called once with the decoded sum."""

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """No federated evaluation."""
        return []

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        """No federated evaluation."""
        return None, {}

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        """No centralised evaluation."""
        return None


def run_secure_sum(
    grid: Grid,
    context: Context,
    strategy: SecureSumStrategy,
    *,
    num_shares: float | None = None,
    reconstruction_threshold: float = 0.6,
    timeout: float | None = None,
) -> np.ndarray:
    """Run one SecAgg+ round with ``strategy`` inside a ServerApp and return the exact sum.

    ``num_shares`` defaults to :func:`default_num_shares`; ``timeout`` bounds each
    SecAgg+ stage in seconds (None: wait for every reply, which suits simulation,
    where a failed client is answered with an error, but hangs a deployment on a
    SuperNode that disappears). Raises :class:`SecureSumError` if the protocol
    halted before a sum was unmasked.
    """
    timeout = check_timeout("timeout", timeout)
    workflow = ExactSumWorkflow(
        min_survivors=strategy.min_survivors,
        num_shares=num_shares if num_shares is not None else default_num_shares(strategy.clients),
        reconstruction_threshold=reconstruction_threshold,
        timeout=timeout,
        clipping_range=clipping_range_for(strategy.clients),
    )
    legacy = LegacyContext(context, config=ServerConfig(num_rounds=1), strategy=strategy)
    DefaultWorkflow(fit_workflow=workflow)(grid, legacy)
    if strategy.total is None:
        raise SecureSumError(
            "secure aggregation halted before the sum was unmasked (too few clients "
            "answered or too few key shares; see the log above); nothing was released"
        )
    return strategy.total
