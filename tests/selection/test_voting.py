import numpy as np
import pytest

from dphype.selection.voting import primary_scores, raw_score_votes, top_k_votes


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
    with pytest.raises(ValueError, match=r"shape \(p,\) or \(p, j\)"):
        top_k_votes([], 1)
    with pytest.raises(ValueError, match=r"shape \(p,\) or \(p, j\)"):
        top_k_votes(np.zeros((2, 2, 2)), 1)


def test_raw_score_votes():
    assert raw_score_votes([0.0, 0.25, 1.0]).tolist() == [0.0, 0.25, 1.0]
    assert raw_score_votes([0.0, 0.25, 1.0], maximize=False).tolist() == [1.0, 0.75, 0.0]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        raw_score_votes([0.5, 1.2])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        raw_score_votes([0.5, np.nan])


def test_second_key_breaks_ties_of_the_first():
    # accuracy ties at 0.8 between candidates 0, 2 and 3; -loss orders them 3 (-0.1), 2 (-0.2), 0 (-0.3)
    keys = [[0.8, -0.3], [0.5, -0.01], [0.8, -0.2], [0.8, -0.1], [0.9, -0.9]]
    assert top_k_votes(keys, 1).tolist() == [0, 0, 0, 0, 1]  # the first key decides first
    assert top_k_votes(keys, 2).tolist() == [0, 0, 0, 1, 1]
    assert top_k_votes(keys, 3).tolist() == [0, 0, 1, 1, 1]
    assert top_k_votes(keys, 4).tolist() == [1, 0, 1, 1, 1]
    # minimising: losses [first, second]; candidate 1 and 2 tie on both keys -> lower index
    losses = [[0.2, 0.5], [0.1, 0.7], [0.1, 0.7], [0.1, 0.3]]
    assert top_k_votes(losses, 1, maximize=False).tolist() == [0, 0, 0, 1]
    assert top_k_votes(losses, 2, maximize=False).tolist() == [0, 1, 0, 1]
    assert top_k_votes(losses, 3, maximize=False).tolist() == [0, 1, 1, 1]


@pytest.mark.parametrize("maximize", [True, False])
def test_non_finite_in_any_key_ranks_last(maximize):
    # candidate 0 is best on the first key but its second key is NaN; candidate 2 has -inf in the second key
    first = 1.0 if maximize else 0.0
    keys = [[first, np.nan], [0.5, 0.5], [first, -np.inf], [0.4, 0.4]]
    assert top_k_votes(keys, 2, maximize=maximize).tolist() == [0, 1, 0, 1]
    assert top_k_votes(keys, 3, maximize=maximize).tolist() == [1, 1, 0, 1]  # broken ones by index


def test_one_column_keys_equal_the_1d_scores():
    rng = np.random.default_rng(3)
    for _ in range(50):
        s = rng.choice([0.0, 0.25, 0.5, 1.0, np.nan], size=12)
        for maximize in (True, False):
            assert np.array_equal(top_k_votes(s, 4, maximize=maximize),
                                  top_k_votes(s[:, None], 4, maximize=maximize))


def test_raw_score_votes_release_the_primary_key_only():
    keys = [[0.25, -3.0], [0.75, -0.5]]
    assert primary_scores(keys).tolist() == [0.25, 0.75]
    assert primary_scores([0.25, 0.75]).tolist() == [0.25, 0.75]
    assert raw_score_votes(keys).tolist() == [0.25, 0.75]
