"""Shared benchmark machinery: noise replay equals the secure-sum noise, selection rule, statistics, cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dphype.privacy.noise import replay_noisy_sums
from dphype.selection.rules import select
from dphype.selection.voting import top_k_votes
from simulations import harness


def test_select_rows_matches_select() -> None:
    votes = np.array([3, 7, 7, 1])
    clean = replay_noisy_sums(votes, sigma=0.0, clients=10, repetitions=3, rng=np.random.default_rng(0))
    assert select(votes) == 1 and np.all(harness.select_rows(clean) == 1)  # tie -> lowest index
    noisy = replay_noisy_sums(votes, sigma=2.0, clients=10, repetitions=50, rng=np.random.default_rng(1),
                            per_client=True)
    assert [select(row) for row in noisy] == list(harness.select_rows(noisy))


def test_client_votes_use_top_k() -> None:
    scores = np.array([[0.1, 0.9, 0.5], [0.7, np.nan, 0.2]])
    votes = harness.client_votes(scores, 2)
    assert np.array_equal(votes, np.stack([top_k_votes(r, 2) for r in scores]))
    assert np.array_equal(harness.client_raw_votes(np.nan_to_num(scores)), np.nan_to_num(scores))


def test_client_votes_break_accuracy_ties_by_loss_and_studies_see_accuracy() -> None:
    # two clients, keys [accuracy, -loss]: every accuracy ties, so the loss decides the vote
    scores = np.array([[[0.75, -0.6], [0.75, -0.4], [0.75, -0.5]],
                       [[0.5, -0.1], [0.75, -0.9], [0.75, -0.2]]])
    assert harness.client_votes(scores, 1).tolist() == [[0, 1, 0], [0, 0, 1]]
    assert harness.local_accuracies(scores, "split").tolist() == [[0.75, 0.75, 0.75], [0.5, 0.75, 0.75]]
    assert np.array_equal(harness.local_accuracies(scores[..., ::-1], "kfold:3:loss"),
                          harness.local_accuracies(scores, "kfold:3"))  # loss first: the accuracy is the second key
    assert np.array_equal(harness.client_raw_votes(scores), harness.local_accuracies(scores, "split"))


def test_score_cache_key_names_the_score_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an array of accuracies alone ((n, p)) is not found under the key of [accuracy, -loss] scores
    from dphype.selection.candidates import table_iii_grid

    fed, cands = harness.Federation("adult", 4, None), table_iii_grid()
    scale = harness.Scale(epochs=1, rounds=1, fedavg_epochs=1)
    cache = harness.ArrayCache(tmp_path)
    cache.get(harness.federation_key(fed, cands, what="client_scores", epochs=1), lambda: np.zeros((4, len(cands))))
    import dphype.ml.torch_task

    monkeypatch.setattr(dphype.ml.torch_task, "score_clients",
                        lambda *a, **k: np.ones((4, len(cands), 2)))  # no training
    assert harness.cached_scores(fed, cands, scale, cache).shape == (4, len(cands), 2)
    assert len(list(tmp_path.glob("*.npy"))) == 2


def test_statistics() -> None:
    mean, half = harness.mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(2.4841, rel=1e-3)  # t_{0.975,2} * 1 / sqrt(3)
    assert harness.mean_ci([0.5]) == (0.5, 0.0)
    lo, hi = harness.wilson_interval(50, 100)
    assert lo < 0.5 < hi and hi - lo == pytest.approx(0.19, abs=0.01)
    filled = harness.fill_diverged(np.array([0.8, np.nan]), np.array([0, 0, 0, 1]))
    assert filled.tolist() == [0.8, 0.75]


def test_array_cache_computes_once(tmp_path: Path) -> None:
    cache = harness.ArrayCache(tmp_path)
    calls, hits = [], []
    key = {"what": "x", "n": 3}
    first = cache.get(key, lambda: calls.append(1) or np.arange(3))
    second = cache.get(key, lambda: calls.append(1) or np.arange(5), on_hit=lambda: hits.append(1))
    assert np.array_equal(first, second) and calls == [1] and hits == [1]
    assert np.array_equal(harness.ArrayCache(None).get(key, lambda: np.ones(2)), np.ones(2))


@pytest.mark.parametrize(
    "fed, message",
    [
        (harness.Federation("nope", 10, None), "dataset must be one of"),
        (harness.Federation("adult", 10, 0.0), "beta must be"),
        (harness.Federation("adult", 10, -2.0), "beta must be"),
        (harness.Federation("adult", 1, None), "clients must be"),
        (harness.Federation("cifar10", 10, None), "needs --data-dir"),
        (harness.Federation("mnist", 10, None, data_dir="/does/not/exist"), "not an existing directory"),
        (harness.Federation("adult", 10_000, None), "too many"),
    ],
)
def test_validate_federations_rejects(fed: harness.Federation, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        harness.validate_federations([fed])


def test_the_benches_default_to_the_products_local_signal_and_select_the_papers() -> None:
    import argparse
    import dataclasses

    from dphype.ml.torch_task import TorchTask

    parser = argparse.ArgumentParser()
    harness.add_federation_arguments(parser, clients=(3,), partitions=("iid",))
    product = next(f.default for f in dataclasses.fields(TorchTask) if f.name == "validation")
    assert harness.Scale.from_args(parser.parse_args([])).validation == product == "split:loss"
    assert harness.Scale(1, 1, 1).validation == product
    assert harness.Scale.from_args(parser.parse_args(["--validation", "split"])).validation == "split"


@pytest.mark.slow
def test_every_studys_default_federations_can_be_split():
    """``dphype bench STUDY`` runs with its own defaults: for each study with federation options, the hardest default
    pair (most clients, smallest Dirichlet beta; a split gets harder with both) is one the data set can give every
    client its minimum of rows (Adult's 0.5 split cannot at n = 250, which once stopped `dphype bench tradeoff`)."""
    import argparse

    from simulations.cli import STUDIES, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    (studies,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    hardest = set()
    for study in STUDIES:
        defaults = studies.choices[study]
        if defaults.get_default("betas") is not None:
            betas = [beta for beta in defaults.get_default("betas") if beta is not None]
            hardest.add((defaults.get_default("dataset"), max(defaults.get_default("clients")),
                         min(betas) if betas else None))
    assert ("adult", 100, 0.5) in hardest  # the tradeoff's and the ablations'
    harness.validate_federations([harness.Federation(dataset, n, beta) for dataset, n, beta in sorted(hardest)])
