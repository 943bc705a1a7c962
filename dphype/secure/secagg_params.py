"""Secure SecAgg+ parameters by construction: neighbour count and reconstruction threshold.

SecAgg+ (Bell et al., CCS 2020) masks each client's vector with ``k`` neighbours on a random ring and Shamir-shares
its secrets among them with threshold ``t``. `secure_parameters` gives, for ``n`` clients of which a fraction
``gamma`` is corrupted and a fraction ``xi`` drops out, the smallest even ``k`` and then the smallest ``t`` with
``P[E1] + P[E2] <= 2**-40`` (E1: an honest client unmasked; E2: the honest clients' graph disconnected) and
``P[E3] <= 2**-20`` (E3: a secret that cannot be reconstructed) over the random graph (exact hypergeometric tails;
the complete graph when no sparser one works), for a semi-honest or an active server.
`flower_graph` turns Flower's ``num_shares`` and ``reconstruction_threshold`` into ``(k, t)``, `check_parameters`
checks a user's own choice against those bounds, and `check_share_threshold` is the part a client checks itself.
The bad events, their bounds and Flower's counting: docs/design/secagg-parameters.md.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dphype.checks import check_dropout, check_int
from dphype.privacy.noise import min_survivors

#: Statistical security parameter: P[E1] + P[E2] <= 2**-SECURITY_BITS.
SECURITY_BITS: float = 40.0
#: Correctness parameter: P[E3] <= 2**-CORRECTNESS_BITS.
CORRECTNESS_BITS: float = 20.0
#: Default fraction of clients assumed to collude with the server.
CORRUPT_FRACTION: float = 1.0 / 3.0
#: Threat models: "semi-honest" (the server follows the protocol) or "active" (it may lie about dropouts).
ADVERSARIES: tuple[str, ...] = ("semi-honest", "active")
#: The DP-Hype paper's benchmark settings (Flower fractions): shares 0.3 n, threshold all shares.
PAPER_NUM_SHARES: float = 0.3
PAPER_THRESHOLD: float = 1.0

_TINY = 1e-12  # keeps floor(gamma n) / ceil((1 - xi) n) from being moved by float rounding of gamma n


@dataclass(frozen=True)
class SecAggParameters:
    """A SecAgg+ configuration and the failure bounds it achieves (log2 of Bell et al.'s events).

    Attributes:
        clients: The number of clients ``n``.
        neighbours: The graph degree ``k`` (``clients - 1``: complete graph).
        threshold: The Shamir threshold ``t``.
        corrupt_fraction: The fraction ``gamma`` of clients assumed to collude with the server.
        dropout: The tolerated dropout fraction ``xi``.
        adversary: The threat model, one of `ADVERSARIES`.
        log2_unmask: Bounds ``log2 P[E1]`` (``-inf``: impossible).
        log2_disconnect: Bounds ``log2 P[E2]``.
        log2_failure: Bounds ``log2 P[E3]``.
    """

    clients: int
    neighbours: int
    threshold: int
    corrupt_fraction: float
    dropout: float
    adversary: str
    log2_unmask: float
    log2_disconnect: float
    log2_failure: float

    @property
    def num_shares(self) -> int:
        """Flower's ``num_shares``, ``k + 1``: the neighbours plus the client's own share."""
        return self.neighbours + 1

    @property
    def log2_insecure(self) -> float:
        """Log2 of the bound on P[E1] + P[E2] (the server learns more than the sum)."""
        return float(np.logaddexp2(self.log2_unmask, self.log2_disconnect))

    def flower_arguments(self) -> dict[str, int]:
        """``num_shares`` and ``reconstruction_threshold`` for ``SecAggPlusWorkflow`` (as ints)."""
        return {"num_shares": self.num_shares, "reconstruction_threshold": self.threshold}

    def to_dict(self) -> dict[str, Any]:
        """The fields, ``num_shares`` and ``log2_insecure`` by name (JSON-friendly)."""
        return {**dataclasses.asdict(self), "num_shares": self.num_shares, "log2_insecure": self.log2_insecure}


def check_corrupt_fraction(corrupt_fraction: Any) -> float:
    """The corrupt fraction ``gamma`` as float; `ValueError` unless a number in ``[0, 1)``."""
    try:
        gamma = float(corrupt_fraction)
    except (TypeError, ValueError):
        gamma = math.nan
    if isinstance(corrupt_fraction, bool) or not 0.0 <= gamma < 1.0:
        raise ValueError(f"corrupt_fraction must be in [0, 1), got {corrupt_fraction!r}")
    return gamma


def check_adversary(adversary: Any) -> str:
    """The threat model as str; `ValueError` unless one of `ADVERSARIES`."""
    if adversary not in ADVERSARIES:
        raise ValueError(f"adversary must be one of {', '.join(ADVERSARIES)}, got {adversary!r}")
    return str(adversary)


def _counts(clients: int, dropout: float, corrupt_fraction: float) -> tuple[int, int]:
    """(corrupted clients ``c = floor(gamma n)``, survivors ``s = ceil((1 - xi) n)``)."""
    return math.floor((corrupt_fraction + _TINY) * clients), min_survivors(clients, dropout)


def log2_disconnect(clients: int, neighbours: int, removed: int) -> float:
    """Log2 bound on P[E2] (docs/design/secagg-parameters.md); ``-inf`` when ``b < k`` or the graph is complete.

    Args:
        clients: The number of clients ``n``.
        neighbours: The graph degree ``k``.
        removed: The number ``b`` of removed (dropped or corrupted) nodes.

    Returns:
        The log2 bound.
    """
    n, k, b = clients, neighbours, removed
    if k >= n - 1 or b < k:
        return -math.inf
    log_ratio = math.lgamma(b + 1) - math.lgamma(b - k + 1) - math.lgamma(n + 1) + math.lgamma(n - k + 1)
    return min(0.0, (math.log(n) + math.log(n - k - 1) - math.log(2) + log_ratio) / math.log(2))


def _log2_counts(clients: int, neighbours: int, marked: int) -> tuple[np.ndarray, np.ndarray]:
    """Log2 P[X >= m], log2 P[X <= m] (m = 0..k), X ~ ``H(n-1, marked, k)`` (``marked`` if complete), tail-summed."""
    n, k = clients, neighbours
    x = np.arange(k + 1)
    if k >= n - 1:
        log_pmf = np.where(x == marked, 0.0, -np.inf)
    else:
        # lazy import: scipy
        from scipy.stats import hypergeom  # local import of scipy.stats: seconds, needed only for these tails

        log_pmf = hypergeom.logpmf(x, n - 1, marked, k) / math.log(2)
    return np.logaddexp2.accumulate(log_pmf[::-1])[::-1], np.logaddexp2.accumulate(log_pmf)


def _at_least(log_ge: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Log2 P[X >= m] for integer arrays ``m`` (0 for m <= 0, -inf beyond the support)."""
    inside = np.clip(m, 0, log_ge.size - 1)
    return np.where(m <= 0, 0.0, np.where(m >= log_ge.size, -np.inf, log_ge[inside]))


def _threshold_bounds(
    clients: int, neighbours: int, thresholds: np.ndarray, corrupted: int, survivors: int, adversary: str
) -> tuple[np.ndarray, np.ndarray]:
    """(log2 bound on P[E1], log2 bound on P[E3]) for each threshold (docs/design/secagg-parameters.md)."""
    n, k, t = clients, neighbours, thresholds
    corrupt_ge, _ = _log2_counts(n, k, corrupted)
    _, survive_le = _log2_counts(n, k, min(survivors, n - 1))
    needed = t if adversary == "semi-honest" else 2 * t - k - 1
    unmask = math.log2(n) + _at_least(corrupt_ge, needed)
    if survivors >= n:  # nobody drops: every client has its k neighbours and its own share
        failure = np.where(t <= k + 1, -np.inf, 0.0)
    else:
        failure = math.log2(n) + np.where(t - 1 >= 0, survive_le[np.clip(t - 1, 0, k)], -np.inf)
    return np.minimum(unmask, 0.0), np.minimum(failure, 0.0)  # a probability is at most 1


def bounds(
    clients: int,
    neighbours: int,
    threshold: int,
    *,
    dropout: float,
    corrupt_fraction: float = CORRUPT_FRACTION,
    adversary: str = "semi-honest",
) -> SecAggParameters:
    """The bounds that ``neighbours`` (``k``) and ``threshold`` (``t``) achieve (no check: `check_parameters`).

    Args:
        clients: The number of clients ``n``, ``>= 2``.
        neighbours: The graph degree ``k``, in ``[2, n - 1]``.
        threshold: The Shamir threshold ``t``, in ``[1, k + 1]``.
        dropout: The tolerated dropout fraction ``xi``.
        corrupt_fraction: The fraction ``gamma`` of clients assumed to collude with the server.
        adversary: The threat model, one of `ADVERSARIES`.

    Returns:
        The configuration and its bounds.

    Raises:
        ValueError: An argument is out of its range.
    """
    n = check_int("clients", clients, 2)  # the graph bounds hold for any n, beyond the protocol's MAX_CLIENTS
    gamma, xi = check_corrupt_fraction(corrupt_fraction), check_dropout(dropout)
    adversary = check_adversary(adversary)
    if not 2 <= neighbours <= n - 1:
        raise ValueError(f"neighbours must be in [2, {n - 1}], got {neighbours}")
    if not 1 <= threshold <= neighbours + 1:
        raise ValueError(f"threshold must be in [1, {neighbours + 1}], got {threshold}")
    corrupted, survivors = _counts(n, xi, gamma)
    unmask, failure = _threshold_bounds(n, neighbours, np.array([threshold]), corrupted, survivors, adversary)
    return SecAggParameters(
        clients=n,
        neighbours=int(neighbours),
        threshold=int(threshold),
        corrupt_fraction=gamma,
        dropout=xi,
        adversary=adversary,
        log2_unmask=float(unmask[0]),
        log2_disconnect=log2_disconnect(n, neighbours, corrupted + n - survivors),
        log2_failure=float(failure[0]),
    )


def _threshold_range(
    clients: int, neighbours: int, corrupted: int, survivors: int, adversary: str, security: float, correctness: float,
    majority: bool = False,
) -> tuple[int, int]:
    """Smallest ``t >= 2`` meeting E1 (with ``majority``, also `majority_threshold`), largest meeting E3."""
    t = np.arange(2, neighbours + 2)
    unmask, failure = _threshold_bounds(clients, neighbours, t, corrupted, survivors, adversary)
    secure = np.flatnonzero(unmask <= -(security + 1))
    correct = np.flatnonzero(failure <= -correctness)
    low = int(t[secure[0]]) if secure.size else neighbours + 2
    high = int(t[correct[-1]]) if correct.size else 1
    if majority:
        low = max(low, majority_threshold(neighbours + 1))
    return low, high


def secure_parameters(
    clients: int,
    *,
    dropout: float,
    corrupt_fraction: float = CORRUPT_FRACTION,
    adversary: str = "semi-honest",
    security_bits: float = SECURITY_BITS,
    correctness_bits: float = CORRECTNESS_BITS,
    majority: bool = False,
) -> SecAggParameters:
    """The cheapest secure SecAgg+ graph for ``n`` clients: smallest even degree ``k``, then smallest ``t``.

    Secure: ``P[E1], P[E2] <= 2**-(sigma+1)``; correct: ``P[E3] <= 2**-eta``. With ``majority``, also
    ``2 t > k + 1`` (`check_share_threshold`). Falls back to the complete graph.

    Args:
        clients: The number of clients ``n``.
        dropout: The tolerated dropout fraction ``xi``.
        corrupt_fraction: The fraction ``gamma`` of clients assumed to collude with the server.
        adversary: The threat model, one of `ADVERSARIES`.
        security_bits: ``sigma``: ``P[E1] + P[E2] <= 2**-sigma``.
        correctness_bits: ``eta``: ``P[E3] <= 2**-eta``.
        majority: Also require a threshold above half the shares.

    Returns:
        The cheapest secure configuration and its bounds.

    Raises:
        ValueError: An argument is out of its range, or even the complete graph cannot satisfy both (too many
            corrupted plus dropped clients).
    """
    n = check_int("clients", clients, 2)  # the graph bounds hold for any n, beyond the protocol's MAX_CLIENTS
    gamma, xi = check_corrupt_fraction(corrupt_fraction), check_dropout(dropout)
    adversary = check_adversary(adversary)
    corrupted, survivors = _counts(n, xi, gamma)
    for k in [*range(2, n - 1, 2), n - 1]:
        if log2_disconnect(n, k, corrupted + n - survivors) > -(security_bits + 1):
            continue
        low, high = _threshold_range(n, k, corrupted, survivors, adversary, security_bits, correctness_bits,
                                     majority)
        if low <= high:
            return bounds(n, k, low, dropout=xi, corrupt_fraction=gamma, adversary=adversary)
    raise ValueError(
        f"no secure SecAgg+ parameters for clients={n}, corrupt_fraction={gamma:g}, dropout={xi:g}: lower "
        f"either\n({adversary} server): not even the complete graph is secure"
    )


def flower_graph(clients: int, num_shares: float, reconstruction_threshold: float) -> tuple[int, int]:
    """``(k, t)`` that Flower's ``SecAggPlusWorkflow.setup_stage`` builds from its two arguments.

    Fractions: ``num_shares = round(f n)``, made odd if below ``n``, ``n`` if at most 2; threshold
    ``max(2, round(f num_shares))``. Ints are used as given. ``k = 2 (num_shares // 2)``, at most ``n - 1``.

    Args:
        clients: The number of clients ``n``, ``>= 2``.
        num_shares: Flower's ``num_shares``: an int, or a float fraction of ``n``.
        reconstruction_threshold: Flower's ``reconstruction_threshold``: an int, or a float fraction of the shares.

    Returns:
        ``(k, t)``: the graph degree and the Shamir threshold.

    Raises:
        ValueError: ``clients`` is not an integer ``>= 2``.
    """  # noqa: DOC502
    n = check_int("clients", clients, 2)  # the graph bounds hold for any n, beyond the protocol's MAX_CLIENTS
    if isinstance(num_shares, float):
        shares = round(num_shares * n)
        if shares < n and shares % 2 == 0:
            shares += 1
        if shares <= 2:
            shares = n
    else:
        shares = int(num_shares)
    if isinstance(reconstruction_threshold, float):
        threshold = max(2, round(reconstruction_threshold * shares))
    else:
        threshold = int(reconstruction_threshold)
    return min(2 * (shares // 2), n - 1), threshold


def check_parameters(
    clients: int,
    num_shares: float,
    reconstruction_threshold: float,
    *,
    dropout: float,
    corrupt_fraction: float = CORRUPT_FRACTION,
    adversary: str = "semi-honest",
    security_bits: float = SECURITY_BITS,
    correctness_bits: float = CORRECTNESS_BITS,
    majority: bool = False,
) -> SecAggParameters:
    """Refuse a user's explicit SecAgg+ choice that is below the secure minimum; return its bounds.

    ``num_shares`` must give at least `secure_parameters`' degree, and the threshold must meet E1 and E3 on that
    graph (with ``majority``, exceed half the shares).

    Args:
        clients: The number of clients ``n``.
        num_shares: Flower's ``num_shares`` (an int, or a float fraction of ``n``).
        reconstruction_threshold: Flower's ``reconstruction_threshold`` (an int, or a float fraction).
        dropout: The tolerated dropout fraction ``xi``.
        corrupt_fraction: The fraction ``gamma`` of clients assumed to collude with the server.
        adversary: The threat model, one of `ADVERSARIES`.
        security_bits: ``sigma``: ``P[E1] + P[E2] <= 2**-sigma``.
        correctness_bits: ``eta``: ``P[E3] <= 2**-eta``.
        majority: Also require a threshold above half the shares.

    Returns:
        The choice's bounds.

    Raises:
        ValueError: ``num_shares`` is even and below ``n`` or gives too small a graph, or
            ``reconstruction_threshold`` is outside its allowed range (named in the message).
    """
    n = check_int("clients", clients, 2)  # the graph bounds hold for any n, beyond the protocol's MAX_CLIENTS
    if isinstance(num_shares, int) and num_shares < n and num_shares % 2 == 0:
        # Flower 1.41 tells the clients the even count but builds the ring for the next odd one: clients crash
        raise ValueError(f"num_shares must be odd or equal to clients={n}, got {num_shares}")
    minimum = secure_parameters(
        n, dropout=dropout, corrupt_fraction=corrupt_fraction, adversary=adversary,
        security_bits=security_bits, correctness_bits=correctness_bits, majority=majority,
    )
    k, t = flower_graph(n, num_shares, reconstruction_threshold)
    corrupted, survivors = _counts(n, minimum.dropout, minimum.corrupt_fraction)
    if k < minimum.neighbours or log2_disconnect(n, k, corrupted + n - survivors) > -(security_bits + 1):
        raise ValueError(
            f"num_shares must be in [{minimum.num_shares}, {n}] for clients={n}, got {num_shares!r} ({k} "
            f"neighbours)\nat corrupt_fraction={minimum.corrupt_fraction:g}, dropout={minimum.dropout:g} "
            f"(P[unmasked] <= 2**-{security_bits:g}, P[failure] <= 2**-{correctness_bits:g})"
        )
    low, high = _threshold_range(n, k, corrupted, survivors, minimum.adversary, security_bits, correctness_bits,
                                 majority)
    if not low <= t <= high:
        allowed = f"[{low}, {high}]" if low <= high else "empty (use more num_shares)"
        raise ValueError(
            f"reconstruction_threshold must be in {allowed} for clients={n}, got {reconstruction_threshold!r}\n"
            f"with {k} neighbours (corrupt_fraction={minimum.corrupt_fraction:g}, dropout={minimum.dropout:g}): "
            f"threshold {t}"
        )
    return bounds(n, k, t, dropout=dropout, corrupt_fraction=corrupt_fraction, adversary=adversary)


def majority_threshold(num_shares: int) -> int:
    """Smallest threshold ``t`` with ``2 t > num_shares``: ``num_shares // 2 + 1``."""
    return num_shares // 2 + 1


def check_share_threshold(clients: int, num_shares: int, threshold: int) -> None:
    """What a client checks itself before any secret leaves it.

    The client's secrets have ``num_shares`` holders (its neighbours and itself). An active server that tells
    some holders "survived" and others "dropped" gets ``t`` shares of both secrets from honest holders only if
    ``2 t <= num_shares``, so that is refused, as is a threshold above ``num_shares`` and a share count outside
    ``[3, clients]``. The graph's size against colluding clients is the server's check (`check_parameters` with
    ``majority=True`` keeps this rule too).

    Args:
        clients: The number of clients ``n``.
        num_shares: The number of holders of the client's secrets, in ``[3, clients]``.
        threshold: The Shamir threshold, in ``[num_shares // 2 + 1, num_shares]``.

    Raises:
        ValueError: ``num_shares`` or ``threshold`` is outside its range.
    """
    n = check_int("clients", clients, 2)  # the graph bounds hold for any n, beyond the protocol's MAX_CLIENTS
    if not 3 <= num_shares <= n:
        raise ValueError(f"num_shares must be in [3, {n}] for clients={n}, got {num_shares}")
    low = majority_threshold(num_shares)
    if not low <= threshold <= num_shares:
        raise ValueError(
            f"reconstruction_threshold must be in [{low}, {num_shares}] for num_shares={num_shares}, got {threshold}\n"
            "(2 * threshold > num_shares, so no server obtains both kinds of shares from honest holders)"
        )
