"""A Pareto problem's evaluation (dphype.ml.oracles.problem) refuses oracle outputs out of range."""

import numpy as np
import pytest

from dphype.ml.oracles import make_problem
from dphype.ml.oracles.problem import ParetoProblem, UtilityResult


def test_evaluate_rejects_bad_oracle_output():
    good = make_problem("svt", runs=2)
    nan_utility = ParetoProblem("broken", good.domain, good.privacy,
                                        lambda c, r: UtilityResult.from_runs([float("nan")]), 0.0)
    with pytest.raises(ValueError, match="utility oracle of 'broken'"):
        nan_utility.evaluate({"C": 2, "b": 1.0}, np.random.default_rng(0))
    negative_eps = ParetoProblem("neg", good.domain, lambda c: -1.0, good.utility, 0.0)
    with pytest.raises(ValueError, match="privacy oracle of 'neg'"):
        negative_eps.evaluate({"C": 2, "b": 1.0}, np.random.default_rng(0))
    over_one = ParetoProblem("big", good.domain, good.privacy,
                                     lambda c, r: UtilityResult.from_runs([1.5]), 0.0)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        over_one.evaluate({"C": 2, "b": 1.0}, np.random.default_rng(0))
    with pytest.raises(ValueError, match="C must be an integer in"):
        good.evaluate({"C": 0, "b": 1.0}, np.random.default_rng(0))
