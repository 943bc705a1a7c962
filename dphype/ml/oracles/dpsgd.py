"""DP-SGD and DP-Adam (DPareto Alg. 3/4) through Opacus, over DPareto's Table 1 domains on Adult and MNIST.

`train_dpsgd` trains with Poisson-sampled lots, Opacus' per-sample gradients, clipping and noise; `dpsgd_epsilon`
accounts for it with Opacus' RDP or PRV accountant. The problems (`DpsgdProblem`) are
``{optimizer}-{model}-{dataset}`` for every optimizer of `DPSGD_OPTIMIZERS`, model of `DPSGD_MODELS` and data set of
`DPSGD_DATASETS` (``adult``, or ``mnist5k``: the bundled 5,000-digit subset of MNIST, `dphype.ml.data`).

torch and Opacus are imported inside the functions that train or account, so importing this module is cheap.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from dphype.checks import check_delta
from dphype.ml.data import load_dataset
from dphype.ml.oracles.problem import NamedProblem, ParetoProblem, ProblemOptions, UtilityResult, subsample_pool
from dphype.ml.oracles.space import Config, Distribution, Domain, Hyperparameter

#: DPareto Table 1 domains per data set (epochs, lot size, learning rate, noise variance, clip norm).
DPSGD_DOMAINS: dict[str, dict[str, tuple[float, float]]] = {
    "adult": {"epochs": (1, 64), "lot_size": (8, 512), "lr": (5e-4, 5e-2), "noise_variance": (0.1, 16),
              "clip_norm": (0.1, 4)},
    "mnist5k": {"epochs": (1, 400), "lot_size": (16, 4000), "lr": (1e-3, 5e-1), "noise_variance": (0.1, 16),
              "clip_norm": (0.1, 12)},
}

#: DPareto Appendix C, Tables 3 (MNIST) and 4 (ADULT): the random baseline's sampling laws.
DPSGD_DISTRIBUTIONS: dict[str, dict[str, Distribution]] = {
    "adult": {
        "epochs": Distribution("uniform", 1, 64),
        "lot_size": Distribution("normal", 128, 64),
        "lr": Distribution("shifted-exponential", 10, 1e-3),
        "noise_variance": Distribution("shifted-exponential", 1e-1, 1e-1),
        "clip_norm": Distribution("shifted-exponential", 1e-1, 1e-1),
    },
    "mnist5k": {
        "epochs": Distribution("uniform", 1, 400),
        "lot_size": Distribution("normal", 800, 800),
        "lr": Distribution("shifted-exponential", 10, 1e-3),
        "noise_variance": Distribution("shifted-exponential", 5e-1, 1e-1),
        "clip_norm": Distribution("shifted-exponential", 5e-1, 1e-1),
    },
}

DPSGD_MODELS: tuple[str, ...] = ("logreg", "svm", "mlp", "mlp1")
DPSGD_OPTIMIZERS: tuple[str, ...] = ("dpsgd", "dpadam")
OPACUS_ACCOUNTANTS: tuple[str, ...] = ("rdp", "prv")
#: The data sets of the problems, by their `dphype.ml.data.load_dataset` names (DPareto's MNIST domain is used on
#: the bundled 5,000-digit subset, ``mnist5k``).
DPSGD_DATASETS: tuple[str, ...] = ("adult", "mnist5k")
#: Renyi orders for the RDP accountant: Opacus' defaults extended to 1024, so that very noisy,
#: short runs (tiny epsilon, optimal order beyond 63) are not over-estimated.
RDP_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
                                      + list(range(64, 1025, 16)))


def dpsgd_steps(epochs: int, lot_size: int, num_samples: int) -> tuple[float, int]:
    """Poisson sampling rate ``q = m / n`` and steps ``T * n / m`` (at least 1); refuses ``T`` or ``m`` out of range."""
    if not 1 <= lot_size <= num_samples:
        raise ValueError(f"lot_size must be in [1, {num_samples}] (the training set size), got {lot_size}")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    return lot_size / num_samples, max(1, int(round(epochs * num_samples / lot_size)))


def dpsgd_epsilon(config: Mapping[str, Any], num_samples: int, delta: float, accountant: str = "rdp") -> float:
    """Epsilon of DP-SGD/DP-Adam with ``config`` on ``num_samples`` records (Opacus accountants).

    The mechanism is the Poisson-subsampled Gaussian mechanism (Abadi et al. 2016) with noise
    multiplier ``sqrt(noise_variance)`` (noise std ``sqrt(noise_variance) * clip_norm`` on the sum
    of clipped per-example gradients, add/remove neighbours), sample rate ``lot_size / n``, for
    ``epochs * n / lot_size`` steps; the clipping norm does not affect epsilon. The RDP accountant
    minimises over `RDP_ORDERS`.

    Args:
        config: ``noise_variance``, ``lot_size``, ``epochs`` (and the rest of the configuration).
        num_samples: ``n``.
        delta: The delta.
        accountant: One of `OPACUS_ACCOUNTANTS`.

    Returns:
        The epsilon.

    Raises:
        ValueError: ``accountant`` is unknown, or ``epochs`` or ``lot_size`` is out of its range.
    """
    # lazy import: Opacus
    from opacus.accountants import create_accountant

    if accountant not in OPACUS_ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {OPACUS_ACCOUNTANTS}, got {accountant!r}")
    q, steps = dpsgd_steps(int(config["epochs"]), int(config["lot_size"]), num_samples)
    acc = create_accountant(accountant)
    acc.history.append((math.sqrt(float(config["noise_variance"])), q, steps))
    if accountant == "rdp":
        return float(acc.get_epsilon(delta, alphas=list(RDP_ORDERS)))
    return float(acc.get_epsilon(delta))


def build_dpsgd_model(name: str, in_features: int, num_classes: int) -> Any:
    """DPareto Sec. 4.1 models.

    ``logreg``/``svm`` (linear, zero-initialised as in Alg. 3), ``mlp`` (MLP2: 128-64 ReLU) and ``mlp1`` (one
    hidden layer of 1000 ReLU units).

    Args:
        name: One of `DPSGD_MODELS`.
        in_features: The number of input features.
        num_classes: The number of classes.

    Returns:
        A fresh torch module.

    Raises:
        ValueError: ``name`` is unknown.
    """
    # lazy import: torch
    from torch import nn

    if name in ("logreg", "svm"):
        layer = nn.Linear(in_features, num_classes)
        nn.init.zeros_(layer.weight)
        nn.init.zeros_(layer.bias)
        return layer
    if name == "mlp":
        return nn.Sequential(nn.Linear(in_features, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                             nn.Linear(64, num_classes))
    if name == "mlp1":
        return nn.Sequential(nn.Linear(in_features, 1000), nn.ReLU(), nn.Linear(1000, num_classes))
    raise ValueError(f"model must be one of {DPSGD_MODELS}, got {name!r}")


def train_dpsgd(
    model_name: str,
    optimizer: str,
    x: Any,
    y: Any,
    num_classes: int,
    config: Mapping[str, Any],
    seed: int,
) -> Any:
    """Train with DP-SGD (DPareto Alg. 3) or DP-Adam (Alg. 4) through Opacus.

    Lots are Poisson samples with rate ``lot_size / n`` (so Opacus' accountants apply); Opacus'
    ``GradSampleModule`` computes per-example gradients and its ``DPOptimizer`` clips them to
    ``clip_norm``, adds ``N(0, noise_variance * clip_norm^2)`` to their sum and divides by the
    expected lot size. An empty lot still takes a (pure-noise) step. ``logreg`` uses the logistic
    (cross-entropy) loss, ``svm`` the multi-class hinge loss, MLPs cross-entropy.

    Args:
        model_name: One of `DPSGD_MODELS`.
        optimizer: One of `DPSGD_OPTIMIZERS`.
        x: ``(n, d)`` training features.
        y: ``(n,)`` labels.
        num_classes: The number of classes.
        config: The configuration (learning rate, clipping norm, noise variance, lot size, epochs).
        seed: Seeds the training.

    Returns:
        The trained model.

    Raises:
        ValueError: ``optimizer`` or ``model_name`` is unknown.
    """  # noqa: DOC502
    # lazy import: Opacus; torch
    import torch
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    if optimizer not in DPSGD_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {DPSGD_OPTIMIZERS}, got {optimizer!r}")
    n = x.shape[0]
    q, steps = dpsgd_steps(int(config["epochs"]), int(config["lot_size"]), n)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = GradSampleModule(build_dpsgd_model(model_name, x.shape[1], num_classes), loss_reduction="sum")
    base = (torch.optim.SGD if optimizer == "dpsgd" else torch.optim.Adam)(model.parameters(), lr=float(config["lr"]))
    opt = DPOptimizer(
        base,
        noise_multiplier=math.sqrt(float(config["noise_variance"])),
        max_grad_norm=float(config["clip_norm"]),
        expected_batch_size=int(config["lot_size"]),
        loss_reduction="mean",
        generator=generator,
    )
    loss_fn = torch.nn.functional.multi_margin_loss if model_name == "svm" else torch.nn.functional.cross_entropy
    with warnings.catch_warnings():
        # Opacus' hooks on the first layer fire without input gradients: expected, harmless.
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        for _ in range(steps):
            idx = (torch.rand(n, generator=generator) < q).nonzero().squeeze(1)
            opt.zero_grad(set_to_none=True)
            if len(idx):
                loss_fn(model(x[idx]), y[idx], reduction="sum").backward()
            else:
                for p in model.parameters():
                    p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype)
            opt.step()
    return model._module


def dpsgd_problem(
    optimizer: str,
    model_name: str,
    dataset: str,
    *,
    runs: int = 3,
    delta: float = 1e-5,
    accountant: str = "rdp",
    train_size: int | None = None,
    data_dir: str | None = None,
) -> ParetoProblem:
    """DP-SGD / DP-Adam over DPareto's Table 1 domain for ``dataset`` in `DPSGD_DATASETS`.

    Utility: test accuracy averaged over ``runs`` independent trainings (best/worst kept).
    Privacy: `dpsgd_epsilon` at ``delta`` with Opacus' ``accountant``.

    Args:
        optimizer: One of `DPSGD_OPTIMIZERS`.
        model_name: One of `DPSGD_MODELS`.
        dataset: ``"adult"`` or ``"mnist5k"``.
        runs: Independent trainings per evaluation, ``>= 1``.
        delta: The fixed delta.
        accountant: ``"rdp"`` or ``"prv"``.
        train_size: Subsamples the training pool (the privacy oracle uses the same ``n``); ``None``: all.
        data_dir: The folder holding a non-bundled data set.

    Returns:
        The problem.

    Raises:
        ValueError: An argument is unknown or out of its range.
    """
    # lazy import: torch
    import torch

    if optimizer not in DPSGD_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {DPSGD_OPTIMIZERS}, got {optimizer!r}")
    if model_name not in DPSGD_MODELS:
        raise ValueError(f"model must be one of {DPSGD_MODELS}, got {model_name!r}")
    if dataset not in DPSGD_DATASETS:
        raise ValueError(f"dataset must be one of {DPSGD_DATASETS}, got {dataset!r}")
    if accountant not in OPACUS_ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {OPACUS_ACCOUNTANTS}, got {accountant!r}")
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    check_delta(delta)
    pool, test = load_dataset(dataset, data_dir)
    pool = subsample_pool(pool, train_size)
    x = torch.from_numpy(pool.x.reshape(len(pool), -1))
    y = torch.from_numpy(pool.y)
    xt = torch.from_numpy(test.x.reshape(len(test), -1))
    yt = torch.from_numpy(test.y)
    n = len(pool)
    bounds = dict(DPSGD_DOMAINS[dataset])
    lot_lo, lot_hi = bounds["lot_size"]
    if lot_lo >= n:
        raise ValueError(f"train_size must exceed the smallest lot size {lot_lo}, got {n}")
    bounds["lot_size"] = (lot_lo, min(lot_hi, n))
    domain = Domain(
        tuple(
            Hyperparameter(name, lo, hi, log=True, integer=name in ("epochs", "lot_size"))
            for name, (lo, hi) in bounds.items()
        )
    )

    def utility(config: Config, rng: np.random.Generator) -> UtilityResult:
        scores = []
        for seed in rng.integers(0, 2**31 - 1, size=runs):
            model = train_dpsgd(model_name, optimizer, x, y, pool.num_classes, config, int(seed))
            with torch.no_grad():
                scores.append(float((model(xt).argmax(dim=1) == yt).double().mean()))
        return UtilityResult.from_runs(scores)

    name = f"{optimizer}-{model_name}-{dataset}"
    return ParetoProblem(
        name=name,
        domain=domain,
        privacy=lambda c: dpsgd_epsilon(c, n, delta, accountant),
        utility=utility,
        delta=delta,
        distributions=DPSGD_DISTRIBUTIONS[dataset],
        description=f"{'DP-SGD' if optimizer == 'dpsgd' else 'DP-Adam'} ({model_name}) on {dataset} via Opacus, "
        f"{accountant.upper()} accountant",
    )


class DpsgdProblem(NamedProblem):
    """``{optimizer}-{model}-{dataset}``: `dpsgd_problem` for every optimizer, model and data set."""

    names = tuple(
        f"{o}-{m}-{d}" for o, m, d in itertools.product(DPSGD_OPTIMIZERS, DPSGD_MODELS, DPSGD_DATASETS))

    @classmethod
    def build(cls, name: str, options: ProblemOptions) -> ParetoProblem:
        """`dpsgd_problem` for the optimizer, model and data set ``name`` names, with the options."""
        optimizer, model_name, dataset = name.split("-")
        return dpsgd_problem(optimizer, model_name, dataset, accountant=options.accountant,
                             train_size=options.train_size, data_dir=options.data_dir, **options.runs_override())
