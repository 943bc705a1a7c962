"""The committee sum release (``"committee-sum"``): the noisy vote sum of the ballots a tally committee verified."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from dphype.privacy.accounting import privacy_report
from dphype.privacy.noise import (
    COMMITTEE_TALLIES,
    check_survivors,
    committee_noise_share,
    committee_sum_std,
    honest_tallies,
    replay_committee_sums,
    secure_generator,
)
from dphype.release.base import (
    NodeCost,
    ReleaseRequest,
    noisy_sum_of,
    rule_result,
    vote_cost,
    vote_event,
    vote_sum_words,
)
from dphype.release.committee_mode import CommitteeMode
from dphype.result import DPHypeResult
from dphype.secure.committee import OPENS_SUM, Opening
from dphype.selection.planner import Forecast


class CommitteeSumRelease(CommitteeMode[Opening | np.ndarray]):
    """The noisy vote sum of the ballots the tally committee verified, with noise the committee made.

    As `SumRelease` (the same accounting of ``sigma``, the same rule on the released vector) but computed by the
    committee, which checks each ballot, leaves out the invalid ones (naming their contributors) and where each tally
    adds a share of variance ``sigma^2 / h`` (`dphype.privacy.noise.committee_noise_share`, ``h`` =
    `dphype.privacy.noise.honest_tallies`): any ``h`` tallies' shares carry ``sigma`` whatever the number of
    contributors. Integer noise only. `noise_inflation` is ``sqrt(parties / h)`` for the default committee.
    """

    name = "committee-sum"
    released = "the noisy vote sum of the ballots a tally committee verified, with noise the tallies make"
    forecast = Forecast.NOISY_SUM
    opens = OPENS_SUM
    noise_inflation = committee_sum_std(1.0, COMMITTEE_TALLIES)
    integer_noise = True

    def node_cost(self, request: ReleaseRequest, *, survivors: int, delta: float, accountant: str,
                  neighbouring: str) -> NodeCost:
        """The noisy sum with noise of std ``sigma`` (any ``h`` tallies' shares), whatever the contributors."""
        return vote_cost(request, request.sigma, delta=delta, accountant=accountant, neighbouring=neighbouring)

    def tally_noise(self, request: ReleaseRequest) -> np.ndarray:
        """One tally's int64 noise share (`dphype.privacy.noise.committee_noise_share`) from the CSPRNG."""
        return committee_noise_share(len(request.candidates), sigma=request.sigma, parties=len(request.tallies),
                                     rng=secure_generator(), noise=request.config.noise)

    def release(self, request: ReleaseRequest, opened: Opening | np.ndarray, survivors: int) -> DPHypeResult:
        """The configured rule on the opened noisy sum of the valid ballots, with the privacy report of ``sigma``."""
        cfg = request.config
        opening = opened if isinstance(opened, Opening) else Opening(tuple(np.asarray(opened).tolist()))
        valid = check_survivors(survivors - len(opening.excluded) - len(opening.unattributed), cfg.clients,
                                request.min_valid)
        total = noisy_sum_of(request, np.asarray(opening.value, dtype=np.float64))
        parties = len(request.tallies)
        noise_std = committee_sum_std(request.sigma, parties)  # all the shares added
        report = replace(
            privacy_report(vote_event(request), cfg.delta, clients=cfg.clients, dropout=cfg.dropout,
                           accountant=cfg.accountant),
            survivors=valid, client_std=0.0, ballots_verified=True, excluded=opening.excluded,
            unattributed=opening.unattributed,
            released=(f"noisy vote sum of the ballots a committee of {parties} tallies verified on MPyC; noise made "
                      f"by the tallies: any {honest_tallies(parties)} of the {parties} shares add up to the sigma "
                      f"above, all {parties} to std {noise_std:.4g}"))
        return rule_result(request, total, report, noise_std, valid)

    def replay(self, request: ReleaseRequest, vote_sum: np.ndarray, *, repetitions: int, rng: np.random.Generator,
               survivors: int | None = None, per_client: bool = False) -> np.ndarray:
        """Noisy sums with the committee's noise (`dphype.privacy.noise.replay_committee_sums`)."""
        return replay_committee_sums(vote_sum, sigma=request.sigma, parties=len(request.tallies),
                                     repetitions=repetitions, rng=rng, per_tally=per_client, noise=request.config.noise)

    def describe(self, request: ReleaseRequest) -> str:
        """The noisy vote sum's parameters, the committee and its noise."""
        parties = len(request.tallies)
        return (f"{vote_sum_words(request)}, tallies={parties}, ballots verified, committee noise std="
                f"{committee_sum_std(request.sigma, parties):.4g}")
