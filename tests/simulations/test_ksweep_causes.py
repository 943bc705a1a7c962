"""``dphype bench ksweep-causes``: why the default ballot trails the best fixed k, on synthetic federations."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from helpers import write_sweep

from dphype.privacy.winner import noise_std
from dphype.selection.voting import auto_depth
from simulations import ksweep_causes
from simulations.cli import main
from simulations.ksweep_aware import Federation


def _federation(top_accuracy: float, n: int = 20, p: int = 30) -> Federation:
    """Every client ranks candidates 0 and 1 first; their FedAvg accuracy is ``top_accuracy``, the rest 0.6-0.9
    except candidate 29 at 0.1 (the federation's lowest)."""
    rng = np.random.default_rng(0)
    scores = rng.random((n, p, 2)) * 0.5
    scores[:, :2, 0] += 1.0
    accuracy = rng.uniform(0.6, 0.9, p)
    accuracy[:2], accuracy[-1] = top_accuracy, 0.1
    local = np.stack([rng.uniform(0.5, 0.8, (n, p)), -rng.random((n, p))], axis=-1)
    return Federation(scores, accuracy, local, np.full(n, 10))


def test_locally_best_candidates_that_federate_to_chance_are_a_collapse() -> None:
    row = ksweep_causes.cause_of(_federation(0.11), 1.0, "replace-one", best_k=12)
    assert row["cause"] == "collapse" and row["default_at_chance"] > 0.9 and row["candidates_at_chance"] == 3
    assert row["default_gap"] > 70  # Opt is near 0.9: the default's winners sit 79 points below it
    row = ksweep_causes.cause_of(_federation(0.95), 1.0, "replace-one", best_k=12)
    assert row["cause"] == "deeper" and row["default_at_chance"] < 0.01 and row["default_gap"] < 1
    assert row["default_k"] == auto_depth(30, noise_std(1.0, "replace-one"), 20)
    assert ksweep_causes.cause_of(_federation(0.95), 1.0, "replace-one", best_k=1)["cause"] == "shallower"


def test_the_accuracy_release_moves_each_count_by_at_most_its_largest_entry() -> None:
    """The accuracy release's premise: one client changes each summed entry by at most ``G``."""
    rng = np.random.default_rng(1)
    g = ksweep_causes.ACCURACY_MAX_ENTRY
    acc = rng.random((15, 40))
    acc[0, 3] = np.nan
    before = ksweep_causes.accuracy_counts(acc)
    assert before[3] == np.rint(acc[1:, 3] * g).sum()  # a non-finite accuracy counts 0
    swapped = acc.copy()
    swapped[4] = rng.random(40)
    assert np.abs(ksweep_causes.accuracy_counts(swapped) - before).max() <= g


def test_the_command_names_a_cause_at_each_trailing_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    k = auto_depth(100, noise_std(1.0, "replace-one"), 20)
    # alpha's best k is the default's (no row); beta's lies 10 above it and trails 5 points there
    runs = [write_sweep(tmp_path / "alpha", "alpha", {(20, 1.0): k}, range(1, 21), slope=0.5),
            write_sweep(tmp_path / "beta", "beta", {(20, 1.0): k + 10}, range(1, 21), slope=0.5)]
    monkeypatch.setattr(ksweep_causes, "load_federation", lambda *a, **kw: _federation(0.95, p=100))
    out = tmp_path / "out"
    assert main(["ksweep-causes", "--runs", *map(str, runs), "--cache", str(tmp_path / "cache"),
                 "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "ksweep_causes.csv").open()))
    assert [(r["dataset"], r["cause"], float(r["behind"])) for r in rows] == [("beta", "deeper", 5.0)]
    assert "| beta | 20 | iid | 1 | 5.00 |" in (out / "ksweep_causes.md").read_text()
    assert (out / "ksweep_causes.png").stat().st_size > 0
