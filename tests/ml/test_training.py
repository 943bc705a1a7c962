"""Batched candidate training: equality with the torch.optim reference, StepLR/momentum semantics,
divergence handling, FedAvg weighting. Tiny data and few epochs; no timings here."""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest
import torch
from helpers import EXACT, in_float64
from torch import nn

from dphype.ml.data import Dataset
from dphype.ml.models import build_model
from dphype.ml.training import (
    StackedModels,
    accuracy,
    client_round_seed,
    evaluate_candidates,
    fedavg,
    train_candidates,
    validation_metrics,
)

CANDIDATES = [
    {"lr": 0.1, "decay": 0.99, "momentum": 0.9},
    {"lr": 0.05, "decay": 0.25, "momentum": 0.0},
    {"lr": 0.01, "decay": 0.0, "momentum": 0.9},
    {"lr": 1e-5, "decay": 1.0, "momentum": 0.0},
]


def _tabular(n: int = 150, d: int = 9, seed: int = 0) -> Dataset:
    """A learnable binary task: the label is the sign of a fixed linear function; ``seed`` draws x."""
    x = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    y = (x @ np.random.default_rng(123).normal(size=d) > 0).astype(np.int64)
    return Dataset(x, y, 2, "adult")


def _images(n: int, channels: int, size: int, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    return Dataset(rng.normal(size=(n, channels, size, size)), np.arange(n) % 10, 10, "images")


def _factory(name: str, data: Dataset) -> Callable[[], nn.Module]:
    return lambda: build_model(name, data.x.shape[1:], data.num_classes, dropout=False)


def _exact_factory(name: str, data: Dataset) -> Callable[[], nn.Module]:
    """`_factory`'s model in float64 (`helpers.in_float64`): two summation orders agree to `EXACT`."""
    return in_float64(_factory(name, data))


def _max_diff(a: StackedModels, b: StackedModels) -> float:
    tensors = [(a.params, b.params), (a.buffers, b.buffers)]
    return max(float((x[k].double() - y[k].double()).abs().max()) for x, y in tensors for k in x)


@pytest.mark.parametrize(
    "name, data, epochs, batch_size",
    [
        ("adult-mlp", _tabular(), 3, 64),
        # 12x12 images: the MNIST CNN's every layer (two convolutions, pooling, two linear layers) at a fifth of
        # 28x28's cost; exactness of the two summation orders does not depend on the image size
        ("mnist-cnn", _images(20, 1, 12), 2, 8),
        ("cifar-cnn", _images(12, 3, 8), 2, 6),  # batch norm: running statistics compared too
    ],
)
def test_batched_training_equals_sequential_torch_optim(name: str, data: Dataset, epochs: int, batch_size: int) -> None:
    kwargs = dict(epochs=epochs, batch_size=batch_size, seed=3, device="cpu", num_threads=1)
    batched = train_candidates(_exact_factory(name, data), data, CANDIDATES, **kwargs)
    sequential = train_candidates(_exact_factory(name, data), data, CANDIDATES, sequential=True, **kwargs)
    assert len(batched) == len(CANDIDATES)
    assert _max_diff(batched, sequential) <= EXACT
    initial = train_candidates(_exact_factory(name, data), data, CANDIDATES, **{**kwargs, "epochs": 0})
    assert _max_diff(batched, initial) > 1e-3  # training did move the weights


def test_chunking_does_not_change_the_result() -> None:
    data = _tabular()
    whole = train_candidates(_factory("adult-mlp", data), data, CANDIDATES, epochs=2, device="cpu")
    chunked = train_candidates(_factory("adult-mlp", data), data, CANDIDATES, epochs=2, device="cpu", chunk_size=3)
    assert _max_diff(whole, chunked) <= 1e-6


def test_decay_zero_stops_learning_after_the_first_epoch() -> None:
    data = _tabular()
    cand = [{"lr": 0.1, "decay": 0.0, "momentum": 0.0}]
    one = train_candidates(_factory("adult-mlp", data), data, cand, epochs=1, device="cpu")
    three = train_candidates(_factory("adult-mlp", data), data, cand, epochs=3, device="cpu")
    assert _max_diff(one, three) == 0.0


def test_all_candidates_start_from_the_same_weights_and_seed_matters() -> None:
    data = _tabular()
    untrained = train_candidates("adult-mlp", data, CANDIDATES, epochs=0, device="cpu")
    for value in untrained.params.values():
        assert torch.equal(value, value[:1].expand_as(value))
    other = train_candidates("adult-mlp", data, CANDIDATES, epochs=0, seed=1, device="cpu")
    assert _max_diff(untrained, other) > 0


def test_scores_are_validation_accuracies_and_learning_helps() -> None:
    data = _tabular(n=400)
    scores = evaluate_candidates("adult-mlp", data, CANDIDATES, epochs=3, device="cpu")
    assert scores.shape == (len(CANDIDATES),) and scores.dtype == np.float64
    assert np.all((scores >= 0) & (scores <= 1))
    # the validation split holds 80 samples, so accuracies are multiples of 1/80
    np.testing.assert_allclose(scores * 80, np.round(scores * 80), atol=1e-9)
    assert scores[0] > 0.8 and scores[0] > scores[3]  # lr 0.1 learns the linear rule, lr 1e-5 does not
    assert np.array_equal(scores, evaluate_candidates("adult-mlp", data, CANDIDATES, epochs=3, device="cpu"))


def test_diverged_candidates_score_nan_without_affecting_others() -> None:
    data = _tabular()
    cands = [{"lr": 1e30, "momentum": 0.9}, {"lr": 0.1}]
    scores = evaluate_candidates("adult-mlp", data, cands, epochs=2, device="cpu")
    assert np.isnan(scores[0]) and np.isfinite(scores[1])
    alone = evaluate_candidates("adult-mlp", data, cands[1:], epochs=2, device="cpu")
    # same model and batches; dropout masks differ with the number of candidates, so compare loosely
    assert abs(alone[0] - scores[1]) <= 0.2


def test_accuracy_flags_non_finite_models() -> None:
    data = _tabular()
    models = train_candidates(_factory("adult-mlp", data), data, CANDIDATES[:2], epochs=0, device="cpu")
    models.params["fc1.weight"][1, 0, 0] = float("inf")
    scores = accuracy(models, data)
    assert np.isfinite(scores[0]) and np.isnan(scores[1])


def test_validation_metrics_match_a_plain_module_and_training_loss() -> None:
    """Batches of 7 summed against one mean over 300 rows, stacked logits against the plain module's: in float64
    to `EXACT` (a float32 sum of 300 losses may differ by 300 ulps, 2e-5 relative, on another CPU's kernels)."""
    data = _tabular(n=300)
    models = train_candidates(_exact_factory("adult-mlp", data), data, CANDIDATES, epochs=1, device="cpu")
    acc, loss = validation_metrics(models, data, batch_size=7)  # batches of unequal size on purpose
    assert np.array_equal(acc, accuracy(models, data))
    y = torch.from_numpy(data.y)
    for c in range(len(CANDIDATES)):
        module = models.unstack(c).eval()
        with torch.no_grad():
            out = module(torch.from_numpy(data.x))
        expected = (nn.functional.binary_cross_entropy_with_logits(out[:, 0], y.double()) if out.shape[1] == 1
                    else nn.functional.cross_entropy(out, y))
        assert loss[c] == pytest.approx(float(expected), rel=EXACT)


def test_with_loss_returns_accuracy_and_negated_loss() -> None:
    data = _tabular(n=200)
    cands = [{"lr": 1e30, "momentum": 0.9}, *CANDIDATES]
    keys = evaluate_candidates("adult-mlp", data, cands, epochs=2, device="cpu", with_loss=True)
    assert keys.shape == (len(cands), 2) and keys.dtype == np.float64
    assert np.all(np.isnan(keys[0]))  # diverged: NaN in both keys
    assert np.array_equal(keys[:, 0], evaluate_candidates("adult-mlp", data, cands, epochs=2, device="cpu"),
                          equal_nan=True)
    assert np.all(keys[1:, 1] < 0)  # -loss, and cross-entropy > 0
    assert keys[1, 1] > keys[4, 1]  # lr 0.1 fits better than lr 1e-5: smaller loss


def test_unstack_gives_the_plain_module_of_one_candidate() -> None:
    """Stacked and plain forward sum in different orders: float64, to `EXACT`."""
    data = _tabular()
    models = train_candidates(_exact_factory("adult-mlp", data), data, CANDIDATES, epochs=1, device="cpu")
    module = models.unstack(2).eval()
    x = torch.from_numpy(data.x[:10])
    with torch.no_grad():
        assert torch.allclose(module(x), models.logits(x, train=False)[2], rtol=0.0, atol=EXACT)


def test_progress_reports_epochs() -> None:
    calls: list[tuple[int, int]] = []
    progress = lambda done, total: calls.append((done, total))  # noqa: E731
    evaluate_candidates("adult-mlp", _tabular(), CANDIDATES, epochs=2, device="cpu", chunk_size=2, progress=progress)
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]


@pytest.mark.parametrize(
    "cands, match",
    [
        ([], "empty"),
        ([{"momentum": 0.9}], "'lr'"),
        ([{"lr": -0.1}], "lr"),
        ([{"lr": float("nan")}], "lr"),
        ([{"lr": 0.1, "momentum": "high"}], "momentum"),
        ([{"lr": 0.1, "decay": -1}], "decay"),
    ],
)
def test_bad_candidates_are_rejected(cands: list[dict], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        train_candidates("adult-mlp", _tabular(), cands, epochs=1, device="cpu")


def test_bad_training_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        train_candidates("adult-mlp", _tabular(), CANDIDATES, batch_size=0, device="cpu")
    with pytest.raises(ValueError, match="chunk_size"):
        train_candidates("adult-mlp", _tabular(), CANDIDATES, chunk_size=0, device="cpu")
    with pytest.raises(ValueError, match="rounds"):
        fedavg("adult-mlp", [_tabular()], CANDIDATES, rounds=0, device="cpu")


def test_fedavg_weights_clients_by_sample_count() -> None:
    """With full-batch plain SGD, one round of FedAvg is one gradient step on the pooled data
    because the clients' mean-loss gradients, weighted by n_i / n, sum to the pooled mean gradient."""
    data = _tabular(n=90)
    small, large = data.subset(np.arange(30)), data.subset(np.arange(30, 90))
    cands = [{"lr": 0.5}, {"lr": 0.05}]
    factory = _exact_factory("adult-mlp", data)
    averaged = fedavg(factory, [small, large], cands, rounds=1, local_epochs=1, batch_size=100, seed=4, device="cpu")
    pooled = train_candidates(factory, data, cands, epochs=1, batch_size=100, seed=4, device="cpu")
    assert _max_diff(averaged, pooled) <= EXACT


def test_fedavg_trains_useful_models() -> None:
    data = _tabular(n=300)
    clients = [data.subset(np.arange(i, 300, 3)) for i in range(3)]
    calls: list[tuple[int, int]] = []
    models = fedavg(
        "adult-mlp",
        clients,
        CANDIDATES,
        rounds=3,
        local_epochs=2,
        batch_size=16,
        device="cpu",
        progress=lambda d, t: calls.append((d, t)),
    )
    scores = accuracy(models, _tabular(n=200, seed=1))
    assert scores.shape == (len(CANDIDATES),)
    assert scores[0] > 0.8 and scores[0] > scores[3] + 0.1  # lr 0.1 learns, lr 1e-5 does not
    assert calls[-1] == (9, 9)


def test_thread_setting_is_restored_and_validated() -> None:
    before = torch.get_num_threads()
    evaluate_candidates("adult-mlp", _tabular(), CANDIDATES[:1], epochs=1, device="cpu", num_threads=1)
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="num_threads"):
        evaluate_candidates("adult-mlp", _tabular(), CANDIDATES[:1], epochs=1, device="cpu", num_threads=0)


def test_fedavg_chunks_match_unchunked() -> None:
    data = _tabular(n=120)
    clients = [data.subset(np.arange(0, 50)), data.subset(np.arange(50, 120))]
    factory = _factory("adult-mlp", data)
    whole = fedavg(factory, clients, CANDIDATES, rounds=2, local_epochs=1, device="cpu")
    chunked = fedavg(factory, clients, CANDIDATES, rounds=2, local_epochs=1, device="cpu", chunk_size=3)
    assert _max_diff(whole, chunked) <= 1e-6


def _fedavg_one_candidate_at_a_time(factory: Callable[[], nn.Module], clients: list[Dataset], candidate: dict,
                                    *, rounds: int, local_epochs: int, batch_size: int, seed: int) -> nn.Module:
    """FedAvg for one candidate written plainly: ``torch.optim.SGD`` + ``StepLR`` on one module per client update,
    the batches of `client_round_seed`, parameters and buffers averaged by sample count."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        global_model = factory()
    weights = [len(c) / sum(len(c) for c in clients) for c in clients]
    for r in range(rounds):
        totals: dict[str, torch.Tensor] = {}
        for i, client in enumerate(clients):
            local = copy.deepcopy(global_model).train()
            optimizer = torch.optim.SGD(local.parameters(), lr=candidate["lr"], momentum=candidate["momentum"])
            schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=candidate["decay"])
            generator = torch.Generator().manual_seed(client_round_seed(seed, r, i))
            x, y = torch.from_numpy(client.x), torch.from_numpy(client.y)
            for _ in range(local_epochs):
                for idx in torch.randperm(len(y), generator=generator).split(batch_size):
                    optimizer.zero_grad()
                    nn.functional.cross_entropy(local(x[idx]), y[idx]).backward()
                    optimizer.step()
                schedule.step()
            for k, v in local.state_dict().items():
                totals[k] = totals.get(k, 0) + weights[i] * v.double()
        state = global_model.state_dict()
        global_model.load_state_dict({k: totals[k].to(v.dtype) if v.dtype.is_floating_point
                                      else totals[k].round().to(v.dtype) for k, v in state.items()})
    return global_model


# clients of 8 and 14 rows at batch 6: unequal sizes, full and partial batches in both (14 rows keep what 28 caught)
@pytest.mark.parametrize("name, data", [("mnist-cnn", _images(22, 1, 8)), ("cifar-cnn", _images(22, 3, 8))])
def test_batched_fedavg_equals_fedavg_one_candidate_at_a_time(name: str, data: Dataset) -> None:
    """The ground truth's batched FedAvg (all candidates at once) gives every candidate the weights of FedAvg
    trained for it alone with ``torch.optim``, for the same seed: clients of unequal sizes, two rounds, momentum,
    StepLR and (CIFAR) batch-norm statistics averaged, in float64 to `EXACT` on every weight (`_exact_factory`)."""
    clients = [data.subset(np.arange(0, 8)), data.subset(np.arange(8, len(data)))]
    factory = _exact_factory(name, data)
    kwargs = dict(rounds=2, local_epochs=2, batch_size=6, seed=5)
    batched = fedavg(factory, clients, CANDIDATES, device="cpu", num_threads=1, **kwargs)
    for c, cand in enumerate(CANDIDATES):
        alone = _fedavg_one_candidate_at_a_time(factory, clients, cand, **kwargs)
        expected = StackedModels.replicate(alone, 1)
        mine = StackedModels(batched.module, {k: v[c : c + 1] for k, v in batched.params.items()},
                             {k: v[c : c + 1] for k, v in batched.buffers.items()})
        assert _max_diff(mine, expected) <= EXACT, cand
    other_seed = fedavg(factory, clients, CANDIDATES[:1], device="cpu", num_threads=1, **{**kwargs, "seed": 6})
    assert _max_diff(StackedModels(batched.module, {k: v[:1] for k, v in batched.params.items()},
                                   {k: v[:1] for k, v in batched.buffers.items()}), other_seed) > 1e-3
