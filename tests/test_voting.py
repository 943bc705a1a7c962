import math

import numpy as np
import pytest
from scipy.stats import norm

from dphype.voting import (
    good_selection_probability_bound,
    raw_score_votes,
    select,
    selection_gap,
    top_k_votes,
)


def test_top_k_maximize_and_minimize():
    s = [0.3, 0.9, 0.1, 0.5, 0.7]
    assert top_k_votes(s, 2).tolist() == [0, 1, 0, 0, 1]
    assert top_k_votes(s, 2, maximize=False).tolist() == [1, 0, 1, 0, 0]
    v = top_k_votes(s, 5)
    assert v.dtype == np.int64 and v.sum() == 5


def test_ties_go_to_lower_index():
    assert top_k_votes([0.5, 0.5, 0.5, 0.1], 2).tolist() == [1, 1, 0, 0]
    assert top_k_votes([0.1, 0.5, 0.5, 0.5], 2).tolist() == [0, 1, 1, 0]
    assert top_k_votes([0.5, 0.5, 0.5, 0.9], 2, maximize=False).tolist() == [1, 1, 0, 0]


@pytest.mark.parametrize("maximize", [True, False])
def test_non_finite_rank_last(maximize):
    s = [np.nan, np.inf, 0.2, -np.inf, 0.4]
    v = top_k_votes(s, 2, maximize=maximize)
    assert v.tolist() == [0, 0, 1, 0, 1]
    v3 = top_k_votes(s, 3, maximize=maximize)
    assert v3.tolist() == [1, 0, 1, 0, 1]  # among non-finite, lowest index first
    assert top_k_votes([np.nan, np.nan], 1).tolist() == [1, 0]


def test_exactly_k_ones_random():
    rng = np.random.default_rng(0)
    for _ in range(200):
        p = int(rng.integers(1, 40))
        k = int(rng.integers(1, p + 1))
        s = rng.choice([0.0, 0.5, 1.0, np.nan], size=p)
        v = top_k_votes(s, k, maximize=bool(rng.integers(2)))
        assert v.sum() == k and set(np.unique(v)) <= {0, 1}


def test_top_k_bad_input():
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 3\]"):
        top_k_votes([1, 2, 3], 4)
    with pytest.raises(ValueError, match="k must be"):
        top_k_votes([1, 2, 3], 0)
    with pytest.raises(ValueError, match="k must be"):
        top_k_votes([1, 2, 3], 1.5)
    with pytest.raises(ValueError, match="1-D"):
        top_k_votes([], 1)


def test_raw_score_votes():
    assert raw_score_votes([0.0, 0.25, 1.0]).tolist() == [0.0, 0.25, 1.0]
    assert raw_score_votes([0.0, 0.25, 1.0], maximize=False).tolist() == [1.0, 0.75, 0.0]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        raw_score_votes([0.5, 1.2])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        raw_score_votes([0.5, np.nan])


def test_select_argmax_lowest_tie():
    assert select([1.0, 3.0, 3.0, 2.0]) == 1
    with pytest.raises(ValueError):
        select([1.0, np.nan])


def test_selection_gap():
    assert selection_gap([10, 8, 3, 5], good=[0, 1]) == 3.0
    with pytest.raises(ValueError):
        selection_gap([1, 2], good=[0, 1])


def test_theorem_iv1_formula():
    # 1 - |H_bad| sigma/(gamma sqrt(pi)) exp(-gamma^2/(4 sigma^2))
    got = good_selection_probability_bound(gap=40.0, sigma=12.0, num_good=5, num_bad=95)
    expected = 1 - 95 * 12.0 / (40.0 * math.sqrt(math.pi)) * math.exp(-(40.0**2) / (4 * 12.0**2))
    assert got == pytest.approx(expected, rel=1e-12)
    # does not depend on |H_good|
    assert good_selection_probability_bound(40.0, 12.0, 1, 95) == got
    # vacuous regimes
    assert good_selection_probability_bound(1.0, 12.0, 5, 95) == 0.0
    assert good_selection_probability_bound(-3.0, 12.0, 5, 95) == 0.0
    assert good_selection_probability_bound(5.0, 12.0, 5, 0) == 1.0


def test_theorem_iv1_tail_step_is_a_valid_upper_bound():
    # the proof's per-candidate step: 1 - Phi_{2 sigma^2}(gamma) <= sigma/(gamma sqrt(pi)) e^{-gamma^2/(4 sigma^2)}
    sigma = 5.0
    for gamma in np.linspace(1.0, 60.0, 50):
        exact_tail = norm.sf(gamma, scale=math.sqrt(2) * sigma)
        bound = sigma / (gamma * math.sqrt(math.pi)) * math.exp(-(gamma**2) / (4 * sigma**2))
        assert exact_tail <= bound


def test_theorem_iv1_holds_in_simulation():
    rng = np.random.default_rng(1)
    p, good, sigma, n = 30, 3, 4.0, 50
    votes = np.full(p, 10.0)
    votes[:good] = [32.0, 30.0, 31.0]
    gamma = selection_gap(votes, range(good))
    bound = good_selection_probability_bound(gamma, sigma, good, p - good)
    noisy = votes + rng.normal(0.0, sigma, size=(20000, p))
    rate = np.mean(np.argmax(noisy, axis=1) < good)
    assert 0.5 < bound <= rate


def test_theorem_iv1_bad_input():
    with pytest.raises(ValueError, match="sigma"):
        good_selection_probability_bound(1.0, 0.0, 1, 1)
    with pytest.raises(ValueError, match="num_good"):
        good_selection_probability_bound(1.0, 1.0, 0, 1)
    with pytest.raises(ValueError, match="num_bad"):
        good_selection_probability_bound(1.0, 1.0, 1, -1)
