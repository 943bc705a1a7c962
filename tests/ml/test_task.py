"""make_task builds every client's shard deterministically; TorchTask scores candidates."""

from __future__ import annotations

import numpy as np
import pytest

from dphype.ml.torch_task import TorchTask, default_epochs, load_cached, make_task
from dphype.task import Task

CANDIDATES = [{"lr": 0.1, "decay": 0.99, "momentum": 0.9}, {"lr": 1e-7, "decay": 1.0, "momentum": 0.0}]


def _rows(task: TorchTask) -> set[bytes]:
    return {row.tobytes() for row in task.data.x}


def test_iid_shards_are_deterministic_disjoint_and_equal() -> None:
    tasks = [make_task("adult", i, 40, seed=7) for i in range(3)]
    again = make_task("adult", 1, 40, seed=7)
    assert np.array_equal(tasks[1].data.x, again.data.x) and np.array_equal(tasks[1].data.y, again.data.y)
    assert len({len(t.data) for t in tasks}) == 1 and len(tasks[0].data) == len(load_cached("adult")[0]) // 40
    assert not _rows(tasks[0]) & _rows(tasks[1])
    assert tasks[0].model == "adult-mlp" and tasks[0].epochs == 5 and tasks[0].maximize
    assert tasks[0].seed != tasks[1].seed  # clients train with their own seeds
    other_seed = make_task("adult", 1, 40, seed=8)
    assert _rows(other_seed) != _rows(tasks[1])


def test_dirichlet_shards_vary_in_size() -> None:
    sizes = {len(make_task("adult", i, 20, partition="dirichlet", beta=0.5).data) for i in range(5)}
    assert len(sizes) > 1


def test_loading_is_cached_per_process() -> None:
    assert load_cached("adult") is load_cached("adult")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(partition_id=5, num_partitions=5), "partition_id"),
        (dict(partition_id=-1, num_partitions=5), "partition_id"),
        (dict(partition_id=0, num_partitions=5, partition="shards"), "partition"),
        (dict(partition_id=0, num_partitions=5, partition="dirichlet"), "beta"),
        (dict(partition_id=0, num_partitions=5, beta=0.5), "beta"),
        (dict(partition_id=0, num_partitions=5, epochs=0), "epochs"),
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_task("adult", **kwargs)


def test_paper_epochs_per_dataset() -> None:
    assert default_epochs("cifar10") == 10 and default_epochs("adult") == 5 and default_epochs("mnist") == 5


def test_torch_task_scores_every_candidate_with_progress() -> None:
    task: Task = make_task("adult", 3, 200, epochs=2)
    calls: list[tuple[int, int]] = []
    scores = task.score(CANDIDATES, progress=lambda done, total: calls.append((done, total)))
    assert scores.shape == (2, 2)  # the default ranks by the loss: [-validation loss, validation accuracy]
    assert np.all((scores[:, 1] >= 0) & (scores[:, 1] <= 1)) and np.all(scores[:, 0] < 0)
    assert calls == [(1, 2), (2, 2)]
    assert np.array_equal(scores, task.score(CANDIDATES))  # deterministic for a fixed seed


def test_fixed_scores_task_replays_its_scores_and_checks_the_length():
    import numpy as np

    from dphype.ml.torch_task import FixedScoresTask
    from dphype.selection.candidates import table_iii_grid

    cands = table_iii_grid()
    scores = np.linspace(0.0, 1.0, len(cands))
    task = FixedScoresTask(scores, maximize=False)
    assert not task.maximize
    np.testing.assert_array_equal(task.score(cands), scores)
    with pytest.raises(ValueError, match="got 100 candidates for 3 precomputed scores"):
        FixedScoresTask(np.zeros(3)).score(cands)
