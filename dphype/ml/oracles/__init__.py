"""Privacy and utility oracles (DPareto, Avent et al. PoPETs 2020) and the registry of the problems built by name.

The vocabulary is `dphype.ml.oracles.space` (the search space: `dphype.ml.oracles.space.Domain`, its axes and the
random baseline's laws) and `dphype.ml.oracles.problem` (`dphype.ml.oracles.problem.ParetoProblem`: the domain, the
privacy oracle and the utility oracle). Each problem is a module:

* `dphype.ml.oracles.svt` - ``svt``: DPareto's sparse vector technique with its closed-form privacy.
* `dphype.ml.oracles.output_perturbation` - ``logreg-output-perturbation``: projected-SGD logistic regression on
  Adult, released with Gaussian output perturbation.
* `dphype.ml.oracles.dpsgd` - ``{dpsgd,dpadam}-{logreg,svm,mlp,mlp1}-{adult,mnist5k}``: DP-SGD / DP-Adam through
  Opacus.
* `dphype.ml.oracles.votes` - DP-Hype's own vote release as a problem over fixed local scores (built with its
  data: `dphype.ml.oracles.votes.dphype_vote_problem`).

`make_problem` builds a problem by name (`problem_names`): each problem registers once, in `PROBLEMS`.
"""

from __future__ import annotations

from dphype.ml.oracles.dpsgd import DpsgdProblem
from dphype.ml.oracles.output_perturbation import OutputPerturbationProblem
from dphype.ml.oracles.problem import NamedProblem, ParetoProblem, ProblemOptions
from dphype.ml.oracles.svt import SvtProblem
from dphype.registry import Registry

#: The problems `make_problem` builds, one entry each, in the order `problem_names` lists their names.
PROBLEMS: tuple[type[NamedProblem], ...] = (SvtProblem, OutputPerturbationProblem, DpsgdProblem)


def _by_name(problems: tuple[type[NamedProblem], ...]) -> Registry[type[NamedProblem]]:
    """Each registered name -> its problem; a name registered twice is refused."""
    registry: Registry[type[NamedProblem]] = Registry("oracle", "problem name")
    for problem in problems:
        for name in problem.names:
            registry.add(name, problem)
    return registry


_BY_NAME = _by_name(PROBLEMS)


def problem_names() -> tuple[str, ...]:
    """All names accepted by `make_problem`."""
    return _BY_NAME.names()


def make_problem(
    name: str,
    *,
    runs: int | None = None,
    seed: int = 0,
    accountant: str = "rdp",
    train_size: int | None = None,
    data_dir: str | None = None,
) -> ParetoProblem:
    """Build the problem ``name``.

    Args:
        name: One of `problem_names`.
        runs: Overrides the problem's default R; ``None``: keep it.
        seed: Seeds the SVT problem's true queries.
        accountant: Opacus' accountant (DP-SGD problems).
        train_size: Subsamples the training pool; ``None``: all.
        data_dir: The folder holding a non-bundled data set.

    Returns:
        The problem.

    Raises:
        ValueError: ``name`` is unknown, or an option is out of the problem's range.
    """  # noqa: DOC502
    problem = _BY_NAME.get(name)
    options = ProblemOptions(runs=runs, seed=seed, accountant=accountant, train_size=train_size, data_dir=data_dir)
    return problem.build(name, options)
