"""Argument checks shared by every layer (the bottom of the package: it imports nothing from dphype).

Each ``check_*`` returns the value in its canonical type or raises ``ValueError`` naming the parameter and
its allowed range, so a bad input fails where it enters (configuration, CLI, request, node policy).
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

ACCOUNTANTS: tuple[str, ...] = ("analytic", "rdp")
NOISE_KINDS: tuple[str, ...] = ("gaussian", "skellam")
DEFAULT_ACCOUNTANT: dict[str, str] = {"gaussian": "analytic", "skellam": "rdp"}
#: Neighbouring relations: replace one client's data (the paper's) or add/remove one client (DP-FedAvg's).
NEIGHBOURING: tuple[str, ...] = ("replace-one", "add-remove")
#: Largest federation accepted: the secure sum's clipping range C(n) is still 2**17 there
#: (:func:`dphype.secure.secure_sum.clipping_range_for`).
MAX_CLIENTS: int = 10_000
#: The default noise kind of a selection (and of every replay of one).
DEFAULT_NOISE = "skellam"
#: Relative slack when comparing an announced epsilon with one recomputed from the noise (request, policy, ledger).
EPSILON_RTOL = 1e-6


def check_positive(name: str, value: Any) -> float:
    """Return ``value`` as float; it must be a finite real number (not a bool) ``> 0``, else
    ``ValueError`` naming ``name`` and the allowed range."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_epsilon(epsilon: Any) -> float:
    """Return ``epsilon`` as float; it must be a finite number > 0."""
    return check_positive("epsilon", epsilon)


def check_delta(delta: Any) -> float:
    """Return ``delta`` as float; it must lie in the open interval (0, 1)."""
    if isinstance(delta, bool) or not isinstance(delta, Real) or not 0.0 < float(delta) < 1.0:
        raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
    return float(delta)


def check_int(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` as int; it must be an integer (not a bool) ``>= minimum``, else ``ValueError``
    naming ``name`` and the allowed range."""
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_num_candidates(num_candidates: Any) -> int:
    """Return the number of candidates ``p`` as int; it must be an integer >= 1."""
    return check_int("num_candidates", num_candidates, 1)


def check_k(k: Any, num_candidates: int | None = None) -> int:
    """Return the number of votes ``k`` as int; it must be an integer in ``[1, num_candidates]``."""
    upper = "num_candidates" if num_candidates is None else str(num_candidates)
    if (
        isinstance(k, bool)
        or not isinstance(k, Integral)
        or int(k) < 1
        or (num_candidates is not None and int(k) > num_candidates)
    ):
        raise ValueError(f"k must be an integer in [1, {upper}], got {k!r}")
    return int(k)


def check_dropout(dropout: Any) -> float:
    """Return the tolerated dropout fraction ``xi`` as float; it must lie in ``[0, 1)`` (Appendix A)."""
    if isinstance(dropout, bool) or not isinstance(dropout, Real) or not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"dropout must be a number in [0, 1), got {dropout!r}")
    return float(dropout)


def check_clients(clients: Any) -> int:
    """Return the number of clients ``n`` as int; it must be an integer in ``[2, MAX_CLIENTS]``: secure
    summation needs 2, and the exact secure sum's range is fixed up to :data:`MAX_CLIENTS`."""
    if isinstance(clients, bool) or not isinstance(clients, Integral) or not 2 <= int(clients) <= MAX_CLIENTS:
        raise ValueError(f"clients must be an integer in [2, {MAX_CLIENTS}], got {clients!r}")
    return int(clients)


def check_sigma(sigma: Any) -> float:
    """Return the total noise std ``sigma`` as float; it must be a finite number > 0."""
    return check_positive("sigma", sigma)


def check_noise(noise: Any) -> str:
    """Return the noise kind; it must be one of :data:`NOISE_KINDS`."""
    if noise not in NOISE_KINDS:
        raise ValueError(f"noise must be one of {', '.join(NOISE_KINDS)}, got {noise!r}")
    return str(noise)


def check_neighbouring(neighbouring: Any) -> str:
    """Return the neighbouring relation; it must be one of :data:`NEIGHBOURING`."""
    if neighbouring not in NEIGHBOURING:
        raise ValueError(f"neighbouring must be one of {', '.join(NEIGHBOURING)}, got {neighbouring!r}")
    return str(neighbouring)


def resolve_accountant(accountant: str | None, noise: str) -> str:
    """Validate ``accountant`` for ``noise``; ``None`` or ``"auto"`` picks the default (analytic for Gaussian,
    rdp for Skellam).

    The analytic Gaussian accountant is exact only for Gaussian noise, so it is refused for Skellam noise.
    """
    noise = check_noise(noise)
    if accountant is None or accountant == "auto":
        return DEFAULT_ACCOUNTANT[noise]
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {', '.join(ACCOUNTANTS)} (or auto), got {accountant!r}")
    if noise == "skellam" and accountant != "rdp":
        raise ValueError(f"accountant must be 'rdp' for skellam noise, got {accountant!r}")
    return str(accountant)


def check_budget(
    epsilon: Any,
    delta: Any,
    k: Any,
    *,
    num_candidates: Any = None,
    clients: Any = None,
    dropout: Any = None,
) -> None:
    """Validate a full DP-Hype configuration at once (each argument only when given)."""
    check_epsilon(epsilon)
    check_delta(delta)
    p = None if num_candidates is None else check_num_candidates(num_candidates)
    check_k(k, p)
    if clients is not None:
        check_clients(clients)
    if dropout is not None:
        check_dropout(dropout)


def check_probability(name: str, value: Any) -> float:
    """Return ``value`` as float; it must be a number in ``[0, 1]``, else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)
