"""Argument checks shared by every layer (the bottom of the package: it imports nothing from dphype).

Each ``check_*`` returns the value in its canonical type or raises ``ValueError`` naming the parameter and
its allowed range, so a bad input fails where it enters (configuration, CLI, request, node policy).
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

#: Accountants: the analytic Gaussian mechanism's and Renyi DP's (each noise kind names those valid for it:
#: `dphype.privacy.noise_kinds`).
ACCOUNTANTS: tuple[str, ...] = ("analytic", "rdp")
#: Neighbouring relations: replace one client's data (the paper's) or add/remove one client (DP-FedAvg's).
NEIGHBOURING: tuple[str, ...] = ("replace-one", "add-remove")
#: Largest federation accepted: the secure sum's clipping range C(n) is still 2**17 there
#: (`dphype.secure.secure_sum.clipping_range_for`).
MAX_CLIENTS: int = 10_000
#: The default noise kind of a selection (and of every replay of one; `dphype.privacy.noise_kinds`).
DEFAULT_NOISE = "skellam"
#: Relative slack when comparing an announced epsilon with one recomputed from the noise (request, policy, ledger).
EPSILON_RTOL = 1e-6


def check_positive(name: str, value: Any) -> float:
    """Check a positive finite number.

    Args:
        name: The parameter's name, for the error message.
        value: A finite real number (not a bool) ``> 0``.

    Returns:
        ``value`` as float.

    Raises:
        ValueError: ``value`` is not a finite number ``> 0``; the message names ``name`` and the allowed range.
    """
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_epsilon(epsilon: Any) -> float:
    """Check the privacy budget epsilon.

    Args:
        epsilon: A finite number ``> 0``.

    Returns:
        ``epsilon`` as float.

    Raises:
        ValueError: ``epsilon`` is not a finite number ``> 0``.
    """  # noqa: DOC502
    return check_positive("epsilon", epsilon)


def check_delta(delta: Any) -> float:
    """Check the privacy parameter delta.

    Args:
        delta: A number in the open interval ``(0, 1)``.

    Returns:
        ``delta`` as float.

    Raises:
        ValueError: ``delta`` is not a number in ``(0, 1)``.
    """
    if isinstance(delta, bool) or not isinstance(delta, Real) or not 0.0 < float(delta) < 1.0:
        raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
    return float(delta)


def check_int(name: str, value: Any, minimum: int) -> int:
    """Check an integer with a lower bound.

    Args:
        name: The parameter's name, for the error message.
        value: An integer (not a bool) ``>= minimum``.
        minimum: The smallest value allowed.

    Returns:
        ``value`` as int.

    Raises:
        ValueError: ``value`` is not an integer ``>= minimum``; the message names ``name`` and the allowed range.
    """
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_num_candidates(num_candidates: Any) -> int:
    """Check the number of candidates ``p``.

    Args:
        num_candidates: An integer ``>= 1``.

    Returns:
        ``num_candidates`` as int.

    Raises:
        ValueError: ``num_candidates`` is not an integer ``>= 1``.
    """  # noqa: DOC502
    return check_int("num_candidates", num_candidates, 1)


def check_k(k: Any, num_candidates: int | None = None) -> int:
    """Check the number of votes per client ``k``.

    Args:
        k: An integer in ``[1, num_candidates]``.
        num_candidates: The number of candidates ``p``; ``None``: no upper bound is checked.

    Returns:
        ``k`` as int.

    Raises:
        ValueError: ``k`` is not an integer in ``[1, num_candidates]``.
    """
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
    """Check the tolerated dropout fraction ``xi`` (Appendix A).

    Args:
        dropout: A number in ``[0, 1)``.

    Returns:
        ``dropout`` as float.

    Raises:
        ValueError: ``dropout`` is not a number in ``[0, 1)``.
    """
    if isinstance(dropout, bool) or not isinstance(dropout, Real) or not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"dropout must be a number in [0, 1), got {dropout!r}")
    return float(dropout)


def check_clients(clients: Any) -> int:
    """Check the number of clients ``n``.

    Secure summation needs 2 clients, and the exact secure sum's range is fixed up to `MAX_CLIENTS`.

    Args:
        clients: An integer in ``[2, MAX_CLIENTS]``.

    Returns:
        ``clients`` as int.

    Raises:
        ValueError: ``clients`` is not an integer in ``[2, MAX_CLIENTS]``.
    """
    if isinstance(clients, bool) or not isinstance(clients, Integral) or not 2 <= int(clients) <= MAX_CLIENTS:
        raise ValueError(f"clients must be an integer in [2, {MAX_CLIENTS}], got {clients!r}")
    return int(clients)


def check_sigma(sigma: Any) -> float:
    """Check the total noise standard deviation ``sigma``.

    Args:
        sigma: A finite number ``> 0``.

    Returns:
        ``sigma`` as float.

    Raises:
        ValueError: ``sigma`` is not a finite number ``> 0``.
    """  # noqa: DOC502
    return check_positive("sigma", sigma)


def check_neighbouring(neighbouring: Any) -> str:
    """Check the neighbouring relation.

    Args:
        neighbouring: One of `NEIGHBOURING`.

    Returns:
        ``neighbouring`` as str.

    Raises:
        ValueError: ``neighbouring`` is not one of `NEIGHBOURING`.
    """
    if neighbouring not in NEIGHBOURING:
        raise ValueError(f"neighbouring must be one of {', '.join(NEIGHBOURING)}, got {neighbouring!r}")
    return str(neighbouring)


def check_budget(
    epsilon: Any,
    delta: Any,
    k: Any,
    *,
    num_candidates: Any = None,
    clients: Any = None,
    dropout: Any = None,
) -> None:
    """Validate a full DP-Hype configuration at once (each keyword argument only when given).

    Args:
        epsilon: The privacy budget, see `check_epsilon`.
        delta: The privacy parameter, see `check_delta`.
        k: Votes per client, see `check_k` (bounded by ``num_candidates`` when given).
        num_candidates: The number of candidates, see `check_num_candidates`.
        clients: The number of clients, see `check_clients`.
        dropout: The tolerated dropout fraction, see `check_dropout`.

    Raises:
        ValueError: Any of them is out of its range.
    """  # noqa: DOC502
    check_epsilon(epsilon)
    check_delta(delta)
    p = None if num_candidates is None else check_num_candidates(num_candidates)
    check_k(k, p)
    if clients is not None:
        check_clients(clients)
    if dropout is not None:
        check_dropout(dropout)


def check_probability(name: str, value: Any) -> float:
    """Check a probability.

    Args:
        name: The parameter's name, for the error message.
        value: A number in ``[0, 1]``.

    Returns:
        ``value`` as float.

    Raises:
        ValueError: ``value`` is not a number in ``[0, 1]``; the message names ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)
