"""Optional DP final training (dphype.flower.final_training): calibration, composition with the selection, app."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.serverapp import GaussianPrivacyEvent, PrivacyAccountant
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg
from helpers import PERMISSIVE, a_run_folder

from dphype.config import DPHypeConfig
from dphype.flower import BoundedFedAvg, ClippingError, TrainingBudget, check_private_training, private_training
from dphype.flower.final_training import RunAccountant, TrainingError, flower_training_spent
from dphype.flower.local import LocalGrid
from dphype.privacy.accounting import calibrate, fedavg_epsilon, privacy_report


def selection(noise: str = "gaussian", epsilon: float = 1.0):
    release = calibrate(epsilon, 1e-5, 5, noise=noise, accountant="rdp")
    return privacy_report(release, 1e-5, clients=20, dropout=0.0, survivors=20, accountant="rdp")


def test_composition_matches_dp_accounting():
    """Gaussian vote + R Gaussian rounds: the run's epsilon equals dp_accounting's RDP accountant's."""
    report = selection("gaussian")
    private = private_training(FedAvg(fraction_evaluate=0.0), report, TrainingBudget(epsilon=2.0, rounds=5),
                               sampled_clients=20)
    z = private.noise_multiplier
    assert fedavg_epsilon(z, 5, 1e-5) == pytest.approx(2.0, rel=1e-5)  # calibrated to the training budget
    for _ in range(5):
        private.accountant.compose(GaussianPrivacyEvent(noise_multiplier=z, sample_size=20, population_size=20))
    reference = dp_accounting.rdp.RdpAccountant(list(np.linspace(1.1, 200, 2000)))
    reference.compose(dp_accounting.GaussianDpEvent(report.sigma / np.sqrt(10)))  # L2 sqrt(2k), k = 5
    reference.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z / 2), 5))  # replace-one
    spent = private.accountant.get_privacy_spent()
    assert spent.epsilon == pytest.approx(reference.get_epsilon(1e-5), rel=2e-3)
    assert 2.0 < spent.epsilon < 1.0 + 2.0  # RDP composition beats adding the epsilons
    assert spent.num_releases == 6
    assert private.accountant.get_delta(spent.epsilon) == pytest.approx(1e-5, rel=1e-3)


@pytest.mark.parametrize("neighbouring", ["replace-one", "add-remove"])
def test_flowers_rdp_accountant_gives_our_training_epsilon(neighbouring):
    """The training rounds alone: Flower's RdpAccountant (PrivacyAccountant interface) and ours agree."""
    for z, rounds in [(0.8, 1), (1.7, 5), (4.0, 30)]:
        spent = flower_training_spent(z, rounds, sampled_clients=10, population=10, delta=1e-6,
                                      neighbouring=neighbouring)
        ours = fedavg_epsilon(z, rounds, 1e-6, neighbouring=neighbouring)
        assert spent.epsilon == pytest.approx(ours, rel=1e-9) and spent.num_releases == rounds
    # replace-one costs more than add/remove at the same multiplier (twice the sensitivity)
    assert (flower_training_spent(1.7, 5, sampled_clients=10, population=10, delta=1e-6, neighbouring="replace-one")
            .epsilon > fedavg_epsilon(1.7, 5, 1e-6, neighbouring="add-remove"))
    with pytest.raises(ValueError, match="rounds"):
        flower_training_spent(1.0, 0, sampled_clients=10, population=10, delta=1e-6, neighbouring=neighbouring)


def test_the_run_reports_both_training_epsilons():
    report = selection("gaussian")
    private = private_training(FedAvg(fraction_evaluate=0.0), report, TrainingBudget(epsilon=2.0, rounds=4),
                               sampled_clients=20)
    accountant: PrivacyAccountant = private.accountant  # the wrappers' accountant is Flower's interface
    event = GaussianPrivacyEvent(noise_multiplier=private.noise_multiplier, sample_size=20, population_size=20)
    assert private.report()["training"]["epsilon"] is None  # no round released yet
    accountant.compose(event, 4)
    training = private.report()["training"]
    assert training["epsilon"] == pytest.approx(2.0, rel=1e-5)  # the training budget, all four rounds spent
    assert training["epsilon_flower"] == pytest.approx(training["epsilon"], rel=1e-9)


def test_the_accountant_refuses_rounds_beyond_the_plan():
    report = selection("skellam")
    private = private_training(FedAvg(fraction_evaluate=0.0), report, TrainingBudget(epsilon=1.0, rounds=3),
                               sampled_clients=20)
    event = GaussianPrivacyEvent(noise_multiplier=private.noise_multiplier, sample_size=20, population_size=20)
    accountant = private.accountant
    for _ in range(3):
        assert not accountant.would_exceed(event)
        accountant.compose(event)
    assert accountant.would_exceed(event)  # a fourth round would overspend the run's total
    assert isinstance(private.strategy, DifferentialPrivacyServerSideFixedClipping)  # the default: server clips
    assert private.strategy.accountant is accountant  # Flower's accounted mode: strict replies, uniform weights


def test_skellam_selection_starts_the_curve():
    accountant = RunAccountant(selection("skellam", epsilon=0.5), population=20,
                               max_epsilon=None)
    assert accountant.get_epsilon(1e-5) == pytest.approx(0.5, rel=1e-2)  # integer-order Skellam bound on the grid


def test_accountant_state_round_trips_and_refuses_forgetting():
    """Flower's PrivacyAccountant protocol: state_dict/load_state_dict restore the composed curve."""
    report = selection("gaussian")
    make = lambda: RunAccountant(report, population=20, max_epsilon=None)  # noqa: E731
    spent, fresh = make(), make()
    spent.compose(GaussianPrivacyEvent(noise_multiplier=1.5, sample_size=20, population_size=20), count=4)
    fresh.load_state_dict(spent.state_dict())
    assert fresh.get_epsilon(1e-5) == spent.get_epsilon(1e-5) > make().get_epsilon(1e-5)
    assert fresh.num_releases == 5
    with pytest.raises(ValueError, match="must not be below"):
        spent.load_state_dict(make().state_dict())  # restoring an earlier state would forget 4 rounds
    with pytest.raises(ValueError, match="neighbouring"):
        fresh.load_state_dict({**spent.state_dict(), "neighbouring": "add-remove"})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"epsilon": 0.0, "rounds": 3}, "epsilon"), ({"epsilon": 1.0, "rounds": 0}, "rounds"),
     ({"epsilon": 1.0, "rounds": 3, "clipping_norm": -1.0}, "clipping_norm"),
     ({"epsilon": 1.0, "rounds": 3, "clipping": "both"}, "clipping must be one of server, client")])
def test_bad_budgets_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainingBudget(**kwargs)


def test_bundled_app_trains_privately_and_reports_both_phases():
    import dphype.app.client_app as client_app
    from dphype.app.run_config import AppConfig
    from dphype.app.server_app import run_app

    cfg = AppConfig(DPHypeConfig(epsilon=20.0, delta=1e-5, k=3, clients=4), candidates="table3:random:6:0",
                    fedavg_rounds=2, local_epochs=1, fraction_evaluate=0.0, train_epsilon=50.0, clipping_norm=5.0)
    grid = LocalGrid(client_app.app, 4, run_config={"dataset": "adult", "seed": 0, "local-epochs": 1},
                     node_config=PERMISSIVE)
    summary = run_app(grid, cfg, a_run_folder())
    training, run = summary["training"], summary["run"]
    assert training["private"] and training["rounds_released"] == 2 and training["noise_multiplier"] > 0
    assert "clipped" in training["released"] and run["releases"] == 4  # the selection, 2 rounds, the evaluation
    assert training["epsilon_flower"] == pytest.approx(training["epsilon"], rel=1e-9) and training["epsilon"] < 50.0
    assert training["clipping"].startswith("server-side") and "weight to 1" in training["weights"]
    # the private evaluation (half the selection's epsilon, 10) is composed into the run's guarantee
    assert summary["privacy"]["epsilon"] < run["epsilon"] < summary["privacy"]["epsilon"] + 50.0 + 10.0
    assert summary["evaluation"]["run_epsilon"] == pytest.approx(run["epsilon"], rel=1e-12)
    trains = [r for r in grid.replies if r.metadata.message_type == "train"]
    assert len(trains) == 8 and all(dict(r.content["metrics"]) == {"num-examples": 1} for r in trains)  # set by
    # the server: the clients sent their training metrics and weights, which the private rounds do not keep


def test_private_training_needs_no_client_metrics():
    from dphype.app.run_config import AppConfig

    with pytest.raises(ValueError, match="fraction-evaluate must be 0 when train-epsilon > 0"):
        AppConfig(DPHypeConfig(epsilon=1.0, delta=1e-5, k=3, clients=4), train_epsilon=1.0)


def test_ordinary_training_says_what_it_releases():
    import dphype.app.client_app as client_app
    from dphype.app.run_config import AppConfig
    from dphype.app.server_app import run_app

    cfg = AppConfig(DPHypeConfig(epsilon=20.0, delta=1e-5, k=3, clients=3), candidates="table3:random:6:0",
                    fedavg_rounds=1, local_epochs=1, fraction_evaluate=0.0)
    grid = LocalGrid(client_app.app, 3, run_config={"dataset": "adult", "seed": 0, "local-epochs": 1},
                     node_config=PERMISSIVE)
    summary = run_app(grid, cfg, a_run_folder())
    assert summary["training"]["private"] is False and "plaintext model updates" in summary["training"]["released"]
    assert summary["run"]["epsilon"] is None


def step_app(step: float, *, clip: bool, weight: int | None = None) -> ClientApp:
    """A client whose update moves every weight by ``step`` (L2 norm ``step * sqrt(4)``), reporting its node id as
    its weight unless ``weight`` is given; ``clip`` adds Flower's ``fixedclipping_mod``."""
    app = ClientApp()

    @app.train(mods=[fixedclipping_mod] if clip else [])
    def train(msg: Message, context: Context) -> Message:
        w = msg.content["arrays"].to_numpy_ndarrays()[0] + step
        metrics = MetricRecord({"num-examples": weight if weight is not None else context.node_id, "loss": 0.5})
        return Message(RecordDict({"arrays": ArrayRecord([w]), "metrics": metrics}), reply_to=msg)

    return app


def train_privately(app: ClientApp, budget: TrainingBudget):
    private = private_training(FedAvg(fraction_evaluate=0.0), selection(), budget, sampled_clients=4)
    result = private.strategy.start(LocalGrid(app, 4), initial_arrays=ArrayRecord([np.zeros(4, np.float32)]),
                                    num_rounds=budget.rounds)
    return private, result


def test_unclipped_client_updates_are_refused_and_the_report_says_not_private():
    """Client-side clipping promised but a client forgot fixedclipping_mod: the server sees an update of norm 2
    above the clipping norm 1, refuses the round before aggregating and the report says not private."""
    budget = TrainingBudget(epsilon=5.0, rounds=2, clipping_norm=1.0, clipping="client")
    private = private_training(FedAvg(fraction_evaluate=0.0), selection(), budget, sampled_clients=4)
    with pytest.raises(ClippingError, match=r"round 1 refused: 4 of 4 updates exceed the clipping norm 1 "
                                            r"\(largest L2 norm 2\b"):
        private.strategy.start(LocalGrid(step_app(1.0, clip=False), 4),
                               initial_arrays=ArrayRecord([np.zeros(4, np.float32)]), num_rounds=2)
    report = private.report()
    assert report["training"]["private"] is False and report["run"]["epsilon"] is None
    assert "ABOVE the norm 1 in round 1 (4 updates, largest norm 2)" in report["training"]["clipping"]
    assert private.accountant.num_releases == 1  # the refused round was neither released nor accounted


def test_client_clipping_is_verified_and_weights_are_set_by_the_server():
    """With fixedclipping_mod the updates have norm 1 (clipped from 2): verified, aggregated with uniform weights
    although the clients report different ones (Flower alone would refuse: unequal weights), and reported."""
    budget = TrainingBudget(epsilon=5.0, rounds=2, clipping_norm=1.0, clipping="client")
    private, result = train_privately(step_app(1.0, clip=True), budget)
    training = private.report()["training"]
    assert training["private"] and "verified by the server" in training["clipping"]
    assert "at most 1 (largest 1, within" in training["clipping"]
    assert private.accountant.num_releases == 3
    assert dict(result.train_metrics_clientapp[1]) == {}  # the clients' "loss" was not kept


def test_server_clipping_is_the_default_and_clips():
    """The default budget clips on the server: an update of norm 20 enters the average with norm 1."""
    budget = TrainingBudget(epsilon=100.0, rounds=1, clipping_norm=1.0)  # the largest budget: z = 0.195
    private, result = train_privately(step_app(10.0, clip=False), budget)
    final = result.arrays.to_numpy_ndarrays()[0]
    assert budget.clipping == "server" and private.report()["training"]["private"]
    assert np.linalg.norm(final) == pytest.approx(1.0, abs=0.3)  # not 20 (noise std z C / 4 = 0.05: 6 of them)


@pytest.mark.parametrize(("strategy", "message"), [
    (FedAvg(fraction_train=0.5, fraction_evaluate=0.0), "fraction_train must be 1.0"),
    (FedAvg(), "fraction_evaluate must be 0.0"),
    (FedAvg(fraction_evaluate=0.0, min_train_nodes=30), "min_train_nodes must be at most sampled_clients=20")])
def test_training_preconditions_are_checked_before_the_selection(strategy, message):
    with pytest.raises(ValueError, match=message):
        check_private_training(strategy, TrainingBudget(epsilon=1.0, rounds=3), delta=1e-5,
                               neighbouring="replace-one", sampled_clients=20)


def test_the_bundled_app_checks_private_training_before_any_client_works():
    from dphype.app.run_config import AppConfig
    from dphype.app.server_app import run_app

    cfg = AppConfig(DPHypeConfig(epsilon=20.0, delta=1e-5, k=3, clients=4), candidates="table3:random:6:0",
                    fraction_evaluate=0.0, train_epsilon=1.0)

    class NoGrid(LocalGrid):
        def get_node_ids(self):
            raise AssertionError("a node was contacted")

    import dphype.app.server_app as server_app
    original = server_app._fedavg
    server_app._fedavg = lambda cfg, survivors: FedAvg(fraction_train=0.5, fraction_evaluate=0.0)
    try:
        with pytest.raises(ValueError, match="fraction_train must be 1.0"):
            run_app(NoGrid(step_app(0.0, clip=False), 4), cfg, a_run_folder())
    finally:
        server_app._fedavg = original


@pytest.mark.parametrize(("excess", "refused"), [(2.0, True), (0.5, False)])
def test_the_servers_clipping_check_holds_at_its_boundary(excess, refused):
    """The server verifies client clipping to float32 rounding (``CLIP_TOLERANCE``), not to a 5% slack:
    an update of norm C (1 + 2 tol) is refused, one of norm C (1 + tol / 2) accepted."""
    from dphype.flower.final_training import CLIP_TOLERANCE

    budget = TrainingBudget(epsilon=5.0, rounds=1, clipping_norm=1.0, clipping="client")
    app = step_app((1.0 + excess * CLIP_TOLERANCE) / 2, clip=False)  # 4 weights: norm 2 x step
    if refused:
        with pytest.raises(ClippingError, match="round 1 refused: 4 of 4 updates exceed the clipping norm 1"):
            train_privately(app, budget)
    else:
        private, _ = train_privately(app, budget)
        assert private.report()["training"]["private"]


@pytest.mark.parametrize("factor", [1.01, 1.001])
def test_an_update_just_above_the_clipping_norm_is_refused_whatever_the_tolerance_constant(factor):
    """An update of norm 1.01 C or 1.001 C is not float32 rounding of a clipped one (float32 moves a norm near 1 by
    about 1e-7): the server refuses the round, nothing is aggregated or accounted, and the report says not
    private. The norms are absolute, so a tolerance loosened to a few per cent fails here."""
    budget = TrainingBudget(epsilon=5.0, rounds=1, clipping_norm=1.0, clipping="client")
    private = private_training(FedAvg(fraction_evaluate=0.0), selection(), budget, sampled_clients=4)
    app = step_app(factor / 2, clip=False)  # 4 weights: norm 2 x step
    try:
        private.strategy.start(LocalGrid(app, 4), initial_arrays=ArrayRecord([np.zeros(4, np.float32)]),
                               num_rounds=1)
    except ClippingError as err:
        assert "round 1 refused: 4 of 4 updates exceed the clipping norm 1" in str(err)
    else:
        pytest.fail(f"updates of L2 norm {factor} x the clipping norm were accepted as clipped")
    assert private.report()["training"]["private"] is False
    assert private.accountant.num_releases == 1  # the selection only: the refused round was not accounted


def test_fedavg_waits_for_a_vanished_voter_only_so_long_then_goes_on_with_the_others_or_stops(caplog):
    grid = LocalGrid(ClientApp(), 4)  # one voter of 5 is gone: Flower's own FedAvg would wait for it forever
    arrays = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})
    strategy = BoundedFedAvg(fewest=3, wait=0.05, fraction_evaluate=0.5, min_train_nodes=5, min_evaluate_nodes=5,
                             min_available_nodes=5)
    assert len(list(strategy.configure_train(1, arrays, ConfigRecord(), grid))) == 4
    assert "4 of the 5 nodes FedAvg trains on are connected after 0.05 s; going on with them" in caplog.text
    assert (strategy.min_available_nodes, strategy.min_train_nodes, strategy.min_evaluate_nodes) == (4, 4, 4)
    assert len(list(strategy.configure_evaluate(1, arrays, ConfigRecord(), grid))) == 4  # no second wait
    strict = BoundedFedAvg(fewest=5, wait=0.05, min_train_nodes=5, min_available_nodes=5)
    with pytest.raises(TrainingError, match="only 4 of 5 training nodes connected \\(< 5\\): restart the voters' "
                                            "SuperNodes, or run again\nFedAvg waited 0.05 s for the 5 it can go on "
                                            "with"):
        strict.configure_train(1, arrays, ConfigRecord(), grid)
    for bad in ({"fewest": 0, "wait": 1.0}, {"fewest": 3, "wait": 0.0}):
        with pytest.raises(ValueError, match="must be"):
            BoundedFedAvg(**bad)


@pytest.mark.parametrize("epsilon", [100.5, 1e6, float("inf"), float("nan"), 0.0, -1.0])
def test_a_training_budget_outside_0_to_100_is_refused_for_library_callers_too(epsilon):
    """``TrainingBudget`` is what a library caller builds directly (no run config check before it): an epsilon
    above `dphype.checks.MAX_EPSILON` is no privacy and must be refused as one at 0 or below is."""
    with pytest.raises(ValueError, match=r"epsilon must be a finite number in \(0, 100\]"):
        TrainingBudget(epsilon=epsilon, rounds=1)
