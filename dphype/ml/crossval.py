"""Cross-validated local scores: every fold of every candidate trained at once (`dphype.ml.validation`'s schemes).

`cross_validate_candidates` stacks the models along a ``(folds, candidates)`` pair of axes; each fold draws its own
mini-batch of its own training rows, and the forward pass maps the model's candidate-batched forward (its
``stacked_forward``, or ``vmap`` over ``functional_call``, as `dphype.ml.training.StackedModels.logits`) over the
folds with ``torch.func.vmap``. Folds whose training sets differ in size by a row are padded to one batch layout:
the padding is weighted 0 in the loss, and a fold with no real row in a step is left unchanged by it, so fold
``f``'s models equal `dphype.ml.training.train_candidates` on fold ``f``'s training rows with seed
``fold_seed(seed, f)``, up to floating-point rounding and dropout masks (and, for a batch-norm model, the padded
rows' share of the last batch's statistics).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dphype.ml.data import Dataset
from dphype.ml.training import (
    Hyperparameters,
    ModelSpec,
    Progress,
    StackedModels,
    _build,
    _check_training_args,
    _chunks,
    _seeded,
    _tensors,
    _threads,
    evaluate_candidates,
    resolve_device,
    validation_metrics,
)
from dphype.ml.validation import DEFAULT_VALIDATION, Validation, fold_seed

import torch  # noqa: E402  isort: skip
from torch import nn  # noqa: E402  isort: skip
from torch.func import functional_call, vmap  # noqa: E402  isort: skip


def _row_losses(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-row loss ``(..., B)`` of ``logits (..., B, K)`` against ``y (..., B)`` (training's loss, unreduced)."""
    if logits.shape[-1] == 1:
        return nn.functional.binary_cross_entropy_with_logits(
            logits[..., 0], y.to(logits.dtype).expand(logits.shape[:-1]), reduction="none")
    log_probs = torch.log_softmax(logits, dim=-1)
    return -log_probs.gather(-1, y.expand(logits.shape[:-1]).unsqueeze(-1))[..., 0]


def _fold_logits(module: nn.Module, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                 x: torch.Tensor) -> torch.Tensor:
    """Logits ``(F, C, B, K)`` of the ``(F, C)`` stacked models, fold ``f`` on its own batch ``x[f]``."""
    module.train(True)
    stacked_forward = getattr(module, "stacked_forward", None)

    def fold(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], xb: torch.Tensor) -> torch.Tensor:
        if stacked_forward is not None:
            return stacked_forward(p, xb)

        def one(pc: dict[str, torch.Tensor], bc: dict[str, torch.Tensor], batch: torch.Tensor) -> torch.Tensor:
            return functional_call(module, (pc, bc), (batch,))

        return vmap(one, in_dims=(0, 0, None), randomness="different")(p, b, xb)

    return vmap(fold, in_dims=(0, 0, 0), randomness="different")(params, buffers, x)


def _fold_batches(fits: Sequence[np.ndarray], batch_size: int, generators: Sequence[torch.Generator]
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """One epoch of every fold's shuffled batches, padded to one layout: ``(rows (F, B), weights (F, B))``.

    Fold ``f`` draws ``torch.randperm`` of its training rows from ``generators[f]`` (as `train_candidates` does
    with its seed) and cuts it into batches of ``batch_size``; shorter folds are padded with row 0 of weight 0.
    """
    longest = max(len(fit) for fit in fits)
    rows = np.zeros((len(fits), longest), dtype=np.int64)
    weights = np.zeros((len(fits), longest), dtype=np.float64)
    for f, (fit, generator) in enumerate(zip(fits, generators)):
        rows[f, : len(fit)] = fit[torch.randperm(len(fit), generator=generator).numpy()]
        weights[f, : len(fit)] = 1.0
    return [(rows[:, s : s + batch_size], weights[:, s : s + batch_size]) for s in range(0, longest, batch_size)]


def _train_folds(
    initial: Sequence[nn.Module],
    hp: Hyperparameters,
    x: torch.Tensor,
    y: torch.Tensor,
    fits: Sequence[np.ndarray],
    seeds: Sequence[int],
    *,
    epochs: int,
    batch_size: int,
    on_epoch: Callable[[], None] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """SGD with momentum and StepLR on every fold's rows, batched over ``(folds, candidates)``.

    Returns the trained ``(F, C, ...)`` parameters and buffers.
    """
    count = len(hp.lr)
    params = {k: torch.stack([dict(m.named_parameters())[k].detach() for m in initial])
              .unsqueeze(1).expand(-1, count, *v.shape).clone().requires_grad_(True)
              for k, v in initial[0].named_parameters()}
    buffers = {k: torch.stack([dict(m.named_buffers())[k] for m in initial])
               .unsqueeze(1).expand(-1, count, *v.shape).clone() for k, v in initial[0].named_buffers()}
    leaves = list(params.values())
    shape = [(1, -1) + (1,) * (p.dim() - 2) for p in leaves]
    momentum = [hp.momentum.to(p.dtype).view(s) for p, s in zip(leaves, shape)]
    bufs = [torch.zeros_like(p) for p in leaves]
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    module = initial[0]
    for epoch in range(epochs):
        lr = hp.epoch_lr(epoch)
        step = [lr.to(p.dtype).view(s) for p, s in zip(leaves, shape)]
        for rows, weights in _fold_batches(fits, batch_size, generators):
            idx = torch.from_numpy(rows).to(x.device)
            w = torch.from_numpy(weights).to(x.device)
            per_row = _row_losses(_fold_logits(module, params, buffers, x[idx]), y[idx].unsqueeze(1))
            used = w.sum(1)
            loss = ((per_row * w.unsqueeze(1).to(per_row.dtype)).sum(-1) / used.clamp(min=1).view(-1, 1)).sum()
            grads = torch.autograd.grad(loss, leaves)
            active = used > 0
            with torch.no_grad():
                for p, g, buf, m, s in zip(leaves, grads, bufs, momentum, step):
                    if bool(active.all()):
                        buf.mul_(m).add_(g)
                        p.addcmul_(s, buf, value=-1.0)
                    else:
                        on = active.view((-1,) + (1,) * (p.dim() - 1))
                        buf.copy_(torch.where(on, buf * m + g, buf))
                        p.sub_(torch.where(on, s * buf, torch.zeros_like(buf)))
        if on_epoch is not None:
            on_epoch()
    return {k: v.detach() for k, v in params.items()}, buffers


def cross_validate_candidates(
    model: ModelSpec,
    train: Dataset,
    candidates: Sequence[Mapping[str, Any]],
    *,
    validation: str | Validation = DEFAULT_VALIDATION,
    epochs: int = 5,
    batch_size: int = 64,
    seed: int = 0,
    device: str | torch.device | None = None,
    chunk_size: int | None = None,
    num_threads: int | None = None,
    progress: Progress | None = None,
) -> np.ndarray:
    """A client's local scores of every candidate under ``validation``: ``(p, 2)`` lexicographic keys.

    ``"split"`` is `dphype.ml.training.evaluate_candidates` with ``with_loss=True`` (then swapped for
    ``":loss"``). Otherwise every fold of every candidate is trained at once (see the module docstring) and the
    accuracy and loss are pooled over every fold's held-out rows (each weighted by its rows); a candidate that
    diverges in any fold scores NaN.

    Args:
        model: A name of `dphype.ml.models.MODELS` or a zero-argument factory of a fresh module.
        train: The client's local data, at least 2 samples.
        candidates: The candidates.
        validation: A `Validation` or its name.
        epochs: Training epochs.
        batch_size: The minibatch size.
        seed: Seeds the folds and (through `fold_seed`) every fold's training.
        device: The torch device; ``None``: CUDA when available.
        chunk_size: Bounds how many candidates are trained at once (each with all its folds).
        num_threads: Torch intra-op threads.
        progress: ``progress(done, total)`` after every epoch of every chunk.

    Returns:
        Float64 ``(p, 2)``: ``[accuracy, -loss]``, or ``[-loss, accuracy]`` for a ``":loss"`` scheme; a NaN row
        for a diverged candidate.

    Raises:
        ValueError: An argument or a candidate is invalid, or ``train`` has fewer than 2 samples.
    """  # noqa: DOC502
    scheme = validation if isinstance(validation, Validation) else Validation.parse(validation)
    if scheme.kind == "split":
        keys = evaluate_candidates(model, train, candidates, epochs=epochs, batch_size=batch_size, seed=seed,
                                   device=device, chunk_size=chunk_size, num_threads=num_threads, progress=progress,
                                   with_loss=True)
    else:
        splits = scheme.splits(len(train), seed)
        _check_training_args(epochs, batch_size, min(len(fit) for fit, _ in splits))
        dev = resolve_device(device)
        hp = Hyperparameters.from_candidates(candidates, dev)
        chunks = _chunks(len(candidates), chunk_size)
        seeds = [fold_seed(seed, f) for f in range(len(splits))]
        x, y = _tensors(train, dev)
        fits = [fit for fit, _ in splits]
        correct = np.zeros(len(candidates))
        loss_sum = np.zeros(len(candidates))
        done = 0

        def on_epoch() -> None:
            nonlocal done
            done += 1
            if progress is not None:
                progress(done, epochs * len(chunks))

        with _threads(num_threads):
            initial = []
            for s in seeds:
                with _seeded(s, dev):
                    initial.append(_build(model, train, dev))
            with _seeded(seed, dev):
                for chunk in chunks:
                    params, buffers = _train_folds(initial, hp[chunk], x, y, fits, seeds, epochs=epochs,
                                                   batch_size=batch_size, on_epoch=on_epoch)
                    for f, (_, held) in enumerate(splits):
                        fold = StackedModels(initial[0], {k: v[f] for k, v in params.items()},
                                             {k: v[f] for k, v in buffers.items()})
                        acc, loss = validation_metrics(fold, train.subset(held))
                        correct[chunk] += acc * len(held)
                        loss_sum[chunk] += loss * len(held)
        rows = sum(len(held) for _, held in splits)
        keys = np.stack([correct / rows, -loss_sum / rows], axis=1)
    return scheme.ranked(keys)
