"""Client-side noise shares for distributed DP under secure summation (DP-Hype Section I-A, Appendix A).

Each of ``n`` clients adds an independent share to its vote vector; only the sum is revealed, so the released sum
carries the survivors' shares. Tolerating a dropout fraction ``xi`` (Appendix A), every share has variance
``sigma^2 / ((1 - xi) n)``: any ``m >= (1 - xi) n`` survivors together contribute variance
``m sigma^2 / ((1 - xi) n) >= sigma^2``. The server never adds noise. Shares are drawn by their noise kind
(`dphype.privacy.noise_kinds`), whose law is closed under sums (Skellam: integer secure summation is exact and the
Skellam accountant applies to the total variance).

Where the randomness comes from. A client's share must be unpredictable to the server, so the client path
(`client_noise_share`) draws it from `secure_generator` (ChaCha20 keyed with 256 fresh bits from ``os.urandom``,
a new key for every share) and takes no generator argument, so no caller can hand it a seeded one. `noise_share`,
`summed_noise` and `replay_noisy_sums` take an explicit ``rng`` for benchmarks, replays and audits.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from numbers import Integral
from typing import Any

import numpy as np
from randomgen import ChaCha

from dphype.checks import (
    DEFAULT_NOISE,
    check_clients,
    check_dropout,
    check_int,
    check_positive,
    check_sigma,
)
from dphype.privacy.noise_kinds import noise_kind

#: (1 - xi) n within this distance of an integer is treated as that integer (float representation of xi).
_SURVIVOR_ROUNDING = 1e-9


def client_noise_variance(sigma: float, clients: int, dropout: float) -> float:
    """Per-client share variance ``sigma^2 / ((1 - xi) n)`` (Appendix A), arguments checked."""
    sigma, clients, dropout = check_sigma(sigma), check_clients(clients), check_dropout(dropout)
    return sigma**2 / ((1.0 - dropout) * clients)


def client_noise_std(sigma: float, clients: int, dropout: float) -> float:
    """Per-client share std ``sigma / sqrt((1 - xi) n)`` (Appendix A)."""
    return math.sqrt(client_noise_variance(sigma, clients, dropout))


def min_survivors(clients: int, dropout: float) -> int:
    """Fewest survivors whose shares still sum to variance ``>= sigma^2``: ``ceil((1 - xi) n)``, at least 1.

    ``m`` survivors give variance ``m sigma^2 / ((1 - xi) n)``, ``>= sigma^2`` iff ``m >= (1 - xi) n``. Any
    ``n >= 2``, also beyond `dphype.checks.MAX_CLIENTS` (the secure-graph bounds use it there).

    Args:
        clients: The number of clients ``n``, an integer ``>= 2``.
        dropout: The tolerated dropout fraction ``xi``, in ``[0, 1)``.

    Returns:
        ``ceil((1 - xi) n)``, at least 1.

    Raises:
        ValueError: ``clients`` or ``dropout`` is out of its range.
    """  # noqa: DOC502
    clients, dropout = check_int("clients", clients, 2), check_dropout(dropout)
    return max(1, math.ceil((1.0 - dropout) * clients - _SURVIVOR_ROUNDING))


def check_survivors(survivors: Any, clients: int, lowest: int = 1) -> int:
    """Check the number of contributing clients ``m``: an integer in ``[lowest, clients]``.

    A release passes ``lowest=min_survivors(clients, xi)``; ``lowest=1`` where fewer is meaningful (accounting shows a
    too-small survivor set's larger epsilon, an audit may probe it).

    Args:
        survivors: The value to check.
        clients: The number of clients ``n``.
        lowest: The fewest survivors allowed.

    Returns:
        ``survivors`` as int.

    Raises:
        ValueError: ``survivors`` is not an integer in ``[lowest, clients]``.
    """
    if isinstance(survivors, bool) or not isinstance(survivors, Integral) or not lowest <= int(survivors) <= clients:
        raise ValueError(f"survivors must be an integer in [{lowest}, {clients}], got {survivors!r}")
    return int(survivors)


#: The share of the clients whose ballots a committee release may leave out on top of the dropout.
MISBEHAVING_SHARE = 0.1


def min_valid_ballots(clients: int, dropout: float) -> int:
    """Fewest valid ballots a committee release counts: ``max(1, ceil((1 - xi) n) - ceil(n / 10))``.

    The committee's noise does not depend on the count, so this floor protects no voter's privacy (each is
    ``epsilon``-DP whatever the count): it keeps the release a decision of most of the federation. Beyond the dropout,
    ``ceil(n / 10)`` contributors' ballots may be left out (`MISBEHAVING_SHARE`).

    Args:
        clients: The number of clients ``n``, an integer ``>= 2``.
        dropout: The tolerated dropout fraction ``xi``, in ``[0, 1)``.

    Returns:
        The floor, at least 1.

    Raises:
        ValueError: ``clients`` or ``dropout`` is out of its range.
    """  # noqa: DOC502
    survivors = min_survivors(clients, dropout)
    return max(1, survivors - math.ceil(MISBEHAVING_SHARE * int(clients) - _SURVIVOR_ROUNDING))


#: Tallies in the default committee (honest majority: MPyC's threshold 1, `honest_tallies` 2).
COMMITTEE_TALLIES = 3


def honest_tallies(parties: int) -> int:
    """Fewest honest tallies ``h`` of ``parties >= 3`` under MPyC's Shamir threshold ``(parties - 1) // 2``."""
    if isinstance(parties, bool) or not isinstance(parties, (int, np.integer)) or parties < 3:
        raise ValueError(f"a tally committee must have an integer number of tallies >= 3, got {parties!r}")
    return int(parties) - (int(parties) - 1) // 2


def committee_noise_share(size: int | tuple[int, ...], *, sigma: float, parties: int, rng: np.random.Generator,
                          noise: str = DEFAULT_NOISE) -> np.ndarray:
    """One tally's noise share for the committee's noisy sum: variance ``sigma^2 / h`` per entry.

    ``h`` = `honest_tallies`: any ``h`` tallies' shares add up to variance ``sigma^2`` (the kind's law is closed under
    sums), what the accountant calibrated ``sigma`` for; the other shares are independent of the data and of those
    ``h`` (post-processing). A tally passes ``rng = secure_generator()``. The MPC adds integers, so the committee
    release admits integer kinds only (`dphype.release`).

    Args:
        size: The share's shape, ``p``.
        sigma: The std the shares of any ``h`` tallies add up to, ``> 0``.
        parties: The committee's size, ``>= 3``.
        rng: The generator to draw from.
        noise: The noise kind's name.

    Returns:
        The share, of shape ``size`` (int64 for an integer kind).

    Raises:
        ValueError: An argument is out of its range.
    """  # noqa: DOC502
    return noise_kind(noise).draw(size, check_positive("sigma", sigma) ** 2 / honest_tallies(parties), rng)


def committee_sum_std(sigma: float, parties: int) -> float:
    """The std of all ``parties`` tallies' shares added: ``sigma sqrt(parties / h)`` (`honest_tallies`)."""
    return check_positive("sigma", sigma) * math.sqrt(int(parties) / honest_tallies(parties))


def replay_committee_sums(vote_sum: np.ndarray, *, sigma: float, parties: int, repetitions: int,
                          rng: np.random.Generator, per_tally: bool = False, noise: str = DEFAULT_NOISE) -> np.ndarray:
    """Noisy sums of ``vote_sum`` as a committee opens them: all ``parties`` shares added, float64 ``(repetitions, p)``.

    Args:
        vote_sum: The noiseless sum of the valid ballots, ``(p,)``, or one row per repetition.
        sigma: The std the shares of any ``h`` tallies add up to, ``> 0``.
        parties: The committee's size, ``>= 3``.
        repetitions: How many sums to draw.
        rng: The generator to draw from.
        per_tally: Draw one `committee_noise_share` per tally, not their sum in one draw (the same law).
        noise: The noise kind's name.

    Returns:
        The noisy sums.
    """
    votes = np.asarray(vote_sum, dtype=np.float64)
    shape = (int(repetitions), votes.shape[-1])
    if per_tally:
        return votes + sum(committee_noise_share(shape, sigma=sigma, parties=parties, rng=rng, noise=noise)
                           for _ in range(int(parties)))
    variance = int(parties) * check_positive("sigma", sigma) ** 2 / honest_tallies(parties)
    return votes + noise_kind(noise).draw(shape, variance, rng)


def noise_share(
    size: int | tuple[int, ...],
    *,
    sigma: float,
    clients: int,
    dropout: float,
    kind: str,
    rng: np.random.Generator,
) -> np.ndarray:
    """One client's share of shape ``size``: the kind's draw of variance `client_noise_variance` from ``rng``."""
    return noise_kind(kind).draw(size, client_noise_variance(sigma, clients, dropout), rng)


def secure_generator() -> np.random.Generator:
    """A numpy ``Generator`` over ChaCha20 keyed with 256 fresh bits from ``os.urandom``.

    randomgen's ``ChaCha`` with 20 rounds (RFC 8439's stream cipher): a cryptographically secure stream no seed or
    server value can reproduce. It runs in counter mode from counter 0, safe because every call draws a fresh key.

    Returns:
        A new generator with a fresh key.
    """
    return np.random.Generator(ChaCha(key=int.from_bytes(os.urandom(32), "little"), rounds=20))


def client_noise_share(
    size: int | tuple[int, ...], *, sigma: float, clients: int, dropout: float, kind: str
) -> np.ndarray:
    """A client's noise share (`noise_share`) from a fresh `secure_generator`; no ``rng`` parameter by design."""
    return noise_share(size, sigma=sigma, clients=clients, dropout=dropout, kind=kind, rng=secure_generator())


def summed_noise(
    size: int | tuple[int, ...],
    *,
    sigma: float,
    clients: int,
    dropout: float,
    survivors: int,
    kind: str,
    rng: np.random.Generator,
) -> np.ndarray:
    """The sum of ``survivors`` independent `noise_share` draws, sampled in one call.

    The kinds' laws are closed under sums (``m`` Gaussians of variance ``v``: ``N(0, m v)``; ``m`` Skellams
    ``Pois(mu) - Pois(mu)``: ``Pois(m mu) - Pois(m mu)``), so this is exactly what secure aggregation releases when
    ``m = survivors`` clients add their shares.

    Args:
        size: The sum's shape.
        sigma: The total noise standard deviation, ``> 0``.
        clients: The number of clients ``n``, in ``[2, MAX_CLIENTS]``.
        dropout: The tolerated dropout fraction ``xi``, in ``[0, 1)``.
        survivors: The number ``m`` of shares summed, an integer in ``[1, clients]``.
        kind: The noise kind's name.
        rng: The generator to draw from.

    Returns:
        The summed noise, of shape ``size`` (int64 for an integer kind).

    Raises:
        ValueError: An argument is out of its range.
    """  # noqa: DOC502
    noise = noise_kind(kind)
    variance = client_noise_variance(sigma, clients, dropout)
    return noise.draw(size, check_survivors(survivors, clients) * variance, rng)


def replay_noisy_sums(
    vote_sum: np.ndarray,
    *,
    sigma: float,
    clients: int,
    repetitions: int,
    rng: np.random.Generator,
    dropout: float = 0.0,
    noise: str = DEFAULT_NOISE,
    survivors: int | None = None,
    per_client: bool = False,
) -> np.ndarray:
    """Independent noisy sums of ``vote_sum`` as the server would receive them (the sum release's replay).

    Args:
        vote_sum: The noiseless sum of the contributing clients' votes, ``(p,)`` or ``(repetitions, p)``.
        sigma: The total noise standard deviation; ``0`` (no noise) returns the votes.
        clients: The number of clients ``n``.
        repetitions: How many sums to draw.
        rng: The generator to draw from.
        dropout: The tolerated dropout fraction ``xi``, in ``[0, 1)``.
        noise: The noise kind's name.
        survivors: The number of clients whose shares are summed (default all).
        per_client: One `noise_share` per client, summed, not one `summed_noise` draw (the same law).

    Returns:
        The noisy sums, float64 ``(repetitions, p)``.
    """
    votes = np.asarray(vote_sum, dtype=np.float64)
    shape = (int(repetitions), votes.shape[-1])
    out = np.broadcast_to(votes, shape).astype(np.float64, copy=True)
    if sigma == 0:
        return out
    m = clients if survivors is None else survivors
    if per_client:
        for _ in range(m):
            out += noise_share(shape, sigma=sigma, clients=clients, dropout=dropout, kind=noise, rng=rng)
    else:
        out += summed_noise(shape, sigma=sigma, clients=clients, dropout=dropout, survivors=m, kind=noise, rng=rng)
    return out


@dataclass(frozen=True)
class TailBound:
    """Range a client's ``vote + share`` entries and the released sum stay within, but with ``failure_probability``.

    Attributes:
        client_max_abs: Bounds ``|vote + share|`` per entry of one client.
        sum_max_abs: Bounds ``|sum|`` per entry of the released sum.
        num_sigmas: The share's bound in multiples of its standard deviation.
        failure_probability: The union bound on the probability that either bound fails.
    """

    client_max_abs: float
    sum_max_abs: float
    num_sigmas: float
    failure_probability: float


def noise_tail_bound(
    sigma: float,
    clients: int,
    dropout: float,
    *,
    kind: str = "gaussian",
    size: int = 1,
    num_sigmas: float = 10.0,
    max_vote: float = 1.0,
) -> TailBound:
    """Secure-sum range check: bound the unbounded shares with high probability.

    Each share entry stays within ``t = num_sigmas * client_std``, each client's entry within ``max_vote + t``; all
    ``clients`` shares summed (the most noise any survivor set carries) stay within ``t sqrt(clients)``, the released
    sum within ``clients * max_vote`` plus that. ``failure_probability`` is the union bound over the ``clients * size``
    share entries and the ``size`` sum entries (the kind's `dphype.privacy.noise_kinds.NoiseKind.tail`).

    Args:
        sigma: The total noise standard deviation, ``> 0``.
        clients: The number of clients ``n``, in ``[2, MAX_CLIENTS]``.
        dropout: The tolerated dropout fraction ``xi``, in ``[0, 1)``.
        kind: The noise kind's name.
        size: The number of entries per vote vector, ``>= 1``.
        num_sigmas: Each share entry's bound in multiples of its standard deviation, ``> 0``.
        max_vote: The largest ``|vote|`` entry, ``>= 0``.

    Returns:
        The two bounds and their failure probability.

    Raises:
        ValueError: An argument is out of its range.
    """
    noise = noise_kind(kind)
    check_positive("num_sigmas", num_sigmas)
    check_int("size", size, 1)
    if not math.isfinite(max_vote) or max_vote < 0:
        raise ValueError(f"max_vote must be a finite number >= 0, got {max_vote!r}")
    variance = client_noise_variance(sigma, clients, dropout)
    share_limit = num_sigmas * math.sqrt(variance)
    sum_limit = share_limit * math.sqrt(clients)
    failure = size * (
        clients * noise.tail(share_limit, variance) + noise.tail(sum_limit, clients * variance)
    )
    return TailBound(
        client_max_abs=max_vote + share_limit,
        sum_max_abs=clients * max_vote + sum_limit,
        num_sigmas=float(num_sigmas),
        failure_probability=min(1.0, failure),
    )
