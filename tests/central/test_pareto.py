"""Pareto sets, hypervolumes and plots on hand-computed cases (dphype.central.pareto)."""

import numpy as np
import pytest

from dphype.central import pareto

POINTS = np.array([[1.0, 0.5], [2.0, 0.3], [0.5, 0.8], [3.0, 0.3], [2.0, 0.6], [12.0, 0.1], [1.0, 0.5]])


def test_non_dominated_mask_and_sorted_front():
    # (3, .3) is dominated by (2, .3); (2, .6) by (1, .5); the duplicate (1, .5) is kept once.
    assert pareto.non_dominated(POINTS).tolist() == [True, True, True, False, False, True, False]
    front = pareto.pareto_front(POINTS)
    assert front.tolist() == [[0.5, 0.8], [1.0, 0.5], [2.0, 0.3], [12.0, 0.1]]


def test_hypervolume_hand_computed():
    # Inside the box (10, 1): strips (10-.5)(1-.8) + (10-1)(.8-.5) + (10-2)(.5-.3) = 1.9 + 2.7 + 1.6.
    assert pareto.hypervolume(POINTS) == pytest.approx(6.2)
    assert pareto.hypervolume([[0.0, 0.0]]) == pytest.approx(10.0)
    assert pareto.hypervolume([[10.0, 0.5], [3.0, 1.0]]) == 0.0  # on the box boundary: nothing
    assert pareto.hypervolume(POINTS, reference=(3.0, 1.0)) == pytest.approx(2.5 * 0.2 + 2 * 0.3 + 1 * 0.2)


def test_hypervolume_improvement_matches_difference_of_hypervolumes():
    rng = np.random.default_rng(0)
    observed = rng.random((40, 2)) * [12.0, 1.1]
    candidates = rng.random((60, 2)) * [12.0, 1.1]
    gains = pareto.hypervolume_improvement(observed, candidates)
    base = pareto.hypervolume(observed)
    expected = [pareto.hypervolume(np.vstack([observed, c])) - base for c in candidates]
    np.testing.assert_allclose(gains, expected, atol=1e-12)
    assert (gains >= 0).all() and (gains > 0).any()


def test_hypervolume_improvement_hand_computed():
    front = [[2.0, 0.5]]
    # (1, .25) adds [1,10]x[.25,1] minus [2,10]x[.5,1] = 6.75 - 4 = 2.75; dominated point adds 0.
    gains = pareto.hypervolume_improvement(front, [[1.0, 0.25], [3.0, 0.6], [11.0, 0.0]])
    np.testing.assert_allclose(gains, [2.75, 0.0, 0.0])


def test_hypervolume_trace_is_monotone_and_ends_at_total():
    rng = np.random.default_rng(1)
    pts = rng.random((50, 2)) * [12.0, 1.0]
    trace = pareto.hypervolume_trace(pts)
    assert np.all(np.diff(trace) >= -1e-12)
    assert trace[-1] == pytest.approx(pareto.hypervolume(pts))
    assert trace[0] == pytest.approx(pareto.hypervolume(pts[:1]))


@pytest.mark.parametrize(
    "bad, match",
    [([[1.0, float("nan")]], "NaN"), ([1.0, 2.0, 3.0], r"shape \(n, 2\)")],
)
def test_bad_points_raise(bad, match):
    with pytest.raises(ValueError, match=match):
        pareto.hypervolume(bad)


def test_bad_reference_raises():
    with pytest.raises(ValueError, match="reference"):
        pareto.hypervolume(POINTS, reference=(float("inf"), 1.0))


def test_plots_write_png(tmp_path):
    rng = np.random.default_rng(2)
    pts = rng.random((30, 2)) * [10.0, 1.0]
    front_png = pareto.plot_front(str(tmp_path / "front.png"), pts, best=pts - [0, 0.05], worst=pts + [0, 0.05])
    curve_png = pareto.plot_hypervolume_curves(str(tmp_path / "hv.png"), {"a": pareto.hypervolume_trace(pts)})
    for path in (front_png, curve_png):
        with open(path, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
