"""End to end through Flower's simulation runtime: DP-Hype over SecAgg+, then FedAvg (Adult)."""

from __future__ import annotations

import pytest

from dphype.candidates import load_candidates
from server.config import AppConfig
from server.demo import simulate

SUBSET = "table3:random:10:0"


@pytest.mark.slow
def test_ten_clients_select_and_train():
    cfg = AppConfig(
        dataset="adult",
        epsilon=1.0,
        delta=1e-5,
        k=3,
        dropout=0.0,
        noise="skellam",
        accountant="auto",
        candidates=SUBSET,
        seed=0,
        fedavg_rounds=1,
        local_epochs=1,
        clients=10,
    )
    result = simulate(cfg)
    candidates = load_candidates(SUBSET)
    assert result["selected"] == candidates[result["selected_index"]]
    assert result["clients"] == 10 and result["k"] == 3
    assert result["accuracy"] > 0.7  # majority class alone: ~0.76
    privacy = result["privacy"]
    assert privacy["survivors"] == 10 and privacy["clients"] == 10
    assert privacy["accountant"] == "rdp" and privacy["noise"] == "skellam"
    assert privacy["epsilon"] == pytest.approx(1.0, rel=1e-6)
    assert privacy["released"].startswith("noisy vote sum only")
    assert result["seconds"] < 90
