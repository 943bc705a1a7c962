"""Local candidate evaluation and FedAvg, batched over hyperparameter candidates (DP-Hype, Section V-B).

Each client trains one model per candidate with SGD (the candidate's ``lr`` and ``momentum``, PyTorch semantics
``buf = momentum * buf + grad; p -= lr * buf``) and a StepLR schedule (``lr`` times the candidate's ``decay``
after every epoch), on 80 % of its local data in mini-batches of 64 for 5 epochs, and scores the candidate on the
remaining 20 %.

All candidates are trained at once: their parameters are stacked along a leading candidate dimension
(`StackedModels`) and the forward pass is ``torch.func.vmap`` over ``functional_call``, or the model's own
``stacked_forward`` when it has one. One backward pass of the summed losses yields every candidate's own gradient
(the candidates share no parameters). All candidates start from the same initial weights and see the same
mini-batches in the same order, so the result equals training them one by one (`train_candidates` with
``sequential=True``, the reference path on ``torch.optim.SGD`` and ``StepLR``) up to floating-point rounding and
dropout masks (drawn per candidate). Batch norm keeps one set of running statistics per candidate.

A candidate that diverges (non-finite weights or outputs) gets the score NaN; the others are unaffected.
Candidates are mappings with the keys ``"lr"`` (required), ``"momentum"`` (default 0) and ``"decay"`` (default 1),
e.g. the items of ``dphype.selection.candidates.table_iii_grid()``.
"""

from __future__ import annotations

import copy
import math
import numbers
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from dphype.ml.data import Dataset, split_indices
from dphype.ml.models import build_model  # first: sets torch's OpenMP wait policy before torch loads
from dphype.ml.validation import VALIDATION_FRACTION

import torch  # noqa: E402  isort: skip
from torch import nn  # noqa: E402  isort: skip
from torch.func import functional_call, stack_module_state, vmap  # noqa: E402  isort: skip

#: A model name of `dphype.ml.models.MODELS`, or a zero-argument factory of a fresh ``nn.Module``.
ModelSpec = str | Callable[[], nn.Module]
#: Called as ``progress(done, total)`` after each unit of work.
Progress = Callable[[int, int], None]

#: The candidate keys training reads (all others are refused).
HYPERPARAMETERS: tuple[str, ...] = ("lr", "momentum", "decay")


@dataclass
class Hyperparameters:
    """Per-candidate SGD settings as float tensors of shape ``(C,)``.

    Attributes:
        lr: ``(C,)`` learning rates.
        momentum: ``(C,)`` momentum factors.
        decay: ``(C,)`` StepLR factors per epoch.
    """

    lr: torch.Tensor
    momentum: torch.Tensor
    decay: torch.Tensor

    @classmethod
    def from_candidates(cls, candidates: Sequence[Mapping[str, Any]], device: torch.device) -> Hyperparameters:
        """Read ``lr``, ``momentum`` (default 0) and ``decay`` (default 1) from each candidate.

        Any other key is refused, naming it: training would ignore it, so candidates differing only in it would
        score the same.

        Args:
            candidates: The candidates (hyperparameter name -> value).
            device: Where the tensors live.

        Returns:
            The ``(C,)`` settings.

        Raises:
            ValueError: No candidates, a missing ``lr``, another key, or a negative or non-finite value.
        """
        if len(candidates) == 0:
            raise ValueError("candidates must not be empty")
        values = []
        for i, cand in enumerate(candidates):
            if "lr" not in cand:
                raise ValueError(f"candidates[{i}] must have the key 'lr', got keys {sorted(cand)}")
            unused = sorted(set(cand) - set(HYPERPARAMETERS))
            if unused:
                raise ValueError(
                    f"candidates[{i}] has key(s) {', '.join(map(repr, unused))} that batched SGD training does not "
                    f"use: remove them\nit reads only {', '.join(HYPERPARAMETERS)}; or train with your own task")
            row = (cand["lr"], cand.get("momentum", 0.0), cand.get("decay", 1.0))
            for key, value in zip(("lr", "momentum", "decay"), row):
                if not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
                    raise ValueError(f"candidates[{i}]['{key}'] must be a finite number >= 0, got {value!r}")
            values.append(row)
        table = torch.tensor(values, dtype=torch.float64, device=device)
        return cls(table[:, 0], table[:, 1], table[:, 2])

    def epoch_lr(self, epoch: int) -> torch.Tensor:
        """The ``(C,)`` learning rates of ``epoch``: StepLR's ``lr * decay**epoch`` (``0**0 = 1``)."""
        return self.lr * self.decay**epoch

    def __getitem__(self, index: slice) -> Hyperparameters:
        return Hyperparameters(self.lr[index], self.momentum[index], self.decay[index])


@dataclass
class StackedModels:
    """``C`` models of one architecture: parameters and buffers stacked along a leading dimension.

    Attributes:
        module: The architecture template; its own tensors are never used by `logits`.
        params: Parameter name -> ``(C, ...)`` stacked parameters.
        buffers: Buffer name -> ``(C, ...)`` stacked buffers.
    """

    module: nn.Module
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]

    @classmethod
    def replicate(cls, module: nn.Module, count: int) -> StackedModels:
        """``count`` copies of ``module``'s current weights (the same initialisation for all)."""
        params = {k: v.detach().expand(count, *v.shape).clone() for k, v in module.named_parameters()}
        buffers = {k: v.detach().expand(count, *v.shape).clone() for k, v in module.named_buffers()}
        return cls(module, params, buffers)

    @classmethod
    def stack(cls, modules: Sequence[nn.Module]) -> StackedModels:
        """Stack independently trained copies of one architecture."""
        params, buffers = stack_module_state(list(modules))
        return cls(modules[0], {k: v.detach() for k, v in params.items()}, buffers)

    def __len__(self) -> int:
        return next(iter(self.params.values())).shape[0]

    def logits(self, x: torch.Tensor, *, train: bool) -> torch.Tensor:
        """``(C, B, K)`` outputs of every model on the shared batch ``x`` (``stacked_forward``, else ``vmap``).

        Args:
            x: ``(B, ...)`` inputs.
            train: Select dropout and batch-norm batch statistics (which then update the stacked running statistics).

        Returns:
            The logits.
        """
        self.module.train(train)
        stacked_forward = getattr(self.module, "stacked_forward", None)
        if stacked_forward is not None:
            return stacked_forward(self.params, x)

        def one(
            params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], batch: torch.Tensor
        ) -> torch.Tensor:
            return functional_call(self.module, (params, buffers), (batch,))

        return vmap(one, in_dims=(0, 0, None), randomness="different")(self.params, self.buffers, x)

    def clone(self) -> StackedModels:
        """An independent copy (the template module is shared)."""
        return StackedModels(
            self.module,
            {k: v.clone() for k, v in self.params.items()},
            {k: v.clone() for k, v in self.buffers.items()},
        )

    def unstack(self, index: int) -> nn.Module:
        """Model ``index`` as a plain ``nn.Module`` (a copy of the template with its weights)."""
        module = copy.deepcopy(self.module)
        state = {k: v[index] for k, v in {**self.params, **self.buffers}.items()}
        module.load_state_dict(state)
        return module

    def finite(self) -> torch.Tensor:
        """Boolean ``(C,)``: whether all of a model's parameters are finite (False: diverged)."""
        ok = torch.ones(len(self), dtype=torch.bool, device=next(iter(self.params.values())).device)
        for value in self.params.values():
            ok &= torch.isfinite(value.detach().reshape(len(self), -1)).all(dim=1)
        return ok


# --------------------------------------------------------------------------------------------------
# set-up helpers


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device``, or CUDA when available and ``device`` is None, else CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@contextmanager
def _threads(num_threads: int | None) -> Iterator[None]:
    """Run with ``num_threads`` intra-op threads (``None``: torch's, capped at the usable CPUs), then restore."""
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"num_threads must be >= 1 or None, got {num_threads}")
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    previous = torch.get_num_threads()
    wanted = min(previous, available) if num_threads is None else num_threads
    torch.set_num_threads(wanted)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Run with torch's global RNG seeded (initialisation, dropout) without disturbing the caller's."""
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _build(model: ModelSpec, data: Dataset, device: torch.device) -> nn.Module:
    """A fresh model (initialised from torch's current RNG state) on ``device``."""
    module = build_model(model, data.x.shape[1:], data.num_classes) if isinstance(model, str) else model()
    return module.to(device)


def _tensors(data: Dataset, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(data.x).to(device), torch.from_numpy(data.y).to(device)


def _batches(num_samples: int, batch_size: int, generator: torch.Generator, device: torch.device) -> list[torch.Tensor]:
    """One epoch of shuffled mini-batch indices on ``device``, ordered by a CPU generator (device-independent)."""
    return list(torch.randperm(num_samples, generator=generator).to(device).split(batch_size))


def _loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean loss over the batch axis of ``logits (..., B, K)``: BCE with logits for ``K = 1``, else cross-entropy."""
    if logits.shape[-1] == 1:
        target = y.to(logits.dtype).expand(logits.shape[:-1])
        return nn.functional.binary_cross_entropy_with_logits(logits[..., 0], target, reduction="none").mean(-1)
    log_probs = torch.log_softmax(logits, dim=-1)
    picked = log_probs.gather(-1, y.expand(logits.shape[:-1]).unsqueeze(-1))
    return -picked[..., 0].mean(-1)


def _correct(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Number of correct predictions per leading index of ``logits (..., B, K)``."""
    predicted = (logits[..., 0] > 0).long() if logits.shape[-1] == 1 else logits.argmax(-1)
    return (predicted == y).sum(-1)


def _cast(average: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A float64 weighted average back in ``dtype`` (integer buffers such as batch counters rounded)."""
    return average.to(dtype) if dtype.is_floating_point else average.round().to(dtype)


def _check_training_args(epochs: int, batch_size: int, num_samples: int) -> None:
    if epochs < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if num_samples < 1:
        raise ValueError("training data must not be empty")


# --------------------------------------------------------------------------------------------------
# training


def _sgd_epochs(
    models: StackedModels,
    hp: Hyperparameters,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    generator: torch.Generator,
    on_epoch: Callable[[], None] | None = None,
) -> None:
    """Train ``models`` in place: SGD with momentum and StepLR, batched over candidates."""
    params = [p.requires_grad_(True) for p in models.params.values()]
    momentum_bufs = [torch.zeros_like(p) for p in params]
    shape = [(-1,) + (1,) * (p.dim() - 1) for p in params]
    momentum = [hp.momentum.to(p.dtype).view(s) for p, s in zip(params, shape)]
    for epoch in range(epochs):
        lr = hp.epoch_lr(epoch)
        step = [lr.to(p.dtype).view(s) for p, s in zip(params, shape)]
        for idx in _batches(len(y), batch_size, generator, y.device):
            yb = y[idx]
            loss = _loss(models.logits(x[idx], train=True), yb).sum()
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g, buf, m, s in zip(params, grads, momentum_bufs, momentum, step):
                    buf.mul_(m).add_(g)
                    p.addcmul_(s, buf, value=-1.0)
        if on_epoch is not None:
            on_epoch()
    for p in params:
        p.requires_grad_(False)


def _train_sequential(
    initial: nn.Module,
    hp: Hyperparameters,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    seed: int,
) -> StackedModels:
    """Reference path: each candidate alone with ``torch.optim.SGD`` + ``StepLR`` on a plain module."""
    trained = []
    for c in range(len(hp.lr)):
        module = copy.deepcopy(initial)
        module.train()
        optimizer = torch.optim.SGD(module.parameters(), lr=float(hp.lr[c]), momentum=float(hp.momentum[c]))
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=float(hp.decay[c]))
        generator = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            for idx in _batches(len(y), batch_size, generator, y.device):
                optimizer.zero_grad()
                _loss(module(x[idx]), y[idx]).backward()
                optimizer.step()
            schedule.step()
        trained.append(module)
    return StackedModels.stack(trained)


def _chunks(count: int, chunk_size: int | None) -> list[slice]:
    """Consecutive slices of ``range(count)`` with at most ``chunk_size`` items (None: one slice)."""
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size}")
    step = count if chunk_size is None else chunk_size
    return [slice(start, min(start + step, count)) for start in range(0, count, step)]


def _concat(template: nn.Module, parts: Sequence[StackedModels]) -> StackedModels:
    """Stack the models of ``parts`` in order."""
    return StackedModels(
        template,
        {k: torch.cat([p.params[k] for p in parts]) for k in parts[0].params},
        {k: torch.cat([p.buffers[k] for p in parts]) for k in parts[0].buffers},
    )


def train_candidates(
    model: ModelSpec,
    data: Dataset,
    candidates: Sequence[Mapping[str, Any]],
    *,
    epochs: int = 5,
    batch_size: int = 64,
    seed: int = 0,
    device: str | torch.device | None = None,
    chunk_size: int | None = None,
    num_threads: int | None = None,
    sequential: bool = False,
    progress: Progress | None = None,
) -> StackedModels:
    """Train one model per candidate on all of ``data`` (Section V-B: SGD, StepLR per epoch, batch 64).

    All candidates start from the same initialisation and mini-batch order, both drawn with ``seed``.

    Args:
        model: A name of `dphype.ml.models.MODELS` or a zero-argument factory of a fresh module.
        data: The training data.
        candidates: The candidates (``lr``, optional ``momentum`` and ``decay``).
        epochs: Training epochs, ``>= 0``.
        batch_size: The minibatch size, ``>= 1``.
        seed: Seeds the initialisation, the mini-batch order and dropout.
        device: The torch device; ``None``: CUDA when available.
        chunk_size: Bounds how many candidates are trained at once (memory); the result does not depend on it.
        num_threads: Torch intra-op threads (``None``: torch's setting, capped at the usable CPUs).
        sequential: Run the reference path (one ``torch.optim.SGD`` per candidate).
        progress: ``progress(done, total)`` after every epoch of every chunk (batched path only).

    Returns:
        The ``C`` trained models, stacked.

    Raises:
        ValueError: An argument or a candidate is invalid, or ``data`` is empty.
    """  # noqa: DOC502
    _check_training_args(epochs, batch_size, len(data))
    dev = resolve_device(device)
    hp = Hyperparameters.from_candidates(candidates, dev)
    chunks = _chunks(len(candidates), chunk_size)
    x, y = _tensors(data, dev)
    with _threads(num_threads), _seeded(seed, dev):
        initial = _build(model, data, dev)
        if sequential:
            return _train_sequential(initial, hp, x, y, epochs=epochs, batch_size=batch_size, seed=seed)
        done = 0

        def on_epoch() -> None:
            nonlocal done
            done += 1
            if progress is not None:
                progress(done, epochs * len(chunks))

        parts = []
        for chunk in chunks:
            part = StackedModels.replicate(initial, chunk.stop - chunk.start)
            generator = torch.Generator().manual_seed(seed)
            _sgd_epochs(
                part, hp[chunk], x, y, epochs=epochs, batch_size=batch_size, generator=generator, on_epoch=on_epoch
            )
            parts.append(part)
    return _concat(initial, parts)


@torch.no_grad()
def validation_metrics(
    models: StackedModels, data: Dataset, *, batch_size: int = 1024
) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and mean loss (the one training minimises) of every stacked model on ``data``, in one pass.

    Args:
        models: The ``C`` stacked models.
        data: The evaluation data, not empty.
        batch_size: The evaluation batch size.

    Returns:
        ``(accuracy, loss)``: float64 ``(C,)`` arrays, NaN for a diverged model.

    Raises:
        ValueError: ``data`` is empty.
    """
    if len(data) == 0:
        raise ValueError("data must not be empty to compute an accuracy")
    dev = next(iter(models.params.values())).device
    x, y = _tensors(data, dev)
    correct = torch.zeros(len(models), dtype=torch.long, device=dev)
    loss_sum = torch.zeros(len(models), dtype=torch.float64, device=dev)
    finite = models.finite()
    for start in range(0, len(y), batch_size):
        yb = y[start : start + batch_size]
        logits = models.logits(x[start : start + batch_size], train=False)
        correct += _correct(logits, yb)
        loss_sum += _loss(logits, yb).double() * len(yb)
        finite &= ~torch.isnan(logits).flatten(1).any(dim=1)
    acc = torch.where(finite, correct.double() / len(y), torch.nan)
    loss = torch.where(finite, loss_sum / len(y), torch.nan)
    return acc.cpu().numpy(), loss.cpu().numpy()


def accuracy(models: StackedModels, data: Dataset, *, batch_size: int = 1024) -> np.ndarray:
    """Float64 ``(C,)`` accuracy of every stacked model on non-empty ``data``, NaN for diverged models."""
    return validation_metrics(models, data, batch_size=batch_size)[0]


def evaluate_candidates(
    model: ModelSpec,
    train: Dataset,
    candidates: Sequence[Mapping[str, Any]],
    *,
    epochs: int = 5,
    batch_size: int = 64,
    seed: int = 0,
    device: str | torch.device | None = None,
    chunk_size: int | None = None,
    num_threads: int | None = None,
    sequential: bool = False,
    progress: Progress | None = None,
    with_loss: bool = False,
) -> np.ndarray:
    """A client's local scores (Section III / V-B): validation accuracy of every candidate.

    ``train`` is split 80/20 with ``seed``; each candidate is trained on the 80 % (`train_candidates`) and scored on
    the 20 %. With ``with_loss`` the validation loss (Algorithm 1's score) is negated so that both columns are
    maximised: lexicographic keys for `dphype.selection.voting.top_k_votes`.

    Args:
        model: A name of `dphype.ml.models.MODELS` or a zero-argument factory of a fresh module.
        train: The client's local data, at least 2 samples.
        candidates: The candidates.
        epochs: Training epochs.
        batch_size: The minibatch size.
        seed: Seeds the split and the training.
        device: The torch device; ``None``: CUDA when available.
        chunk_size: Bounds how many candidates are trained at once.
        num_threads: Torch intra-op threads.
        sequential: Run the reference path.
        progress: ``progress(done, total)`` after every epoch of every chunk.
        with_loss: Return ``[accuracy, -loss]`` per candidate.

    Returns:
        Float64 ``(p,)`` accuracies, or ``(p, 2)`` keys; NaN for a diverged candidate.

    Raises:
        ValueError: An argument or a candidate is invalid, or ``train`` has fewer than 2 samples.
    """  # noqa: DOC502
    fit_idx, val_idx = split_indices(len(train), VALIDATION_FRACTION, seed)
    with _threads(num_threads):
        models = train_candidates(
            model,
            train.subset(fit_idx),
            candidates,
            epochs=epochs,
            batch_size=batch_size,
            seed=seed,
            device=device,
            chunk_size=chunk_size,
            num_threads=num_threads,
            sequential=sequential,
            progress=progress,
        )
        acc, loss = validation_metrics(models, train.subset(val_idx))
    return np.stack([acc, -loss], axis=1) if with_loss else acc


def client_round_seed(seed: int, round_index: int, client: int) -> int:
    """The mini-batch seed of ``client`` in FedAvg round ``round_index`` (`fedavg` and a ClientApp draw alike)."""
    return int(np.random.SeedSequence([seed, round_index, client]).generate_state(1)[0])


def fedavg(
    model: ModelSpec,
    clients: Sequence[Dataset],
    candidates: Sequence[Mapping[str, Any]],
    *,
    rounds: int = 5,
    local_epochs: int = 5,
    batch_size: int = 64,
    seed: int = 0,
    device: str | torch.device | None = None,
    chunk_size: int | None = None,
    num_threads: int | None = None,
    progress: Progress | None = None,
) -> StackedModels:
    """FedAvg (McMahan et al.; Section V-B: 5 rounds x 5 local epochs, batch 64) for every candidate.

    Each round every client starts from the global models and trains all candidates on all its data (fresh momentum,
    StepLR restarting at ``lr``); the server averages parameters and buffers weighted by sample counts. All
    candidates start from the same initialisation (drawn with ``seed``).

    Args:
        model: A name of `dphype.ml.models.MODELS` or a zero-argument factory of a fresh module.
        clients: Every client's data, at least one.
        candidates: The candidates.
        rounds: FedAvg rounds, ``>= 1``.
        local_epochs: Local epochs per round.
        batch_size: The minibatch size.
        seed: Seeds the initialisation and every round's batches (`client_round_seed`).
        device: The torch device; ``None``: CUDA when available.
        chunk_size: As in `train_candidates`.
        num_threads: As in `train_candidates`.
        progress: ``progress(done, total)`` after each client update of each chunk.

    Returns:
        The ``C`` global models, stacked.

    Raises:
        ValueError: ``rounds`` is below 1, ``clients`` is empty, or another argument is invalid.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if len(clients) == 0:
        raise ValueError("clients must not be empty")
    for client in clients:
        _check_training_args(local_epochs, batch_size, len(client))
    dev = resolve_device(device)
    hp = Hyperparameters.from_candidates(candidates, dev)
    chunks = _chunks(len(candidates), chunk_size)
    data = [_tensors(client, dev) for client in clients]
    weights = np.array([len(c) for c in clients], dtype=np.float64) / sum(len(c) for c in clients)
    total = len(chunks) * rounds * len(clients)
    done = 0
    with _threads(num_threads), _seeded(seed, dev):
        initial = _build(model, clients[0], dev)
        parts = []
        for chunk in chunks:
            global_models = StackedModels.replicate(initial, chunk.stop - chunk.start)
            for r in range(rounds):
                totals: dict[str, torch.Tensor] = {}
                for i, (x, y) in enumerate(data):
                    local = global_models.clone()
                    generator = torch.Generator().manual_seed(client_round_seed(seed, r, i))
                    _sgd_epochs(local, hp[chunk], x, y, epochs=local_epochs, batch_size=batch_size, generator=generator)
                    for k, v in {**local.params, **local.buffers}.items():
                        totals[k] = totals.get(k, 0) + weights[i] * v.double()
                    done += 1
                    if progress is not None:
                        progress(done, total)
                global_models = StackedModels(
                    initial,
                    {k: _cast(totals[k], v.dtype) for k, v in global_models.params.items()},
                    {k: _cast(totals[k], v.dtype) for k, v in global_models.buffers.items()},
                )
            parts.append(global_models)
    return _concat(initial, parts)


# --------------------------------------------------------------------------------------------------
# one model: the final training of the selected candidate (FedAvg through Flower)


def initial_state(model: ModelSpec, data: Dataset, *, seed: int, device: str | torch.device | None = None
                  ) -> dict[str, torch.Tensor]:
    """Initial weights (a state dict) of the model for ``data``'s shape, drawn with ``seed``: FedAvg's start."""
    dev = resolve_device(device)
    with _seeded(seed, dev):
        return {k: v.detach().clone() for k, v in _build(model, data, dev).state_dict().items()}


def _loaded(model: ModelSpec, data: Dataset, state: Mapping[str, torch.Tensor], device: torch.device) -> nn.Module:
    module = _build(model, data, device)
    module.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    return module


def local_update(
    model: ModelSpec,
    data: Dataset,
    state: Mapping[str, torch.Tensor],
    candidate: Mapping[str, Any],
    *,
    epochs: int,
    batch_size: int = 64,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> dict[str, torch.Tensor]:
    """FedAvg's local update of one client (`fedavg`'s procedure): new weights from the global ``state``.

    Args:
        model: A name of `dphype.ml.models.MODELS` or a zero-argument factory of a fresh module.
        data: The client's data.
        state: The global weights (a state dict).
        candidate: The hyperparameters.
        epochs: Local epochs.
        batch_size: The minibatch size.
        seed: Seeds the batches and dropout.
        device: The torch device; ``None``: CUDA when available.

    Returns:
        The new weights (a state dict).
    """
    dev = resolve_device(device)
    module = _loaded(model, data, state, dev)
    trained = train_candidates(lambda: module, data, [candidate], epochs=epochs, batch_size=batch_size, seed=seed,
                               device=dev)
    return {k: v.detach().clone() for k, v in trained.unstack(0).state_dict().items()}


def evaluate_state(model: ModelSpec, data: Dataset, state: Mapping[str, torch.Tensor], *,
                   device: str | torch.device | None = None) -> tuple[float, float]:
    """``(accuracy, loss)`` of the weights ``state`` on ``data``, NaN for a diverged model."""
    dev = resolve_device(device)
    acc, loss = validation_metrics(StackedModels.replicate(_loaded(model, data, state, dev), 1), data)
    return float(acc[0]), float(loss[0])
