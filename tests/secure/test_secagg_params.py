"""Secure SecAgg+ parameters (dphype.secure.secagg_params) against hand-computed bounds and the reference finder."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dphype.secure import secagg_params as sp


def _hypergeom(population: int, marked: int, draws: int, values: range) -> Fraction:
    """P[X in values] for X ~ H(population, marked, draws), exactly (integer binomials)."""
    total = math.comb(population, draws)
    return sum((Fraction(math.comb(marked, x) * math.comb(population - marked, draws - x), total)
                for x in values), Fraction(0))


def test_bounds_match_a_hand_computation():
    # n = 20 clients, gamma = 1/4 (c = 5 corrupted), xi = 1/5 (s = 16 survivors), k = 6, t = 4.
    got = sp.bounds(20, 6, 4, dropout=0.2, corrupt_fraction=0.25)
    # E1: an honest client has >= 4 corrupted among its 6 neighbours drawn from the other 19.
    unmask = 20 * _hypergeom(19, 5, 6, range(4, 7))
    # E3: a dropped client has <= 3 surviving neighbours (all 16 survivors are among the other 19).
    failure = 20 * _hypergeom(19, 16, 6, range(4))
    # E2: two disjoint runs of 3 positions all among the b = 5 + 4 removed clients.
    disconnect = Fraction(20 * (20 - 6 - 1), 2) * Fraction(math.comb(9, 6), math.comb(20, 6))
    assert got.log2_unmask == pytest.approx(math.log2(unmask), rel=1e-9)
    assert got.log2_failure == pytest.approx(math.log2(failure), rel=1e-9)
    assert got.log2_disconnect == pytest.approx(math.log2(disconnect), rel=1e-9)
    assert got.num_shares == 7 and got.flower_arguments() == {"num_shares": 7, "reconstruction_threshold": 4}


def test_active_server_needs_twice_the_threshold():
    # Active: both kinds of shares once 2t <= k + 1 + c_i, i.e. c_i >= 2t - k - 1 = 5 for k = 10, t = 8.
    got = sp.bounds(20, 10, 8, dropout=0.2, corrupt_fraction=0.25, adversary="active")
    assert got.log2_unmask == pytest.approx(math.log2(20 * _hypergeom(19, 5, 10, range(5, 11))), rel=1e-9)
    semi_honest = sp.bounds(20, 10, 8, dropout=0.2, corrupt_fraction=0.25)
    assert semi_honest.log2_unmask == -math.inf  # only 5 corrupted clients: never 8 corrupted neighbours


def test_complete_graph_bounds_are_exact():
    got = sp.bounds(10, 9, 4, dropout=0.3, corrupt_fraction=0.3)  # c = 3, s = 7
    assert got.log2_unmask == -math.inf and got.log2_failure == -math.inf and got.log2_disconnect == -math.inf
    assert sp.bounds(10, 9, 3, dropout=0.3, corrupt_fraction=0.3).log2_unmask == 0.0  # 3 corrupted >= t: certain
    assert sp.bounds(10, 9, 8, dropout=0.3, corrupt_fraction=0.3).log2_failure == 0.0  # 7 survivors < t


# The authors' reference finder (Google FCP, fcp/secagg/server/graph_parameter_finder_test.cc, sigma = 40,
# eta = 20): (n, gamma, xi, adversary, degree, threshold). It draws neighbours from n rather than the n - 1
# other clients and words E3 slightly differently, so degrees may differ by a few.
REFERENCE = [
    (100, 0.45, 0.45, "semi-honest", 92, 46),
    (1000, 0.45, 0.45, "semi-honest", 822, 417),
    (10, 0.33, 0.33, "semi-honest", 8, 4),
    (1000, 0.33, 0.33, "semi-honest", 286, 150),
    (10000, 0.33, 0.33, "semi-honest", 422, 221),
    (1000, 0.05, 0.33, "semi-honest", 72, 24),
    (100000, 0.05, 0.33, "semi-honest", 96, 32),
    (1000, 0.33, 0.05, "semi-honest", 78, 60),
    (10000, 0.33, 0.05, "semi-honest", 92, 70),
    (100, 0.3, 0.3, "active", 92, 62),
    (1000, 0.05, 0.33, "active", 398, 223),
    (1000, 0.33, 0.05, "active", 132, 109),
]


@pytest.mark.parametrize(("n", "gamma", "xi", "adversary", "degree", "threshold"), REFERENCE)
def test_agrees_with_the_reference_parameter_finder(n, gamma, xi, adversary, degree, threshold):
    got = sp.secure_parameters(n, dropout=xi, corrupt_fraction=gamma, adversary=adversary)
    assert abs(got.neighbours - degree) <= 4
    assert abs(got.threshold - threshold) <= 2


@pytest.mark.parametrize(("n", "xi", "gamma"),
                         [(50, 0.0, 1 / 3), (100, 0.1, 1 / 3), (250, 0.1, 0.2), (1000, 0.1, 1 / 3)])
def test_secure_parameters_are_secure_correct_and_minimal(n, xi, gamma):
    got = sp.secure_parameters(n, dropout=xi, corrupt_fraction=gamma)
    assert got.log2_unmask <= -41 and got.log2_disconnect <= -41 and got.log2_insecure <= -40
    assert got.log2_failure <= -20
    assert got.neighbours % 2 == 0 or got.neighbours == n - 1
    # one threshold less lets a client be unmasked too often ...
    assert sp.bounds(n, got.neighbours, got.threshold - 1, dropout=xi, corrupt_fraction=gamma).log2_unmask > -41
    # ... and no smaller graph admits any threshold
    k = got.neighbours - 2
    if k >= 2:
        options = [sp.bounds(n, k, t, dropout=xi, corrupt_fraction=gamma) for t in range(2, k + 2)]
        assert not any(max(o.log2_unmask, o.log2_disconnect) <= -41 and o.log2_failure <= -20 for o in options)


def test_parameters_grow_logarithmically():
    degrees = [sp.secure_parameters(n, dropout=0.1).neighbours for n in (1000, 10_000, 100_000)]
    assert degrees[0] < degrees[1] < degrees[2] < 1.5 * degrees[0]  # 100x the clients, < 1.5x the neighbours


def test_impossible_requirements_are_refused():
    with pytest.raises(ValueError, match="no secure SecAgg\\+ parameters"):
        sp.secure_parameters(10, dropout=0.5, corrupt_fraction=0.6)
    with pytest.raises(ValueError, match="corrupt_fraction must be in \\[0, 1\\)"):
        sp.secure_parameters(10, dropout=0.1, corrupt_fraction=1.0)
    with pytest.raises(ValueError, match="adversary must be one of"):
        sp.secure_parameters(10, dropout=0.1, adversary="malicious")


def test_flower_graph_follows_flowers_rules():
    assert sp.flower_graph(100, sp.PAPER_NUM_SHARES, sp.PAPER_THRESHOLD) == (30, 31)  # 30 shares made odd
    assert sp.flower_graph(50, 0.2, 0.6) == (10, 7)  # 11 shares, threshold round(6.6)
    assert sp.flower_graph(5, 0.2, 0.6) == (4, 3)  # 1 share -> all 5 -> complete graph
    assert sp.flower_graph(1000, 39, 37) == (38, 37)


def test_explicit_choice_below_the_minimum_is_refused():
    secure = sp.secure_parameters(1000, dropout=0.1)
    assert sp.check_parameters(1000, secure.num_shares, secure.threshold, dropout=0.1) == secure
    with pytest.raises(ValueError, match=f"num_shares must be in \\[{secure.num_shares}, 1000\\]"):
        sp.check_parameters(1000, secure.num_shares - 2, secure.threshold, dropout=0.1)
    with pytest.raises(ValueError, match="reconstruction_threshold must be in \\["):
        sp.check_parameters(1000, secure.num_shares, secure.threshold - 1, dropout=0.1)
    with pytest.raises(ValueError, match="num_shares must be odd"):
        sp.check_parameters(1000, secure.num_shares + 1, secure.threshold, dropout=0.1)
    # The paper's settings (threshold = all shares) fail as soon as one neighbour may drop out.
    with pytest.raises(ValueError, match="reconstruction_threshold must be in"):
        sp.check_parameters(1000, sp.PAPER_NUM_SHARES, sp.PAPER_THRESHOLD, dropout=0.1)
    paper = sp.bounds(1000, *sp.flower_graph(1000, sp.PAPER_NUM_SHARES, sp.PAPER_THRESHOLD), dropout=0.1)
    assert paper.log2_failure == 0.0 and paper.log2_insecure < -40  # secure, but not correct under dropout


def test_client_side_threshold_check():
    sp.check_share_threshold(50, 23, 12)
    with pytest.raises(ValueError, match="reconstruction_threshold must be in \\[12, 23\\]"):
        sp.check_share_threshold(50, 23, 11)  # 2t <= num_shares: both kinds from honest holders
    with pytest.raises(ValueError, match="reconstruction_threshold must be in \\[2, 3\\]"):
        sp.check_share_threshold(50, 3, 1)
    with pytest.raises(ValueError, match="num_shares must be in \\[3, 50\\]"):
        sp.check_share_threshold(50, 1, 1)


def test_disconnection_bound_holds_for_random_harary_graphs():
    """Monte Carlo of E2 on Flower's graph (shuffled ring, k/2 neighbours each side) at a loose setting."""
    n, k, removed = 40, 4, 16
    rng = np.random.default_rng(0)
    trials, disconnected = 4000, 0
    for _ in range(trials):
        gone = np.zeros(n, dtype=bool)
        gone[rng.choice(n, removed, replace=False)] = True  # positions on the shuffled ring
        kept = np.flatnonzero(~gone)
        gaps = np.diff(np.append(kept, kept[0] + n)) - 1  # removed nodes between ring neighbours
        disconnected += int(np.sum(gaps >= k // 2) >= 2)
    bound = 2 ** sp.log2_disconnect(n, k, removed)
    assert disconnected / trials <= bound
    assert disconnected > 0  # the event is real at this setting, so the check above is not vacuous
