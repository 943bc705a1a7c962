"""The registry of problems built by name (dphype.ml.oracles): one entry per problem, names, refusals, options."""

import numpy as np
import pytest

from dphype.ml.oracles import PROBLEMS, _by_name, make_problem, problem_names
from dphype.ml.oracles.dpsgd import DPSGD_MODELS, DPSGD_OPTIMIZERS, DpsgdProblem
from dphype.ml.oracles.output_perturbation import OutputPerturbationProblem
from dphype.ml.oracles.svt import SvtProblem, svt_problem


def test_every_problem_registers_once_and_lists_its_names_in_order():
    names = problem_names()
    assert PROBLEMS == (SvtProblem, OutputPerturbationProblem, DpsgdProblem)
    assert names[:3] == ("svt", "logreg-output-perturbation", "dpsgd-logreg-adult")
    assert len(names) == len(set(names)) == 2 + len(DPSGD_OPTIMIZERS) * len(DPSGD_MODELS) * 2
    assert {"dpadam-mlp1-mnist5k", "dpsgd-svm-mnist5k"} <= set(names)


def test_an_unknown_name_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="oracle must be one of svt, logreg-output-perturbation, dpsgd-logreg-adult"):
        make_problem("nope")
    with pytest.raises(ValueError, match="got 'dpsgd-logreg-cifar10'"):
        make_problem("dpsgd-logreg-cifar10")


def test_a_name_registered_twice_is_refused():
    with pytest.raises(ValueError, match=r"problem name 'svt' is already registered \(<class '.*SvtProblem'>\)"):
        _by_name((SvtProblem, OutputPerturbationProblem, SvtProblem))


def test_make_problem_passes_its_options_to_the_problem():
    built = make_problem("svt", runs=7, seed=3)
    direct = svt_problem(runs=7, seed=3)
    config = {"C": 4, "b": 2.0}
    a, b = (p.evaluate(config, np.random.default_rng(0)) for p in (built, direct))
    assert a.utility.runs == b.utility.runs and len(a.utility.runs) == 7 and a.epsilon == b.epsilon
    assert make_problem("svt", runs=7).evaluate(config, np.random.default_rng(0)).utility.runs != a.utility.runs
    dpsgd = make_problem("dpadam-svm-adult", runs=1, accountant="prv", train_size=300)
    assert dpsgd.name == "dpadam-svm-adult" and "PRV accountant" in dpsgd.description
    assert dpsgd.domain.params[1].high == 300  # the lot size is capped by the subsampled pool
