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
#: Largest privacy budget any entry point accepts (`check_epsilon_budget`): a guarantee lets the odds of any
#: inference about one client grow by up to ``e^epsilon``, about ``2.7e43`` here, which bounds nothing an attacker
#: could observe (far above it, the winner-only release's noise parameter underflows double precision).
MAX_EPSILON: float = 100.0
#: Relative slack when comparing an announced epsilon with one recomputed from the noise (request, policy, ledger).
EPSILON_RTOL = 1e-6


def check_positive(name: str, value: Any) -> float:
    """``value`` as float, refused unless a finite real number (not a bool) ``> 0``."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_epsilon(epsilon: Any) -> float:
    """The privacy budget epsilon as float: any finite number ``> 0`` (the mathematical functions' check)."""
    return check_positive("epsilon", epsilon)


def check_epsilon_budget(epsilon: Any, name: str = "epsilon") -> float:
    """A budget a user sets (configuration, run config, command line): a finite number in ``(0, MAX_EPSILON]``."""
    value = math.nan if isinstance(epsilon, bool) or not isinstance(epsilon, Real) else float(epsilon)
    if not 0.0 < value <= MAX_EPSILON:  # NaN fails it too
        too_large = value > MAX_EPSILON
        why = (f"\nabove {MAX_EPSILON:g} the guarantee lets the odds of any inference about one client grow by more "
               f"than e^{MAX_EPSILON:g}, about {math.exp(MAX_EPSILON):.1e}: no privacy" if too_large else "")
        raise ValueError(f"{name} must be a finite number in (0, {MAX_EPSILON:g}], got {epsilon!r}; set {name} within "
                         f"it, e.g. 1{why}\n(DP-Hype is meant for about 0.1 to 10)")
    return value


def check_delta(delta: Any) -> float:
    """The privacy parameter delta as float, in the open interval ``(0, 1)``."""
    if isinstance(delta, bool) or not isinstance(delta, Real) or not 0.0 < float(delta) < 1.0:
        raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
    return float(delta)


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as int, refused unless an integer (not a bool) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_num_candidates(num_candidates: Any) -> int:
    """The number of candidates ``p`` as int, ``>= 1``."""
    return check_int("num_candidates", num_candidates, 1)


def check_k(k: Any, num_candidates: int | None = None) -> int:
    """Votes per client ``k`` as int, in ``[1, num_candidates]`` (no upper bound for ``None``)."""
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
    """The tolerated dropout fraction ``xi`` (Appendix A) as float, in ``[0, 1)``."""
    if isinstance(dropout, bool) or not isinstance(dropout, Real) or not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"dropout must be a number in [0, 1), got {dropout!r}")
    return float(dropout)


def check_clients(clients: Any) -> int:
    """The number of clients ``n`` as int, in ``[2, MAX_CLIENTS]`` (the exact secure sum's range is fixed up to it)."""
    if isinstance(clients, bool) or not isinstance(clients, Integral) or not 2 <= int(clients) <= MAX_CLIENTS:
        raise ValueError(f"clients must be an integer in [2, {MAX_CLIENTS}], got {clients!r}")
    return int(clients)


def check_sigma(sigma: Any) -> float:
    """The total noise standard deviation ``sigma`` as float, a finite number ``> 0``."""
    return check_positive("sigma", sigma)


def check_neighbouring(neighbouring: Any) -> str:
    """The neighbouring relation as str, one of `NEIGHBOURING`."""
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
    """Validate a full DP-Hype configuration at once, each keyword argument only when given (``k`` against ``p``)."""
    check_epsilon(epsilon)
    check_delta(delta)
    p = None if num_candidates is None else check_num_candidates(num_candidates)
    check_k(k, p)
    if clients is not None:
        check_clients(clients)
    if dropout is not None:
        check_dropout(dropout)


def check_probability(name: str, value: Any) -> float:
    """``value`` as float, refused unless a number in ``[0, 1]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)
