"""Noise kinds are registered types: a new kind is sampled, accounted for and checked as itself everywhere, and an
unknown kind is refused at every entry point with the same message."""

import argparse
import ast
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from dphype.cli import add_noise_arguments
from dphype.config import DPHypeConfig
from dphype.flower.final_training import RunAccountant
from dphype.node.ledger import Ledger, LedgerEntry
from dphype.privacy import noise_kinds
from dphype.privacy.accounting import RDP_ORDERS, VoteEvent, calibrate, mechanism_epsilon, privacy_report, vote_rdp
from dphype.privacy.audit import claimed_profile
from dphype.privacy.noise import (
    client_noise_variance,
    committee_noise_share,
    honest_tallies,
    noise_share,
    noise_tail_bound,
    replay_committee_sums,
    replay_noisy_sums,
    summed_noise,
)
from dphype.privacy.noise_kinds import (
    NoiseKind,
    ShareNoiseKind,
    any_noise_kind,
    check_noise,
    noise_kind,
    noise_kind_names,
    register_noise_kind,
    resolve_accountant,
)
from dphype.privacy.winner import WINNER_NOISE, DiscreteLaplace, epsilon_with_samplers, winner_rdp
from dphype.secure import secure_sum as ss


class Marked(ShareNoiseKind):
    """A throwaway integer kind whose every answer shows that it, and no other kind, was asked.

    Its draws are the constant ``round(1000 variance)`` (not noise: only the dispatch is under test), its tail is 0,
    its RDP curve the constant 0.125 and its epsilon ``L2 / sigma``.
    """

    name = "marked"
    label = "Marked"
    description = "a test's throwaway kind"
    integer = True
    fixed_point_scale = 1
    accountants = ("rdp",)

    def draw(self, size, variance, rng):
        return np.full(size, round(1000 * variance), dtype=np.int64)

    def tail(self, threshold, variance):
        return 0.0

    def rdp(self, orders, l2, l1, sigma):
        return np.full(len(orders), 0.125)

    def epsilon(self, l2, l1, sigma, delta, accountant):
        return l2 / sigma

    def vote_profile(self, epsilons, sigma, k):
        return np.full(len(epsilons), 0.25)


@pytest.fixture
def marked(monkeypatch):
    """``Marked`` registered for one test; the registry is restored afterwards."""
    monkeypatch.setattr(noise_kinds, "_KINDS", noise_kinds._KINDS.copy())
    register_noise_kind(Marked)
    return noise_kind("marked")


def test_the_registry_holds_the_two_kinds_with_their_constants():
    assert noise_kind_names() == ("gaussian", "skellam")
    assert noise_kind_names(integer=True) == ("skellam",) and noise_kind_names(integer=False) == ("gaussian",)
    gaussian, skellam = noise_kind("gaussian"), noise_kind("skellam")
    assert (gaussian.fixed_point_scale, skellam.fixed_point_scale) == (2**10, 1)
    assert (gaussian.default_accountant, skellam.default_accountant) == ("analytic", "rdp")
    rng = np.random.default_rng(0)
    assert gaussian.draw(3, 4.0, rng).dtype == np.float64 and skellam.draw(3, 4.0, rng).dtype == np.int64


def test_a_new_kind_is_sampled_accounted_and_checked_as_itself(marked):
    """Every path that samples, accounts for, encodes or checks the noise asks the kind the name names."""
    rng = np.random.default_rng(0)
    variance = client_noise_variance(2.0, 10, 0.2)
    assert check_noise("marked") == "marked" and "marked" in noise_kind_names(integer=True)
    # sampling: one share, the survivors' sum, replays, the committee's shares
    assert np.array_equal(noise_share(3, sigma=2.0, clients=10, dropout=0.2, kind="marked", rng=rng),
                          np.full(3, round(1000 * variance)))
    assert np.array_equal(summed_noise(2, sigma=2.0, clients=10, dropout=0.2, survivors=9, kind="marked", rng=rng),
                          np.full(2, round(9000 * variance)))
    replayed = replay_noisy_sums(np.zeros(4), sigma=2.0, clients=10, repetitions=2, rng=rng, dropout=0.2,
                                 noise="marked")
    assert np.array_equal(replayed, np.full((2, 4), round(10_000 * variance)))
    share = committee_noise_share(4, sigma=2.0, parties=3, rng=rng, noise="marked")
    assert np.array_equal(share, np.full(4, round(1000 * 4.0 / honest_tallies(3))))
    assert np.array_equal(replay_committee_sums(np.zeros(4), sigma=2.0, parties=3, repetitions=1, rng=rng,
                                                per_tally=True, noise="marked"), 3 * share[None, :])
    # the secure sum's range and encoding
    assert noise_tail_bound(2.0, 10, 0.2, kind="marked").failure_probability == 0.0
    assert ss.fixed_point_scale("marked") == 1
    assert ss.clip_probability(size=4, sigma=2.0, clients=10, dropout=0.2, noise="marked") == 0.0
    assert np.array_equal(ss.decode(ss.encode(np.array([3.0, -2.0]), "marked"), "marked"), [3, -2])
    with pytest.raises(ValueError, match="noisy_votes must be integers for Marked noise"):
        ss.encode(np.array([0.5]), "marked")
    # accounting: the kind's epsilon, its RDP curve, calibration, the audit's profile
    assert resolve_accountant(None, "marked") == "rdp"
    with pytest.raises(ValueError, match="accountant must be 'rdp' for marked noise, got 'analytic'"):
        resolve_accountant("analytic", "marked")
    assert mechanism_epsilon(2.0, 4.0, 8.0, "marked", 1e-5, "rdp") == 0.25
    assert np.array_equal(vote_rdp(2, 3.0, "marked"), np.full(len(RDP_ORDERS), 0.125))
    assert calibrate(0.5, 1e-5, 2, noise="marked").sigma == pytest.approx(4.0, rel=1e-9)  # L2 / sigma = 0.5
    assert np.array_equal(claimed_profile(np.array([0.0, 1.0]), sigma=1.0, k=1, noise="marked"), [0.25, 0.25])
    with pytest.raises(ValueError, match="noise must be 'gaussian' for raw_scores releases"):
        VoteEvent(1, 4, 1.0, noise="marked", raw_scores=True)
    # the configuration, a node's ledger and the CLI take the name
    assert DPHypeConfig(1.0, 1e-5, 2, 10, noise="marked").accountant == "rdp"
    entry = LedgerEntry(noise="marked", k=2, total_std=3.0, survivors=5, epsilon=1.0, delta=1e-6,
                        neighbouring="replace-one", time="2026-01-01T00:00:00Z", request="")
    assert np.array_equal(entry.rdp("replace-one"), np.full(len(RDP_ORDERS), 0.125))
    parser = argparse.ArgumentParser()
    add_noise_arguments(parser)
    assert parser.parse_args(["--noise", "marked"]).noise == "marked"


class Stated(NoiseKind):
    """A throwaway kind that is not a share kind, sampled like the winner's: its curve shows what it was given."""

    name = "stated"
    label = "Stated"
    description = "a test's throwaway kind of a whole release"
    integer = True
    sampled = True

    def stated_rdp(self, orders, *, k, sigma, epsilon, stated, neighbouring):
        return np.full(len(orders), 1e-3 * k + 1e-2 * sigma + 0.1 * epsilon + (stated != neighbouring))


def test_the_winner_release_noise_is_a_registered_kind_that_no_configuration_names():
    kind = any_noise_kind(WINNER_NOISE)
    assert isinstance(kind, DiscreteLaplace) and (kind.name, kind.integer, kind.sampled) == ("discrete-laplace", True,
                                                                                            True)
    assert noise_kind_names(shares=False) == ("gaussian", "skellam", "discrete-laplace")
    assert noise_kind_names() == ("gaussian", "skellam") and noise_kind_names(integer=True) == ("skellam",)
    for refused in (lambda: noise_kind(WINNER_NOISE), lambda: check_noise(WINNER_NOISE),
                    lambda: DPHypeConfig(1.0, 1e-5, 2, 10, noise=WINNER_NOISE)):
        with pytest.raises(ValueError, match="noise must be one of gaussian, skellam, got 'discrete-laplace'"):
            refused()
    # its curve: the pure epsilon's, rescaled between the relations (replace-one moves the threshold twice as far)
    orders = np.asarray(RDP_ORDERS)
    assert np.array_equal(kind.stated_rdp(orders, k=3, sigma=2.0, epsilon=0.5, stated="add-remove",
                                          neighbouring="replace-one"), winner_rdp(1.0, orders))
    assert np.array_equal(kind.stated_rdp(orders, k=3, sigma=2.0, epsilon=0.5, stated="replace-one",
                                          neighbouring="replace-one"), winner_rdp(0.5, orders))


def test_the_ledger_and_the_run_accountant_take_a_vote_curve_and_its_sampler_from_the_kind(monkeypatch, tmp_path):
    """A vote's ledger entry and a run's selection compose by their kind's `stated_rdp` and `sampled`, by no name."""
    monkeypatch.setattr(noise_kinds, "_KINDS", noise_kinds._KINDS.copy())
    register_noise_kind(Stated)
    curve = Stated().stated_rdp(np.asarray(RDP_ORDERS), k=2, sigma=3.0, epsilon=1.0, stated="add-remove",
                                neighbouring="replace-one")
    entry = LedgerEntry(noise="stated", k=2, total_std=3.0, survivors=5, epsilon=1.0, delta=1e-6,
                        neighbouring="add-remove", time="2026-01-01T00:00:00Z", request="")
    assert np.array_equal(entry.rdp("replace-one"), curve)
    assert Ledger(tmp_path / "l.json").composed_epsilon([entry], 1e-6, "replace-one") == epsilon_with_samplers(
        curve, 1e-6, 1)
    with pytest.raises(ValueError, match="invalid ledger entry"):  # an evaluation is a sum of shares
        dataclasses.replace(entry, release="evaluation")
    report = privacy_report(calibrate(1.0, 1e-5, 2, accountant="rdp"), 1e-5, clients=20, dropout=0.0, survivors=20,
                            accountant="rdp")
    stated = dataclasses.replace(report, noise="stated", sigma=3.0, neighbouring="add-remove")
    accountant = RunAccountant(stated, population=20, max_epsilon=None)
    same = Stated().stated_rdp(np.asarray(RDP_ORDERS), k=report.k, sigma=3.0, epsilon=report.epsilon,
                               stated="add-remove", neighbouring="add-remove")
    assert accountant.get_epsilon(1e-5) == epsilon_with_samplers(same, 1e-5, 1)


def _noise_name_comparisons(source: str, names: set[str]) -> list[int]:
    """The lines of ``source`` comparing a noise kind's name, or a ``noise`` value by equality (not the registry's)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        equality = any(isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)) for op in node.ops)
        operands = [node.left, *node.comparators]
        operands += [e for o in operands if isinstance(o, (ast.Tuple, ast.List, ast.Set)) for e in o.elts]
        for operand in operands:
            word = operand.id if isinstance(operand, ast.Name) else getattr(operand, "attr", None)
            literal = operand.value if isinstance(operand, ast.Constant) else None
            if (literal in names or (isinstance(word, str) and word.endswith("_NOISE"))
                    or (equality and word == "noise")):
                found.append(node.lineno)
    return sorted(set(found))


def test_no_module_compares_noise_names_the_registry_decides():
    """The kinds answer for themselves: no module tells one noise kind from another by its name."""
    root = Path(__file__).resolve().parents[2]
    names = set(noise_kind_names(shares=False))
    modules = sorted([*(root / "dphype").rglob("*.py"), *(root / "simulations").rglob("*.py")])
    found = [f"{path}:{line}" for path in modules
             for line in _noise_name_comparisons(path.read_text(encoding="utf-8"), names)]
    assert found == []
    planted = ("def f(entry, kind):\n    a = entry.noise == WINNER_NOISE\n    b = kind in ('x', 'skellam')\n"
               "    c = entry.noise != kind\n    return entry.noise in names(), kind.integer == a\n")
    assert _noise_name_comparisons(planted, names) == [2, 3, 4]


def test_a_kind_is_gone_once_its_test_ends(monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(noise_kinds, "_KINDS", noise_kinds._KINDS.copy())
        register_noise_kind(Marked)
        assert noise_kind("marked").name == "marked"
    with pytest.raises(ValueError, match="noise must be one of gaussian, skellam, got 'marked'"):
        noise_kind("marked")


def test_registration_refuses_a_taken_name_and_an_unknown_accountant(monkeypatch):
    monkeypatch.setattr(noise_kinds, "_KINDS", noise_kinds._KINDS.copy())

    class Twice(Marked):
        name = "gaussian"

    class Private(Marked):
        name = "private"
        accountants = ("prv",)

    with pytest.raises(ValueError, match="noise kind 'gaussian' is already registered"):
        register_noise_kind(Twice)
    with pytest.raises(ValueError, match="accountants must be a non-empty subset of analytic, rdp"):
        register_noise_kind(Private)
    assert noise_kind_names() == ("gaussian", "skellam")


@pytest.mark.parametrize("entry", [
    lambda: noise_kind("laplace"),
    lambda: check_noise("laplace"),
    lambda: resolve_accountant(None, "laplace"),
    lambda: noise_share(3, sigma=1.0, clients=4, dropout=0.0, kind="laplace", rng=np.random.default_rng(0)),
    lambda: summed_noise(3, sigma=1.0, clients=4, dropout=0.0, survivors=4, kind="laplace",
                         rng=np.random.default_rng(0)),
    lambda: replay_noisy_sums(np.zeros(3), sigma=1.0, clients=4, repetitions=1, rng=np.random.default_rng(0),
                              noise="laplace"),
    lambda: committee_noise_share(3, sigma=1.0, parties=3, rng=np.random.default_rng(0), noise="laplace"),
    lambda: replay_committee_sums(np.zeros(3), sigma=1.0, parties=3, repetitions=1, rng=np.random.default_rng(0),
                                  noise="laplace"),
    lambda: noise_tail_bound(1.0, 4, 0.0, kind="laplace"),
    lambda: ss.fixed_point_scale("laplace"),
    lambda: ss.encode(np.zeros(3), "laplace"),
    lambda: ss.decode(np.zeros(3), "laplace"),
    lambda: ss.check_range(size=3, sigma=1.0, clients=4, dropout=0.0, noise="laplace"),
    lambda: mechanism_epsilon(2.0, 4.0, 1.0, "laplace", 1e-5, "rdp"),
    lambda: VoteEvent(2, None, 1.0, noise="laplace"),
    lambda: calibrate(1.0, 1e-5, 2, noise="laplace"),
    lambda: vote_rdp(2, 1.0, "laplace"),
    lambda: claimed_profile(np.zeros(2), sigma=1.0, k=1, noise="laplace"),
    lambda: DPHypeConfig(1.0, 1e-5, 2, 10, noise="laplace"),
    lambda: noise_kind(["gaussian"]),
])
def test_an_unknown_kind_is_refused_at_every_entry_point(entry):
    with pytest.raises(ValueError, match=r"noise must be one of gaussian, skellam, got "):
        entry()


def test_an_unknown_kind_is_refused_by_the_ledger_and_the_cli():
    with pytest.raises(ValueError, match="invalid ledger entry"):
        LedgerEntry(noise="laplace", k=2, total_std=3.0, survivors=5, epsilon=1.0, delta=1e-6,
                    neighbouring="replace-one", time="2026-01-01T00:00:00Z", request="")
    parser = argparse.ArgumentParser()
    add_noise_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--noise", "laplace"])


@pytest.mark.parametrize(("threshold", "variance"), [(3.0, 2.0), (10.0, 10.0), (40.0, 100.0), (120.0, 1000.0)])
def test_skellams_tail_bound_covers_both_signs_or_the_secure_sums_failure_probability_is_understated(threshold,
                                                                                                     variance):
    """P(|X| > t) <= 2 min_l E[e^(l X)] e^(-l m) (m = floor(t) + 1, the union of the two signs' Chernoff bounds),
    with Skellam's moment generating function ``exp(2 mu (cosh l - 1))`` minimised numerically here; a one-sided
    bound (half of it) is below what the code must promise. It also bounds the exact tail (scipy)."""
    from scipy.optimize import minimize_scalar
    from scipy.stats import skellam

    mu, m = variance / 2.0, math.floor(threshold) + 1.0
    best = minimize_scalar(lambda lam: 2.0 * mu * (math.cosh(lam) - 1.0) - lam * m, bounds=(0.0, 20.0),
                           method="bounded", options={"xatol": 1e-12})
    expected = min(1.0, 2.0 * math.exp(best.fun))
    bound = noise_kind("skellam").tail(threshold, variance)
    assert bound == pytest.approx(expected, rel=1e-6)
    assert bound >= 2.0 * skellam.sf(math.floor(threshold), mu, mu)
