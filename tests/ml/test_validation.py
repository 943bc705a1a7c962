"""Validation schemes (dphype.ml.validation) and their batched cross-validation (dphype.ml.crossval)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import EXACT, in_float64
from torch import nn

from dphype.ml.crossval import cross_validate_candidates
from dphype.ml.data import Dataset
from dphype.ml.models import AdultMLP
from dphype.ml.torch_task import TorchTask, make_task
from dphype.ml.training import evaluate_candidates, train_candidates, validation_metrics
from dphype.ml.validation import DEFAULT_VALIDATION, Validation, check_validation, fold_seed

CANDIDATES = [{"lr": 0.1, "momentum": 0.9, "decay": 0.9}, {"lr": 0.01}, {"lr": 0.5, "momentum": 0.5}]


def table(rows: int, classes: int, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) if classes == 2 else rng.integers(0, classes, rows)
    return Dataset(x, y, classes, "t")


def per_fold(model: Any, data: Dataset, name: str, seed: int, **kw: Any) -> np.ndarray:
    """The scheme's keys from one `train_candidates` per fold (the unbatched reference)."""
    scheme = Validation.parse(name)
    correct = loss = 0.0
    held_rows = 0
    for f, (fit, held) in enumerate(scheme.splits(len(data), seed)):
        models = train_candidates(model, data.subset(fit), CANDIDATES, seed=fold_seed(seed, f), **kw)
        acc, mean_loss = validation_metrics(models, data.subset(held))
        correct, loss, held_rows = correct + acc * len(held), loss + mean_loss * len(held), held_rows + len(held)
    keys = np.stack([correct / held_rows, -loss / held_rows], axis=1)
    return keys[:, ::-1] if scheme.loss_first else keys


@pytest.mark.parametrize("name", ["kfold", "kfold:3:loss", "repeat:3", "split:loss"])
def test_names_are_canonical(name: str) -> None:
    assert check_validation(check_validation(name)) == check_validation(name)
    assert check_validation("kfold") == "kfold:5"
    assert check_validation(DEFAULT_VALIDATION) == DEFAULT_VALIDATION == "split:loss"


@pytest.mark.parametrize(("name", "match"), [
    ("cv", "validation must be one of"), ("kfold:1", r"count must lie in \[2, 20\]"),
    ("repeat", "needs a count"), ("split:3", "takes no count"), (5, "validation must be one of"),
])
def test_bad_names_are_refused_naming_the_fix(name: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Validation.parse(name)


def test_kfold_holds_every_row_out_once_and_caps_folds_at_the_rows() -> None:
    splits = Validation.parse("kfold:4").splits(23, seed=1)
    held = np.concatenate([h for _, h in splits])
    assert sorted(held) == list(range(23))
    for fit, h in splits:
        assert not set(fit) & set(h) and len(fit) + len(h) == 23
    assert len(Validation.parse("kfold:10").splits(3, seed=0)) == 3  # leave one out
    assert all(len(h) == 2 for _, h in Validation.parse("repeat:3").splits(10, seed=0))


@pytest.mark.parametrize(("rows", "name", "batch_size"), [
    (203, "kfold:5", 16),  # folds of 162 and 163 rows: a padded last batch
    (201, "kfold:5", 16),  # 160 and 161: one fold has no real row in the last step
    (131, "repeat:3", 16),
    (131, "kfold:3:loss", 64),
])
@pytest.mark.parametrize("classes", [2, 3])
def test_batched_folds_equal_training_each_fold_alone(rows: int, name: str, batch_size: int, classes: int) -> None:
    """Batched folds and one fold at a time sum in different orders: float64 (`helpers.in_float64`), to `EXACT` (in
    float32 one flipped near-tie prediction moves the accuracy key by 1 / 163 on some CPU's kernels)."""
    data = table(rows, classes)
    model = in_float64(lambda: AdultMLP(6, classes, dropout=False))
    got = cross_validate_candidates(model, data, CANDIDATES, validation=name, epochs=3, batch_size=batch_size, seed=4)
    want = per_fold(model, data, name, 4, epochs=3, batch_size=batch_size)
    np.testing.assert_allclose(got, want, rtol=0.0, atol=EXACT)


def test_vmap_path_and_batch_norm_match_too() -> None:
    data = table(205, 3, seed=1)  # folds of 164 rows each: no padding

    model = in_float64(lambda: nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)))
    got = cross_validate_candidates(model, data, CANDIDATES, validation="kfold:5", epochs=2, batch_size=16, seed=2,
                                    chunk_size=2)
    np.testing.assert_allclose(got, per_fold(model, data, "kfold:5", 2, epochs=2, batch_size=16), rtol=0.0,
                               atol=EXACT)


def test_split_is_the_single_split_of_evaluate_candidates() -> None:
    data = table(90, 2)
    want = evaluate_candidates("adult-mlp", data, CANDIDATES, epochs=2, seed=3, with_loss=True)
    np.testing.assert_array_equal(
        cross_validate_candidates("adult-mlp", data, CANDIDATES, validation="split", epochs=2, seed=3), want)
    np.testing.assert_array_equal(
        cross_validate_candidates("adult-mlp", data, CANDIDATES, validation="split:loss", epochs=2, seed=3),
        want[:, ::-1])


def test_a_candidate_diverging_in_a_fold_scores_nan_and_progress_counts_epochs() -> None:
    seen: list[tuple[int, int]] = []
    keys = cross_validate_candidates("adult-mlp", table(60, 2), [{"lr": 1e30}, {"lr": 0.05}], validation="kfold:3",
                                     epochs=2, seed=0, chunk_size=1, progress=lambda d, t: seen.append((d, t)))
    assert np.isnan(keys[0]).all() and np.isfinite(keys[1]).all()
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_torch_task_ranks_by_the_default_scheme_and_keeps_the_paper_split_selectable() -> None:
    task = make_task("breast-cancer", 0, 10, epochs=1)
    assert task.validation == DEFAULT_VALIDATION
    folds = make_task("breast-cancer", 0, 10, epochs=1, validation="kfold:3")
    np.testing.assert_allclose(
        folds.score(CANDIDATES),
        cross_validate_candidates(folds.model, folds.data, CANDIDATES, validation="kfold:3", epochs=1,
                                  seed=folds.seed))
    paper = make_task("breast-cancer", 0, 10, epochs=1, validation="split")
    np.testing.assert_array_equal(
        paper.score(CANDIDATES),
        evaluate_candidates(paper.model, paper.data, CANDIDATES, epochs=1, seed=paper.seed, with_loss=True))
    np.testing.assert_allclose(
        task.score(CANDIDATES),
        cross_validate_candidates(task.model, task.data, CANDIDATES, epochs=1, seed=task.seed))
    with pytest.raises(ValueError, match="validation must be one of"):
        TorchTask(task.data, task.model, validation="loo")
