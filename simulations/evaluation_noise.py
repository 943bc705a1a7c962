"""The private evaluation's price and accuracy: its epsilon, the run's composed epsilon and each released mean's noise.

For every ``--clients`` n and ``--shares`` share of ``--epsilon`` (the selection's, a top-``--k`` sum release with the
library's default noise and relation): the evaluation's epsilon, the selection and the evaluation composed in RDP
(`dphype.flower.private_evaluation.compose_evaluation`), and the std of each released mean (accuracy, majority baseline)
when all n contribute (`dphype.privacy.evaluation.evaluation_noise_std`). With ``--measure R`` the real handlers run
R evaluations in process (`dphype.flower.local.LocalGrid`: every client reports accuracy 0.8 and baseline 0.6) and
the released accuracies' sample std is set beside the predicted one. ``load`` is the 1-minute load average at the
start.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from typing import Any

import numpy as np

from simulations import harness


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 50], help="n values (default 20 50)")
    parser.add_argument("--shares", type=float, nargs="+", default=[0.1, 0.25, 0.5, 1.0],
                        help="shares of epsilon for the evaluation (default 0.1 0.25 0.5 1)")
    parser.add_argument("--epsilon", type=float, default=1.0, help="the selection's epsilon (default 1)")
    parser.add_argument("--k", type=int, default=5, help="the selection's top-k (default 5)")
    parser.add_argument("--measure", type=int, default=0,
                        help="evaluations to run in process per cell at the default share (default 0: none)")


def run(args: argparse.Namespace, study: harness.StudyRun) -> dict[str, Any]:
    from dphype.config import DPHypeConfig
    from dphype.flower.private_evaluation import compose_evaluation
    from dphype.privacy.accounting import calibrate, privacy_report
    from dphype.privacy.evaluation import (
        DEFAULT_EVALUATION_SHARE,
        calibrate_evaluation,
        check_share,
        evaluation_noise_std,
        evaluation_scale,
        release_evaluation,
    )
    from dphype.result import DPHypeResult
    from dphype.selection.candidates import candidate_grid

    clients = [harness.check_int("clients", n, 2) for n in args.clients]
    shares = [check_share(s, "--shares") for s in args.shares]
    measure = harness.check_int("measure", args.measure, 0)
    load = os.getloadavg()[0]
    rows = []
    for n in clients:
        config = DPHypeConfig(args.epsilon, 1e-5, args.k, n)
        release = calibrate(config.epsilon, config.delta, config.k, noise=config.noise, accountant=config.accountant,
                            neighbouring=config.neighbouring)
        report = privacy_report(release, config.delta, clients=n, dropout=0.0, survivors=n,
                                accountant=config.accountant)
        result = DPHypeResult(selected_index=0, selected={"a": 0}, noisy_sum=None, report=report, selection=None,
                              candidates=candidate_grid(a=[0]))
        for share in shares:
            std = evaluation_noise_std(share * config.epsilon, config.delta, n, noise=config.noise,
                                       accountant=config.accountant)
            sigma = calibrate_evaluation(share * config.epsilon, config.delta, noise=config.noise,
                                         accountant=config.accountant)
            scale = evaluation_scale(config.noise)
            released = release_evaluation([0.8 * scale * n, 0.6 * scale * n], n, sigma=sigma, clients=n, dropout=0.0,
                                          noise=config.noise, delta=config.delta, accountant=config.accountant,
                                          neighbouring=config.neighbouring, share=share)
            composed = compose_evaluation(released, result, None).composed_epsilon
            row: dict[str, Any] = {"clients": n, "share": share, "evaluation epsilon": share * config.epsilon,
                                   "selection + evaluation epsilon": round(float(composed or math.nan), 4),
                                   "noise std of each mean": round(std, 4)}
            if measure and share == DEFAULT_EVALUATION_SHARE:
                row["measured std"] = round(_measured(config, share, measure), 4)
            rows.append(row)
    study.write_csv("evaluation_noise.csv", rows)
    return study.result(load_average=load, epsilon=args.epsilon, k=args.k, rows=rows)


def _measured(config: Any, share: float, repetitions: int) -> float:
    """The sample std of ``repetitions`` released accuracies through the real handlers under LocalGrid."""
    from flwr.app import ArrayRecord
    from flwr.clientapp import ClientApp

    from dphype.flower import PrivateEvaluation, register_private_evaluation
    from dphype.flower.local import LocalGrid
    from dphype.privacy.accounting import calibrate, privacy_report
    from dphype.result import DPHypeResult
    from dphype.selection.candidates import candidate_grid

    app = ClientApp()
    register_private_evaluation(app, lambda context, arrays: (0.8, 0.6))
    release = calibrate(config.epsilon, config.delta, config.k, noise=config.noise)
    report = privacy_report(release, config.delta, clients=config.clients, dropout=0.0, survivors=config.clients)
    result = DPHypeResult(selected_index=0, selected={"a": 0}, noisy_sum=None, report=report, selection=None,
                          candidates=candidate_grid(a=[0]))
    evaluation = PrivateEvaluation(config, share=share)
    accuracies = []
    with tempfile.TemporaryDirectory() as home:  # the simulated nodes' ledgers, gone with the study
        for run_id in range(1, repetitions + 1):
            grid = LocalGrid(app, config.clients, run_id=run_id,
                             node_config={"dphype-ledger": f"{home}/ledger.json", "dphype-lifetime-epsilon": 1e6})
            out = evaluation.start(grid, ArrayRecord([np.zeros(1)]), result).evaluation
            assert out is not None
            accuracies.append(out.accuracy)
    return float(np.std(accuracies, ddof=1))
