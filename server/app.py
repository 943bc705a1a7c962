"""The dphype ServerApp: DP-Hype selection over SecAgg+, then FedAvg with the winner.

One ``flwr run`` (or simulation) does both phases in a single ServerApp run:

1. :func:`dphype.strategy.run_dphype` -- every client votes on the public
   candidate list; one SecAgg+ round releases only the noisy vote sum; the argmax
   is selected with a privacy report;
2. :func:`server.fedavg.run_fedavg` -- FedAvg for ``fedavg-rounds`` rounds with
   the selected hyperparameters, evaluated on the held-out test split.

The summary (selection, privacy report, test accuracy, timings) is logged as one
JSON line prefixed ``DPHYPE_RESULT``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

from flwr.app import Context
from flwr.common import log
from flwr.serverapp import ServerApp
from flwr.serverapp.grid import Grid

from dphype.candidates import load_candidates
from dphype.strategy import run_dphype
from server.config import AppConfig
from server.fedavg import run_fedavg

#: Prefix of the log line that carries the run summary as JSON.
RESULT_PREFIX = "DPHYPE_RESULT "


def run_app(grid: Grid, context: Context, cfg: AppConfig) -> dict[str, Any]:
    """DP-Hype selection then FedAvg; returns the run summary."""
    from dphype.task import load_cached

    candidates = load_candidates(cfg.candidates)
    start = time.perf_counter()
    result = run_dphype(
        grid,
        context,
        candidates,
        **cfg.vote_parameters(),
        timeout=cfg.round_timeout,
        connect_timeout=cfg.connect_timeout,
    )
    selected_at = time.perf_counter()
    log(logging.INFO, "DP-Hype selected candidate %d: %s", result.selected_index, result.selected)
    test = load_cached(cfg.dataset)[1]
    accuracy = run_fedavg(
        grid,
        context,
        dataset=cfg.dataset,
        test=test,
        candidate=result.selected,
        # Clients that dropped out of the vote are not waited for (all that are
        # still connected are sampled).
        clients=result.report.survivors,
        rounds=cfg.fedavg_rounds,
        local_epochs=cfg.local_epochs,
        seed=cfg.seed,
        round_timeout=cfg.round_timeout,
    )
    summary = result.to_dict()
    summary.update(
        epsilon=cfg.epsilon,
        delta=cfg.delta,
        k=cfg.k,
        clients=cfg.clients,
        num_candidates=len(candidates),
        accuracy=accuracy,
        selection_seconds=selected_at - start,
        fedavg_seconds=time.perf_counter() - selected_at,
    )
    return summary


def build_server_app(
    config: AppConfig | None = None,
    *,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> ServerApp:
    """The ServerApp; ``config=None`` reads the run config (``flwr run``).

    ``on_result`` receives the summary (used by ``dphype demo`` to return it).
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        cfg = config if config is not None else AppConfig.from_run_config(context.run_config)
        summary = run_app(grid, context, cfg)
        log(logging.INFO, "%s%s", RESULT_PREFIX, json.dumps(summary, sort_keys=True))
        if on_result is not None:
            on_result(summary)

    return app


app = build_server_app()
