"""Output-perturbed L2-regularised logistic regression on Adult (DPareto Sec. 2.2; Wu et al. 2017, Alg. 2).

Projected permutation SGD (`train_psgd_logreg`) trains the non-private weights; the release adds Gaussian noise to
them, so epsilon is the analytic Gaussian mechanism's (Balle & Wang 2018, `dphype.privacy.accounting`) at the
L2 sensitivity of `OutputPerturbationSetup`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dphype.checks import check_delta
from dphype.ml.data import load_dataset
from dphype.ml.oracles.problem import NamedProblem, ParetoProblem, ProblemOptions, UtilityResult, subsample_pool
from dphype.ml.oracles.space import Config, Distribution, Domain, Hyperparameter
from dphype.privacy.noise_kinds import analytic_gaussian_epsilon


@dataclass(frozen=True)
class OutputPerturbationSetup:
    """Constants of Wu et al. (2017) Alg. 2 for logistic loss on unit-norm features.

    Logistic loss is ``L = 1``-Lipschitz and ``beta = 1/4``-smooth when ``||x|| <= 1``; with the
    regulariser ``gamma/2 ||w||^2`` and projection onto the ball of radius ``1/gamma`` (which holds
    the minimiser), the objective is ``gamma``-strongly convex, ``(beta + gamma)``-smooth and
    ``(1 + gamma * 1/gamma) = 2``-Lipschitz on the ball.

    Attributes:
        lipschitz: ``L`` of the objective on the ball.
        smoothness: ``beta`` of the logistic loss.
    """

    lipschitz: float = 2.0
    smoothness: float = 0.25

    def sensitivity(self, gamma: float, n: int) -> float:
        """L2 sensitivity ``2 L / (gamma n)`` of strongly convex permutation PSGD on ``n`` rows (Wu et al., Alg. 2)."""
        return 2.0 * self.lipschitz / (gamma * n)


def train_psgd_logreg(
    x: np.ndarray,
    y: np.ndarray,
    gamma: float,
    *,
    epochs: int,
    batch_size: int,
    rng: np.random.Generator,
    setup: OutputPerturbationSetup = OutputPerturbationSetup(),
) -> np.ndarray:
    """Projected permutation SGD on ``logistic + gamma/2 ||w||^2`` (Wu et al. 2017, Alg. 2).

    The data are reshuffled every epoch; step ``eta_t = min(1/(beta+gamma), 1/(gamma t))``;
    after each step ``w`` is projected onto ``||w|| <= 1/gamma``. Starts from ``w = 0``.

    Args:
        x: ``(n, d)`` features with unit-norm rows.
        y: ``(n,)`` labels in {-1, +1}.
        gamma: The regularisation.
        epochs: Passes over the data.
        batch_size: The minibatch size.
        rng: Shuffles the data.
        setup: The loss's constants.

    Returns:
        The non-private ``(d,)`` weights ``w``.
    """
    n, d = x.shape
    w = np.zeros(d)
    radius = 1.0 / gamma
    t = 0
    for _ in range(epochs):
        order = rng.permutation(n)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            xb, yb = x[idx], y[idx]
            coef = -yb / (1.0 + np.exp(yb * (xb @ w)))  # derivative of log(1 + e^{-y w.x}) w.r.t. w.x
            grad = coef @ xb / len(idx) + gamma * w
            t += 1
            w -= min(1.0 / (setup.smoothness + gamma), 1.0 / (gamma * t)) * grad
            norm = float(np.linalg.norm(w))
            if norm > radius:
                w *= radius / norm
    return w


def output_perturbation_problem(
    *,
    runs: int = 50,
    epochs: int = 10,
    batch_size: int = 32,
    delta: float = 1e-6,
    train_size: int | None = None,
) -> ParetoProblem:
    """DPareto's private logistic regression example (Sec. 2.2) on Adult.

    Hyperparameters: regularisation ``gamma`` in [1e-4, 1] and output-noise std ``sigma`` in [0.1, 10] (log-uniform,
    Sec. 3.3). Privacy: the analytic Gaussian mechanism with `OutputPerturbationSetup`'s sensitivity. Utility: test
    accuracy of ``w + N(0, sigma^2 I)`` averaged over ``runs`` noise draws; the non-private ``w`` is trained once per
    call (one data order) and the runs differ in the output noise, which dominates the variability. The sensitivity
    bound of the strongly convex case does not depend on the batch size (DPareto uses 1). Rows are scaled to unit norm.

    Args:
        runs: Output-noise draws per evaluation.
        epochs: PSGD passes.
        batch_size: PSGD's minibatch size.
        delta: The fixed delta.
        train_size: Subsample the training rows to this many; ``None``: all.

    Returns:
        The problem.

    Raises:
        ValueError: ``train_size`` is below 2.
    """  # noqa: DOC502
    check_delta(delta)
    pool, test = load_dataset("adult")
    pool = subsample_pool(pool, train_size)
    x = pool.x.astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = 2.0 * pool.y - 1.0
    xt = test.x.astype(np.float64)
    xt /= np.linalg.norm(xt, axis=1, keepdims=True)
    yt = 2.0 * test.y - 1.0
    setup = OutputPerturbationSetup()
    n = len(y)

    def privacy(config: Config) -> float:
        return analytic_gaussian_epsilon(setup.sensitivity(float(config["gamma"]), n), float(config["sigma"]), delta)

    def utility(config: Config, rng: np.random.Generator) -> UtilityResult:
        w = train_psgd_logreg(x, y, float(config["gamma"]), epochs=epochs, batch_size=batch_size, rng=rng)
        w = w[None, :] + rng.normal(0.0, float(config["sigma"]), size=(runs, len(w)))
        return UtilityResult.from_runs(((xt @ w.T) * yt[:, None] > 0).mean(axis=0))

    return ParetoProblem(
        name="logreg-output-perturbation",
        domain=Domain((Hyperparameter("gamma", 1e-4, 1.0, log=True), Hyperparameter("sigma", 0.1, 10.0, log=True))),
        privacy=privacy,
        utility=utility,
        delta=delta,
        distributions={"gamma": Distribution("loguniform", 1e-4, 1.0), "sigma": Distribution("loguniform", 0.1, 10.0)},
        description="output-perturbed L2 logistic regression on Adult (Wu et al. Alg. 2, analytic Gaussian)",
    )


class OutputPerturbationProblem(NamedProblem):
    """``logreg-output-perturbation``: `output_perturbation_problem` on the options' ``train_size`` rows."""

    names = ("logreg-output-perturbation",)

    @classmethod
    def build(cls, name: str, options: ProblemOptions) -> ParetoProblem:
        """`output_perturbation_problem` with the options' ``train_size`` and ``runs``."""
        return output_perturbation_problem(train_size=options.train_size, **options.runs_override())
