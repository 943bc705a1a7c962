"""Synthetic utility study of Section IV-B (Fig. 2a-c): how ``k`` trades utility against privacy.

Loss model (Section IV-B): each of ``n`` clients draws ``|H_good|`` local losses from ``N(0, sigma_loss^2)``
and ``|H| - |H_good|`` from ``N(1, sigma_loss^2)``, votes for its ``k`` smallest losses (Algorithm 1,
lines 5-8), the noisy vote sum is released and the server takes the argmax. Success means the argmax is a
good candidate; it is estimated over ``repetitions`` independent runs (fresh losses and fresh noise).

The three panels sweep ``sigma_loss`` (a), ``|H_good| = 2^i`` (b) and ``|H|`` (c) for every ``k`` and
``epsilon`` (``delta = 1e-5``, ``n = 250``, 5000 repetitions in the paper).

Speed (the whole figure is billions of losses): clients and repetitions are vectorised, and the clients'
rankings come from the exact samplers of :mod:`dphype.selection.planner` (the loss model's home, shared with the
planner): one ranking per client serves every ``k`` (nested top-k prefixes), drawn by sorting rank keys or
by order statistics instead of drawing every loss (``--sampler losses`` draws every loss: the reference).
``tests/simulations/test_synthetic.py`` checks the ranking against :func:`dphype.selection.voting.top_k_votes` and the
samplers against each other.

The noise of every release is the library's: :func:`dphype.privacy.noise.summed_noise` (via
:func:`dphype.privacy.noise.replay_noisy_sums`, identical in distribution to adding the ``n`` shares of
:func:`dphype.privacy.noise.noise_share`; ``--per-client-noise`` adds them literally).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from dphype.privacy.noise import replay_noisy_sums
from dphype.privacy.noise_kinds import resolve_accountant
from dphype.selection.planner import LossModel, ranking_prefix, vote_counts
from simulations import harness

#: paper defaults (Section IV-B, Fig. 2)
KS: tuple[int, ...] = (1, 5, 25, 50, 100)
EPSILONS: tuple[float, ...] = (0.25, 1.0)
SIGMA_LOSSES: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
GOOD_EXPONENTS: tuple[int, ...] = tuple(range(7))  # |H_good| = 2^i, i = 0..6
NUM_CANDIDATES: tuple[int, ...] = (100, 300, 900, 2700)
PANELS: tuple[str, ...] = ("a", "b", "c")

#: reps per vectorised chunk (bounded memory: chunk * n * depth int32)
_CHUNK_REPS = 100


@dataclass(frozen=True)
class Settings:
    """Everything one synthetic run needs besides the loss model."""

    clients: int
    ks: tuple[int, ...]
    epsilons: tuple[float, ...]
    delta: float
    repetitions: int
    accountant: str | None
    noise: str
    per_client_noise: bool
    workers: int
    sampler: str = "auto"


def success_counts(
    model: LossModel, settings: Settings, seed: Sequence[int], progress: Any = None
) -> dict[tuple[int, float], int]:
    """Number of repetitions whose selection is a good candidate, per ``(k, epsilon)``.

    Repetitions run in chunks on ``settings.workers`` threads (numpy releases the GIL while sampling and
    sorting); every chunk has its own random stream spawned from ``seed``, so results do not depend on
    the number of workers.
    """
    ks = list(settings.ks)
    for k in ks:
        if not 1 <= k <= model.num_candidates:
            raise ValueError(f"k must be in [1, {model.num_candidates}] (|H|), got {k}")
    depth = max([k for k in ks if k < model.num_candidates], default=1)
    sigmas = {
        (k, eps): harness.sigma_for(eps, settings.delta, k, num_candidates=model.num_candidates,
                                    accountant=settings.accountant, noise=settings.noise)
        for k in ks for eps in settings.epsilons
    }
    chunks = list(harness.chunked(settings.repetitions, _CHUNK_REPS))
    streams = np.random.SeedSequence(seed).spawn(len(chunks))

    def one_chunk(args: tuple[tuple[int, int], np.random.SeedSequence]) -> dict[tuple[int, float], int]:
        (start, stop), stream = args
        rng = np.random.default_rng(stream)
        reps = stop - start
        prefix = ranking_prefix(model, reps * settings.clients, depth, rng, settings.sampler)
        counts = vote_counts(prefix, ks, reps, settings.clients, model.num_candidates)
        out = {}
        for (k, eps), sigma in sigmas.items():
            noisy = replay_noisy_sums(counts[k], sigma=sigma, clients=settings.clients, repetitions=reps, rng=rng,
                                    noise=settings.noise, per_client=settings.per_client_noise)
            out[(k, eps)] = int(np.count_nonzero(harness.select_rows(noisy) < model.num_good))
        if progress is not None:
            progress(reps)
        return out

    total = {key: 0 for key in sigmas}
    with ThreadPoolExecutor(max_workers=settings.workers) as pool:
        for part in pool.map(one_chunk, zip(chunks, streams)):
            for key, value in part.items():
                total[key] += value
    return total


def panel_models(panel: str, sigma_losses: Sequence[float], good_exponents: Sequence[int],
                 num_candidates: Sequence[int]) -> list[tuple[float, LossModel]]:
    """``(x, model)`` pairs of one panel of Fig. 2 (a: sigma_loss, b: |H_good|, c: |H|)."""
    if panel == "a":
        return [(s, LossModel(5, 100, s)) for s in sigma_losses]
    if panel == "b":
        return [(2**i, LossModel(2**i, 100, 0.2)) for i in good_exponents]
    if panel == "c":
        return [(p, LossModel(5, p, 0.2)) for p in num_candidates]
    raise ValueError(f"panel must be one of {', '.join(PANELS)}, got {panel!r}")


# ------------------------------------------------------------------------------------------------ CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=250, help="n (default 250)")
    parser.add_argument("--repetitions", type=int, default=5000, help="runs per point (default 5000)")
    parser.add_argument("--ks", type=int, nargs="+", default=list(KS), help="votes per client (default 1 5 25 50 100)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS), help="default 0.25 1")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--panels", nargs="+", default=list(PANELS), choices=PANELS,
                        help="Fig. 2 panels (default a b c)")
    parser.add_argument("--sigma-losses", type=float, nargs="+", default=list(SIGMA_LOSSES), help="panel a sweep")
    parser.add_argument("--good-exponents", type=int, nargs="+", default=list(GOOD_EXPONENTS),
                        help="panel b: |H_good| = 2^i (default i = 0..6)")
    parser.add_argument("--num-candidates", type=int, nargs="+", default=list(NUM_CANDIDATES),
                        help="panel c sweep of |H|")
    harness.add_noise_arguments(parser)
    parser.add_argument("--per-client-noise", action="store_true",
                        help="add n noise shares literally instead of one draw of the same total distribution (slow)")
    parser.add_argument("--sampler", choices=("auto", "losses"), default="auto",
                        help="auto: fast exact samplers; losses: draw every loss (reference, slower)")
    parser.add_argument("--workers", type=int, default=2, help="threads (default 2)")
    parser.add_argument("--flower", action="store_true",
                        help="also run one configuration (|H_good|=5, |H|=100, sigma_loss=0.2, k=5, largest epsilon) "
                             "once through Flower + SecAgg+ with --flower-clients clients")
    parser.add_argument("--flower-clients", type=int, default=50, help="clients of the --flower run (default 50)")


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    settings = Settings(
        clients=harness.check_clients(args.clients),
        ks=tuple(harness.check_int("k", k, 1) for k in args.ks),
        epsilons=tuple(harness.check_epsilons(args.epsilons)),
        delta=harness.check_delta(args.delta),
        repetitions=harness.check_int("repetitions", args.repetitions, 1),
        accountant=args.accountant,
        noise=harness.check_noise(args.noise),
        per_client_noise=bool(args.per_client_noise),
        workers=harness.check_int("workers", args.workers, 1),
        sampler=args.sampler,
    )
    resolve_accountant(settings.accountant, settings.noise)  # Skellam needs the RDP accountant
    if args.flower:
        harness.check_clients(args.flower_clients)
    for i in args.good_exponents:
        if not 0 <= i < 7:
            raise ValueError(f"good exponent must be in [0, 6] (|H_good| = 2^i < |H| = 100), got {i}")
    panels = {p: panel_models(p, args.sigma_losses, args.good_exponents, args.num_candidates) for p in args.panels}
    for points in panels.values():
        for _, model in points:
            if max(settings.ks) > model.num_candidates:
                raise ValueError(f"k must be <= |H| = {model.num_candidates}, got {max(settings.ks)}")
    total = sum(len(v) for v in panels.values()) * settings.repetitions
    rows: list[dict[str, Any]] = []
    cache: dict[LossModel, dict[tuple[int, float], int]] = {}
    timings: dict[str, float] = {}
    with harness.progress_bar(total, "synthetic") as bar:
        for panel, points in panels.items():
            t0 = time.perf_counter()
            for x, model in points:
                if model not in cache:
                    seed = [args.seed, model.num_good, model.num_candidates, int(round(model.sigma_loss * 1e6))]
                    cache[model] = success_counts(model, settings, seed, bar.update)
                else:
                    bar.update(settings.repetitions)
                for (k, eps), wins in sorted(cache[model].items()):
                    lo, hi = harness.wilson_interval(wins, settings.repetitions)
                    rows.append({
                        "panel": panel, "x": x, "num_good": model.num_good, "num_candidates": model.num_candidates,
                        "sigma_loss": model.sigma_loss, "k": k, "epsilon": eps, "clients": settings.clients,
                        "repetitions": settings.repetitions, "successes": wins,
                        "success_rate": wins / settings.repetitions, "ci_low": lo, "ci_high": hi,
                    })
            timings[panel] = round(time.perf_counter() - t0, 3)
    study.write_csv("synthetic.csv", rows)
    plot(rows, settings, study)
    extra = {"flower": flower_check(settings, args.flower_clients, args.seed)} if args.flower else {}
    return study.result(**extra, panel_seconds=timings, clients=settings.clients, repetitions=settings.repetitions,
                        ks=list(settings.ks), epsilons=list(settings.epsilons), accountant=settings.accountant,
                        noise=settings.noise, per_client_noise=settings.per_client_noise, sampler=settings.sampler,
                        points=len(rows))


def flower_check(settings: Settings, clients: int, seed: int) -> dict[str, Any]:
    """One synthetic configuration (``|H_good| = 5``, ``|H| = 100``, ``sigma_loss = 0.2``, ``k = 5``, the
    largest epsilon) through Flower + SecAgg+, with the replay's success probability for the same votes."""
    from dphype.config import DPHypeConfig
    from dphype.selection.candidates import table_iii_grid
    from simulations.flower import replay_picks, vote_through_flower

    model = LossModel(5, 100, 0.2)
    eps = max(settings.epsilons)
    losses = model.losses(harness.check_clients(clients), np.random.default_rng(seed))
    config = DPHypeConfig(epsilon=eps, delta=settings.delta, k=5, clients=clients)
    candidates = table_iii_grid()
    out = vote_through_flower(losses, candidates, config, maximize=False)
    picks = replay_picks(losses, candidates, config, maximize=False)
    return {"clients": clients, "num_good": 5, "num_candidates": 100, "sigma_loss": 0.2, "k": 5, "epsilon": eps,
            "noise": "skellam", "selected_index": out["selected_index"],
            "selected_is_good": out["selected_index"] < model.num_good,
            "replay_good_probability": float(picks[: model.num_good].sum()),
            "round_seconds": round(out["round_seconds"], 3)}


_XLABEL = {"a": r"$\sigma_{loss}$ ($|H_{good}|=5$, $|H|=100$)", "b": r"$|H_{good}|$ ($\sigma_{loss}=0.2$, $|H|=100$)",
           "c": r"$|H|$ ($|H_{good}|=5$, $\sigma_{loss}=0.2$)"}


def plot(rows: Sequence[dict[str, Any]], settings: Settings, study: harness.StudyRun) -> None:
    """Fig. 2: success probability per panel, one colour per ``k``, one line style per ``epsilon``."""
    plt = harness.pyplot()
    panels = sorted({r["panel"] for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    styles = ["-", "--", ":", "-."]
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(settings.ks)))
    for ax, panel in zip(axes[0], panels):
        for ci, k in enumerate(sorted(settings.ks)):
            for si, eps in enumerate(settings.epsilons):
                pts = sorted((r["x"], r["success_rate"]) for r in rows if r["panel"] == panel and r["k"] == k
                             and r["epsilon"] == eps)
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, styles[si % len(styles)], color=colors[ci], marker=".",
                            label=f"k={k}, ε={eps:g}")
        if panel in ("b", "c"):
            ax.set_xscale("log", base=2 if panel == "b" else 10)
        ax.set_xlabel(_XLABEL[panel])
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"Fig. 2{panel}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("P[selected ∈ H_good]")
    axes[0][-1].legend(fontsize=6, ncol=2, loc="lower left")
    fig.suptitle(f"Synthetic study: n={settings.clients}, {settings.repetitions} runs, δ={settings.delta:g}",
                 fontsize=9,
                 y=1.03)
    study.save_figure(fig, "synthetic_fig2.png")
