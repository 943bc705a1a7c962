"""Client-side noise shares for distributed DP under secure summation (DP-Hype Section I-A, Appendix A).

Each of ``n`` clients adds an independent share to its vote vector; only the sum is revealed, so the
released sum carries the sum of the survivors' shares. Tolerating a dropout fraction ``xi``
(Appendix A), every share has variance ``sigma^2 / ((1 - xi) n)``: any ``m >= (1 - xi) n`` survivors
together contribute variance ``m sigma^2 / ((1 - xi) n) >= sigma^2``. The server never adds noise.

* ``"gaussian"``: ``N(0, sigma^2 / ((1 - xi) n))`` as float64 (sums of Gaussians are Gaussian).
* ``"skellam"``: ``Pois(mu) - Pois(mu)`` with ``mu = sigma^2 / (2 (1 - xi) n)`` as int64; sums of
  independent Skellams are Skellam (Agarwal, Kairouz & Liu, NeurIPS 2021), so integer secure summation is
  exact and the Skellam accountant applies to the total variance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm, skellam

from dphype.accounting import check_clients, check_dropout, check_noise, check_sigma

#: (1 - xi) n within this distance of an integer is treated as that integer (float representation of xi);
#: the effect on the total variance is below 1e-9 relative.
_SURVIVOR_ROUNDING = 1e-9


def client_noise_variance(sigma: float, clients: int, dropout: float) -> float:
    """Per-client share variance ``sigma^2 / ((1 - xi) n)`` (Appendix A)."""
    sigma, clients, dropout = check_sigma(sigma), check_clients(clients), check_dropout(dropout)
    return sigma**2 / ((1.0 - dropout) * clients)


def client_noise_std(sigma: float, clients: int, dropout: float) -> float:
    """Per-client share std ``sigma / sqrt((1 - xi) n)`` (Appendix A)."""
    return math.sqrt(client_noise_variance(sigma, clients, dropout))


def min_survivors(clients: int, dropout: float) -> int:
    """Fewest surviving clients whose shares still sum to total variance ``>= sigma^2``: ``ceil((1 - xi) n)``.

    ``m`` survivors give variance ``m sigma^2 / ((1 - xi) n)``, which is ``>= sigma^2`` iff
    ``m >= (1 - xi) n``; the smallest integer such ``m`` is the ceiling.
    """
    clients, dropout = check_clients(clients), check_dropout(dropout)
    return max(1, math.ceil((1.0 - dropout) * clients - _SURVIVOR_ROUNDING))


def noise_share(
    size: int | tuple[int, ...],
    *,
    sigma: float,
    clients: int,
    dropout: float,
    kind: str,
    rng: np.random.Generator,
) -> np.ndarray:
    """One client's noise share of shape ``size`` for total noise std ``sigma`` (see module docstring)."""
    kind = check_noise(kind)
    variance = client_noise_variance(sigma, clients, dropout)
    if kind == "gaussian":
        return rng.normal(0.0, math.sqrt(variance), size=size).astype(np.float64, copy=False)
    mu = variance / 2.0
    return (rng.poisson(mu, size=size) - rng.poisson(mu, size=size)).astype(np.int64, copy=False)


@dataclass(frozen=True)
class TailBound:
    """Range that one client's ``vote + noise`` entries and the survivors' sum stay within.

    ``client_max_abs``: bound on ``|vote + share|`` per entry; ``sum_max_abs``: bound on ``|sum|`` per entry
    when all ``clients`` contribute (the most noise); ``failure_probability``: union bound on the chance
    that any of ``clients * size`` share entries exceeds ``num_sigmas`` client stds (then the sum bound
    holds too, since each share is within its bound) -- exact tails of the share distribution.
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
    """Secure-sum range check: Gaussian and Skellam shares are unbounded, so bound them with high probability.

    A share entry exceeds ``t = num_sigmas * client_std`` with probability ``2 P(X > t)`` (Gaussian:
    ``2 Phi(-num_sigmas)``; Skellam: exact ``scipy.stats.skellam`` tail). Union over ``clients * size``
    entries gives ``failure_probability``. With every share within ``t`` each client's entry is within
    ``max_vote + t`` and the sum within ``clients * (max_vote + t)``; the sum is also bounded, with the
    same union bound plus one more tail term, by ``clients * max_vote + num_sigmas * sigma_all`` where
    ``sigma_all = client_std * sqrt(clients)``. The smaller of the two is reported. Use it to refuse
    configurations whose range does not fit the secure-sum modulus or clipping range.
    """
    kind = check_noise(kind)
    if not math.isfinite(num_sigmas) or num_sigmas <= 0:
        raise ValueError(f"num_sigmas must be a finite number > 0, got {num_sigmas!r}")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"size must be an integer >= 1, got {size!r}")
    if not math.isfinite(max_vote) or max_vote < 0:
        raise ValueError(f"max_vote must be a finite number >= 0, got {max_vote!r}")
    std = client_noise_std(sigma, clients, dropout)
    t = num_sigmas * std
    if kind == "gaussian":
        one_tail = float(norm.sf(num_sigmas))
        sum_tail = one_tail
    else:
        mu = std**2 / 2.0
        one_tail = float(skellam.sf(math.floor(t), mu, mu))  # P(X > t) for integer X
        all_mu = mu * clients
        sum_tail = float(skellam.sf(math.floor(num_sigmas * std * math.sqrt(clients)), all_mu, all_mu))
    per_share = 2.0 * one_tail * clients * size
    sum_total = 2.0 * sum_tail * size
    failure = min(1.0, per_share + sum_total)
    sum_max = min(clients * (max_vote + t), clients * max_vote + num_sigmas * std * math.sqrt(clients))
    return TailBound(
        client_max_abs=max_vote + t,
        sum_max_abs=sum_max,
        num_sigmas=float(num_sigmas),
        failure_probability=failure,
    )
