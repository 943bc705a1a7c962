"""The private evaluation of the final model, driven from the server: a pre-flight, one SecAgg+ round, the means.

`PrivateEvaluation` is built before the selection (so a bad setting is refused before any client works: the share,
the calibration, the secure sum's range and graph) and run after the final training with ``start``:

1. every voter gets the `dphype.node.evaluation_policy.EvaluationRequest` and the model (``query.dphype_evaluation``,
   with the SecAgg+ round's first stage); each checks it against its own policy and budget, evaluates the model on its
   held-out rows and answers ready (`dphype.flower.client.evaluation_client`);
2. one SecAgg+ round (`dphype.flower.server.secagg_server.run_secure_sum`, message type
   `dphype.flower.wire.EVALUATION_TYPE`) releases the noisy sums, unmasked only if at least ``ceil((1 - xi) n)``
   clients contributed;
3. the means and their noise (`dphype.privacy.evaluation.release_evaluation`), composed with the selection (and the
   DP training, when its accountant is given) in RDP, on the result (`dphype.result.DPHypeResult.evaluation`).

Too few ready or contributing clients release nothing (`dphype.flower.server.readiness.PreflightError`,
`dphype.secure.secure_sum.SecureSumError`). The evaluation always runs over SecAgg+ among the voters, also after a
committee selection (``release="argmax"``): the values are a sum, which SecAgg+ releases exactly.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common import log
from flwr.serverapp.grid import Grid

from dphype.config import DPHypeConfig
from dphype.flower.final_training import RunAccountant
from dphype.flower.grid import check_timeout, send_and_receive
from dphype.flower.server.readiness import ready_nodes, wait_for_nodes
from dphype.flower.server.secagg_server import advertise_record, run_secure_sum, secagg_graph
from dphype.flower.wire import EVALUATION_PREFLIGHT_TYPE, EVALUATION_TYPE, MODEL_KEY, RECORD_KEY, STAGE_KEY
from dphype.node.evaluation_policy import EvaluationRequest, make_evaluation_request, model_digest
from dphype.privacy.evaluation import (
    DEFAULT_EVALUATION_SHARE,
    EVALUATION_RELEASE,
    EVALUATION_VALUES,
    EvaluationResult,
    evaluation_rdp,
    evaluation_scale,
    release_evaluation,
)
from dphype.privacy.noise import min_survivors
from dphype.result import DPHypeResult
from dphype.secure.secagg import Advertised
from dphype.secure.secagg_params import CORRUPT_FRACTION, check_corrupt_fraction
from dphype.secure.secure_sum import check_range

#: A released mean noisier than this says little about a model (its 2-std interval spans most of [0, 1]): the
#: server warns before the selection starts.
INFORMATIVE_STD = 0.1


class PrivateEvaluation:
    """The private evaluation of the final model with ``share`` of ``config.epsilon``, checked on construction.

    Args:
        config: The selection's configuration (its clients, dropout, delta, noise, accountant and relation).
        share: The evaluation's share of ``config.epsilon``, spent on top of the selection, in ``(0, 1]``
            (`dphype.privacy.evaluation.DEFAULT_EVALUATION_SHARE`).
        num_shares: SecAgg+ parameter, as for `dphype.flower.DPHype` (``None``: the secure graph).
        reconstruction_threshold: SecAgg+ parameter, as for `dphype.flower.DPHype`.
        corrupt_fraction: Fraction of the clients assumed to collude with the server.

    Raises:
        ValueError: If ``share`` is out of ``(0, 1]``, the noise cannot be calibrated, its shares could leave the
            secure sum's range, or no SecAgg+ round can sum ``config.clients`` with its dropout.
    """

    def __init__(self, config: DPHypeConfig, *, share: float = DEFAULT_EVALUATION_SHARE,
                 num_shares: float | None = None, reconstruction_threshold: float | None = None,
                 corrupt_fraction: float = CORRUPT_FRACTION) -> None:
        if not isinstance(config, DPHypeConfig):
            raise ValueError(f"config must be a DPHypeConfig, got {type(config).__name__}")
        self.config = config
        self._template = make_evaluation_request(config, share, "0" * 64)  # share and calibration checked
        self.num_shares = num_shares
        self.reconstruction_threshold = reconstruction_threshold
        self.corrupt_fraction = check_corrupt_fraction(corrupt_fraction)
        check_range(size=len(EVALUATION_VALUES), sigma=self.sigma, clients=config.clients, dropout=config.dropout,
                    noise=config.noise, largest_value=evaluation_scale(config.noise))
        try:
            secagg_graph(config.clients, self._template.min_survivors, num_shares, reconstruction_threshold,
                         self.corrupt_fraction)
        except ValueError as err:
            raise ValueError(f"no SecAgg+ round can sum the evaluation of clients={config.clients} with "
                             f"dropout={config.dropout:g}: {err}") from None
        if self.noise_std > INFORMATIVE_STD:
            log(logging.WARNING, "DP-Hype: the private evaluation's means will carry noise of std %.3g at %d clients "
                "(evaluation share %g of epsilon %g): too noisy to tell a good model from a bad one; raise the share, "
                "or run with more clients", self.noise_std, config.clients, self.share, config.epsilon)

    @property
    def share(self) -> float:
        """The evaluation's share of ``config.epsilon``."""
        return self._template.share

    @property
    def epsilon(self) -> float:
        """The evaluation's epsilon: ``share * config.epsilon``."""
        return self._template.epsilon

    @property
    def sigma(self) -> float:
        """The calibrated total noise std, in grid units (`dphype.privacy.evaluation.evaluation_scale`)."""
        return self._template.sigma

    @property
    def noise_std(self) -> float:
        """Each released mean's noise std when exactly ``ceil((1 - xi) n)`` clients contribute (the largest)."""
        fewest = min_survivors(self.config.clients, self.config.dropout)
        return self.sigma / (evaluation_scale(self.config.noise) * fewest)

    def __repr__(self) -> str:
        return (f"PrivateEvaluation(share={self.share:g}, epsilon={self.epsilon:.4g}, clients={self.config.clients}, "
                f"noise std {self.noise_std:.3g})")

    def request(self, arrays: ArrayRecord) -> EvaluationRequest:
        """The request that names the model in ``arrays``."""
        return dataclasses.replace(self._template, model=model_digest(arrays.to_numpy_ndarrays()))

    def start(self, grid: Grid, arrays: ArrayRecord, result: DPHypeResult, *, accountant: RunAccountant | None = None,
              timeout: float | None = 3600.0, connect_timeout: float | None = 600.0) -> DPHypeResult:
        """Evaluate the model in ``arrays`` privately on the voters of ``grid``; ``result`` with its `evaluation`.

        Args:
            grid: The voters' grid (`dphype.flower.Committee.voters` after a committee selection).
            arrays: The final model.
            result: The selection's result (its privacy report starts the composition).
            accountant: The private training's `dphype.flower.final_training.RunAccountant`: the evaluation is
                composed into it, and the result's ``run_epsilon`` is the whole run's; ``None``: the training was not
                private, so no guarantee covers the run (``run_epsilon`` is ``None``).
            timeout: Seconds for the pre-flight (which includes the clients' evaluation) and each SecAgg+ stage.
            connect_timeout: Seconds to wait for ``config.clients`` nodes.

        Returns:
            ``result`` with ``evaluation`` set (`dphype.privacy.evaluation.EvaluationResult`).

        Raises:
            ValueError: If a timeout is invalid.
            dphype.flower.server.readiness.PreflightError: When too few clients are ready (nothing released).
            dphype.secure.secure_sum.SecureSumError: When too few clients contribute to the sum (nothing released).
        """  # noqa: DOC502, DOC503
        timeout = check_timeout("timeout", timeout)
        connect_timeout = check_timeout("connect_timeout", connect_timeout)
        cfg = self.config
        request = self.request(arrays)
        nodes = wait_for_nodes(grid, cfg.clients, connect_timeout)
        round_id, advertise = advertise_record(request.digest())
        ready = self._preflight(grid, request, arrays, nodes, timeout, advertise)
        summed = run_secure_sum(
            grid, list(ready), request.digest(), size=len(EVALUATION_VALUES), noise=cfg.noise,
            min_survivors=request.min_survivors, num_shares=self.num_shares,
            reconstruction_threshold=self.reconstruction_threshold, corrupt_fraction=self.corrupt_fraction,
            timeout=timeout, advertised=Advertised(round_id, ready), message_type=EVALUATION_TYPE)
        released = release_evaluation(summed.total, summed.survivors, sigma=self.sigma, clients=cfg.clients,
                                      dropout=cfg.dropout, noise=cfg.noise, delta=cfg.delta,
                                      accountant=cfg.accountant, neighbouring=cfg.neighbouring, share=self.share)
        released = compose_evaluation(released, result, accountant)
        log(logging.INFO, "DP-Hype %s", released.describe())
        verdict = released.verdict()
        if verdict is not None:
            log(logging.WARNING, "DP-Hype: %s", verdict)
        return dataclasses.replace(result, evaluation=released)

    def _preflight(self, grid: Grid, request: EvaluationRequest, arrays: ArrayRecord, nodes: list[int],
                   timeout: float | None, advertise: ConfigRecord) -> dict[int, dict[str, Any]]:
        """Send the request, the model and the first stage; the ready nodes' answers, or `PreflightError`."""
        content = RecordDict({RECORD_KEY: ConfigRecord(request.to_record()), MODEL_KEY: arrays, STAGE_KEY: advertise})
        messages = [Message(content, dst_node_id=node, message_type=EVALUATION_PREFLIGHT_TYPE) for node in nodes]
        replies = send_and_receive(grid, messages, timeout=timeout, what="DP-Hype private evaluation pre-flight")
        return ready_nodes(replies, nodes, fewest=request.min_survivors, what="private evaluation pre-flight",
                           refused="; nothing was sent and nothing was released")


def compose_evaluation(released: EvaluationResult, result: DPHypeResult,
                       accountant: RunAccountant | None) -> EvaluationResult:
    """``released`` composed with the selection, and with the whole run when the training's ``accountant`` is given.

    Args:
        released: The evaluation's release (its ``sigma`` is the noise the contributors added).
        result: The selection's result.
        accountant: The private training's accountant (the evaluation is composed into it), or ``None``.

    Returns:
        ``released`` with ``composed_epsilon`` and ``run_epsilon`` set, at the selection's delta.
    """
    curve = evaluation_rdp(released.sigma, released.noise)
    report = result.report
    selection = RunAccountant(report, population=report.clients, max_epsilon=None)
    selection.compose_release(EVALUATION_RELEASE, curve)
    run = None
    if accountant is not None:
        accountant.compose_release(EVALUATION_RELEASE, curve)
        run = accountant.get_epsilon(report.delta)
    return dataclasses.replace(released, composed_epsilon=selection.get_epsilon(report.delta), run_epsilon=run)
