"""The winner release (``"argmax"``): only the winner's index, a secure argmax among the tally committee."""

from __future__ import annotations

import math

import numpy as np

from dphype.checks import check_k
from dphype.privacy.winner import (
    THRESHOLD_SHIFT,
    WINNER_NOISE,
    JointSampler,
    WinnerEvent,
    noise_parameter,
    noise_std,
    replay_winners,
    sampler_delta,
    winner_report,
)
from dphype.release.base import NodeCost, ReleaseConfig, ReleaseRequest
from dphype.release.committee_mode import CommitteeMode
from dphype.result import DPHypeResult
from dphype.secure.committee import OPENS_ARGMAX, Opening
from dphype.selection.candidates import CandidateList
from dphype.selection.planner import Forecast

#: The argmax release's ballot unless the configuration names one (docs/ballots.md).
DEFAULT_ARGMAX_BALLOT = "auto"


class ArgmaxRelease(CommitteeMode[Opening | int]):
    """Only the winner's index: report-noisy-max over the verified ballots with committee-made discrete Laplace noise.

    A tally committee computes it under MPC (`dphype.privacy.winner`, `dphype.secure.committee`): it checks each ballot
    against the request's form, leaves out the invalid ones (naming their contributors), samples the noise jointly (no
    tally knows any of it) and opens only the argmax.

    ``(epsilon, sampler_delta)``-DP (pure ``epsilon`` for exact noise; the MPC sampler is within total variation
    ``2^-64`` of it) with noise independent of ``k``, the clients, the dropout and the committee's size; ``sigma`` is
    the discrete Laplace std that ``epsilon`` and the ballot's largest entry imply (`dphype.privacy.winner.noise_std`).
    ``delta``, ``noise`` and ``accountant`` concern only composition with other releases; the selection rule does not
    apply. Graded ballots are allowed: the noise depends on their largest entry only.
    """

    name = "argmax"
    released = "only the winner's index, a secure argmax among the tally committee with noise sampled in the MPC"
    forecast = Forecast.WINNER
    opens = OPENS_ARGMAX
    default_ballot = DEFAULT_ARGMAX_BALLOT
    graded_ballots = True

    def calibrate(self, config: ReleaseConfig, candidates: CandidateList) -> float:
        """The discrete Laplace std that ``epsilon`` and the ballot imply (`dphype.privacy.winner.noise_std`)."""
        return noise_std(config.epsilon, config.neighbouring, self.sensitivity(config))

    def check_sigma(self, request: ReleaseRequest) -> None:
        """Refuse a ``sigma`` other than ``epsilon`` implies, a ``k`` outside ``[1, p]`` or a too small epsilon."""
        cfg = request.config
        expected = noise_std(cfg.epsilon, cfg.neighbouring, self.sensitivity(cfg))
        if not abs(request.sigma - expected) <= 1e-9 * expected:
            raise ValueError(f"sigma must be {expected:.12g} (the discrete Laplace std of epsilon and the ballot), "
                             f"got {request.sigma!r}")
        check_k(cfg.k, len(request.candidates))  # the configured k, whether or not the ballot votes with it
        _ = self.accounting(request)  # validates the ballot's k against the number of candidates
        _ = self.tally_noise(request)  # an epsilon too small for the committee's sampler, before any client works

    def accounting(self, request: ReleaseRequest) -> WinnerEvent:
        """The winner release the request describes."""
        cfg = request.config
        return WinnerEvent(epsilon=cfg.epsilon, k=self.votes_per_client(cfg, len(request.candidates)),
                             num_candidates=len(request.candidates),
                             neighbouring=cfg.neighbouring, sensitivity=self.sensitivity(cfg))

    def check_claims(self, request: ReleaseRequest) -> None:
        """Nothing to recompute: each tally derives the sampler from the announced epsilon and ballot."""

    def announced_epsilon(self, request: ReleaseRequest) -> None:
        """``None``: the node's own relation decides the cost (`node_cost`)."""
        return None

    def node_cost(self, request: ReleaseRequest, *, survivors: int, delta: float, accountant: str,
                  neighbouring: str) -> NodeCost:
        """``epsilon_node = -shift G log t`` under the node's relation (`THRESHOLD_SHIFT`; ``G`` the ballot's).

        Independent of the node's delta and accountant and of the contributors: the noise is one discrete Laplace per
        count sampled in the MPC (its sampler's delta is added where the ledger composes,
        `dphype.privacy.winner.epsilon_with_samplers`); ``total_std`` is the request's ``sigma``.

        Args:
            request: The request.
            survivors: Unused.
            delta: Unused.
            accountant: Unused.
            neighbouring: The node's neighbouring relation.

        Returns:
            The cost.
        """
        cfg = request.config
        parties, g = len(request.tallies), self.sensitivity(cfg)
        eps = -THRESHOLD_SHIFT[neighbouring] * g * math.log(noise_parameter(cfg.epsilon, cfg.neighbouring, g))
        return NodeCost(noise=WINNER_NOISE, total_std=request.sigma, epsilon=eps,
                        accountant="report-noisy-max, MPC-sampled",
                        claim=f"the requested winner release gives epsilon {eps:.3g} with delta "
                              f"{sampler_delta(eps):.2g} (noise sampled jointly by the {parties} tallies)")

    def tally_noise(self, request: ReleaseRequest) -> JointSampler:
        """The committee's discrete Laplace sampler, the same at every tally."""
        cfg = request.config
        return JointSampler.for_release(len(request.candidates), cfg.epsilon, cfg.neighbouring, self.sensitivity(cfg))

    def release(self, request: ReleaseRequest, opened: Opening | int, survivors: int) -> DPHypeResult:
        """The server's record of the index the tallies opened, and of the ballots they left out.

        Args:
            request: The request.
            opened: The index and the contributors whose ballots were invalid, or the index alone (a `replay`'s).
            survivors: The number of contributors whose ballots reached the tallies (valid or not).

        Returns:
            The result with the winner and the privacy report, no noisy sum or selection.

        Raises:
            ValueError: For an index outside the candidate list (or a vector), or fewer valid ballots than the minimum.
        """
        cfg = request.config
        opened = opened if isinstance(opened, Opening) else Opening(int(opened))
        index = opened.value
        if not isinstance(index, int):
            raise ValueError("the argmax release opens an index, not a vector")
        report = winner_report(self.accounting(request), cfg.delta, clients=cfg.clients, dropout=cfg.dropout,
                               survivors=survivors - len(opened.excluded) - len(opened.unattributed),
                               committee=len(request.tallies), excluded=opened.excluded,
                               unattributed=opened.unattributed)
        if not 0 <= index < len(request.candidates):
            raise ValueError(f"index must be in [0, {len(request.candidates) - 1}], got {index}")
        return DPHypeResult(selected_index=index, selected=request.candidates[index],
                            noisy_sum=None, report=report, selection=None, candidates=request.candidates)

    def replay(self, request: ReleaseRequest, vote_sum: np.ndarray, *, repetitions: int, rng: np.random.Generator,
               survivors: int | None = None, per_client: bool = False) -> np.ndarray:
        """Winning indices, int64 ``(repetitions,)`` (`dphype.privacy.winner.replay_winners`)."""
        cfg = request.config
        return replay_winners(vote_sum, epsilon=cfg.epsilon, neighbouring=cfg.neighbouring, repetitions=repetitions,
                              rng=rng, sensitivity=self.sensitivity(cfg))

    def describe(self, request: ReleaseRequest) -> str:
        """The winner release's parameters: ballot, k, clients, dropout, relation, the committee and its noise."""
        # discrete Laplace sampled in the MPC: no run delta, noise kind or rule applies
        cfg = request.config
        parties, g = len(request.tallies), self.sensitivity(cfg)
        k = self.votes_per_client(cfg, len(request.candidates))
        return (f"ballot={cfg.ballot!r}, k={k}, clients={cfg.clients}, dropout={cfg.dropout:g}, "
                f"neighbouring={cfg.neighbouring!r}, tallies={parties}, ballots verified, committee noise std="
                f"{noise_std(cfg.epsilon, cfg.neighbouring, g):.4g} (sampled jointly in the MPC)")
