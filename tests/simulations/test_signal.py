"""dphype bench signal: the validation schemes' noiseless and released gaps, on one shared ground truth."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import TINY, bench

from simulations import harness


def test_signal_compares_schemes_on_the_same_ground_truth(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    # the smallest bundled table: the schemes' comparison, not the data, is under test
    res: dict[str, Any] = bench(["signal", *TINY, "--dataset", "breast-cancer",
                                 "--validations", "split", "kfold:3", "kfold:3:loss", "--epsilons", "1",
                                 "--ks", "1", "2", "--repetitions", "20",
                                 "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "s")], capsys)
    assert res["validations"] == ["split", "kfold:3", "kfold:3:loss"]
    rows = list(csv.DictReader((tmp_path / "s" / "signal.csv").open()))
    assert len(rows) == 2 * 3  # partitions x schemes x epsilons
    for row in rows:
        assert float(row["noiseless_best_gap"]) <= float(row["noiseless_mean_gap"])
        assert -1 <= float(row["local_rank_correlation"]) <= 1
        assert 0 <= float(row["release_auto_within_2pt"]) <= 1
    # one FedAvg ground truth per federation, one score array per base scheme (':loss' reuses kfold:3's)
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 2 * (1 + 2)
    assert set(res["summary"]) == {"split", "kfold:3", "kfold:3:loss"}


def test_the_single_split_keeps_the_cache_key_of_the_scores_before_schemes(tmp_path: Path) -> None:
    cache = harness.ArrayCache(tmp_path)
    fed = harness.Federation("breast-cancer", 3, None)
    from dphype.selection.candidates import table_iii_grid

    cands = table_iii_grid()
    seen: list[dict[str, Any]] = []
    cache.get = lambda key, compute, on_hit=None: seen.append(dict(key)) or np.zeros(1)  # type: ignore[method-assign]
    harness.cached_scores(fed, cands, harness.Scale(1, 1, 1, validation="split"), cache)
    harness.cached_scores(fed, cands, harness.Scale(1, 1, 1, validation="kfold:5"), cache)
    assert "validation" not in seen[0] and seen[1]["validation"] == "kfold:5"
    assert {k: v for k, v in seen[1].items() if k != "validation"} == seen[0]


def test_a_loss_first_scheme_reads_its_base_schemes_arrays_with_the_keys_swapped(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch
                                                                                 ) -> None:
    import dphype.ml.torch_task
    from dphype.selection.candidates import table_iii_grid

    fed, cands = harness.Federation("breast-cancer", 3, None), table_iii_grid()
    asked: list[str] = []

    def fake_scores(*args: Any, validation: str, **kwargs: Any) -> np.ndarray:
        asked.append(validation)
        return np.stack([np.full((3, len(cands)), 0.5), np.full((3, len(cands)), -0.25)], axis=-1)

    monkeypatch.setattr(dphype.ml.torch_task, "score_clients", fake_scores)  # no training
    cache = harness.ArrayCache(tmp_path)
    for base in ("split", "kfold:3"):
        plain = harness.cached_scores(fed, cands, harness.Scale(1, 1, 1, validation=base), cache)
        loss = harness.cached_scores(fed, cands, harness.Scale(1, 1, 1, validation=f"{base}:loss"), cache)
        assert np.array_equal(loss, plain[..., ::-1]) and loss[0, 0].tolist() == [-0.25, 0.5]
    assert asked == ["split", "kfold:3"]  # each base computed once, its ':loss' read from the cache
    assert len(list(tmp_path.glob("*.npy"))) == 2


def test_signal_refuses_bad_input_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    from simulations.cli import main

    assert main(["signal", "--validations", "loo"]) == 2
    assert "validation must be one of" in capsys.readouterr().err
    assert main(["signal", "--epsilons", "inf"]) == 2
    assert "epsilons must be finite" in capsys.readouterr().err
