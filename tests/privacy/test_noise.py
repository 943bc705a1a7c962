"""Noise shares: the survivors' sum must carry the calibrated variance (DP-Hype Appendix A)."""

import math

import numpy as np
import pytest
from scipy.stats import chi2, norm, skellam

from dphype.privacy.noise import (
    client_noise_share,
    client_noise_std,
    client_noise_variance,
    min_survivors,
    min_valid_ballots,
    noise_share,
    noise_tail_bound,
    secure_generator,
    summed_noise,
)

SIGMA = 12.84
N_COORDS = 200_000  # coordinates of the summed noise per configuration
Z = 5.0  # two-sided z limit: false-failure probability ~5.7e-7 per check
CONFIGS = [(2, 0.0), (7, 0.5), (10, 0.3), (50, 0.1), (50, 0.0)]


def test_client_variance_formula():
    assert client_noise_variance(10.0, 50, 0.2) == pytest.approx(100.0 / 40.0)
    assert client_noise_std(10.0, 50, 0.0) == pytest.approx(10.0 / math.sqrt(50))


@pytest.mark.parametrize("clients,dropout", CONFIGS + [(3, 1 / 3), (9, 0.999), (1000, 0.25)])
def test_min_survivors_is_the_smallest_count_reaching_sigma_squared(clients, dropout):
    m = min_survivors(clients, dropout)
    per_client = client_noise_variance(SIGMA, clients, dropout)
    assert 1 <= m <= clients
    assert m * per_client >= SIGMA**2 * (1 - 1e-9)  # m survivors: total variance >= sigma^2
    if m > 1:
        assert (m - 1) * per_client < SIGMA**2  # one fewer: not enough
    assert m == next(j for j in range(1, clients + 1) if j >= (1 - dropout) * clients - 1e-9)


def _survivor_sum(kind, clients, dropout, survivors, seed):
    rng = np.random.default_rng(seed)
    total = np.zeros(N_COORDS, dtype=np.float64 if kind == "gaussian" else np.int64)
    for _ in range(survivors):
        total += noise_share(N_COORDS, sigma=SIGMA, clients=clients, dropout=dropout, kind=kind, rng=rng)
    return total


def _variance_z(total, variance, kind):
    """z-score of sum(x^2) against its sampling distribution with known mean 0 and variance V.

    E[sum x^2] = N V. Var[sum x^2] = N (E x^4 - V^2) = N (2 V^2 + kappa_4) with kappa_4 = 0 (Gaussian)
    or kappa_4 = V (symmetric Skellam: cumulants mu1 + mu2 for even orders). N = 2e5 makes the CLT exact
    enough at |z| <= 5.
    """
    n = total.size
    kappa4 = 0.0 if kind == "gaussian" else variance
    ss = float(np.sum(np.asarray(total, dtype=np.float64) ** 2))
    return (ss - n * variance) / math.sqrt(n * (2 * variance**2 + kappa4))


@pytest.mark.parametrize("clients,dropout", CONFIGS)
def test_gaussian_survivor_sum_has_calibrated_variance_chi_square(clients, dropout):
    m = min_survivors(clients, dropout)
    variance = m * client_noise_variance(SIGMA, clients, dropout)
    assert variance >= SIGMA**2 * (1 - 1e-9)
    total = _survivor_sum("gaussian", clients, dropout, m, seed=clients)
    assert total.dtype == np.float64
    # sum(x^2)/V ~ chi2(N) exactly for Gaussian shares; two-sided at 1e-6
    stat = float(np.sum(total**2)) / variance
    assert chi2.ppf(5e-7, N_COORDS) < stat < chi2.isf(5e-7, N_COORDS)
    assert abs(float(np.mean(total))) < Z * math.sqrt(variance / N_COORDS)


@pytest.mark.parametrize("clients,dropout", CONFIGS)
def test_skellam_survivor_sum_has_calibrated_variance(clients, dropout):
    m = min_survivors(clients, dropout)
    variance = m * client_noise_variance(SIGMA, clients, dropout)
    total = _survivor_sum("skellam", clients, dropout, m, seed=100 + clients)
    assert total.dtype == np.int64
    assert abs(_variance_z(total, variance, "skellam")) < Z
    assert abs(float(np.mean(total))) < Z * math.sqrt(variance / N_COORDS)


@pytest.mark.parametrize("kind", ["gaussian", "skellam"])
def test_one_survivor_too_few_is_detectably_short_of_sigma(kind):
    clients, dropout = 7, 0.5  # m = 4 survivors give 8/7 sigma^2, 3 give 6/7 sigma^2
    m = min_survivors(clients, dropout)
    assert m == 4
    total = _survivor_sum(kind, clients, dropout, m - 1, seed=7)
    # one-sided: the sample is far below sigma^2
    assert _variance_z(total, SIGMA**2, kind) < -Z


def test_skellam_share_is_exactly_skellam_distributed():
    rng = np.random.default_rng(3)
    sigma, clients = 3.0, 4  # mu = 9/8 per side
    x = noise_share(100_000, sigma=sigma, clients=clients, dropout=0.0, kind="skellam", rng=rng)
    mu = sigma**2 / (2 * clients)
    values, counts = np.unique(x, return_counts=True)
    expected = skellam.pmf(values, mu, mu) * x.size
    keep = expected > 20
    stat = float(np.sum((counts[keep] - expected[keep]) ** 2 / expected[keep]))
    assert stat < chi2.isf(1e-6, int(keep.sum()))


def test_share_shapes_dtypes_and_reproducibility():
    kw = dict(sigma=5.0, clients=10, dropout=0.2)
    a = noise_share((3, 4), kind="gaussian", rng=np.random.default_rng(1), **kw)
    b = noise_share((3, 4), kind="gaussian", rng=np.random.default_rng(1), **kw)
    assert a.shape == (3, 4) and a.dtype == np.float64 and np.array_equal(a, b)
    c = noise_share(5, kind="skellam", rng=np.random.default_rng(1), **kw)
    assert c.shape == (5,) and c.dtype == np.int64


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(kind="laplace"), "noise must be one of"),
        (dict(clients=1), r"clients must be an integer in \[2, 10000\]"),
        (dict(dropout=1.0), r"dropout must be a number in \[0, 1\)"),
        (dict(sigma=-1.0), "sigma must be a finite number > 0"),
    ],
)
def test_share_bad_input(kwargs, match):
    args = dict(sigma=5.0, clients=10, dropout=0.0, kind="gaussian", rng=np.random.default_rng(0))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        noise_share(3, **args)


def test_tail_bound_values():
    b = noise_tail_bound(10.0, 40, 0.0, kind="gaussian", size=100, num_sigmas=8.0)
    std = 10.0 / math.sqrt(40)
    assert b.client_max_abs == pytest.approx(1.0 + 8.0 * std)
    assert b.sum_max_abs == pytest.approx(40 + 8.0 * 10.0)
    assert b.failure_probability == pytest.approx(100 * 41 * 2 * norm.sf(8.0))
    with pytest.raises(ValueError, match="num_sigmas"):
        noise_tail_bound(10.0, 40, 0.0, num_sigmas=0.0)


@pytest.mark.parametrize("kind", ["gaussian", "skellam"])
@pytest.mark.parametrize("sigma", [12.84, 40.0])
def test_tail_bound_covers_empirical_exceedances(kind, sigma):
    # a loose num_sigmas so that failures are frequent enough to measure, yet the bound is not vacuous
    # (the Skellam Chernoff bound is looser than the exact Gaussian tail, hence a larger num_sigmas)
    clients, size, runs = 10, 20, 4000
    num_sigmas = 3.2 if kind == "gaussian" else 3.6
    bound = noise_tail_bound(sigma, clients, 0.0, kind=kind, size=size, num_sigmas=num_sigmas, max_vote=0.0)
    assert 0.05 < bound.failure_probability < 0.9
    rng = np.random.default_rng(11)
    shares = noise_share((runs, clients, size), sigma=sigma, clients=clients, dropout=0.0, kind=kind, rng=rng)
    failed = (np.abs(shares) > bound.client_max_abs).any(axis=(1, 2)) | (
        np.abs(shares.sum(axis=1)) > bound.sum_max_abs
    ).any(axis=1)
    freq = failed.mean()
    assert freq > 0.05  # the event is observable
    # the bound must dominate the observed failure frequency (binomial slack at 5 sd)
    assert freq <= bound.failure_probability + 5 * math.sqrt(0.25 / runs)


def test_skellam_chernoff_tail_dominates_exact_tail():
    from dphype.privacy.noise_kinds import noise_kind

    for mu in (0.01, 0.5, 3.0, 40.0):
        for t in (0.5, 1.0, 3.0, 10.0, 50.0):
            exact = 2 * skellam.sf(math.floor(t), mu, mu)
            assert noise_kind("skellam").tail(t, 2 * mu) >= exact * (1 - 1e-9)


@pytest.mark.parametrize("clients,dropout,survivors", [(2, 0.0, 2), (7, 0.5, 4), (50, 0.1, 45), (50, 0.0, 1)])
@pytest.mark.parametrize("kind", ["gaussian", "skellam"])
def test_summed_noise_has_the_distribution_of_the_summed_shares(kind, clients, dropout, survivors):
    one_call = summed_noise(N_COORDS, sigma=SIGMA, clients=clients, dropout=dropout, survivors=survivors, kind=kind,
                            rng=np.random.default_rng(5))
    assert one_call.dtype == (np.float64 if kind == "gaussian" else np.int64)
    variance = survivors * client_noise_variance(SIGMA, clients, dropout)
    assert abs(_variance_z(one_call, variance, kind)) < Z
    assert abs(one_call.mean()) < Z * math.sqrt(variance / N_COORDS)
    literal = _survivor_sum(kind, clients, dropout, survivors, seed=6)
    # two-sample Kolmogorov-Smirnov: the one-call draw and the literal sum of shares agree in law
    from scipy.stats import ks_2samp

    assert ks_2samp(one_call[:50_000], literal[:50_000]).pvalue > 1e-4
    if kind == "skellam":  # integer-valued, and exactly the Skellam law: compare a few point masses
        mu = variance / 2
        for value in (0, 1, -2):
            freq = float(np.mean(one_call == value))
            expected = float(skellam.pmf(value, mu, mu))
            assert abs(freq - expected) < Z * math.sqrt(expected * (1 - expected) / N_COORDS)


def test_summed_noise_validates_survivors():
    kw = dict(sigma=1.0, clients=5, dropout=0.0, kind="gaussian", rng=np.random.default_rng(0))
    for bad in (0, 6, 2.5, True):
        with pytest.raises(ValueError, match=r"survivors must be an integer in \[1, 5\]"):
            summed_noise(3, survivors=bad, **kw)
    with pytest.raises(ValueError, match="kind|noise"):
        summed_noise(3, survivors=2, **{**kw, "kind": "laplace"})


# ------------------------------------------------------------------- the client path's secure generator
def test_secure_generator_is_chacha20_with_a_fresh_os_key_each_time():
    a, b = secure_generator(), secure_generator()
    state = a.bit_generator.state
    assert state["bit_generator"] == "randomgen.chacha.ChaCha" and state["state"]["rounds"] == 20
    key_a, key_b = state["state"]["keysetup"], b.bit_generator.state["state"]["keysetup"]
    assert key_a.dtype == np.uint32 and key_a.size == 8  # a 256-bit key
    assert not np.array_equal(key_a, key_b)
    assert not np.array_equal(a.integers(0, 2**63, 8), b.integers(0, 2**63, 8))


def test_client_noise_share_accepts_no_generator():
    with pytest.raises(TypeError, match="rng"):
        client_noise_share(3, sigma=1.0, clients=2, dropout=0.0, kind="gaussian", rng=np.random.default_rng(0))


def stat_below(counts, expected):
    """Pearson chi-square below its 1 - 1e-6 quantile."""
    stat = float(np.sum((counts - expected) ** 2 / expected))
    return stat < chi2.isf(1e-6, counts.size - 1)


@pytest.mark.parametrize("kind", ["gaussian", "skellam"])
def test_secure_shares_have_the_calibrated_variance(kind):
    clients, dropout = 50, 0.1
    variance = client_noise_variance(SIGMA, clients, dropout)
    x = client_noise_share(N_COORDS, sigma=SIGMA, clients=clients, dropout=dropout, kind=kind)
    assert x.dtype == (np.float64 if kind == "gaussian" else np.int64)
    assert abs(_variance_z(x, variance, kind)) < Z
    assert abs(float(np.mean(x))) < Z * math.sqrt(variance / N_COORDS)


def test_secure_skellam_share_is_exactly_skellam_distributed():
    sigma, clients = 3.0, 4  # mu = 9/8 per side
    x = client_noise_share(100_000, sigma=sigma, clients=clients, dropout=0.0, kind="skellam")
    mu = sigma**2 / (2 * clients)
    values, counts = np.unique(x, return_counts=True)
    expected = skellam.pmf(values, mu, mu) * x.size
    keep = expected > 20
    assert stat_below(counts[keep], expected[keep])


def test_secure_gaussian_share_is_normal():
    x = client_noise_share(100_000, sigma=2.0, clients=4, dropout=0.0, kind="gaussian")
    edges = norm.ppf(np.linspace(0, 1, 51)[1:-1], scale=1.0)  # 50 equiprobable bins of N(0, 1)
    counts = np.bincount(np.searchsorted(edges, x), minlength=50)
    assert stat_below(counts, np.full(50, x.size / 50))


def test_the_committee_never_releases_noise_alone_its_floor_of_valid_ballots_is_at_least_one():
    """``min_valid_ballots``: at least one valid ballot, whatever the federation's size and dropout (a floor of 0
    would let the committee open the noise of no ballot at all as a selection)."""
    floors = [min_valid_ballots(n, xi) for n in range(2, 40) for xi in (0.0, 0.1, 0.5, 0.9)]
    assert min(floors) == 1
    assert min_valid_ballots(2, 0.9) == 1 and min_valid_ballots(3, 0.9) == 1
