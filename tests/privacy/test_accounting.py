"""Accounting tests: the calibration table of dp-facts.md and independent checks of every formula."""

import json
import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.stats import norm

from dphype import checks
from dphype.privacy import noise_kinds as kinds
from dphype.privacy.accounting import PrivacyReport, VoteEvent, calibrate, epsilon, privacy_report
from dphype.privacy.noise_kinds import (
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    gaussian_rdp_epsilon,
    rdp_to_dp,
    skellam_rdp,
    skellam_rdp_epsilon,
)

DELTA = 1e-5
# dp-facts.md: total noise std for L2 = sqrt(10) (k = 5), delta = 1e-5
TABLE = {
    # eps: (analytic, rdp tighter (Thm I.1), rdp classic, skellam sqrt(variance))
    0.1: (97.24, 107.46, 152.07, 107.46),
    0.25: (42.01, 46.06, 61.02, 46.08),
    0.5: (22.24, 24.25, 30.67, 24.27),
    1.0: (11.80, 12.79, 15.50, 12.84),
    3.0: (4.397, 4.722, 5.369, 4.862),
}


def sig3(x: float) -> float:
    return float(f"{x:.3g}")


@pytest.mark.parametrize("eps", sorted(TABLE))
def test_reproduces_dp_facts_table_to_3_significant_digits(eps):
    analytic, rdp_tight, _, sk = TABLE[eps]
    assert sig3(calibrate(eps, DELTA, 5, noise="gaussian").sigma) == sig3(analytic)
    assert sig3(calibrate(eps, DELTA, 5, accountant="rdp", noise="gaussian").sigma) == sig3(rdp_tight)
    assert sig3(calibrate(eps, DELTA, 5, noise="skellam").sigma) == sig3(sk)


def _classic_rdp_sigma(eps: float, l2: float, delta: float) -> float:
    """Independent closed form: min_alpha alpha c + log(1/delta)/(alpha-1) = c + 2 sqrt(c log(1/delta))
    (Mironov 2017 Prop. 3), solved for c = L2^2/(2 sigma^2)."""
    log_inv = math.log(1.0 / delta)
    c = (math.sqrt(log_inv + eps) - math.sqrt(log_inv)) ** 2
    return l2 / math.sqrt(2.0 * c)


@pytest.mark.parametrize("eps", sorted(TABLE))
def test_classic_conversion_column_and_thm_i1_is_tighter(eps):
    classic = _classic_rdp_sigma(eps, math.sqrt(10), DELTA)
    assert sig3(classic) == sig3(TABLE[eps][2])
    tight = calibrate(eps, DELTA, 5, accountant="rdp", noise="gaussian").sigma
    analytic = calibrate(eps, DELTA, 5, noise="gaussian").sigma
    assert analytic < tight < classic


@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0, 3.0, 8.0])
def test_analytic_matches_dp_accounting_get_sigma_gaussian(eps):
    from dp_accounting import get_sigma_gaussian

    for delta in (1e-5, 1e-8):
        ours = calibrate(eps, delta, 5, noise="gaussian").sigma / math.sqrt(10)  # noise multiplier (sensitivity 1)
        theirs = get_sigma_gaussian(eps, delta)
        assert ours == pytest.approx(theirs, rel=1e-6)


@pytest.mark.parametrize("sigma", [4.0, 11.8, 50.0])
def test_analytic_epsilon_matches_pld_accountant(sigma):
    from dp_accounting import GaussianDpEvent, NeighboringRelation
    from dp_accounting.pld import PLDAccountant

    pld = PLDAccountant(NeighboringRelation.REPLACE_SPECIAL, value_discretization_interval=1e-4)
    pld.compose(GaussianDpEvent(noise_multiplier=sigma / math.sqrt(10)))
    theirs = pld.get_epsilon(DELTA)
    ours = analytic_gaussian_epsilon(math.sqrt(10), sigma, DELTA)
    # PLD discretisation is pessimistic: it may only be (slightly) above the exact value
    assert ours <= theirs + 1e-12
    assert theirs == pytest.approx(ours, rel=1e-6)


@pytest.mark.parametrize("eps,sigma", [(0.0, 3.0), (0.7, 2.0), (1.5, 11.0), (3.0, 1.0)])
def test_analytic_delta_equals_hockey_stick_integral(eps, sigma):
    """Balle-Wang closed form vs direct numerical integration of max(0, p - e^eps q) dx."""
    l2 = math.sqrt(10)

    def integrand(x):
        return max(0.0, norm.pdf(x, loc=l2, scale=sigma) - math.exp(eps) * norm.pdf(x, loc=0.0, scale=sigma))

    # the positive part lives where x > L2/2 + eps sigma^2/L2
    start = l2 / 2 + eps * sigma**2 / l2
    integral, _ = quad(integrand, start, start + 40 * sigma, epsabs=1e-14, epsrel=1e-10, limit=200)
    assert analytic_gaussian_delta(eps, l2, sigma) == pytest.approx(integral, rel=1e-6, abs=1e-15)


@pytest.mark.parametrize("sigma", [4.0, 12.79, 107.46])
def test_gaussian_rdp_matches_opacus(sigma):
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    l2 = math.sqrt(10)
    orders = list(np.concatenate([1 + np.geomspace(1e-3, 1e4, 20000)]))
    rdp = compute_rdp(q=1.0, noise_multiplier=sigma / l2, steps=1, orders=orders)
    theirs, _ = get_privacy_spent(orders=orders, rdp=rdp, delta=DELTA)
    ours = gaussian_rdp_epsilon(l2, sigma, DELTA)
    assert ours <= theirs + 1e-12  # continuous optimum can only beat a grid of orders
    assert ours == pytest.approx(theirs, rel=1e-6)


def test_rdp_to_dp_formula_and_optimal_order():
    # Thm I.1 verbatim
    a, r, d = 7.5, 0.3, 1e-6
    assert rdp_to_dp(r, a, d) == pytest.approx(r + math.log((a - 1) / a) - (math.log(d) + math.log(a)) / (a - 1))
    with pytest.raises(ValueError, match="alpha"):
        rdp_to_dp(0.1, 1.0, d)
    # the continuous minimiser beats a dense grid of orders
    slope = kinds.gaussian_rdp(1.0, math.sqrt(10), 12.0)
    grid = 1 + np.geomspace(1e-4, 1e5, 200001)
    dense = min(rdp_to_dp(slope * x, x, DELTA) for x in grid[::50])
    assert gaussian_rdp_epsilon(math.sqrt(10), 12.0, DELTA) <= dense + 1e-12


@pytest.mark.parametrize("variance", [1.5, 20.0, 163.0, 2.3e3, 1.2e4])
@pytest.mark.parametrize("k", [1, 5])
def test_skellam_integer_order_search_equals_brute_force(variance, k):
    l2, l1 = math.sqrt(2 * k), 2.0 * k
    brute = min(rdp_to_dp(skellam_rdp(a, l2, l1, variance), a, DELTA) for a in range(2, 3000))
    ours, order = skellam_rdp_epsilon(l2, l1, variance, DELTA)
    assert ours == pytest.approx(max(0.0, brute), rel=1e-12, abs=1e-15)
    assert isinstance(order, int) and order >= 2


def test_skellam_bound_formula_and_gaussian_limit():
    l2, l1, lam = math.sqrt(10), 10.0, 50.0
    a = 4
    expected = a * 10 / (2 * lam) + min(((2 * a - 1) * 10 + 60) / (4 * lam**2), 30 / (2 * lam))
    assert skellam_rdp(a, l2, l1, lam) == pytest.approx(expected)
    # Skellam is never better than the Gaussian with the same variance, and converges to it
    for sigma in (3.0, 30.0, 3000.0):
        g = gaussian_rdp_epsilon(l2, sigma, DELTA)
        s, _ = skellam_rdp_epsilon(l2, l1, sigma**2, DELTA)
        assert s >= g
    assert s == pytest.approx(g, rel=2e-3)


@pytest.mark.parametrize("accountant,noise", [("analytic", "gaussian"), ("rdp", "gaussian"), ("rdp", "skellam")])
@pytest.mark.parametrize("eps", [0.05, 0.7, 4.0])
def test_calibrate_epsilon_round_trip(accountant, noise, eps):
    release = calibrate(eps, 1e-6, 3, accountant=accountant, noise=noise)
    assert epsilon(release, 1e-6, accountant) == pytest.approx(eps, rel=1e-8)
    slightly_less = VoteEvent(3, None, release.sigma * 0.999, noise=noise)
    assert epsilon(slightly_less, 1e-6, accountant) > eps


def test_sensitivities_and_independence_from_number_of_candidates():
    r = VoteEvent(k=5, num_candidates=100, sigma=1.0, noise="gaussian")
    assert r.l2_sensitivity == pytest.approx(math.sqrt(10)) and r.l1_sensitivity == 10
    assert (calibrate(1.0, DELTA, 5, num_candidates=100, noise="gaussian").sigma
            == calibrate(1.0, DELTA, 5, noise="gaussian").sigma)
    raw = VoteEvent(k=1, num_candidates=10, sigma=1.0, raw_scores=True, noise="gaussian")
    assert raw.l2_sensitivity == pytest.approx(math.sqrt(10)) and raw.l1_sensitivity == 10
    # raw scores over p = 10 candidates need the same noise as top-5 votes (both L2 = sqrt(10))
    assert calibrate(1.0, DELTA, 1, num_candidates=10, raw_scores=True, noise="gaussian").sigma == pytest.approx(
        calibrate(1.0, DELTA, 5, noise="gaussian").sigma
    )
    # sigma grows like sqrt(k) (Thm III.1: rdp = alpha k / sigma^2)
    s1, s4 = (calibrate(1.0, DELTA, k, accountant="rdp", noise="gaussian").sigma for k in (1, 4))
    assert s4 == pytest.approx(2 * s1, rel=1e-9)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(epsilon=0.0), r"epsilon must be a finite number > 0, got 0"),
        (dict(epsilon=-1.0), r"epsilon must be a finite number > 0"),
        (dict(epsilon=math.inf), r"epsilon must be a finite number > 0"),
        (dict(epsilon=math.nan), r"epsilon must be a finite number > 0"),
        (dict(delta=0.0), r"delta must be a number in \(0, 1\)"),
        (dict(delta=1.0), r"delta must be a number in \(0, 1\)"),
        (dict(k=0), r"k must be an integer in \[1, "),
        (dict(k=6, num_candidates=5), r"k must be an integer in \[1, 5\]"),
        (dict(k=2.5), r"k must be an integer"),
        (dict(accountant="moments"), r"accountant must be one of analytic, rdp"),
        (dict(noise="laplace"), r"noise must be one of gaussian, skellam"),
        (dict(noise="skellam", accountant="analytic"), r"accountant must be 'rdp' for skellam"),
        (dict(noise="skellam", raw_scores=True, num_candidates=10, accountant="rdp"), r"noise must be 'gaussian'"),
        (dict(raw_scores=True), r"num_candidates must be given"),
    ],
)
def test_calibrate_bad_input(kwargs, match):
    args = dict(epsilon=1.0, delta=1e-5, k=5)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        calibrate(args.pop("epsilon"), args.pop("delta"), args.pop("k"), **args)


@pytest.mark.parametrize("clients", [0, 1, checks.MAX_CLIENTS + 1, 50_000, 2.0])
def test_client_count_refused(clients):
    with pytest.raises(ValueError, match=r"clients must be an integer in \[2, 10000\]"):
        checks.check_clients(clients)


def test_client_count_accepted_at_bounds():
    assert checks.check_clients(2) == 2
    assert checks.check_clients(checks.MAX_CLIENTS) == checks.MAX_CLIENTS


def test_validators():
    assert checks.check_dropout(0.0) == 0.0
    with pytest.raises(ValueError, match=r"dropout must be a number in \[0, 1\)"):
        checks.check_dropout(1.0)
    with pytest.raises(ValueError, match="dropout"):
        checks.check_dropout(-0.1)
    with pytest.raises(ValueError, match=r"clients must be an integer in \[2, 10000\], got 1"):
        checks.check_clients(1)
    with pytest.raises(ValueError, match="clients"):
        checks.check_clients(True)
    assert kinds.resolve_accountant(None, "gaussian") == "analytic"
    assert kinds.resolve_accountant(None, "skellam") == "rdp"
    checks.check_budget(1.0, 1e-5, 5, num_candidates=100, clients=10, dropout=0.2)
    with pytest.raises(ValueError, match="clients"):
        checks.check_budget(1.0, 1e-5, 5, clients=1)
    with pytest.raises(ValueError, match="sigma"):
        VoteEvent(5, None, sigma=0.0, noise="gaussian")


def test_privacy_report():
    release = calibrate(1.0, DELTA, 5, noise="skellam")
    rep = privacy_report(release, DELTA, clients=10, dropout=0.3)
    assert isinstance(rep, PrivacyReport)
    assert rep.epsilon == pytest.approx(1.0, rel=1e-8) and rep.accountant == "rdp" and rep.noise == "skellam"
    assert rep.client_std == pytest.approx(release.sigma / math.sqrt(7.0))
    d = rep.to_dict()
    json.dumps(d)
    assert set(d) == {
        "epsilon", "delta", "accountant", "noise", "sigma", "client_std", "clients", "dropout", "k",
        "num_candidates", "survivors", "neighbouring", "l2_sensitivity", "released", "release_delta",
        "ballots_verified", "excluded", "unattributed",
    }
    assert d["release_delta"] is None and rep.guarantee() == "(1, 1e-05)-DP"  # the sum release is (epsilon, delta)-DP
    # SecAgg+ sums whatever the clients send: the report says its ballots were not verified
    assert (d["ballots_verified"], d["excluded"]) == (False, ()) and rep.ballots().startswith("NOT verified")
    assert d["neighbouring"] == "replace-one" and d["l2_sensitivity"] == pytest.approx(math.sqrt(10))
    assert d["released"] == "noisy vote sum only (secure aggregation)"
    # 7 survivors of 10 (xi = 0.3) keep the guarantee; 6 do not, and the report says so
    ok = privacy_report(release, DELTA, clients=10, dropout=0.3, survivors=7)
    assert ok.epsilon <= 1.0 + 1e-9 and ok.sigma == pytest.approx(release.sigma)
    short = privacy_report(release, DELTA, clients=10, dropout=0.3, survivors=6)
    assert short.epsilon > 1.05 and short.sigma < release.sigma
    full = privacy_report(release, DELTA, clients=10, dropout=0.3, survivors=10)
    assert full.epsilon < 1.0
    with pytest.raises(ValueError, match="survivors"):
        privacy_report(release, DELTA, clients=10, dropout=0.3, survivors=11)


def test_theorem_iii1_vote_rdp_is_alpha_k_over_sigma_squared():
    for alpha, k, sigma in [(2.0, 5, 12.0), (37.5, 1, 3.0), (1.01, 100, 250.0)]:
        assert kinds.gaussian_rdp(alpha, math.sqrt(2 * k), sigma) == pytest.approx(alpha * k / sigma**2)
    with pytest.raises(ValueError, match="delta"):
        epsilon(VoteEvent(5, None, 10.0, noise="gaussian"), 0.0)


def test_check_int_is_the_one_integer_validator():
    import numpy as np

    from dphype.checks import check_int

    assert check_int("rounds", np.int64(3), 1) == 3 and isinstance(check_int("rounds", np.int64(3), 1), int)
    assert check_int("iterations", 0, 0) == 0
    for bad in (True, 2.0, "3", 0):
        with pytest.raises(ValueError, match=r"rounds must be an integer >= 1, got "):
            check_int("rounds", bad, 1)


@pytest.mark.parametrize("neighbouring, changed", [("replace-one", 2), ("add-remove", 1)])
@pytest.mark.parametrize("eps", [0.25, 1.0, 4.0])
def test_both_neighbouring_relations_against_dp_accounting(neighbouring, changed, eps):
    """sigma / L2 is dp_accounting's noise multiplier: L2 = sqrt(2k) (replace-one) or sqrt(k) (add-remove)."""
    from dp_accounting import GaussianDpEvent, NeighboringRelation, get_sigma_gaussian
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    k = 5
    release = calibrate(eps, DELTA, k, neighbouring=neighbouring, noise="gaussian")
    assert release.neighbouring == neighbouring and release.l2_sensitivity == pytest.approx(math.sqrt(changed * k))
    multiplier = release.sigma / math.sqrt(changed * k)
    assert multiplier == pytest.approx(get_sigma_gaussian(eps, DELTA), rel=1e-6)
    relation = (NeighboringRelation.REPLACE_SPECIAL if neighbouring == "replace-one"
                else NeighboringRelation.ADD_OR_REMOVE_ONE)
    pld = PLDAccountant(relation, value_discretization_interval=1e-4)
    pld.compose(GaussianDpEvent(noise_multiplier=multiplier))
    assert pld.get_epsilon(DELTA) == pytest.approx(eps, rel=1e-4)
    # RDP: dp_accounting minimises the same conversion over a finite list of orders, we over all alpha > 1
    rdp_release = calibrate(eps, DELTA, k, accountant="rdp", neighbouring=neighbouring, noise="gaussian")
    rdp = RdpAccountant(neighboring_relation=relation)
    rdp.compose(GaussianDpEvent(noise_multiplier=rdp_release.sigma / math.sqrt(changed * k)))
    theirs = rdp.get_epsilon(DELTA)
    assert eps <= theirs + 1e-9 and theirs == pytest.approx(eps, rel=0.02)
    # the report states the relation and the sensitivity
    report = privacy_report(release, DELTA, clients=20, dropout=0.0)
    assert report.neighbouring == neighbouring and report.l2_sensitivity == pytest.approx(math.sqrt(changed * k))
    assert report.epsilon == pytest.approx(eps, rel=1e-8)


def test_add_remove_sensitivities_and_noise():
    top = VoteEvent(k=5, num_candidates=100, sigma=1.0, neighbouring="add-remove", noise="gaussian")
    assert top.l2_sensitivity == pytest.approx(math.sqrt(5)) and top.l1_sensitivity == 5
    raw = VoteEvent(k=1, num_candidates=10, sigma=1.0, raw_scores=True, neighbouring="add-remove", noise="gaussian")
    assert raw.l2_sensitivity == pytest.approx(math.sqrt(10)) and raw.l1_sensitivity == 10  # unchanged
    # half the squared sensitivity: sigma shrinks by sqrt(2) for every Gaussian accountant
    for accountant in ("analytic", "rdp"):
        ratio = (calibrate(1.0, DELTA, 5, accountant=accountant, noise="gaussian").sigma
                 / calibrate(1.0, DELTA, 5, accountant=accountant, neighbouring="add-remove", noise="gaussian").sigma)
        assert ratio == pytest.approx(math.sqrt(2), rel=1e-8)
    # Skellam: L1 enters too, and add-remove needs less noise
    assert (calibrate(1.0, DELTA, 5, noise="skellam", neighbouring="add-remove").sigma
            < calibrate(1.0, DELTA, 5, noise="skellam").sigma)
    with pytest.raises(ValueError, match="neighbouring must be one of replace-one, add-remove"):
        calibrate(1.0, DELTA, 5, neighbouring="swap", noise="gaussian")


def test_calibration_at_a_tiny_epsilon_answers_or_says_why():
    # huge noise: the Skellam accountant's best order exceeds int64 and lambda^2 overflows; both still answer
    for noise in ("skellam", "gaussian"):
        release = calibrate(1e-9, 1e-5, 5, noise=noise)
        assert math.isfinite(release.sigma) and epsilon(release, 1e-5) <= 1e-9
    # beyond what floating point can solve: a ValueError that names epsilon and the fix, not a crash
    with pytest.raises(ValueError, match=r"epsilon 3\.5e-120 at delta 1e-05 cannot be solved.*larger epsilon"):
        calibrate(3.5e-120, 1e-5, 5, noise="skellam")
