"""DPareto's sparse vector technique problem (Avent et al. PoPETs 2020, Alg. 1, Sec. 2.2, Appendix B).

The privacy oracle is the closed form of Appendix B (`svt_epsilon`); the utility is the F1 score of the released
answers (`f1_scores`) over ``R`` runs with random query orders (`svt_answers` runs Alg. 1).
"""

from __future__ import annotations

import numpy as np

from dphype.checks import check_positive
from dphype.ml.oracles.problem import NamedProblem, ParetoProblem, ProblemOptions, UtilityResult
from dphype.ml.oracles.space import Config, Distribution, Domain, Hyperparameter


def svt_epsilon(b: float, bound: int) -> float:
    """DPareto App. B: Alg. 1 with noise ``b``, bound ``C`` is ``((1 + (2C)^(1/3)) (1 + (2C)^(2/3)) / b, 0)``-DP."""
    check_positive("b", b)
    if bound < 1:
        raise ValueError(f"C must be an integer >= 1, got {bound}")
    two_c = 2.0 * bound
    return (1.0 + two_c ** (1.0 / 3.0)) * (1.0 + two_c ** (2.0 / 3.0)) / b


def svt_answers(answers: np.ndarray, b: float, bound: int, rng: np.random.Generator) -> np.ndarray:
    """Run DPareto Alg. 1 on each row of the 0/1 matrix ``answers`` (one run per row).

    ``b1 = b / (1 + (2C)^(1/3))``, ``b2 = b - b1``; threshold noise ``rho ~ Lap(b1)`` per run, query noise
    ``nu_i ~ Lap(b2)``; query ``i`` is answered 1 if ``q_i + nu_i >= 1/2 + rho``, and the run stops after the
    ``C``-th positive answer.

    Args:
        answers: ``(R, m)`` true 0/1 answers, one run per row.
        b: The noise scale.
        bound: ``C``.
        rng: The generator of the Laplace noise.

    Returns:
        The ``(R, m)`` released 0/1 vectors ``w``.
    """
    q = np.atleast_2d(answers).astype(np.float64)
    b1 = b / (1.0 + (2.0 * bound) ** (1.0 / 3.0))
    b2 = b - b1
    rho = rng.laplace(0.0, b1, size=(q.shape[0], 1))
    nu = rng.laplace(0.0, b2, size=q.shape)
    above = q + nu >= 0.5 + rho
    return above & (np.cumsum(above, axis=1) <= bound)


def f1_scores(truth: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Row-wise F1 score ``2TP / (2TP + FP + FN)`` of ``(R, m)`` 0/1 matrices (1 when both are empty)."""
    t = np.atleast_2d(truth).astype(bool)
    p = np.atleast_2d(predicted).astype(bool)
    tp = (t & p).sum(axis=1)
    denom = 2 * tp + (p & ~t).sum(axis=1) + (t & ~p).sum(axis=1)
    return np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 1.0)


def svt_problem(*, queries: int = 100, positives: int = 10, runs: int = 50, seed: int = 0) -> ParetoProblem:
    """DPareto's SVT example (Sec. 2.2/3.3): ``C`` in [1, 30] (uniform), ``b`` in [1e-2, 1e2] (log-uniform).

    Args:
        queries: ``m``.
        positives: True queries, in ``[1, m]``.
        runs: ``R``, ``>= 1``: runs with random query orders whose F1 scores are averaged.
        seed: Seeds which queries are true.

    Returns:
        The problem.

    Raises:
        ValueError: ``positives`` or ``runs`` is out of its range.
    """
    if not 1 <= positives <= queries:
        raise ValueError(f"positives must be in [1, queries={queries}], got {positives}")
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    truth = np.zeros(queries, dtype=bool)
    truth[np.random.default_rng(seed).choice(queries, positives, replace=False)] = True

    def utility(config: Config, rng: np.random.Generator) -> UtilityResult:
        order = np.argsort(rng.random((runs, queries)), axis=1)
        answers = truth[order]
        released = svt_answers(answers, float(config["b"]), int(config["C"]), rng)
        return UtilityResult.from_runs(f1_scores(answers, released))

    domain = Domain((Hyperparameter("C", 1, 30, integer=True), Hyperparameter("b", 1e-2, 1e2, log=True)))
    return ParetoProblem(
        name="svt",
        domain=domain,
        privacy=lambda c: svt_epsilon(float(c["b"]), int(c["C"])),
        utility=utility,
        delta=0.0,
        distributions={"C": Distribution("uniform", 1, 30), "b": Distribution("loguniform", 1e-2, 1e2)},
        description="sparse vector technique, closed-form privacy (DPareto Alg. 1, App. B), F1 utility",
    )


class SvtProblem(NamedProblem):
    """``svt``: `svt_problem`, its true queries seeded by the options' ``seed``."""

    names = ("svt",)

    @classmethod
    def build(cls, name: str, options: ProblemOptions) -> ParetoProblem:
        """`svt_problem` with the options' ``seed`` and ``runs``."""
        return svt_problem(seed=options.seed, **options.runs_override())
