"""The paper's release (``"sum"``): the noisy vote sum over SecAgg+, picked by the selection rule."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from dphype.privacy.accounting import privacy_report
from dphype.privacy.noise import check_survivors, client_noise_share, client_noise_std, replay_noisy_sums
from dphype.privacy.noise_kinds import noise_kind
from dphype.release.base import (
    Aggregator,
    NodeCost,
    ReleaseConfig,
    ReleaseMode,
    ReleaseRequest,
    noisy_sum_of,
    rule_result,
    vote_cost,
    vote_event,
    vote_sum_words,
)
from dphype.result import DPHypeResult
from dphype.secure.secure_sum import check_range, encode
from dphype.selection.candidates import CandidateList
from dphype.selection.planner import Forecast


class SumRelease(ReleaseMode[np.ndarray, np.ndarray]):
    """The paper's release: the noisy vote sum over SecAgg+, then the configured selection rule.

    ``sigma`` is the TOTAL noise std on the released sum; each client adds a share of variance
    ``sigma^2 / ((1 - xi) n)`` (`dphype.privacy.noise.client_noise_variance`). Everything after the sum is
    post-processing.
    """

    name = "sum"
    released = "the noisy vote sum over SecAgg+, picked by the selection rule"
    aggregator = Aggregator.SECAGG
    forecast = Forecast.NOISY_SUM

    def calibrate(self, config: ReleaseConfig, candidates: CandidateList) -> float:
        """Solve ``sigma``; refuse one whose shares secure summation could clip (`check_range`)."""
        sigma = super().calibrate(config, candidates)
        check_range(size=len(candidates), sigma=sigma, clients=config.clients, dropout=config.dropout,
                    noise=config.noise)
        return sigma

    def node_cost(self, request: ReleaseRequest, *, survivors: int, delta: float, accountant: str,
                  neighbouring: str) -> NodeCost:
        """``survivors`` shares of variance ``sigma^2 / ((1 - xi) n)`` (Appendix A), accounted the node's way."""
        cfg = request.config
        total_std = client_noise_std(request.sigma, cfg.clients, cfg.dropout) * math.sqrt(survivors)
        return vote_cost(request, total_std, delta=delta, accountant=accountant, neighbouring=neighbouring)

    def ballot(self, request: ReleaseRequest, scores: np.ndarray, *, maximize: bool,
               clipping_range: int | None = None, voter: str | None = None) -> np.ndarray:
        """Top-k votes plus this client's noise share, encoded for exact secure summation (lines 5-10).

        Values beyond the round's ``clipping_range`` are refused, never clipped; ``voter`` does not apply.

        Args:
            request: The approved request.
            scores: The client's scores, ``(p,)`` or ``(p, j)``.
            maximize: Whether a higher score is better.
            clipping_range: The SecAgg+ round's range.
            voter: Unused.

        Returns:
            The encoded vector, ``(p,)``.

        Raises:
            ValueError: Without a ``clipping_range``, or for a value beyond it.
        """
        if clipping_range is None:
            raise ValueError("clipping_range must be the SecAgg+ round's (dphype.secure.secure_sum.clipping_range_for)")
        cfg = request.config
        votes = self.resolved_ballot(cfg, len(request.candidates)).cast(scores, cfg.k, maximize=maximize)
        share = client_noise_share(votes.size, sigma=request.sigma, clients=cfg.clients, dropout=cfg.dropout,
                                   kind=cfg.noise)
        return encode(votes + share, cfg.noise, clipping_range)

    def release(self, request: ReleaseRequest, opened: np.ndarray, survivors: int) -> DPHypeResult:
        """The configured rule on the decoded noisy sum (line 12), with the report of the noise actually summed."""
        cfg = request.config
        survivors = check_survivors(survivors, cfg.clients, request.min_survivors)
        total = noisy_sum_of(request, opened)
        report = privacy_report(vote_event(request), cfg.delta, clients=cfg.clients, dropout=cfg.dropout,
                                survivors=survivors, accountant=cfg.accountant)
        kind = noise_kind(cfg.noise)
        if not kind.integer:
            report = replace(
                report, released=f"{report.released}; {kind.label} shares rounded to a 1/{kind.fixed_point_scale} "
                "grid before summation, so the guarantee is approximate")
        return rule_result(request, total, report, report.sigma, survivors)

    def replay(self, request: ReleaseRequest, vote_sum: np.ndarray, *, repetitions: int, rng: np.random.Generator,
               survivors: int | None = None, per_client: bool = False) -> np.ndarray:
        """Noisy sums, float64 ``(repetitions, p)`` (`dphype.privacy.noise.replay_noisy_sums`)."""
        cfg = request.config
        return replay_noisy_sums(vote_sum, sigma=request.sigma, clients=cfg.clients, repetitions=repetitions, rng=rng,
                                 dropout=cfg.dropout, noise=cfg.noise, survivors=survivors, per_client=per_client)

    def describe(self, request: ReleaseRequest) -> str:
        """The sum release's parameters: delta, k, clients, dropout, noise and rule."""
        return vote_sum_words(request)
