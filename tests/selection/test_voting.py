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


# ------------------------------------------------------------------------------------- graded ballots
from dphype.selection.ballots import BallotForm  # noqa: E402
from dphype.selection.voting import (  # noqa: E402
    AUTO_EXPONENT,
    AUTO_FLOOR,
    AUTO_MIN_DEPTH,
    AUTO_SCALE,
    SHARE_EXPONENT,
    SHARE_SCALE,
    Ballot,
    auto_depth,
    check_ballot,
    rank_votes,
    rank_weights,
    rule_depth,
    score_votes,
    share_depth,
)


def test_rank_weights_fall_linearly_from_g_and_stay_positive():
    assert rank_weights(15, 15).tolist() == list(range(15, 0, -1))
    assert rank_weights(4, 15).tolist() == [15, 12, 8, 4]
    assert rank_weights(1, 7).tolist() == [7]
    assert rank_weights(40, 3).min() == 1 and rank_weights(40, 3).max() == 3


def test_rank_ballot_with_g_1_is_top_k_and_follows_the_ranking_rules():
    rng = np.random.default_rng(0)
    for _ in range(10):
        s = rng.normal(size=12)
        assert np.array_equal(rank_votes(s, 4, max_entry=1), top_k_votes(s, 4))
    s = np.array([0.5, np.nan, 0.9, 0.5, 0.1])
    assert rank_votes(s, 3, max_entry=15).tolist() == [10, 0, 15, 5, 0]  # ties by index, NaN last
    assert rank_votes(s, 3, max_entry=15, maximize=False).tolist() == [10, 0, 0, 5, 15]
    assert rank_votes(s, 9, max_entry=3).tolist() == rank_votes(s, 5, max_entry=3).tolist()  # depth cut to p


def test_score_ballot_is_a_clipped_linear_utility_of_the_shortfall():
    s = np.array([0.75, 0.875, 0.8125, 0.5, np.nan, 0.875])  # binary fractions: exact shortfalls
    assert score_votes(s, 0.25).tolist() == [8, 15, 11, 0, 0, 15]  # round(15 * 0.5), round(15 * 0.75); 0.375: 0
    assert score_votes(s, 0.125).tolist() == [0, 15, 8, 0, 0, 15]
    losses = np.array([0.2, 0.3, 0.1])
    assert score_votes(losses, 0.2, max_entry=3, maximize=False).tolist() == [2, 0, 3]
    assert score_votes(np.full(4, np.nan), 0.1).tolist() == [15, 0, 0, 0]  # no finite score: candidate 0
    keys = np.array([[0.9, -0.3], [0.9, -0.1], [0.8, 0.0]])
    assert score_votes(keys, 0.2).tolist() == [15, 15, 8]  # only the primary key is graded


@pytest.mark.parametrize("name", ["top-k", "rank:1", "rank:7", "rank:30:2", "rank:200", "score:0.05",
                                  "score:0.3:1", "score:2:8"])
def test_every_graded_ballot_satisfies_its_form(name):
    ballot = Ballot.parse(name)
    rng = np.random.default_rng(1)
    for p in (1, 5, 40):
        form = ballot.form(min(3, p), p)
        assert form.max_entry == ballot.max_entry
        for scores in (rng.uniform(size=p), rng.uniform(size=(p, 2)), np.round(rng.uniform(size=p), 1),
                       np.where(rng.uniform(size=p) < 0.3, np.nan, rng.uniform(size=p))):
            votes = ballot.cast(scores, min(3, p))
            assert np.array_equal(form.check(votes, p), votes)
            if ballot.kind != "rank" or ballot.depth <= p:  # without p: the form of every p at least the depth
                assert np.array_equal(ballot.form(min(3, p)).check(votes), votes)


def test_ballot_names_are_canonical_and_forms_exact():
    assert check_ballot(" rank:20:4") == "rank:20" and check_ballot("score:0.050") == "score:0.05"
    assert check_ballot("rank:20:2") == "rank:20:2" and Ballot.parse("rank:20:2").max_entry == 3
    assert Ballot.parse("top-k").form(4) == BallotForm.top_k(4) and not Ballot.parse("top-k").graded
    assert Ballot.parse("rank:4").form(1) == BallotForm(15, 39, 39)
    assert Ballot.parse("score:0.1").form(1, 10) == BallotForm(15, 15, 150)


@pytest.mark.parametrize(("value", "why"), [
    ("top", "unknown kind"), ("top-k:3", "takes no parameter"), ("rank", "unknown kind"), ("rank:0", "D must be"),
    ("rank:2.5", "D is not an integer"), ("score:0", "M must be"), ("score:nan", "M must be"),
    ("score:x", "not a number"), ("rank:3:0", "BITS out of"), ("rank:3:9", "BITS out of"),
    ("rank:3:x", "BITS is not"), (3, "not a string"), (None, "not a string"), ("auto:0", "C must be"),
    ("auto:x", "C or A is not"), ("auto:1:2", "unknown kind"), ("share:-1", "C must be"), ("share:inf", "C must be"),
    ("share:x", "C or A is not"), ("share:0.2:y", "C or A is not"), ("share:0.2:nan", "A must be"),
    ("share:0.2:1:1", "unknown kind"),
])
def test_a_bad_ballot_names_the_parameter_the_allowed_values_and_the_fix(value, why):
    with pytest.raises(ValueError, match=r"ballot must be \"top-k\", \"share\[:C\[:A\]\]\".*\"auto\[:C\]\".*"
                       + r"\"rank:D\[:BITS\]\".*" + why + r".*set ballot"):
        Ballot.parse(value)


def test_auto_ballot_follows_the_public_rule_and_must_be_resolved():
    # k = round(c p (s / m)^a), written out: p = 100, replace-one epsilon 1 (s = sqrt(2t)/(1-t), t = e^-1/2), m = 20
    t = np.exp(-0.5)
    s = np.sqrt(2 * t) / (1 - t)
    c, a = AUTO_SCALE, AUTO_EXPONENT
    assert AUTO_FLOOR == 0.03
    for m in (10, 20, 50):
        assert auto_depth(100, s, m) == max(3, round(c * 100 * (s / m) ** a))
    assert auto_depth(100, s, 20, scale=2 * c) == max(3, round(2 * c * 100 * (s / 20) ** a))  # auto:C scales k
    assert auto_depth(100, 1e3, 2) == 50 and auto_depth(3, 1e3, 2) == 1  # at most p // 2
    assert auto_depth(100, 0.01, 50) == round(AUTO_FLOOR * 100) == 3  # the floor, a fraction of p
    # below 100 candidates the floor of 2 (one vote each is what label skew decides), never above p // 2
    assert AUTO_MIN_DEPTH == 2 and auto_depth(10, 0.01, 50) == auto_depth(8, 0.01, 50) == 2
    assert auto_depth(10, s, 20) == max(2, round(c * 10 * (s / 20) ** a)) and auto_depth(3, 0.01, 50) == 1
    auto = Ballot.parse("auto")
    assert auto.name == "auto" and auto.graded and auto.max_entry == 1 and Ballot.parse("auto:0.3").name == "auto:0.3"
    with pytest.raises(ValueError, match="resolve it first"):
        auto.form(3, 100)
    with pytest.raises(ValueError, match="resolve it first"):
        auto.cast(np.arange(5.0), 2)
    fixed, k = auto.resolve(100, s, 20), auto_depth(100, s, 20)
    assert fixed == Ballot("rank", depth=k, bits=1) and fixed.form(1, 100) == BallotForm.top_k(k)
    scores = np.random.default_rng(2).normal(size=100)
    assert np.array_equal(fixed.cast(scores, 1), top_k_votes(scores, k))
    assert Ballot.parse("rank:4").resolve(100, s, 20) == Ballot.parse("rank:4")


def test_share_ballot_votes_for_a_share_of_the_candidates_set_by_the_noise_and_must_be_resolved():
    # k = round(c p s^a), at least 2 and 0.03 p, at most p // 2, whatever the number of voters
    c, a = SHARE_SCALE, SHARE_EXPONENT
    for s in (1.4, 2.8, 5.6):
        assert share_depth(100, s) == min(50, max(3, round(c * 100 * s**a)))
    assert share_depth(100, 2.0, 0.4, 0.0) == 40 and share_depth(100, 2.0, 0.1, 1.0) == 20
    assert share_depth(100, 1.0, 0.9, 0.0) == 50 and share_depth(3, 1.0, 0.9, 0.0) == 1  # at most p // 2
    assert share_depth(100, 1.0, 0.001) == 3 and share_depth(10, 1.0, 0.001) == 2  # the floors: 0.03 p, 2
    share = Ballot.parse("share")
    assert share.name == "share" and share.graded and share.from_public_facts and share.max_entry == 1
    assert (share.scale, share.exponent) == (c, a) and Ballot.parse(f"share:{c}:{a}") == share
    assert Ballot.parse("share:0.3").name == "share:0.3" and Ballot.parse("share:0.3:0.5").name == "share:0.3:0.5"
    assert Ballot.parse("share:0.3:0.5").exponent == 0.5 and Ballot.parse("share:0.3").exponent == a
    assert not Ballot.parse("top-k").from_public_facts and not Ballot.parse("rank:3").from_public_facts
    with pytest.raises(ValueError, match="a share ballot's k follows from the release's public facts"):
        share.form(3, 100)
    with pytest.raises(ValueError, match="resolve it first"):
        share.cast(np.arange(5.0), 2)
    for m in (10, 200):  # the same k whatever the number of voters
        assert share.resolve(100, 2.8, m) == Ballot("rank", depth=share_depth(100, 2.8), bits=1)
    assert Ballot.parse("share:0.3:0").resolve(100, 9.0, 20).form(1, 100) == BallotForm.top_k(30)


def test_rule_depth_is_element_wise_and_auto_is_one_of_its_rules():
    p, s, m = np.array([100, 100, 10]), np.array([2.7, 5.5, 2.7]), np.array([20, 10, 50])
    got = rule_depth(p, s, m, AUTO_SCALE, AUTO_EXPONENT, AUTO_EXPONENT)
    assert got.tolist() == [auto_depth(int(a), float(b), int(d)) for a, b, d in zip(p, s, m)]
    assert rule_depth(100, s, m, 0.2, 0.0, 0.0).tolist() == [20, 20, 20]  # no exponent: a share of p
