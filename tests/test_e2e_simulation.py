"""End to end through Flower's simulation runtime: DP-Hype over SecAgg+, then FedAvg (Adult)."""

from __future__ import annotations

import pytest

from dphype.candidates import load_candidates
from server.config import AppConfig
from server.demo import simulate

SUBSET = "table3:random:10:0"


@pytest.mark.slow
def test_ten_clients_select_and_train():
    # epsilon=20 (sigma ~1.1 against 10 votes): the vote, not the noise, decides, so the
    # winner is a candidate most clients rank top-3 and the accuracy check is meaningful.
    cfg = _config(epsilon=20.0, fedavg_rounds=1, clients=10)
    result = simulate(cfg)
    candidates = load_candidates(SUBSET)
    assert result["selected"] == candidates[result["selected_index"]]
    assert result["clients"] == 10 and result["k"] == 3
    assert result["accuracy"] > 0.7  # majority class alone: ~0.76
    privacy = result["privacy"]
    assert privacy["survivors"] == 10 and privacy["clients"] == 10
    assert privacy["accountant"] == "rdp" and privacy["noise"] == "skellam"
    assert privacy["epsilon"] == pytest.approx(20.0, rel=1e-6)
    assert privacy["released"].startswith("noisy vote sum only")


def _config(**overrides) -> AppConfig:
    values = dict(
        dataset="adult",
        epsilon=1.0,
        delta=1e-5,
        k=3,
        dropout=0.0,
        noise="skellam",
        accountant="auto",
        candidates=SUBSET,
        seed=0,
        fedavg_rounds=2,
        local_epochs=1,
        clients=4,
    )
    values.update(overrides)
    return AppConfig(**values)


def test_apps_in_process_select_then_train():
    """The real ServerApp logic and ClientApp (TorchTask on Adult shards) without Ray."""
    from flwr.app import Context, RecordDict
    from local_grid import LocalGrid

    from clients.app import build_client_app
    from server.app import run_app

    # 4 clients: at epsilon=1 the noise (sigma ~10), not the vote, would decide
    cfg = _config(epsilon=20.0, round_timeout=123.0)
    grid = LocalGrid(build_client_app(cfg), cfg.clients)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    summary = run_app(grid, context, cfg)
    assert summary["selected"] == load_candidates(SUBSET)[summary["selected_index"]]
    assert len(summary["noisy_sum"]) == 10
    assert summary["accuracy"] > 0.7
    assert summary["privacy"]["survivors"] == 4
    train_rounds = [
        m for m in grid.sent if m.content.config_records.get("fitins.config", {}).get("dphype.phase") == "train"
    ]
    assert len(train_rounds) == 2 * cfg.clients  # every client trains in every FedAvg round
    # Every SecAgg+ stage and every FedAvg round waits at most round-timeout seconds.
    assert grid.timeouts and set(grid.timeouts) == {123.0}


def test_weights_round_trip_and_local_update():
    import numpy as np

    from dphype.task import make_task
    from server.fedavg import build_global_model, get_weights, local_update, set_weights

    task = make_task("adult", 0, 20, seed=0, epochs=1)
    model = build_global_model("adult", task.data, seed=3)
    weights = get_weights(model)
    same = build_global_model("adult", task.data, seed=3)
    for a, b in zip(weights, get_weights(same)):
        np.testing.assert_array_equal(a, b)  # the seed fixes the initial global model
    other = set_weights(build_global_model("adult", task.data, seed=4), weights)
    for a, b in zip(weights, get_weights(other)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="weight arrays"):
        set_weights(other, weights[:-1])
    trained = local_update(other, task.data, {"lr": 0.1, "decay": 1.0, "momentum": 0.9}, epochs=1, seed=0)
    assert any(not np.array_equal(a, b) for a, b in zip(weights, get_weights(trained)))
