"""Resource consumption of Table IV (Section V-D): local evaluation and the voting round.

* **Local evaluation**, per client: wall time and peak memory of one client scoring every candidate
  (:meth:`dphype.ml.torch_task.TorchTask.score`). On a GPU the memory is ``torch.cuda.max_memory_allocated`` (what
  the paper reports); on a CPU it is the growth of the process's peak resident set size during scoring
  (Linux: the peak ``VmHWM`` is reset through ``/proc/self/clear_refs`` just before scoring, and the
  resident size at that moment is subtracted; a tiny warm-up run first keeps torch's one-off start-up
  allocations out), in a fresh subprocess per client. Averaged over ``--measured-clients``.
* **Voting round**: one DP-Hype release over Flower + SecAgg+ (:func:`simulations.flower.vote_through_flower`)
  with a 100-entry vote vector and ``n`` clients; per-client upload/download payload, the round's wall
  time (inside the ServerApp), the whole simulation's wall time (Ray start-up included) and the peak
  resident memory of the simulation's processes. ``--secagg secure`` (default) uses the product's secure
  SecAgg+ graph (:func:`dphype.secure.secagg_params.secure_parameters` for ``--dropout``);
  ``--secagg paper`` the paper's settings (shares ``0.3 n``, threshold = number of shares). Scores are
  random (the round does not depend on them). ``--release sum argmax`` measures both release modes on the
  same scores: ``argmax`` is the winner-only release with 3 simulated tally nodes beside the ``n`` clients
  (:func:`simulations.flower.vote_through_flower`; its round: finding the committee, the pre-flight, the
  sealed shares and the tallies' secure argmax; ``tally_upload_kb`` / ``tally_download_kb`` per tally node).
  ``time_exponent`` is, per release mode, the least-squares slope of ``log(round seconds)`` against
  ``log(n)`` over the voting rounds (plotted in ``resources_scaling.png``).
* **Voting round by stage** (``resources_stages.csv`` and ``.txt``, ``stages`` in the result): each stage's wall
  seconds and CPU seconds of the server process (ServerApp and Flower's engine), of the simulated clients and of
  Ray's other processes, with the idle-machine estimate (:meth:`simulations.flower.StageClock.stages`), so that a
  later slowdown shows which stage moved and whether in the server or the clients; beside each run print the
  machine's load (``uptime``): on a shared machine the CPU seconds are the measure to compare.
"""

from __future__ import annotations

import argparse
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from dphype.release import RELEASE_MODES, release_mode
from simulations import harness


def _status_kb(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (VmRSS: resident now, VmHWM: peak since the last reset)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _measure_client(dataset: str, partition_id: int, clients: int, seed: int, epochs: int, candidates_json: str,
                    data_dir: str | None) -> dict[str, float]:
    """Runs in a fresh subprocess: one client's local evaluation, its seconds and memory overhead (MB)."""
    import dataclasses
    import time

    import torch

    from dphype.ml.torch_task import make_task
    from dphype.selection.candidates import CandidateList

    task = make_task(dataset, partition_id, clients, seed=seed, epochs=epochs, data_dir=data_dir)
    candidates = CandidateList.from_json(candidates_json)
    # warm-up on 20 rows and one candidate: torch's one-off start-up allocations are not the evaluation's
    dataclasses.replace(task, data=task.data.subset(np.arange(min(20, len(task.data)))), epochs=1).score(
        CandidateList([candidates[0]]))
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    rss_before_kb = _status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:  # reset the peak RSS (VmHWM) to the current RSS (Linux)
        fh.write("5")
    start = time.perf_counter()
    task.score(candidates)
    seconds = time.perf_counter() - start
    if gpu:
        memory_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        memory_mb = max(0, _status_kb("VmHWM") - rss_before_kb) / 1024
    return {"seconds": seconds, "memory_mb": memory_mb, "rows": float(len(task.data)), "gpu": float(gpu)}


def local_evaluation(dataset: str, clients: int, *, seed: int, epochs: int, candidates: Any, measured: int,
                     data_dir: str | None) -> dict[str, Any]:
    """Mean seconds and memory of the first ``measured`` clients' local evaluations (fresh process each)."""
    runs = []
    ctx = multiprocessing.get_context("spawn")
    for i in range(min(measured, clients)):
        with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            runs.append(pool.submit(_measure_client, dataset, i, clients, seed, epochs, candidates.to_json(),
                                    data_dir).result())
    return {
        "seconds": float(np.mean([r["seconds"] for r in runs])),
        "memory_mb": float(np.mean([r["memory_mb"] for r in runs])),
        "rows": float(np.mean([r["rows"] for r in runs])),
        "memory_kind": "cuda max_memory_allocated" if runs[0]["gpu"] else "peak RSS growth (CPU)",
        "measured_clients": len(runs),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--datasets", nargs="+", default=["adult"], help="data sets for the local evaluation")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--clients", type=int, nargs="+", default=[50, 100, 250], help="n for the local evaluation")
    parser.add_argument("--vote-clients", type=int, nargs="+", default=[50, 100, 250],
                        help="n for the SecAgg+ voting round (250 is slow on 2 cores)")
    parser.add_argument("--candidates", default="table3", help="candidate spec (default table3: 100)")
    parser.add_argument("--epochs", type=int, default=None, help="local epochs (default: the paper's)")
    parser.add_argument("--measured-clients", type=int, default=1, help="clients measured per setting (default 1)")
    parser.add_argument("--vote-repetitions", type=int, default=1, help="voting rounds per n (paper: 5)")
    parser.add_argument("--secagg", choices=("secure", "paper"), default="secure",
                        help="SecAgg+ graph: secure (default; dphype.secure.secagg_params) or paper (shares 0.3 n, "
                             "all needed)")
    parser.add_argument("--dropout", type=float, default=0.0, help="tolerated dropout xi (default 0)")
    parser.add_argument("--release", nargs="+", choices=RELEASE_MODES.names(), default=["sum"],
                        help="release modes of the voting round: sum (SecAgg+, default) and/or argmax (the winner "
                             "only, 3 simulated tally nodes)")
    parser.add_argument("--skip-local", action="store_true", help="only the voting round")
    parser.add_argument("--skip-voting", action="store_true", help="only the local evaluation")


def secagg_arguments(clients: int, secagg: str, dropout: float) -> dict[str, Any]:
    """``num_shares`` and ``reconstruction_threshold`` for the voting round, with the graph's bounds
    (a third of the clients colluding with the server, :data:`dphype.secure.secagg_params.CORRUPT_FRACTION`)."""
    from dphype.secure import secagg_params as sp

    if secagg == "secure":  # the product's default: DPHype picks the graph itself (reported here as it will)
        from dphype.flower.server.secagg_server import secagg_graph
        from dphype.privacy.noise import min_survivors

        chosen = secagg_graph(clients, min_survivors(clients, dropout), None, None, sp.CORRUPT_FRACTION)
        passed, gamma = {}, chosen.corrupt_fraction
    else:  # Flower's fractions; the paper's graph is secure only against no colluding client at small n
        chosen = sp.bounds(clients, *sp.flower_graph(clients, sp.PAPER_NUM_SHARES, sp.PAPER_THRESHOLD),
                           dropout=dropout, corrupt_fraction=sp.CORRUPT_FRACTION)
        passed = {"num_shares": sp.PAPER_NUM_SHARES, "reconstruction_threshold": sp.PAPER_THRESHOLD}
        gamma = 0.0
    return {"num_shares": chosen.num_shares, "reconstruction_threshold": chosen.threshold, "arguments": passed,
            "corrupt_fraction": gamma, "log2_insecure": chosen.log2_insecure, "log2_failure": chosen.log2_failure}


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    from dphype.checks import MAX_CLIENTS
    from dphype.ml.torch_task import default_epochs

    candidates = harness.candidates_from_args(args)
    measured = harness.check_int("measured_clients", args.measured_clients, 1)
    vote_reps = harness.check_int("vote_repetitions", args.vote_repetitions, 1)
    for n in args.vote_clients:
        if not 2 <= n <= MAX_CLIENTS:
            raise ValueError(f"vote client count must be in [2, {MAX_CLIENTS}], got {n}")
    releases = list(dict.fromkeys(args.release))
    graphs = {n: secagg_arguments(n, args.secagg, args.dropout) for n in args.vote_clients}
    feds = [] if args.skip_local else [harness.Federation(d, n, None, args.seed, args.data_dir)
                                       for d in args.datasets for n in args.clients]
    harness.validate_federations(feds)
    rows: list[dict[str, Any]] = []
    stage_rows: list[dict[str, Any]] = []
    units = len(feds) + (0 if args.skip_voting else len(args.vote_clients) * vote_reps * len(releases))
    with harness.progress_bar(units, "resources") as bar:
        for fed in feds:
            epochs = default_epochs(fed.dataset) if args.epochs is None else harness.check_int("epochs", args.epochs, 1)
            m = local_evaluation(fed.dataset, fed.clients, seed=args.seed, epochs=epochs, candidates=candidates,
                                 measured=measured, data_dir=fed.data_dir)
            rows.append({"part": "local evaluation", "release": "", "dataset": fed.dataset, "clients": fed.clients,
                         "candidates": len(candidates), "epochs": epochs, "seconds": m["seconds"],
                         "memory_mb": m["memory_mb"], "memory_kind": m["memory_kind"], "rows_per_client": m["rows"],
                         "upload_kb": "", "download_kb": "", "tally_upload_kb": "", "tally_download_kb": "",
                         "simulation_seconds": "", "peak_memory_mb": "", "num_shares": "",
                         "reconstruction_threshold": ""})
            bar.update(1)
        if not args.skip_voting:
            from dphype.config import DPHypeConfig
            from simulations.flower import vote_through_flower

            for n in args.vote_clients:
                for rep in range(vote_reps):
                    scores = np.random.default_rng([args.seed, n, rep]).random((n, len(candidates)))
                    for release in releases:  # both modes on the same scores
                        secagg = not release_mode(release).uses_committee
                        graph = graphs[n] if secagg else None  # the committee's modes run no SecAgg+
                        secagg = {} if graph is None else {"corrupt_fraction": graph["corrupt_fraction"],
                                                           **graph["arguments"]}
                        config = DPHypeConfig(epsilon=1.0, delta=1e-5, k=5, clients=n, dropout=args.dropout,
                                              release=release)
                        v = vote_through_flower(scores, candidates, config, count_bytes=True, **secagg)
                        stage_rows += [{"release": release, "clients": n, "repetition": rep,
                                        **{k: (round(x, 3) if isinstance(x, float) else x) for k, x in st.items()}}
                                       for st in v["stages"]]
                        rows.append({
                            "part": "voting round", "release": release, "dataset": "", "clients": n,
                            "candidates": len(candidates), "epochs": "", "seconds": v["round_seconds"],
                            "memory_mb": "", "memory_kind": "", "rows_per_client": "",
                            "upload_kb": v["upload_bytes_per_client"] / 1000,
                            "download_kb": v["download_bytes_per_client"] / 1000,
                            "tally_upload_kb": "" if graph is not None else v["upload_bytes_per_tally"] / 1000,
                            "tally_download_kb": "" if graph is not None else v["download_bytes_per_tally"] / 1000,
                            "simulation_seconds": v["simulation_seconds"], "peak_memory_mb": v["peak_memory_mb"],
                            "num_shares": "" if graph is None else graph["num_shares"],
                            "reconstruction_threshold": "" if graph is None else graph["reconstruction_threshold"]})
                        bar.update(1)
    study.write_csv("resources.csv", rows)
    if stage_rows:
        study.write_csv("resources_stages.csv", stage_rows)
        target = study.path("resources_stages.txt")
        target.write_text(stage_table(stage_rows) + "\n")
        study.outputs.append(str(target))
    table = summarize(rows)
    plot(table, study)
    exponents = {release: time_exponent([t for t in table if t["release"] == release]) for release in releases}
    if any(e is not None for e in exponents.values()):
        plot_scaling(table, exponents, study)
    return study.result(table=table, stages=stage_rows, candidates=len(candidates), secagg=args.secagg,
                        dropout=args.dropout, releases=releases, time_exponent=exponents)


STAGE_COLUMNS = ("wall_s", "server_cpu_s", "clients_cpu_s", "ray_cpu_s", "idle_estimate_s")


def stage_table(rows: Sequence[dict[str, Any]]) -> str:
    """The voting rounds stage by stage as plain text, each run followed by its totals."""
    lines = [" | ".join(["release", "n", "rep", "stage", *STAGE_COLUMNS])]
    for key in dict.fromkeys((r["release"], r["clients"], r["repetition"]) for r in rows):
        run = [r for r in rows if (r["release"], r["clients"], r["repetition"]) == key]
        for r in [*run, {"stage": "total", **{c: sum(x[c] for x in run) for c in STAGE_COLUMNS}}]:
            lines.append(" | ".join([*map(str, key), r["stage"], *(f"{r[c]:.2f}" for c in STAGE_COLUMNS)]))
    return "\n".join(lines)


def time_exponent(table: Sequence[dict[str, Any]]) -> float | None:
    """Least-squares slope of log(round seconds) against log(n) over the voting rounds of ``table`` (one release
    mode's; None below 2 sizes)."""
    vote = [t for t in table if t["part"] == "voting round"]
    if len({t["clients"] for t in vote}) < 2:
        return None
    slope, _ = np.polyfit(np.log([t["clients"] for t in vote]), np.log([t["seconds"] for t in vote]), 1)
    return round(float(slope), 3)


def plot_scaling(table: Sequence[dict[str, Any]], exponents: dict[str, float | None],
                 study: harness.StudyRun) -> None:
    """Voting-round and simulation seconds against n on log-log axes, with the fitted power law, per release mode
    with an exponent."""
    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 3.0))
    for release, exponent in exponents.items():
        if exponent is None:
            continue
        vote = sorted((t for t in table if t["part"] == "voting round" and t["release"] == release),
                      key=lambda t: t["clients"])
        n = np.array([t["clients"] for t in vote], dtype=float)
        seconds = np.array([t["seconds"] for t in vote])
        line = ax.loglog(n, seconds, "o-", label=f"{release}: voting round (ServerApp)")[0]
        ax.loglog(n, [t["simulation_seconds"] for t in vote], "s--", color=line.get_color(),
                  label=f"{release}: whole simulation (Ray)")
        scale = np.exp(np.mean(np.log(seconds) - exponent * np.log(n)))
        ax.loglog(n, scale * n**exponent, ":", color="gray", label=f"{release} fit: time ~ n^{exponent:.2f}")
    ax.set_xlabel("clients n")
    ax.set_ylabel("seconds")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    study.save_figure(fig, "resources_scaling.png")


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table IV: means per (part, release mode, data set, n)."""
    out = []
    for key in dict.fromkeys((r["part"], r["release"], r["dataset"], r["clients"]) for r in rows):
        sel = [r for r in rows if (r["part"], r["release"], r["dataset"], r["clients"]) == key]
        entry: dict[str, Any] = {"part": key[0], "release": key[1], "dataset": key[2], "clients": key[3],
                                 "runs": len(sel), "seconds": round(float(np.mean([r["seconds"] for r in sel])), 3)}
        if key[0] == "local evaluation":
            entry["memory_mb"] = round(float(np.mean([r["memory_mb"] for r in sel])), 2)
            entry["memory_kind"] = sel[0]["memory_kind"]
        else:
            for key in ("upload_kb", "download_kb", "tally_upload_kb", "tally_download_kb", "simulation_seconds",
                        "peak_memory_mb"):
                if sel[0][key] != "":  # the tallies' columns in argmax mode only
                    entry[key] = round(float(np.mean([r[key] for r in sel])), 2)
            entry["num_shares"] = sel[0]["num_shares"]
            entry["reconstruction_threshold"] = sel[0]["reconstruction_threshold"]
        out.append(entry)
    return out


def plot(table: Sequence[dict[str, Any]], study: harness.StudyRun) -> None:
    """Table IV as bars: local evaluation seconds/memory per n, voting round KB and seconds per n."""
    plt = harness.pyplot()
    local = [t for t in table if t["part"] == "local evaluation"]
    vote = [t for t in table if t["part"] == "voting round"]
    panels = ([("local eval. time [s]", local, "seconds"), ("local eval. memory [MB]", local, "memory_mb")] if local
              else []) + ([("voting upload/download [KB]", vote, None), ("voting round [s]", vote, "seconds")]
                          if vote else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 2.7), squeeze=False)
    for ax, (title, data, key) in zip(axes[0], panels):
        labels = [" ".join(filter(None, (t.get("release"), t["dataset"], f"n={t['clients']}"))) for t in data]
        xs = np.arange(len(data))
        if key is None:
            ax.bar(xs - 0.2, [t["upload_kb"] for t in data], 0.4, label="upload")
            ax.bar(xs + 0.2, [t["download_kb"] for t in data], 0.4, label="download")
            ax.legend(fontsize=7)
        else:
            ax.bar(xs, [t[key] for t in data])
        ax.set_xticks(xs, labels, rotation=30, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("Table IV: resources of DP-Hype", fontsize=9, y=1.03)
    study.save_figure(fig, "resources.png")
