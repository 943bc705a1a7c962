"""DPareto (dphype.central.dpareto): PoI/HVPoI closed forms, the GP surrogate, searches on SVT."""

import math

import numpy as np
import pytest
from scipy.stats import norm

from dphype.central import dpareto
from dphype.central.pareto import hypervolume
from dphype.ml.oracles import make_problem


def test_probability_of_improvement_single_point_unbounded():
    # Gamma~ = complement of the quadrant [0, inf)^2: 1 - 1/2 * 1/2.
    poi = dpareto.probability_of_improvement(np.array([[0.0, 0.0]]), np.zeros((1, 2)), np.ones((1, 2)))
    assert poi[0] == pytest.approx(0.75)


def test_probability_of_improvement_bounded_box_and_monte_carlo():
    front = np.array([[0.0, 0.0]])
    mean, std = np.array([[0.2, -0.1]]), np.array([[0.7, 1.3]])
    ref = (1.0, 1.0)
    got = dpareto.probability_of_improvement(front, mean, std, ref)[0]
    px = norm.cdf((1.0 - 0.2) / 0.7) - norm.cdf((0.0 - 0.2) / 0.7)  # 0 <= f1 < 1
    qx = norm.cdf((1.0 + 0.1) / 1.3) - norm.cdf((0.0 + 0.1) / 1.3)  # 0 <= f2 < 1
    exact = norm.cdf(0.8 / 0.7) * norm.cdf(1.1 / 1.3) - px * qx
    assert got == pytest.approx(exact, abs=1e-12)
    # Monte Carlo over a two-point staircase.
    rng = np.random.default_rng(0)
    front2 = np.array([[-0.5, 0.5], [0.5, -0.5]])
    samples = mean + std * rng.standard_normal((400_000, 2))
    dominated = ((samples[:, None, :] >= front2[None]).all(axis=2)).any(axis=1)
    inside = (samples < np.array(ref)).all(axis=1)
    mc = np.mean(inside & ~dominated)
    assert dpareto.probability_of_improvement(front2, mean, std, ref)[0] == pytest.approx(mc, abs=3e-3)


def test_hvpoi_on_a_two_point_toy_with_known_answer():
    observed = np.array([[2.0, 0.5], [20.0, 0.05]])  # the second point lies outside the box
    # GP means (transformed space) at (1, .25) and at a dominated point (3, .6), nearly exact.
    means = dpareto.transform_objectives(np.array([[1.0, 0.25], [3.0, 0.6]]))
    alpha, poi = dpareto.hvpoi(observed, means, np.full((2, 2), 1e-6))
    # Delta_PF((1, .25)) = [1,10]x[.25,1] minus [2,10]x[.5,1] = 6.75 - 4 = 2.75, PoI -> 1.
    assert alpha[0] == pytest.approx(2.75, rel=1e-6) and poi[0] == pytest.approx(1.0)
    assert alpha[1] == 0.0 and poi[1] == pytest.approx(0.0, abs=1e-12)
    # A very uncertain prediction at (1, .25): PoI is the Gaussian mass of Gamma~, alpha scales with it.
    alpha2, poi2 = dpareto.hvpoi(observed, means[:1], np.array([[1.0, 1.0]]))
    assert 0.0 < poi2[0] < 1.0 and alpha2[0] == pytest.approx(2.75 * poi2[0])


def test_transforms_are_inverse_and_monotone():
    pts = np.array([[0.01, 0.2], [3.0, 0.9], [10.0, 0.5]])
    np.testing.assert_allclose(dpareto.untransform_objectives(dpareto.transform_objectives(pts)), pts)
    t = dpareto.transform_objectives(np.array([[0.0, 0.0], [1.0, 1.0]]))
    assert np.isfinite(t).all()  # floors keep log/logit finite


def test_surrogate_matches_gpytorch_posterior():
    import torch

    rng = np.random.default_rng(0)
    x = rng.random((30, 2))
    y = np.stack([np.sin(3 * x[:, 0]) + x[:, 1], x[:, 1] ** 2], axis=1) + 0.01 * rng.standard_normal((30, 2))
    surrogate = dpareto.Surrogate(dim=2, refit_every=4, fit_maxiter=30)
    surrogate.update(x, y)
    z = rng.random((5, 2))
    mean, std = surrogate.predict(z)
    # Two float64 Cholesky solves of K + noise I (the surrogate's cached one, GPyTorch's own): they agree to about
    # cond(K + noise I) n u |y| (noise floored at 1e-4 by BoTorch, cond 4.5e4 here: 5e-10; measured 3e-15 with MKL's
    # AVX-512 and AVX2 paths), within 1e-8; a wrong standardisation or kernel moves them by 1e-3 or more.
    for j, model in enumerate(surrogate.models):
        with torch.no_grad():
            post = model(torch.from_numpy(z))
        np.testing.assert_allclose(mean[:, j], post.mean.numpy() * surrogate.stats[1, j] + surrogate.stats[0, j],
                                   atol=1e-8)
        np.testing.assert_allclose(std[:, j], post.variance.sqrt().numpy() * surrogate.stats[1, j], atol=1e-8)


def test_dpareto_beats_random_sampling_on_svt():
    problem = make_problem("svt", runs=20)
    bo = dpareto.run_search(problem, "hvpoi", seeds=8, iterations=24, seed=1)
    rnd = dpareto.run_search(problem, "random", seeds=8, iterations=24, seed=1)
    assert len(bo.evaluations) == len(rnd.evaluations) == 32
    # Both start from the same k0 = 8 seed configurations.
    assert [e.config for e in bo.evaluations[:8]] == [e.config for e in rnd.evaluations[:8]]
    assert bo.hypervolume > rnd.hypervolume
    assert bo.hypervolume == pytest.approx(hypervolume(bo.points()))
    assert bo.fits >= 1 and bo.overhead_seconds > 0 and bo.oracle_seconds > 0


def test_grid_search_uses_the_largest_full_grid():
    problem = make_problem("svt", runs=5)
    result = dpareto.run_search(problem, "grid", seeds=4, iterations=12, seed=0)
    assert len(result.evaluations) == 16  # 4 values per axis, 2 axes
    cs = sorted({e.config["C"] for e in result.evaluations})
    assert cs[0] == 1 and cs[-1] == 30 and len(cs) == 4


@pytest.mark.parametrize(
    "kwargs, match",
    [({"seeds": 0, "iterations": 1}, "seeds"), ({"seeds": 2, "iterations": -1}, "iterations")],
)
def test_bad_counts_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dpareto.run_search(make_problem("svt", runs=2), "hvpoi", **kwargs)


def test_unknown_method_raises():
    with pytest.raises(ValueError, match="method"):
        dpareto.run_search(make_problem("svt", runs=2), "anneal", seeds=2, iterations=1)


def test_qnehvi_option_runs(monkeypatch):
    """On its first use on a machine BoTorch compiles a fused C++ kernel of qLogNEHVI (``-march=native``, about 45 s
    of g++ into ~/.cache/torch_extensions, more than the rest of the fast suite's CPU on one worker); the test takes
    BoTorch's own pure-PyTorch path of the same quantity, as BoTorch does where no compiler is found."""
    from botorch.acquisition.multi_objective import logei

    monkeypatch.setattr(logei, "_load_attempted", True)
    monkeypatch.setattr(logei, "_C", None)
    result = dpareto.run_search(make_problem("svt", runs=5), "qnehvi", seeds=6, iterations=2, seed=0,
                                pool_size=64, local_pool=16)
    assert len(result.evaluations) == 8 and math.isfinite(result.hypervolume)


def test_pareto_cli_writes_outputs_and_reports_overhead(tmp_path):
    import contextlib
    import io
    import json
    import os

    from dphype.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["pareto", "--oracle", "svt", "--seeds", "4", "--iterations", "3", "--runs", "5",
                     "--baseline", "random", "--out", str(tmp_path / "p"), "--json"])
    assert code == 0
    result = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert result["iterations"] == 3 and result["evaluations"] == 7
    assert result["overhead_seconds"] >= result["search_overhead_seconds"] > 0
    assert result["hypervolume"] > 0 and "baseline_random_hypervolume" in result
    assert [os.path.basename(p) for p in result["outputs"]] == ["evaluations.csv", "front.png", "hypervolume.png"]
    with open(result["outputs"][0]) as fh:
        lines = fh.read().splitlines()
    assert lines[0].startswith("index,phase,C,b,epsilon") and len(lines) == 8
