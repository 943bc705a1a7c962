"""The private evaluation of the final model: the handlers under LocalGrid, the ledgers, the accounting, the refusals.

The accounting is checked against independent formulas: dp_accounting's RDP accountant for Gaussian noise (the
selection, DP-FedAvg and the evaluation composed), the Gaussian mechanism's closed form for the evaluation's curve
and Agarwal, Kairouz & Liu's Skellam bound written out here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from flwr.app import ArrayRecord, Context
from flwr.clientapp import ClientApp
from flwr.serverapp import GaussianPrivacyEvent
from flwr.serverapp.strategy import FedAvg
from helpers import CANDS, TableTask, grid_of, scores_table, sum_config

from dphype.flower import (
    DPHype,
    PreflightError,
    PrivateEvaluation,
    TrainingBudget,
    private_training,
    register_dphype,
    register_private_evaluation,
)
from dphype.flower.local import LocalGrid
from dphype.node.ledger import Ledger
from dphype.privacy.accounting import RDP_ORDERS, calibrate, privacy_report, rdp_epsilon, vote_rdp
from dphype.privacy.evaluation import (
    COLLAPSE_GUIDE,
    EVALUATION_SCALE,
    calibrate_evaluation,
    evaluation_epsilon,
    evaluation_rdp,
    release_evaluation,
)
from dphype.result import DPHypeResult

N = 6
MODEL = ArrayRecord([np.arange(5.0)])


def app_with(evaluate, scores=None) -> ClientApp:
    """A ClientApp with DP-Hype's vote and the private evaluation, each node's values from ``evaluate(partition)``."""
    scores = scores_table(N) if scores is None else scores
    app = ClientApp()
    register_dphype(app, lambda ctx: TableTask(scores[int(ctx.node_config["partition-id"])]))

    def node_evaluation(context: Context, arrays: ArrayRecord):
        assert np.array_equal(arrays.to_numpy_ndarrays()[0], np.arange(5.0))  # the model the server sent
        return evaluate(int(context.node_config["partition-id"]))

    register_private_evaluation(app, node_evaluation)
    return app


def selected(grid: LocalGrid, **config) -> tuple[DPHypeResult, PrivateEvaluation]:
    cfg = sum_config(**config)
    evaluation = PrivateEvaluation(cfg, share=1.0)  # checked before any client works
    return DPHype(CANDS, cfg).start(grid), evaluation


def node_ledgers(grid: LocalGrid, tmp_path) -> list[list]:
    return [Ledger(tmp_path / f"ledger-{i}.json").entries() for i in range(N)]


def grid_with(app: ClientApp, tmp_path, **policy) -> LocalGrid:
    grid = grid_of(app, N)
    for i, context in enumerate(grid.contexts.values()):
        context.node_config.update({"dphype-ledger": str(tmp_path / f"ledger-{i}.json"), **policy})
    return grid


@pytest.mark.parametrize("noise", ["skellam", "gaussian"])
def test_the_means_are_released_with_their_noise_and_charged_in_every_ledger(tmp_path, noise):
    accuracy = np.linspace(0.7, 0.9, N)
    grid = grid_with(app_with(lambda i: (accuracy[i], 0.6)), tmp_path)
    result, evaluation = selected(grid, epsilon=100.0, noise=noise)
    result = evaluation.start(grid, MODEL, result)
    ev = result.evaluation
    assert ev is not None and ev.contributors == N and ev.noise == noise
    std = evaluation.sigma / (EVALUATION_SCALE if noise == "skellam" else 1) / N  # all n shares: sigma exactly
    assert ev.noise_std == pytest.approx(std, rel=1e-12)
    assert ev.accuracy == pytest.approx(accuracy.mean(), abs=6 * std + 1e-3)
    assert ev.majority_baseline == pytest.approx(0.6, abs=6 * std + 1e-3)
    assert ev.epsilon == pytest.approx(100.0, rel=1e-6) and ev.verdict() is None
    for entries in node_ledgers(grid, tmp_path):  # the vote, then the evaluation, each before anything left
        assert [e.release for e in entries] == ["vote", "evaluation"]
        assert entries[1].k == 2 and entries[1].noise == noise
    assert ev.composed_epsilon is not None and 100.0 < ev.composed_epsilon < 200.0 and ev.run_epsilon is None
    text = result.summary()
    assert "private evaluation of the final model on 6 of 6 clients" in text and "BELOW" not in text
    again = DPHypeResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again.evaluation == ev


def test_a_pick_below_the_majority_class_says_so_in_the_last_line(tmp_path):
    grid = grid_with(app_with(lambda i: (0.24, 0.76)), tmp_path)
    result, evaluation = selected(grid, epsilon=100.0)
    result = evaluation.start(grid, MODEL, result)
    last = result.summary().splitlines()[-1]
    assert last.startswith("warning: the selected candidate trained a model BELOW the majority-class baseline")
    assert "beyond 2 noise std" in last and last.endswith(f"score best on their own rows: {COLLAPSE_GUIDE}")
    noisy = release_evaluation([0.5 * EVALUATION_SCALE * N, 0.6 * EVALUATION_SCALE * N], N, sigma=5000.0,
                               clients=N, dropout=0.0, noise="skellam", delta=1e-5, accountant=None,
                               neighbouring="replace-one", share=0.5)
    assert "the noise may explain it" in str(noisy.verdict()) and "BELOW" not in str(noisy.verdict())


def test_a_node_refuses_above_its_own_limit_and_nothing_is_released(tmp_path):
    grid = grid_with(app_with(lambda i: (0.8, 0.6)), tmp_path)
    result, evaluation = selected(grid, epsilon=100.0)
    for context in grid.contexts.values():  # the operators lower their limit after the selection
        context.node_config["dphype-max-epsilon"] = 50.0
    with pytest.raises(PreflightError, match=r"6 x refused: policy .*nothing was sent and nothing was released"):
        evaluation.start(grid, MODEL, result)
    assert all([e.release for e in entries] == ["vote"] for entries in node_ledgers(grid, tmp_path))


@pytest.mark.parametrize(("values", "code"), [(lambda i: (1.2, 0.5), "task_error"),
                                              (lambda i: (float("nan"), 0.5), "task_error")])
def test_values_outside_0_1_are_refused_never_clipped(tmp_path, values, code):
    grid = grid_with(app_with(values), tmp_path)
    result, evaluation = selected(grid, epsilon=100.0)
    with pytest.raises(PreflightError, match=f"refused: {code}"):
        evaluation.start(grid, MODEL, result)


def test_a_model_other_than_the_one_named_is_refused(tmp_path, monkeypatch):
    grid = grid_with(app_with(lambda i: (0.8, 0.6)), tmp_path)
    result, evaluation = selected(grid, epsilon=100.0)
    named = evaluation.request(ArrayRecord([np.zeros(5)]))
    monkeypatch.setattr(evaluation, "request", lambda arrays: named)  # a server that names another model
    with pytest.raises(PreflightError, match="refused: malformed_request"):
        evaluation.start(grid, MODEL, result)


@pytest.mark.parametrize("share", [0.0, 1.5, True, float("nan"), "0.1"])
def test_the_share_is_refused_before_any_client_works(share):
    with pytest.raises(ValueError, match=r"evaluation share must be a number in \(0, 1\]"):
        PrivateEvaluation(sum_config(), share=share)


def test_the_evaluation_curve_is_the_gaussian_and_skellam_mechanisms():
    """Gaussian: alpha L2^2 / (2 sigma^2) with L2 = sqrt(2); Skellam: the AKL21 bound with L2 = sqrt(2) Q, L1 = 2 Q."""
    sigma = 3.7
    assert np.allclose(evaluation_rdp(sigma, "gaussian"), RDP_ORDERS * 2.0 / (2 * sigma**2), rtol=1e-12)
    q, lam = EVALUATION_SCALE, (sigma * 1000) ** 2
    a = np.maximum(np.ceil(RDP_ORDERS), 2.0)
    l2sq, l1 = 2.0 * q * q, 2.0 * q
    expected = a * l2sq / (2 * lam) + np.minimum(((2 * a - 1) * l2sq + 6 * l1) / (4 * lam**2), 3 * l1 / (2 * lam))
    assert np.allclose(evaluation_rdp(sigma * 1000, "skellam"), expected, rtol=1e-12)
    for noise, accountant in [("skellam", "rdp"), ("gaussian", "rdp"), ("gaussian", "analytic")]:
        s = calibrate_evaluation(0.5, 1e-5, noise=noise, accountant=accountant)
        assert evaluation_epsilon(s, 1e-5, noise=noise, accountant=accountant) == pytest.approx(0.5, rel=1e-8)


def test_the_run_composes_selection_training_and_evaluation_as_dp_accounting_does():
    """Gaussian vote + 3 DP-FedAvg rounds + the evaluation: our composition equals dp_accounting's."""
    delta = 1e-5
    report = privacy_report(calibrate(1.0, delta, 5, noise="gaussian", accountant="rdp"), delta, clients=20,
                            dropout=0.0, survivors=20, accountant="rdp")
    private = private_training(FedAvg(fraction_evaluate=0.0), report, TrainingBudget(epsilon=2.0, rounds=3),
                               sampled_clients=20)
    z = private.noise_multiplier
    private.accountant.compose(GaussianPrivacyEvent(noise_multiplier=z, sample_size=20, population_size=20), 3)
    from dphype.flower.private_evaluation import compose_evaluation  # noqa: PLC0415 - the function under test

    sigma = calibrate_evaluation(0.5, delta, noise="gaussian", accountant="rdp")
    released = release_evaluation([0.8 * 20, 0.6 * 20], 20, sigma=sigma, clients=20, dropout=0.0, noise="gaussian",
                                  delta=delta, accountant="rdp", neighbouring="replace-one", share=0.5)
    result = DPHypeResult(selected_index=0, selected=CANDS[0], noisy_sum=None, report=report, selection=None,
                          candidates=CANDS)
    composed = compose_evaluation(released, result, private.accountant)
    reference = dp_accounting.rdp.RdpAccountant(list(RDP_ORDERS))
    reference.compose(dp_accounting.GaussianDpEvent(report.sigma / math.sqrt(10)))  # top-5 vote: L2 sqrt(2k)
    reference.compose(dp_accounting.GaussianDpEvent(sigma / math.sqrt(2)))  # the evaluation: L2 sqrt(2)
    assert composed.composed_epsilon == pytest.approx(reference.get_epsilon(delta), rel=1e-9)
    reference.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z / 2), 3))  # replace-one
    assert composed.run_epsilon == pytest.approx(reference.get_epsilon(delta), rel=1e-9)
    training = private.report()
    assert training["training"]["rounds_released"] == 3  # the evaluation is not a training round
    assert training["run"]["epsilon"] == pytest.approx(composed.run_epsilon, rel=1e-12)
    assert "evaluation" in training["run"]["accountant"] and training["run"]["releases"] == 5


def test_the_ledger_composes_votes_and_evaluations_and_reads_older_entries(tmp_path, capsys):
    from dphype.node.evaluation_policy import EvaluationGuarantee  # noqa: PLC0415
    from dphype.node.policy import NodePolicy, VoteGuarantee  # noqa: PLC0415

    policy = NodePolicy(ledger=tmp_path / "ledger.json", lifetime_epsilon=100.0)
    ledger = Ledger(policy.ledger)
    vote = VoteGuarantee(noise="skellam", k=5, total_std=30.0, survivors=10, epsilon=1.0, delta=1e-5,
                         neighbouring="replace-one")
    evaluation = EvaluationGuarantee(noise="skellam", k=2, total_std=9000.0, survivors=10, epsilon=0.5, delta=1e-5,
                                     neighbouring="replace-one")
    ledger.spend(vote, policy, "a" * 64)
    total = ledger.spend(evaluation, policy, "b" * 64)
    curve = vote_rdp(5, 30.0, "skellam") + evaluation_rdp(9000.0, "skellam")
    assert total == pytest.approx(rdp_epsilon(curve, 1e-5)[0], rel=1e-12)
    from dphype.cli import main  # noqa: PLC0415

    assert main(["ledger", "--path", str(policy.ledger), "--json"]) == 0  # the operator's view counts each kind
    shown = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert shown["votes"] == 1 and shown["evaluations"] == 1 and shown["epsilon"] == pytest.approx(total, rel=1e-12)
    # a ledger written before the evaluation existed (entries without "release") still reads, as votes
    data = json.loads(policy.ledger.read_text())
    old = [{k: v for k, v in data["entries"][0].items() if k != "release"}]
    from dphype.node.ledger import _checksum  # noqa: PLC0415

    policy.ledger.write_text(json.dumps({**data, "entries": old, "checksum": _checksum(old)}))
    assert [e.release for e in ledger.entries()] == ["vote"]


def test_the_gaussian_evaluation_is_the_audited_top_1_vote_release():
    """In value units the Gaussian evaluation (L2 = sqrt(2)) is the replace-one top-1 vote release (Lemma III.1):
    the same sigma, so `dphype.privacy.audit.audit_vote_noise(k=1)` audits its noise path (`noise_share`)."""
    for epsilon in (0.1, 0.5, 2.0):
        for accountant in ("analytic", "rdp"):
            vote = calibrate(epsilon, 1e-5, 1, noise="gaussian", accountant=accountant)
            assert calibrate_evaluation(epsilon, 1e-5, noise="gaussian", accountant=accountant) == pytest.approx(
                vote.sigma, rel=1e-12)


def test_an_evaluation_re_run_in_the_same_run_is_refused_and_charged_once(tmp_path):
    """One evaluation per request and run: a server that re-runs the evaluation request in the same run (to average
    the noise away, or to drain the nodes' budgets) is refused in the pre-flight, before any node evaluates, and each
    ledger holds the one evaluation."""
    evaluated = []
    grid = grid_with(app_with(lambda i: evaluated.append(i) or (0.8, 0.6)), tmp_path)
    result, evaluation = selected(grid, epsilon=100.0)
    evaluation.start(grid, MODEL, result)
    assert sorted(evaluated) == list(range(N))
    with pytest.raises(PreflightError, match=f"{N} x refused: already_voted"):
        evaluation.start(grid, MODEL, result)
    assert sorted(evaluated) == list(range(N))  # nothing evaluated again
    assert all([e.release for e in entries] == ["vote", "evaluation"] for entries in node_ledgers(grid, tmp_path))


def test_the_gaussian_values_lie_on_the_secure_sums_grid_so_its_rounding_never_depends_on_them():
    """A Gaussian value is sent as ``rint(F (x + share))``: with ``x`` on the grid ``1/F`` that is ``F x + rint(F
    share)`` for every share (the vote's rounding); off the grid the rounding error would be a function of the data."""
    from dphype.privacy.evaluation import quantize  # noqa: PLC0415
    from dphype.secure.secure_sum import encode, fixed_point_scale  # noqa: PLC0415

    grid = fixed_point_scale("gaussian")
    values = quantize([0.3337, 0.9999], "gaussian")
    assert np.array_equal(values * grid, np.rint(values * grid))
    assert np.all(np.abs(values - [0.3337, 0.9999]) <= 0.5 / grid)  # rounded, not clipped
    shares = np.random.default_rng(7).normal(0.0, 3.0, size=(2000, 2))
    sent = np.array([encode(values + share, "gaussian", 2**40) for share in shares])
    assert np.array_equal(sent, values * grid + np.array([encode(share, "gaussian", 2**40) for share in shares]))
    assert np.array_equal(quantize([0.3337, 0.9999], "skellam"), [334.0, 1000.0])  # the integer grid, within [0, Q]


@pytest.mark.parametrize("app, policy, message", [
    (object(), None, "app must be a flwr ClientApp"),
    (ClientApp(), {"dphype-max-epsilon": 1.0}, "policy must be a NodePolicy, a function of the context or None"),
])
def test_a_bad_registration_is_refused_as_the_votes_is(app, policy, message):
    with pytest.raises(ValueError, match=message):
        register_private_evaluation(app, lambda context, arrays: (1.0, 0.5), policy=policy)


def test_the_verdict_points_to_a_section_the_guide_has():
    page, section = COLLAPSE_GUIDE.split(", ", 1)
    text = (Path(__file__).resolve().parents[2] / page).read_text(encoding="utf-8")
    assert f"\n## {section.strip(chr(34))}\n" in text
