"""The DP-SGD / DP-Adam problems (dphype.ml.oracles.dpsgd) against Opacus called directly and a plain gradient step."""

import numpy as np
import pytest

from dphype.ml.oracles import make_problem
from dphype.ml.oracles.dpsgd import DPSGD_DISTRIBUTIONS, DPSGD_DOMAINS, dpsgd_epsilon, dpsgd_steps, train_dpsgd
from dphype.ml.oracles.space import Domain, Hyperparameter, sample_configs
from dphype.ml.reference import majority_of_test_split


def test_dpsgd_epsilon_equals_opacus_rdp_accountant_stepped_independently():
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    config = {"epochs": 3, "lot_size": 100, "lr": 0.01, "noise_variance": 1.44, "clip_norm": 1.0}
    n = 1000
    eps = dpsgd_epsilon(config, n, 1e-5, "rdp")
    acc = RDPAccountant()
    for _ in range(30):  # 3 epochs * 1000 / 100 steps
        acc.step(noise_multiplier=1.2, sample_rate=0.1)
    orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + list(range(64, 1025, 16))
    assert eps == pytest.approx(acc.get_epsilon(1e-5, alphas=orders), rel=1e-12)
    assert eps <= acc.get_epsilon(1e-5) + 1e-12  # more orders can only help
    direct, _ = get_privacy_spent(orders=orders, rdp=compute_rdp(q=0.1, noise_multiplier=1.2, steps=30, orders=orders),
                                  delta=1e-5)
    assert eps == pytest.approx(direct, rel=1e-9)
    prv = dpsgd_epsilon(config, n, 1e-5, "prv")
    assert 0 < prv <= eps * 1.05  # PRV is the tighter accountant


def test_dpsgd_step_without_noise_is_plain_gradient_step():
    import torch

    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((40, 3)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 2, 40))
    config = {"epochs": 1, "lot_size": 40, "lr": 0.5, "noise_variance": 0.0, "clip_norm": 1e6}
    model = train_dpsgd("logreg", "dpsgd", x, y, 2, config, seed=0)  # q = 1: one full-batch step
    ref = torch.nn.Linear(3, 2)
    torch.nn.init.zeros_(ref.weight)
    torch.nn.init.zeros_(ref.bias)
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    # Two float32 sums of the 40 per-sample gradients (each |x| / 2 at zero weights) in different orders (Opacus's
    # and autograd's kernels): the means differ by at most 2 (n - 1) u max|x| / 2, times lr (about 3e-6); a missed
    # sample, clip or factor moves weights by 1e-2 or more.
    bound = 0.5 * (len(x) - 1) * np.finfo(np.float32).eps / 2 * float(x.abs().max())
    np.testing.assert_allclose(model.weight.detach().numpy(), -0.5 * ref.weight.grad.numpy(), rtol=0.0, atol=bound)
    # Tiny lots: many empty Poisson samples still step (pure noise, here zero).
    sparse = train_dpsgd("svm", "dpadam", x, y, 2, {**config, "lot_size": 1}, seed=1)
    assert torch.isfinite(sparse.weight).all()


def test_dpsgd_steps_round_and_refuse():
    assert dpsgd_steps(2, 50, 1000) == (0.05, 40)
    with pytest.raises(ValueError, match="lot_size must be in \\[1, 1000\\]"):
        dpsgd_steps(1, 1001, 1000)


def test_dpsgd_problem_end_to_end_small():
    problem = make_problem("dpsgd-logreg-adult", runs=2, train_size=400)
    assert problem.domain.names == ("epochs", "lot_size", "lr", "noise_variance", "clip_norm")
    config = {"epochs": 1, "lot_size": 40, "lr": 0.05, "noise_variance": 1.0, "clip_norm": 1.0}
    ev = problem.evaluate(config, np.random.default_rng(0))
    assert ev.epsilon == pytest.approx(dpsgd_epsilon(config, 400, 1e-5))
    # 400 rows, one epoch: the private model only just beats always predicting the majority class (measured
    # 0.7636 against 0.7596), so this checks that the pipeline trains, not that it learns much
    assert majority_of_test_split("adult") < ev.utility.mean <= 1.0 and len(ev.utility.runs) == 2
    with pytest.raises(ValueError, match="lot_size must be"):
        problem.evaluate({**config, "lot_size": 4}, np.random.default_rng(0))


def test_appendix_c_sampling_respects_accept_ranges():
    dom = Domain(tuple(
        Hyperparameter(k, lo, hi, log=True, integer=k in ("epochs", "lot_size"))
        for k, (lo, hi) in DPSGD_DOMAINS["adult"].items()
    ))
    cfgs = sample_configs(dom, DPSGD_DISTRIBUTIONS["adult"], 300, np.random.default_rng(0))
    dom.check(cfgs)
    lots = np.array([c["lot_size"] for c in cfgs])
    assert 100 < lots.mean() < 170  # Normal(128, 64) truncated to [8, 512]
    lrs = np.array([c["lr"] for c in cfgs])
    assert lrs.min() >= 1e-3 and np.median(lrs) < 0.1  # shifted exponential, rate 10
