"""The bench studies' data fixture: ``small_adult`` replaces each data set by a small slice of it.

A small slice of Adult (600 training / 300 test rows; of mnist5k 120 / 60) replaces the data set for speed: the
studies load data only through :mod:`dphype.ml.torch_task`'s cached loader, which the fixture swaps."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import dphype.ml.torch_task as task
from dphype.ml.torch_task import (
    load_cached as load_whole,  # the real per-process cache (the fixture swaps task.load_cached)
)

#: training and test rows the fixture keeps; fewer of mnist5k, whose CNN costs ~10x the Adult MLP per row (its one
#: study test asserts the CNN path's outputs and their ranges, no accuracy: 60 rows per client of 2 exercise it all)
SMALL_ROWS = {"mnist5k": (120, 60)}


@functools.lru_cache(maxsize=4)
def _small(dataset: str, data_dir: str | None = None) -> Any:
    """The first training and test rows (600 / 300 unless :data:`SMALL_ROWS` says otherwise), loaded once per
    session (the studies never modify them)."""
    train, test = load_whole(dataset, data_dir)
    rows, test_rows = SMALL_ROWS.get(dataset, (600, 300))
    return train.subset(np.arange(rows)), test.subset(np.arange(test_rows))


@pytest.fixture
def small_adult(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(task, "load_cached", _small)
    task.partition_cached.cache_clear()
    yield
    task.partition_cached.cache_clear()
