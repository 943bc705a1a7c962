"""Data and accuracy distributions: Figs. 6-7 (Appendix C) and Figs. 3, 8 (Section V-B, Appendix D).

* **Label plots** (Figs. 6, 7): the Dirichlet partitions of :func:`dphype.ml.data.partition_dirichlet` (the
  shards every client gets through :func:`dphype.ml.torch_task.make_task`) for each ``beta``; the first
  ``--show`` clients of ``n`` as stacked bars of per-label sample counts (bar length = local data size).
* **Accuracy histograms** (Figs. 3, 8): the FedAvg test accuracy of every candidate for each
  (``n``, partition) setting, from the cache the tradeoff study fills (trained here when missing).

``--flower`` runs one DP-Hype release on the first setting through Flower + SecAgg+ (like the other studies).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from simulations import harness


def add_arguments(parser: argparse.ArgumentParser) -> None:
    harness.add_federation_arguments(parser, clients=(50,), partitions=("30", "5", "0.5"))
    parser.add_argument("--show", type=int, default=10, help="clients shown per label plot (default 10)")
    parser.add_argument("--histograms", action=argparse.BooleanOptionalAction, default=True,
                        help="also train/load the FedAvg accuracies for the histograms (default on)")
    parser.add_argument("--flower", action="store_true",
                        help="also run DP-Hype (k=5, epsilon=1) once through Flower + SecAgg+ on the first setting")


def label_counts(fed: harness.Federation) -> np.ndarray:
    """``(n, num_classes)`` label counts of every client's shard."""
    from dphype.ml.torch_task import load_cached

    num_classes = load_cached(fed.dataset, fed.data_dir)[0].num_classes
    return np.stack([np.bincount(c.y, minlength=num_classes) for c in harness.federation_clients(fed)])


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    show = harness.check_int("show", args.show, 1)
    candidates = harness.candidates_from_args(args)
    scale = harness.Scale.from_args(args)
    feds = harness.federations_from_args(args)
    cache = harness.cache_from_args(args)
    units = harness.work_units(feds, scale, scores=False) if args.histograms else 0
    label_rows: list[dict[str, Any]] = []
    acc_rows: list[dict[str, Any]] = []
    counts = {fed: label_counts(fed) for fed in feds}
    for fed, table in counts.items():
        for i, row in enumerate(table):
            label_rows.append({"dataset": fed.dataset, "clients": fed.clients, "partition": fed.label, "client": i,
                               "size": int(row.sum()), **{f"label_{j}": int(c) for j, c in enumerate(row)}})
    study.write_csv("distributions_labels.csv", label_rows)
    plot_labels(counts, show, study)
    summary: list[dict[str, Any]] = []
    if args.histograms:
        accuracies = {}
        with harness.progress_bar(units, "distributions") as bar:
            for fed in feds:
                accuracies[fed] = harness.cached_accuracies(fed, candidates, scale, cache, bar)
        for fed, acc in accuracies.items():
            for j, a in enumerate(acc):
                acc_rows.append({"dataset": fed.dataset, "clients": fed.clients, "partition": fed.label,
                                 "candidate": j, **candidates[j], "fedavg_accuracy": float(a)})
            finite = acc[np.isfinite(acc)]
            summary.append({"clients": fed.clients, "partition": fed.label, "max": round(float(finite.max()), 4),
                            "median": round(float(np.median(finite)), 4), "diverged": int((~np.isfinite(acc)).sum())})
        study.write_csv("distributions_accuracy.csv", acc_rows)
        plot_histograms(accuracies, study)
    sizes = {f"n={f.clients},{f.label}": [int(t.sum(axis=1).min()), int(t.sum(axis=1).max())]
             for f, t in counts.items()}
    extra: dict[str, Any] = {}
    if args.flower:  # the first setting's partition, voted on once through the real Flower path
        from dphype.ml.torch_task import load_cached
        from simulations.flower import flower_check

        fed = feds[0]
        accuracy = harness.fill_diverged(harness.cached_accuracies(fed, candidates, scale, cache),
                                         load_cached(fed.dataset, fed.data_dir)[1].y)
        extra["flower"] = flower_check(fed, candidates, harness.cached_scores(fed, candidates, scale, cache),
                                       accuracy, k=5, epsilon=1.0, delta=1e-5)
    return study.result(**extra, dataset=args.dataset, scale=vars(scale), client_size_range=sizes,
                        accuracy=summary)


def plot_labels(counts: dict[harness.Federation, np.ndarray], show: int, study: harness.StudyRun) -> None:
    """Figs. 6/7: stacked per-label bars of the first ``show`` clients, one panel per partition."""
    plt = harness.pyplot()
    feds = list(counts)
    fig, axes = plt.subplots(1, len(feds), figsize=(3.2 * len(feds), 2.8), squeeze=False)
    for ax, fed in zip(axes[0], feds):
        table = counts[fed][:show]
        left = np.zeros(len(table))
        colors = plt.get_cmap("tab10")(np.arange(table.shape[1]) % 10)
        for label in range(table.shape[1]):
            ax.barh(np.arange(len(table)), table[:, label], left=left, color=colors[label], label=str(label))
            left += table[:, label]
        ax.set_yticks(np.arange(len(table)), [f"client {i}" for i in range(len(table))], fontsize=7)
        ax.set_xlabel("local samples")
        ax.set_title(f"{fed.dataset}, n={fed.clients}, {fed.label}", fontsize=9)
    axes[0][-1].legend(title="label", fontsize=6, title_fontsize=7, loc="lower right")
    fig.suptitle("Label distribution and size of local data sets (Appendix C)", fontsize=9, y=1.03)
    study.save_figure(fig, f"distributions_labels_{feds[0].dataset}.png")


def plot_histograms(accuracies: dict[harness.Federation, np.ndarray], study: harness.StudyRun) -> None:
    """Figs. 3/8: histogram of the candidates' FedAvg test accuracies, one panel per setting."""
    plt = harness.pyplot()
    feds = list(accuracies)
    fig, axes = plt.subplots(1, len(feds), figsize=(3.0 * len(feds), 2.5), squeeze=False, sharey=True)
    for ax, fed in zip(axes[0], feds):
        acc = accuracies[fed]
        ax.hist(acc[np.isfinite(acc)], bins=np.linspace(0, 1, 21), color="tab:blue")
        ax.set_title(f"n={fed.clients}, {fed.label}", fontsize=9)
        ax.set_xlabel("test accuracy")
    axes[0][0].set_ylabel("candidates")
    fig.suptitle(f"{feds[0].dataset}: FedAvg accuracy of the candidates (Figs. 3, 8)", fontsize=9, y=1.03)
    study.save_figure(fig, f"distributions_accuracy_{feds[0].dataset}.png")
