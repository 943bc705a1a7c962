"""The search space (dphype.ml.oracles.space): unit-cube mapping, grid and refusals."""

import numpy as np
import pytest

from dphype.ml.oracles.space import Domain, Hyperparameter


def test_domain_mapping_grid_and_validation():
    dom = Domain((Hyperparameter("n", 1, 64, log=True, integer=True),
                          Hyperparameter("lr", 1e-3, 1e-1, log=True)))
    cfgs = dom.from_unit(np.array([[0.0, 0.0], [1.0, 1.0], [0.5, 0.5]]))
    assert cfgs[0] == {"n": 1, "lr": pytest.approx(1e-3)} and cfgs[1] == {"n": 64, "lr": pytest.approx(0.1)}
    assert cfgs[2]["n"] == 8 and cfgs[2]["lr"] == pytest.approx(1e-2)
    np.testing.assert_allclose(dom.to_unit(cfgs[:2]), [[0, 0], [1, 1]], atol=1e-12)
    assert len(dom.grid(3)) == 9
    with pytest.raises(ValueError, match="at least one"):
        Domain(())
    with pytest.raises(ValueError, match="low < high"):
        Hyperparameter("x", 1.0, 1.0)
