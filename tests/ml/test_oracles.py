"""Privacy and utility oracles (dphype.ml.oracles) against closed forms and Opacus called directly."""

import math

import numpy as np
import pytest

from dphype.ml import oracles
from dphype.ml.reference import majority_of_test_split


def test_svt_privacy_is_dpareto_appendix_b():
    # (1 + (2C)^(1/3)) (1 + (2C)^(2/3)) / b
    assert oracles.svt_epsilon(1.0, 1) == pytest.approx((1 + 2 ** (1 / 3)) * (1 + 2 ** (2 / 3)))
    assert oracles.svt_epsilon(4.0, 4) == pytest.approx((1 + 2.0) * (1 + 4.0) / 4.0)
    with pytest.raises(ValueError, match="b must be"):
        oracles.svt_epsilon(0.0, 3)


def test_svt_stops_after_c_answers_and_is_exact_without_noise():
    rng = np.random.default_rng(0)
    answers = np.tile(np.array([1, 0, 1, 1, 0, 1], dtype=bool), (3, 1))
    w = oracles.svt_answers(answers, 1e-9, 2, rng)  # (almost) no noise: the first two true queries
    assert w.tolist() == [[1, 0, 1, 0, 0, 0]] * 3
    w_all = oracles.svt_answers(answers, 1e-9, 10, rng)
    assert (w_all == answers).all()


def test_f1_scores_hand_computed():
    truth = np.array([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=bool)
    pred = np.array([[1, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=bool)
    # row 0: TP=1, FP=1, FN=1 -> 2/4
    np.testing.assert_allclose(oracles.f1_scores(truth, pred), [0.5, 1.0, 1.0])


def test_svt_problem_oracles():
    problem = oracles.make_problem("svt", runs=30)
    rng = np.random.default_rng(1)
    sharp = problem.evaluate({"C": 10, "b": 0.01}, rng)  # tiny noise, C = #positives: perfect
    assert sharp.utility.mean == 1.0 and sharp.epsilon == pytest.approx(oracles.svt_epsilon(0.01, 10))
    noisy = problem.evaluate({"C": 3, "b": 50.0}, rng)
    assert noisy.utility.worst <= noisy.utility.mean <= noisy.utility.best
    assert len(noisy.utility.runs) == 30 and noisy.error == pytest.approx(1 - noisy.utility.mean)


def test_dpsgd_epsilon_equals_opacus_rdp_accountant_stepped_independently():
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    config = {"epochs": 3, "lot_size": 100, "lr": 0.01, "noise_variance": 1.44, "clip_norm": 1.0}
    n = 1000
    eps = oracles.dpsgd_epsilon(config, n, 1e-5, "rdp")
    acc = RDPAccountant()
    for _ in range(30):  # 3 epochs * 1000 / 100 steps
        acc.step(noise_multiplier=1.2, sample_rate=0.1)
    orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + list(range(64, 1025, 16))
    assert eps == pytest.approx(acc.get_epsilon(1e-5, alphas=orders), rel=1e-12)
    assert eps <= acc.get_epsilon(1e-5) + 1e-12  # more orders can only help
    direct, _ = get_privacy_spent(orders=orders, rdp=compute_rdp(q=0.1, noise_multiplier=1.2, steps=30, orders=orders),
                                  delta=1e-5)
    assert eps == pytest.approx(direct, rel=1e-9)
    prv = oracles.dpsgd_epsilon(config, n, 1e-5, "prv")
    assert 0 < prv <= eps * 1.05  # PRV is the tighter accountant


def test_dpsgd_step_without_noise_is_plain_gradient_step():
    import torch

    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((40, 3)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 2, 40))
    config = {"epochs": 1, "lot_size": 40, "lr": 0.5, "noise_variance": 0.0, "clip_norm": 1e6}
    model = oracles.train_dpsgd("logreg", "dpsgd", x, y, 2, config, seed=0)  # q = 1: one full-batch step
    ref = torch.nn.Linear(3, 2)
    torch.nn.init.zeros_(ref.weight)
    torch.nn.init.zeros_(ref.bias)
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    np.testing.assert_allclose(model.weight.detach().numpy(), -0.5 * ref.weight.grad.numpy(), atol=1e-6)
    # Tiny lots: many empty Poisson samples still step (pure noise, here zero).
    sparse = oracles.train_dpsgd("svm", "dpadam", x, y, 2, {**config, "lot_size": 1}, seed=1)
    assert torch.isfinite(sparse.weight).all()


def test_dpsgd_problem_end_to_end_small():
    problem = oracles.make_problem("dpsgd-logreg-adult", runs=2, train_size=400)
    assert problem.domain.names == ("epochs", "lot_size", "lr", "noise_variance", "clip_norm")
    config = {"epochs": 1, "lot_size": 40, "lr": 0.05, "noise_variance": 1.0, "clip_norm": 1.0}
    ev = problem.evaluate(config, np.random.default_rng(0))
    assert ev.epsilon == pytest.approx(oracles.dpsgd_epsilon(config, 400, 1e-5))
    # 400 rows, one epoch: the private model only just beats always predicting the majority class (measured
    # 0.7636 against 0.7596), so this checks that the pipeline trains, not that it learns much
    assert majority_of_test_split("adult") < ev.utility.mean <= 1.0 and len(ev.utility.runs) == 2
    with pytest.raises(ValueError, match="lot_size must be"):
        problem.evaluate({**config, "lot_size": 4}, np.random.default_rng(0))


def test_output_perturbation_privacy_is_analytic_gaussian():
    from dphype.privacy.noise_kinds import analytic_gaussian_epsilon

    problem = oracles.make_problem("logreg-output-perturbation", runs=5, train_size=500)
    sens = oracles.OutputPerturbationSetup().sensitivity(0.01, 500)
    assert sens == pytest.approx(2 * 2.0 / (0.01 * 500))
    assert problem.privacy({"gamma": 0.01, "sigma": 1.0}) == pytest.approx(analytic_gaussian_epsilon(sens, 1.0, 1e-6))
    ev = problem.evaluate({"gamma": 0.1, "sigma": 0.1}, np.random.default_rng(0))
    assert majority_of_test_split("adult") + 0.02 < ev.utility.mean <= 1.0  # measured 0.787 against 0.760
    noisy = problem.evaluate({"gamma": 0.1, "sigma": 10.0}, np.random.default_rng(0))
    assert noisy.utility.mean < ev.utility.mean - 0.1  # output noise 100x larger: measured 0.548


def test_psgd_logreg_stays_in_the_ball():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 4))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = np.sign(x[:, 0] + 0.1)
    w = oracles.train_psgd_logreg(x, y, 2.0, epochs=3, batch_size=8, rng=rng)
    assert np.linalg.norm(w) <= 0.5 + 1e-12 and w[0] > 0


def test_evaluate_rejects_bad_oracle_output():
    good = oracles.make_problem("svt", runs=2)
    nan_utility = oracles.ParetoProblem("broken", good.domain, good.privacy,
                                        lambda c, r: oracles.UtilityResult.from_runs([float("nan")]), 0.0)
    with pytest.raises(ValueError, match="utility oracle of 'broken'"):
        nan_utility.evaluate({"C": 2, "b": 1.0}, np.random.default_rng(0))
    negative_eps = oracles.ParetoProblem("neg", good.domain, lambda c: -1.0, good.utility, 0.0)
    with pytest.raises(ValueError, match="privacy oracle of 'neg'"):
        negative_eps.evaluate({"C": 2, "b": 1.0}, np.random.default_rng(0))
    over_one = oracles.ParetoProblem("big", good.domain, good.privacy,
                                     lambda c, r: oracles.UtilityResult.from_runs([1.5]), 0.0)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        over_one.evaluate({"C": 2, "b": 1.0}, np.random.default_rng(0))
    with pytest.raises(ValueError, match="C must be an integer in"):
        good.evaluate({"C": 0, "b": 1.0}, np.random.default_rng(0))


def test_domain_mapping_grid_and_validation():
    dom = oracles.Domain((oracles.Hyperparameter("n", 1, 64, log=True, integer=True),
                          oracles.Hyperparameter("lr", 1e-3, 1e-1, log=True)))
    cfgs = dom.from_unit(np.array([[0.0, 0.0], [1.0, 1.0], [0.5, 0.5]]))
    assert cfgs[0] == {"n": 1, "lr": pytest.approx(1e-3)} and cfgs[1] == {"n": 64, "lr": pytest.approx(0.1)}
    assert cfgs[2]["n"] == 8 and cfgs[2]["lr"] == pytest.approx(1e-2)
    np.testing.assert_allclose(dom.to_unit(cfgs[:2]), [[0, 0], [1, 1]], atol=1e-12)
    assert len(dom.grid(3)) == 9
    with pytest.raises(ValueError, match="at least one"):
        oracles.Domain(())
    with pytest.raises(ValueError, match="low < high"):
        oracles.Hyperparameter("x", 1.0, 1.0)


def test_appendix_c_sampling_respects_accept_ranges():
    dom = oracles.Domain(tuple(
        oracles.Hyperparameter(k, lo, hi, log=True, integer=k in ("epochs", "lot_size"))
        for k, (lo, hi) in oracles.DPSGD_DOMAINS["adult"].items()
    ))
    cfgs = oracles.sample_configs(dom, oracles.DPSGD_DISTRIBUTIONS["adult"], 300, np.random.default_rng(0))
    dom.check(cfgs)
    lots = np.array([c["lot_size"] for c in cfgs])
    assert 100 < lots.mean() < 170  # Normal(128, 64) truncated to [8, 512]
    lrs = np.array([c["lr"] for c in cfgs])
    assert lrs.min() >= 1e-3 and np.median(lrs) < 0.1  # shifted exponential, rate 10


def test_vote_privacy_oracle_is_dphype_accounting():
    from dphype.privacy.accounting import calibrate

    release = calibrate(1.0, 1e-5, 5, num_candidates=100, accountant="analytic")
    privacy = oracles.vote_privacy_oracle(delta=1e-5, num_candidates=100, accountant="analytic")
    assert privacy({"sigma": release.sigma, "k": 5}) == pytest.approx(1.0, rel=1e-6)
    assert privacy({"sigma": 2 * release.sigma, "k": 5}) < 1.0


def test_candidate_utility_oracle_from_a_task():
    class Task:
        maximize = False

        def score(self, candidates):
            return np.array([c["lr"] for c in candidates])

    utility = oracles.candidate_utility_oracle(Task().score, maximize=Task.maximize)
    assert utility({"lr": 0.25}, np.random.default_rng(0)).mean == pytest.approx(0.75)


def test_candidate_utility_oracle_uses_the_primary_key_of_lexicographic_scores():
    def score(candidates):  # TorchTask-style keys [accuracy, -loss]
        return np.array([[c["lr"], -3.0] for c in candidates])

    utility = oracles.candidate_utility_oracle(score)
    assert utility({"lr": 0.25}, np.random.default_rng(0)).mean == pytest.approx(0.25)


def test_dphype_vote_problem_accepts_lexicographic_keys():
    # every client's accuracy ties for all candidates; the second key (-loss) makes candidate 2 the winner
    keys = np.zeros((30, 5, 2))
    keys[:, :, 0] = 0.75
    keys[:, :, 1] = -1.0
    keys[:, 2, 1] = -0.1
    accuracy = np.array([0.5, 0.5, 0.9, 0.5, 0.5])
    problem = oracles.dphype_vote_problem(keys, accuracy, delta=1e-5, runs=20)
    assert problem.evaluate({"sigma": 1.0, "k": 1}, np.random.default_rng(1)).utility.mean == pytest.approx(0.9)


def test_registry():
    names = oracles.problem_names()
    assert {"svt", "logreg-output-perturbation", "dpsgd-logreg-adult", "dpadam-mlp-mnist"} <= set(names)
    with pytest.raises(ValueError, match="oracle must be one of"):
        oracles.make_problem("nope")
    assert math.isfinite(oracles.dpsgd_steps(2, 50, 1000)[1])


def test_dphype_vote_problem_trades_privacy_for_accuracy():
    rng = np.random.default_rng(0)
    scores = rng.random((40, 10)) * 0.5
    scores[:, 3] += 0.6  # every client ranks candidate 3 first
    accuracy = np.full(10, 0.5)
    accuracy[3] = 0.9
    problem = oracles.dphype_vote_problem(scores, accuracy, delta=1e-5, runs=40)
    quiet = problem.evaluate({"sigma": 2.0, "k": 1}, rng)
    loud = problem.evaluate({"sigma": 100.0, "k": 1}, rng)
    assert quiet.utility.mean == pytest.approx(0.9) and loud.utility.mean < quiet.utility.mean
    assert loud.epsilon < quiet.epsilon
    assert quiet.epsilon == pytest.approx(oracles.vote_privacy_oracle(delta=1e-5, num_candidates=10)(
        {"sigma": 2.0, "k": 1}))
