"""What the planner simulates of a release: its forecasts of a good pick on a scenario's votes.

Theorem IV.1 bounds the chance that the argmax of the noisy vote sum is good, given the gap between good and bad
vote counts (`theorem_iv1_success`); the simulation replays the run's noise on the scenario's votes. Both kinds of
release (`Forecast`) are simulated on the SAME votes: the noisy vote sum picked by the selection rule (Skellam or
Gaussian shares, replayed by `dphype.privacy.noise.replay_noisy_sums`; with a dropout fraction ``xi`` the worst
accepted case, only ``ceil((1 - xi) n)`` clients vote and their shares add up to std ``sigma``), and the winner's
index alone (`dphype.privacy.winner`: discrete Laplace noise whose scale depends on epsilon and the neighbouring
relation only, replayed by `dphype.privacy.winner.replay_winners`). Success = the pick is good.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from dphype.privacy.accounting import calibrate
from dphype.privacy.noise import min_survivors, replay_noisy_sums
from dphype.privacy.winner import noise_std, replay_winners
from dphype.selection.rules import good_selection_probability_bound, select_batch
from dphype.selection.scenarios import Scenario, simulate_votes

if TYPE_CHECKING:
    from dphype.selection.candidates import FeatureSpace


class Forecast(enum.Enum):
    """What the planner simulates of a release; its value is the ``by_k`` column with the simulated success.

    Attributes:
        NOISY_SUM: The noisy vote sum (``sigma`` calibrated for ``(epsilon, delta, k)``), picked by the run's rule.
        WINNER: The winner's index alone, report-noisy-max with the discrete Laplace noise epsilon and the relation
            imply (`dphype.privacy.winner.noise_std`).
    """

    NOISY_SUM = "success"
    WINNER = "success_winner"


class PlannedRelease(Protocol):
    """What the planner needs of a release mode (`dphype.release.ReleaseMode` has it)."""

    @property
    def name(self) -> str:
        """The mode's configuration name (for the plan's report)."""
        ...

    @property
    def forecast(self) -> Forecast:
        """The forecast that predicts the mode's release."""
        ...

    @property
    def noise_inflation(self) -> float:
        """The released noise's std over the calibrated ``sigma`` of a noisy-sum forecast (1: exactly ``sigma``)."""
        ...



def theorem_iv1_success(votes: np.ndarray, good: np.ndarray, sigma: float) -> float:
    """Theorem IV.1's lower bound on the chance that the argmax is good, averaged over vote vectors ``(R, p)``.

    The theorem holds for any set ``H'`` of good candidates (``Pr[pick in H_good] >= Pr[pick in H']``); the best of
    the sets "the ``j`` most-voted good candidates" is used, whose gap is the ``j``-th good count minus the largest
    count outside the set.

    Args:
        votes: The noiseless vote sums, ``(R, p)``.
        good: The good masks, bool ``(R, p)``.
        sigma: The noise std of the sum.

    Returns:
        The mean bound.
    """
    p = votes.shape[1]
    total = 0.0
    for row, mask in zip(votes.astype(np.float64), good):
        ranked = np.sort(row[mask])[::-1]
        outside_bad = row[~mask].max()
        best = 0.0
        for j in range(1, ranked.size + 1):
            rival = max(outside_bad, ranked[j]) if j < ranked.size else outside_bad
            best = max(best, good_selection_probability_bound(float(ranked[j - 1] - rival), sigma, j, p - j))
        total += best
    return total / len(votes)


def simulated_success(votes: np.ndarray, good: np.ndarray, sigma: float, *, rule: str,
                      space: FeatureSpace | None, clients: int, voters: int, dropout: float, noise: str, k: int,
                      rng: np.random.Generator) -> float:
    """Share of releases whose pick under ``rule`` is good.

    A release is ``votes`` of ``voters`` of the ``clients`` clients plus their noise shares
    (`dphype.privacy.noise.replay_noisy_sums`).

    Args:
        votes: The noiseless vote sums, ``(R, p)``.
        good: The good masks, bool ``(R, p)``.
        sigma: The total noise std calibrated for ``clients``.
        rule: The selection rule.
        space: The candidates' feature space (``None``: no structure).
        clients: The number ``n`` of clients the noise is calibrated for.
        voters: The number of clients that contribute.
        dropout: The tolerated dropout fraction.
        noise: The noise kind.
        k: Votes per client.
        rng: The random generator.

    Returns:
        The share of good picks.
    """
    noisy = replay_noisy_sums(votes, sigma=sigma, clients=clients, repetitions=len(votes), rng=rng, dropout=dropout,
                            noise=noise, survivors=voters)
    picks = select_batch(noisy, space, sigma, rule=rule, clients=voters, k=k).picks
    return float(good[np.arange(len(picks)), picks].mean())


#: the normal density's normalising constant
_SQRT_2PI = np.sqrt(2 * np.pi)


def unanimous_success(clients: int, k: int, num_candidates: int, sigma: float) -> float:
    """Chance that the argmax picks one of ``k`` candidates ALL ``clients`` voted for (1 if ``k >= p`` or ``sigma`` 0).

    With ``u = (x - n) / sigma``: ``int k phi(u) Phi(u)^(k-1) Phi(u + n / sigma)^(p-k) du`` (the largest of the
    ``k`` counts ``n + sigma Z`` beats the ``p - k`` counts ``sigma W``).

    Args:
        clients: The number ``n`` of clients.
        k: Votes per client.
        num_candidates: The number ``p`` of candidates.
        sigma: The noise std of the sum.

    Returns:
        The chance.
    """
    # lazy import: scipy (the normal law from scipy.special: scipy.stats would cost the server a 0.3-0.6 s import)
    from scipy.integrate import quad
    from scipy.special import ndtr

    p = num_candidates
    if k >= p or not sigma > 0.0:  # without noise the unanimous counts always lead
        return 1.0
    lead = clients / sigma

    def density(u: float) -> float:
        return k * (np.exp(-(u**2) / 2.0) / _SQRT_2PI) * ndtr(u) ** (k - 1) * ndtr(u + lead) ** (p - k)

    return float(min(1.0, quad(density, -12.0, 12.0, limit=200)[0]))



@dataclass(frozen=True)
class ForecastSetting:
    """Everything fixed while the planner varies ``k``, epsilon or ``n`` (from the planner's arguments).

    Attributes:
        delta: The run's delta.
        dropout: The tolerated dropout fraction.
        num_candidates: The number ``p`` of candidates.
        space: The candidates' feature space.
        scenario: The consensus scenario.
        rule: The selection rule.
        noise: The noise kind.
        accountant: The accountant, resolved.
        neighbouring: The neighbouring relation.
        repetitions: Simulated runs per point.
        seed: The simulation's seed.
        inflation: The released noisy sum's std over the calibrated ``sigma`` (`PlannedRelease.noise_inflation`).
    """

    delta: float
    dropout: float
    num_candidates: int
    space: FeatureSpace | None
    scenario: Scenario
    rule: str
    noise: str
    accountant: str
    neighbouring: str
    repetitions: int
    seed: int
    inflation: float = 1.0

    def sigma(self, epsilon: float, k: int) -> float:
        """The calibrated noise std of the sum at ``(epsilon, k)``."""
        return calibrate(epsilon, self.delta, k, num_candidates=self.num_candidates, accountant=self.accountant,
                         noise=self.noise, neighbouring=self.neighbouring).sigma

    def votes(self, clients: int, ks: Sequence[int]) -> tuple[int, dict[int, np.ndarray], np.ndarray]:
        """Voters (the ``ceil((1 - xi) n)`` survivors), their ``(R, p)`` vote sums per ``k`` and the good masks."""
        voters = min_survivors(clients, self.dropout)
        rng = np.random.default_rng([self.seed, voters])
        counts, good = simulate_votes(self.scenario, voters, ks, self.num_candidates, self.space, self.repetitions,
                                      rng)
        return voters, counts, good

    def winner_success(self, votes: np.ndarray, good: np.ndarray, epsilon: float) -> float:
        """Share of winner releases that pick a good candidate, on the same votes."""
        rng = np.random.default_rng([self.seed, 2])  # common random numbers across k, epsilon and n
        picks = replay_winners(votes, epsilon=epsilon, neighbouring=self.neighbouring, repetitions=len(votes),
                               rng=rng)  # the committee's noise: neither the clients nor the dropout change it
        return float(good[np.arange(len(picks)), picks].mean())

    def success(self, votes: np.ndarray, good: np.ndarray, sigma: float, clients: int, voters: int, k: int,
                rule: str) -> float:
        """Share of noisy-sum releases whose pick under ``rule`` is good (`simulated_success`)."""
        rng = np.random.default_rng([self.seed, 1])  # common random numbers across k, epsilon and n
        return simulated_success(votes, good, sigma, rule=rule, space=self.space, clients=clients, voters=voters,
                                 dropout=self.dropout, noise=self.noise, k=k, rng=rng)

    def forecast_sigma(self, forecast: Forecast, epsilon: float, k: int) -> float:
        """The noise std of ``forecast``'s release at ``(epsilon, k)``."""
        if forecast is Forecast.WINNER:
            return noise_std(epsilon, self.neighbouring)
        return self.sigma(epsilon, k)

    def forecast_success(self, forecast: Forecast, votes: np.ndarray, good: np.ndarray, epsilon: float,
                         clients: int, voters: int, k: int) -> float:
        """Simulated success of ``forecast``'s release at ``(epsilon, k)`` on ``votes`` (the run's rule on a sum)."""
        if forecast is Forecast.WINNER:
            return self.winner_success(votes, good, epsilon)
        return self.success(votes, good, self.inflation * self.sigma(epsilon, k), clients, voters, k, self.rule)

