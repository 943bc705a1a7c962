"""Differentially private Bayesian optimisation (Kusner, Gardner, Garnett, Weinberger, ICML 2015).

GP-UCB over a finite candidate set ``Lambda`` (Alg. 1, lines 2-8) with
``beta_t = 2 log(|Lambda| t^2 pi^2 / (3 delta))``, then

* the best hyperparameter released by the exponential mechanism on the posterior mean
  ``mu_T`` with the sensitivity bound of Theorem 1, ``2 sqrt(beta_{T+1}) + c``
  (Alg. 1 line 12; Corollary 1: (epsilon, delta)-DP);
* the best validation gain released by the Laplace mechanism with the sensitivity of
  Theorem 3, ``sqrt(C1 beta_T gamma_T / T) + c + q`` (Alg. 1 lines 13-15; Corollary 2);
* Alg. 3: the best gain under Assumption 2 (Lipschitz validation loss, convex Lipschitz
  training loss, L2 regularisation as the hyperparameter) with the sensitivity of Theorem 7,
  for any acquisition function (Corollary 4: epsilon-DP).

Assumptions (also returned in every result's ``assumptions``):

* Alg. 1 (Assumption 1): the validation gains of ALL data sets are jointly a GP with known,
  normalised kernels ``k1(V, V') k2(lambda, lambda')`` (``k2`` fixed, not fitted on the data;
  ``1 - k1(V, V')`` for neighbours is given), ``|Lambda| < inf``, and observations carry
  Gaussian noise of known variance ``sigma^2 > 0``. Privacy holds only with probability
  ``1 - delta`` over that model; nothing is guaranteed if the GP assumption is false.
* Only the validation set is protected; the training set is public (Sec. 2, Sec. 7).
* Releasing both outputs costs (2 epsilon, 2 delta) (basic composition).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dphype.checks import check_delta, check_epsilon, check_positive

ASSUMPTIONS_ALG1: tuple[str, ...] = (
    "Assumption 1 (Kusner et al. 2015): validation gains of all data sets are jointly a GP with known "
    "normalised kernels k1(V,V') k2(lambda,lambda'); k2 fixed in advance (Matern 5/2, given lengthscale), "
    "1 - k1(V,V') for neighbouring validation sets given",
    "finite candidate set; Gaussian observation noise with known variance > 0",
    "privacy holds with probability 1 - delta over the GP model (Thm 1 / Thm 3)",
    "protects the validation set only; the training set is treated as public",
    "trusted curator: one party holds all data and runs the whole search",
)

ASSUMPTIONS_ALG3: tuple[str, ...] = (
    "Assumption 2 (Kusner et al. 2015): validation score is the mean of an L-Lipschitz loss bounded by g*; "
    "the model minimises lambda/2 ||w||^2 + mean training loss with a 1-Lipschitz convex loss; "
    "lambda in [lambda_min, lambda_max]",
    "protects the validation set only; the training set is treated as public",
    "trusted curator: one party holds all data and runs the whole search",
)


# ------------------------------------------------------------------------------------ GP on Lambda
def matern52(a: np.ndarray, b: np.ndarray, lengthscale: float) -> np.ndarray:
    """Normalised Matern 5/2 kernel ``(1 + sqrt5 r/l + 5 r^2/(3 l^2)) exp(-sqrt5 r/l)``, ``r = ||a - b||`` (Sec. 2)."""
    if not lengthscale > 0:
        raise ValueError(f"lengthscale must be > 0, got {lengthscale}")
    r = np.sqrt(np.maximum(((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=-1), 0.0))
    s = math.sqrt(5.0) * r / lengthscale
    return (1.0 + s + s * s / 3.0) * np.exp(-s)


def gp_posterior(
    kernel: np.ndarray, observed: Sequence[int], values: Sequence[float] | np.ndarray, noise_var: float
) -> tuple[np.ndarray, np.ndarray]:
    """Kusner et al. Eq. (2) on a finite set, prior mean 0: the ``(|Lambda|,)`` posterior mean and std."""
    idx = np.asarray(observed, dtype=np.int64)
    if len(idx) == 0:
        return np.zeros(len(kernel)), np.sqrt(np.diag(kernel))
    k_tt = kernel[np.ix_(idx, idx)] + noise_var * np.eye(len(idx))
    k_xt = kernel[:, idx]
    chol = np.linalg.cholesky(k_tt)
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, np.asarray(values, dtype=np.float64)))
    v = np.linalg.solve(chol, k_xt.T)
    var = np.diag(kernel) - (v * v).sum(axis=0)
    return k_xt @ alpha, np.sqrt(np.maximum(var, 0.0))


def ucb_beta(t: int, num_candidates: int, delta: float) -> float:
    """Alg. 1 line 4: ``beta_t = 2 log(|Lambda| t^2 pi^2 / (3 delta))``."""
    return 2.0 * math.log(num_candidates * t * t * math.pi**2 / (3.0 * delta))


@dataclass
class UCBTrace:
    """GP-UCB run: sampled indices, their noisy gains, and the final posterior over ``Lambda``.

    Attributes:
        indices: The sampled indices, in order.
        values: Their noisy gains.
        mean: The ``(|Lambda|,)`` final posterior mean.
        std: The ``(|Lambda|,)`` final posterior standard deviation.
    """

    indices: list[int]
    values: list[float]
    mean: np.ndarray
    std: np.ndarray


def gp_ucb(
    gain: Callable[[int], float],
    kernel: np.ndarray,
    iterations: int,
    *,
    delta: float,
    noise_var: float,
) -> UCBTrace:
    """Alg. 1 lines 2-8: ``lambda_t = argmax mu_{t-1} + sqrt(beta_t) sigma_{t-1}`` (ties: lowest), observe, update.

    Args:
        gain: Observes the (noisy) gain of a candidate index.
        kernel: The ``(|Lambda|, |Lambda|)`` prior covariance.
        iterations: ``T``.
        delta: The failure probability of ``beta_t``.
        noise_var: The observation noise variance.

    Returns:
        The run.
    """
    p = len(kernel)
    indices: list[int] = []
    values: list[float] = []
    mean, std = gp_posterior(kernel, indices, values, noise_var)
    for t in range(1, iterations + 1):
        i = int(np.argmax(mean + math.sqrt(ucb_beta(t, p, delta)) * std))
        indices.append(i)
        values.append(float(gain(i)))
        mean, std = gp_posterior(kernel, indices, values, noise_var)
    return UCBTrace(indices, values, mean, std)


def max_information_gain_bound(kernel: np.ndarray, iterations: int, noise_var: float) -> float:
    """Upper bound on ``gamma_T = max_{|A| = T} 1/2 log det(I + K_A / sigma^2)`` over multisets of ``Lambda``.

    The information gain is monotone submodular, so greedy selection (largest posterior variance, Srinivas et al.
    2010, Lemma 5.3) reaches at least ``(1 - 1/e)`` of the optimum (Nemhauser et al. 1978):
    ``gamma_T <= greedy / (1 - 1/e)``.

    Args:
        kernel: The ``(|Lambda|, |Lambda|)`` prior covariance.
        iterations: ``T``.
        noise_var: ``sigma^2``.

    Returns:
        The bound.
    """
    chosen: list[int] = []
    total = 0.0
    for _ in range(iterations):
        _, std = gp_posterior(kernel, chosen, np.zeros(len(chosen)), noise_var)
        i = int(np.argmax(std))
        total += 0.5 * math.log1p(std[i] ** 2 / noise_var)
        chosen.append(i)
    return total / (1.0 - 1.0 / math.e)


# -------------------------------------------------------------------------------------- sensitivities
def neighbour_gap(kernel_gap: float, num_candidates: int, delta: float) -> float:
    """``c`` of Alg. 1 line 9 / Theorem 1: ``2 sqrt((1 - k1) log(3 |Lambda| / delta))``.

    ``|f_V - f_V'| <= sigma_1 sqrt(2 log(3|Lambda|/delta))`` for all ``lambda`` w.p. ``1 - delta/3``, with
    ``sigma_1 = sqrt(2 (1 - k1(V, V')))``.

    Args:
        kernel_gap: ``1 - k1(V, V')``, in ``[0, 1]``.
        num_candidates: ``|Lambda|``.
        delta: The failure probability.

    Returns:
        ``c``.

    Raises:
        ValueError: ``kernel_gap`` is outside ``[0, 1]``.
    """
    if not 0.0 <= kernel_gap <= 1.0:
        raise ValueError(f"kernel_gap (1 - k1(V, V')) must be in [0, 1], got {kernel_gap}")
    return 2.0 * math.sqrt(kernel_gap * math.log(3.0 * num_candidates / delta))


def mean_sensitivity(iterations: int, num_candidates: int, delta: float, kernel_gap: float) -> float:
    """Theorem 1: ``|mu'_T(lambda) - mu_T(lambda)| <= 2 sqrt(beta_{T+1}) + c`` w.p. ``1 - delta``."""
    return 2.0 * math.sqrt(ucb_beta(iterations + 1, num_candidates, delta)) + neighbour_gap(
        kernel_gap, num_candidates, delta
    )


def gain_sensitivity(
    iterations: int, num_candidates: int, delta: float, kernel_gap: float, noise_var: float, gamma_t: float
) -> float:
    """Theorem 3 (Alg. 1 lines 9-14): ``sqrt(C1 beta_T gamma_T / T) + c + q``.

    ``C1 = 8 / log(1 + sigma^-2)``, ``q = sigma sqrt(8 log(3 / delta))``, ``gamma_T`` from
    `max_information_gain_bound`; ``kernel_gap`` outside ``[0, 1]`` is refused.

    Args:
        iterations: ``T``.
        num_candidates: ``|Lambda|``.
        delta: The failure probability.
        kernel_gap: ``1 - k1(V, V')``.
        noise_var: ``sigma^2``.
        gamma_t: ``gamma_T``.

    Returns:
        The sensitivity of the best observed gain.
    """
    c1 = 8.0 / math.log1p(1.0 / noise_var)
    q = math.sqrt(noise_var) * math.sqrt(8.0 * math.log(3.0 / delta))
    beta = ucb_beta(iterations, num_candidates, delta)
    return math.sqrt(c1 * beta * gamma_t / iterations) + neighbour_gap(kernel_gap, num_candidates, delta) + q


def lipschitz_gain_sensitivity(
    validation_size: int, lipschitz: float, lam_min: float, lam_max: float, loss_bound: float
) -> float:
    """Theorem 7 / Alg. 3 line 5: total sensitivity of the best validation score.

    ``min(g*/m, L/(m lambda_min)) + (lambda_max - lambda_min) L / (lambda_max lambda_min)``.

    Args:
        validation_size: ``m``, ``>= 1``.
        lipschitz: ``L > 0``.
        lam_min: ``lambda_min > 0``.
        lam_max: ``lambda_max >= lambda_min``.
        loss_bound: ``g* > 0``.

    Returns:
        The sensitivity.

    Raises:
        ValueError: An argument is out of its range.
    """
    if not 0 < lam_min <= lam_max:
        raise ValueError(f"need 0 < lambda_min <= lambda_max, got {lam_min}, {lam_max}")
    if validation_size < 1 or lipschitz <= 0 or loss_bound <= 0:
        raise ValueError("validation_size must be >= 1, lipschitz and loss_bound > 0")
    m = validation_size
    return min(loss_bound / m, lipschitz / (m * lam_min)) + (lam_max - lam_min) * lipschitz / (lam_max * lam_min)


# --------------------------------------------------------------------------------------- mechanisms
def exponential_mechanism_probabilities(utility: np.ndarray, epsilon: float, sensitivity: float) -> np.ndarray:
    """Def. 4 (McSherry & Talwar 2007): ``P(lambda) ~ exp(epsilon q(lambda) / (2 Delta))``, ``epsilon, Delta > 0``."""
    check_epsilon(epsilon)
    check_positive("sensitivity", sensitivity)
    logits = epsilon * np.asarray(utility, dtype=np.float64) / (2.0 * sensitivity)
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def laplace_scale(sensitivity: float, epsilon: float) -> float:
    """Def. 3: the Laplace mechanism's scale ``Delta / epsilon`` (both ``> 0``)."""
    check_epsilon(epsilon)
    check_positive("sensitivity", sensitivity)
    return sensitivity / epsilon


# ------------------------------------------------------------------------------------------- DP-BO
@dataclass
class DPBOResult:
    """Released outputs of DP-BO with their privacy cost and the assumptions they rest on.

    Attributes:
        index: The released index (exponential mechanism on ``mu_T``).
        noisy_gain: The released noisy best gain, or ``None``.
        epsilon_spent: The epsilon of the releases.
        delta_spent: Their delta.
        mean_sensitivity: Theorem 1's sensitivity.
        gain_sensitivity: Theorem 3's sensitivity, or ``None``.
        probabilities: The ``(|Lambda|,)`` exponential mechanism's probabilities.
        trace: The GP-UCB run.
        assumptions: The privacy claim's assumptions.
    """

    index: int
    noisy_gain: float | None
    epsilon_spent: float
    delta_spent: float
    mean_sensitivity: float
    gain_sensitivity: float | None
    probabilities: np.ndarray
    trace: UCBTrace
    assumptions: tuple[str, ...] = field(default=ASSUMPTIONS_ALG1)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary with the accountant (without the probabilities and the trace)."""
        return {
            "index": self.index,
            "noisy_gain": self.noisy_gain,
            "epsilon": self.epsilon_spent,
            "delta": self.delta_spent,
            "accountant": "exponential mechanism (Thm 1)" + (" + Laplace (Thm 3), basic composition"
                                                             if self.noisy_gain is not None else ""),
            "mean_sensitivity": self.mean_sensitivity,
            "gain_sensitivity": self.gain_sensitivity,
            "evaluations": len(self.trace.indices),
            "assumptions": list(self.assumptions),
        }


def candidate_features(candidates: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """Public numeric features in ``[0, 1]^d`` for ``k2``: min-max scaled keys (log scale if positive and over 10x)."""
    keys = sorted(candidates[0])
    cols = []
    for key in keys:
        vals = np.array([float(c[key]) for c in candidates])
        if (vals > 0).all() and vals.max() / vals.min() > 10.0:
            vals = np.log(vals)
        span = vals.max() - vals.min()
        if span > 0:
            cols.append((vals - vals.min()) / span)
    return np.stack(cols, axis=1) if cols else np.zeros((len(candidates), 1))


def dp_bo(
    gain: Callable[[int], float],
    features: np.ndarray,
    *,
    iterations: int,
    epsilon: float,
    delta: float,
    noise_var: float,
    kernel_gap: float,
    lengthscale: float = 0.5,
    release_gain: bool = True,
    rng: np.random.Generator,
) -> DPBOResult:
    """Kusner et al. Alg. 1 (noisy observations) on the candidates with ``features`` (rows).

    Releases the index drawn by the exponential mechanism on ``mu_T`` ((epsilon, delta)-DP, Cor. 1) and, if
    ``release_gain``, ``max_t v_t + Lap(Theorem 3 / epsilon)`` (another (epsilon, delta), Cor. 2).

    Args:
        gain: ``gain(i)`` observes the (noisy) validation gain of candidate ``i``.
        features: The ``(|Lambda|, d)`` candidate features (`candidate_features`).
        iterations: ``T``, ``>= 1``.
        epsilon: Each release's epsilon.
        delta: Each release's delta.
        noise_var: The observation noise variance, ``> 0`` (Alg. 1 needs noisy observations).
        kernel_gap: ``1 - k1(V, V')``, in ``[0, 1]``.
        lengthscale: The Matern kernel's lengthscale.
        release_gain: Also release the noisy best gain.
        rng: The generator of the mechanisms' noise.

    Returns:
        The releases and their privacy cost.

    Raises:
        ValueError: An argument is out of its range.
    """
    check_epsilon(epsilon)
    check_delta(delta)
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if not (noise_var > 0 and math.isfinite(noise_var)):
        raise ValueError(f"noise_var must be a finite number > 0 (Alg. 1 needs noisy observations), got {noise_var}")
    feats = np.asarray(features, dtype=np.float64)
    if feats.ndim != 2 or len(feats) == 0:
        raise ValueError(f"features must be a non-empty (candidates, d) array, got shape {feats.shape}")
    kernel = matern52(feats, feats, lengthscale)
    p = len(kernel)
    trace = gp_ucb(gain, kernel, iterations, delta=delta, noise_var=noise_var)
    sens = mean_sensitivity(iterations, p, delta, kernel_gap)
    probs = exponential_mechanism_probabilities(trace.mean, epsilon, sens)
    index = int(rng.choice(p, p=probs))
    noisy, g_sens = None, None
    if release_gain:
        gamma_t = max_information_gain_bound(kernel, iterations, noise_var)
        g_sens = gain_sensitivity(iterations, p, delta, kernel_gap, noise_var, gamma_t)
        noisy = max(trace.values) + float(rng.laplace(0.0, laplace_scale(g_sens, epsilon)))
    factor = 2 if release_gain else 1
    return DPBOResult(index, noisy, factor * epsilon, factor * delta, sens, g_sens, probs, trace)


def dp_bo_lipschitz(
    observed_gains: Sequence[float],
    *,
    epsilon: float,
    validation_size: int,
    lipschitz: float,
    lam_min: float,
    lam_max: float,
    loss_bound: float,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Kusner et al. Alg. 3: ``max_t f_V(w_{lambda_t}) + Lap(Theorem 7 / epsilon)``.

    Epsilon-DP for the validation set under Assumption 2 whatever acquisition chose the ``lambda_t``.

    Args:
        observed_gains: The observed validation gains, at least one.
        epsilon: The budget, ``> 0``.
        validation_size: ``m``, ``>= 1``.
        lipschitz: ``L > 0``.
        lam_min: ``lambda_min > 0``.
        lam_max: ``lambda_max >= lambda_min``.
        loss_bound: ``g* > 0``.
        rng: The generator of the Laplace noise.

    Returns:
        The noisy best gain, the Laplace scale, the privacy spent and `ASSUMPTIONS_ALG3`.

    Raises:
        ValueError: No gains, or an argument is out of its range.
    """
    if len(observed_gains) == 0:
        raise ValueError("observed_gains must not be empty")
    scale = laplace_scale(
        lipschitz_gain_sensitivity(validation_size, lipschitz, lam_min, lam_max, loss_bound), epsilon
    )
    return {
        "noisy_gain": float(max(observed_gains)) + float(rng.laplace(0.0, scale)),
        "laplace_scale": scale,
        "epsilon": epsilon,
        "delta": 0.0,
        "assumptions": list(ASSUMPTIONS_ALG3),
    }
