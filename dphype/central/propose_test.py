"""Propose-test hyperparameter tuning with doubling step (Ding & Wu, NeurIPS 2022 ML Safety WS, Alg. 1).

1. Subsample and aggregate (lines 3-11): split the training set into ``k`` disjoint parts, train
   every candidate ``s`` on every part and average the ``k`` utilities, ``u_s = mean_i u_s^(i)``.
   Adding or removing one record changes one part, so each ``u_s`` moves by at most ``1/k``.
2. Propose-test loop (lines 12-32): propose ``u_hat = u + step g + Lap(2/(k eps0))``; scan the
   candidates in order with fresh ``gamma_s ~ Lap(4/(k eps0))`` and take the first with
   ``u_s + gamma_s >= u_hat`` (AboveThreshold); on success ``s* = s``, ``u += step g``,
   ``step *= 2``; otherwise ``step = floor(step / 2)``; stop when ``step = 0`` or ``u >= 1``.
3. The selected candidate is then trained (privately with (epsilon, delta) in the paper, line 33).

Privacy (the paper's theorem): each loop iteration is ``eps0``-DP; ``T`` iterations compose by
advanced composition (Dwork, Rothblum, Vadhan 2010) to ``O~(sqrt(T)) eps0``, plus the final
training's ``(epsilon, delta)`` by basic composition. The paper reports ``T`` as the number of
iterations actually run (it depends on the data). A data-independent bound also holds: at most
``ceil((1 - u0)/g)`` accumulations (each adds ``>= g`` while ``u < 1``) and at most one more
failure than accumulations (``step`` starts at 1 and a failure at ``step = 1`` ends the loop), so
``T <= 2 ceil((1 - u0)/g) + 1``; `calibrate_eps0` uses it to fit a budget in advance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import brentq

from dphype.checks import check_delta, check_epsilon

ASSUMPTIONS: tuple[str, ...] = (
    "add/remove-one neighbours of the training set; the k parts are disjoint, so each averaged utility "
    "has sensitivity 1/k (utilities in [0, 1])",
    "each propose-test iteration is eps0-DP (Ding & Wu, Thm proof); iterations compose by advanced "
    "composition with slack delta'",
    "trusted curator: one party holds all partitions and sees every utility",
)


def advanced_composition(eps0: float, iterations: int, delta_slack: float) -> float:
    """Epsilon of ``iterations`` adaptive ``eps0``-DP mechanisms (Dwork & Roth, Thm 3.20).

    ``min(T eps0, sqrt(2 T ln(1/delta')) eps0 + T eps0 (e^eps0 - 1))`` at extra delta ``delta'`` (the basic bound
    ``T eps0`` needs no slack).

    Args:
        eps0: Each mechanism's epsilon.
        iterations: Their number ``T``.
        delta_slack: The extra delta ``delta'``.

    Returns:
        The composed epsilon.
    """
    if iterations == 0:
        return 0.0
    if eps0 >= 1.0:  # then T eps0 (e^eps0 - 1) alone exceeds T eps0
        return iterations * eps0
    advanced = math.sqrt(2.0 * iterations * math.log(1.0 / delta_slack)) * eps0 + iterations * eps0 * math.expm1(eps0)
    return min(iterations * eps0, advanced)


def worst_case_iterations(granularity: float, lower_bound: float) -> int:
    """Data-independent bound ``2 ceil((1 - u0) / g) + 1`` on the loop length (module docstring)."""
    return 2 * math.ceil((1.0 - lower_bound) / granularity - 1e-12) + 1


def calibrate_eps0(epsilon: float, delta_slack: float, granularity: float, lower_bound: float) -> float:
    """Largest ``eps0`` whose worst-case composition (`worst_case_iterations`) is ``epsilon`` at ``delta_slack``."""
    t_max = worst_case_iterations(granularity, lower_bound)
    return brentq(lambda e: advanced_composition(e, t_max, delta_slack) - epsilon, 1e-12, epsilon, xtol=1e-14)


@dataclass
class ProposeTestResult:
    """Outcome of Alg. 1's loop.

    Attributes:
        index: The selected index (``None`` if nothing was ever accepted).
        iterations: The iterations run ``T``.
        utility_level: The final utility level ``u``.
        eps0: The per-iteration epsilon.
        epsilon_tuning: The epsilon of the iterations run (`advanced_composition`).
        epsilon_tuning_worst_case: The epsilon of the worst-case number of iterations.
        delta_tuning: The delta of the composition (``delta'``).
        steps: ``(u, step, accepted)`` after every iteration.
        assumptions: The privacy claim's assumptions.
    """

    index: int | None
    iterations: int
    utility_level: float
    eps0: float
    epsilon_tuning: float
    epsilon_tuning_worst_case: float
    delta_tuning: float
    steps: list[tuple[float, int, bool]] = field(default_factory=list)
    assumptions: tuple[str, ...] = ASSUMPTIONS

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary with the accountant (without the steps)."""
        return {
            "index": self.index,
            "iterations": self.iterations,
            "utility_level": self.utility_level,
            "eps0": self.eps0,
            "epsilon_tuning": self.epsilon_tuning,
            "epsilon_tuning_worst_case": self.epsilon_tuning_worst_case,
            "delta_tuning": self.delta_tuning,
            "accountant": "advanced composition of eps0-DP iterations (Dwork-Rothblum-Vadhan)",
            "assumptions": list(self.assumptions),
        }


def aggregate_utilities(part_utilities: np.ndarray) -> np.ndarray:
    """Alg. 1 line 9: ``u_s = (1/k) sum_i u_s^(i)``; utilities outside ``[0, 1]`` (or NaN) are refused."""
    u = np.asarray(part_utilities, dtype=np.float64)
    if u.ndim != 2 or u.shape[0] < 1 or u.shape[1] < 1:
        raise ValueError(f"part utilities must be a non-empty (k, candidates) matrix, got shape {u.shape}")
    if not np.all((u >= 0.0) & (u <= 1.0)):  # also rejects NaN
        raise ValueError("part utilities must lie in [0, 1] (a NaN marks a failed candidate: score it 0)")
    return u.mean(axis=0)


def propose_test(
    part_utilities: np.ndarray,
    *,
    eps0: float,
    granularity: float,
    lower_bound: float,
    delta_slack: float,
    rng: np.random.Generator,
) -> ProposeTestResult:
    """Ding & Wu Alg. 1, lines 1-32, on the ``(k, |S|)`` matrix of per-part utilities.

    Args:
        part_utilities: The ``(k, |S|)`` per-part utilities, in ``[0, 1]``.
        eps0: The per-iteration budget.
        granularity: ``g``, in ``(0, 1)``.
        lower_bound: ``u0``, in ``[0, 1)``.
        delta_slack: The ``delta'`` of advanced composition.
        rng: The generator of the Laplace noise.

    Returns:
        The selected index and the loop's accounting.

    Raises:
        ValueError: An argument is out of its range.
    """
    check_epsilon(eps0)
    check_delta(delta_slack)
    if not 0.0 < granularity < 1.0:
        raise ValueError(f"granularity g must be in (0, 1), got {granularity}")
    if not 0.0 <= lower_bound < 1.0:
        raise ValueError(f"lower_bound u0 must be in [0, 1), got {lower_bound}")
    k = np.asarray(part_utilities).shape[0] if np.ndim(part_utilities) == 2 else 0
    u_s = aggregate_utilities(part_utilities)
    selected: int | None = None
    u, step, count = lower_bound, 1, 0
    steps: list[tuple[float, int, bool]] = []
    while step != 0:
        count += 1
        threshold = u + step * granularity + rng.laplace(0.0, 2.0 / (k * eps0))
        accepted = False
        for s in range(len(u_s)):
            if u_s[s] + rng.laplace(0.0, 4.0 / (k * eps0)) >= threshold:
                selected = s
                u += step * granularity
                accepted = True
                step *= 2
                break
        if not accepted:
            step //= 2
        steps.append((u, step, accepted))
        if u >= 1.0:
            break
    t_max = worst_case_iterations(granularity, lower_bound)
    return ProposeTestResult(
        index=selected,
        iterations=count,
        utility_level=u,
        eps0=eps0,
        epsilon_tuning=advanced_composition(eps0, count, delta_slack),
        epsilon_tuning_worst_case=advanced_composition(eps0, t_max, delta_slack),
        delta_tuning=delta_slack,
        steps=steps,
    )
