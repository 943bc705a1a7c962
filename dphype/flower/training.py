"""Optional private final training: Flower's DP-FedAvg wrappers, calibrated and accounted with the selection.

After DP-Hype has selected a candidate, :func:`private_training` wraps the user's Message-API ``FedAvg`` in
Flower's ``DifferentialPrivacyClientSideFixedClipping`` (clients clip with ``fixedclipping_mod``) or
``DifferentialPrivacyServerSideFixedClipping``, with the noise multiplier that makes ``rounds`` rounds
``(epsilon, delta)``-DP for the training budget (:func:`dphype.privacy.accounting.calibrate_fedavg`, dp_accounting).

The wrapper runs in Flower's *accounted mode* with :class:`RunAccountant`, which starts from the selection's
own RDP curve (:func:`dphype.privacy.accounting.vote_rdp`; Skellam included) and composes every training round
(:func:`dphype.privacy.accounting.fedavg_rdp`), so the run has one ``(epsilon, delta)`` for both phases. Accounted
mode makes Flower refuse a round that would exceed that total, aggregate only when every sampled client
replied with an equal weight (a round with a missing or failed reply is skipped and releases nothing), and
log the composed spend after each round.

What each phase releases: the selection releases only the noisy vote sum; each training round releases the
global model, the uniform average of the clients' clipped updates plus Gaussian noise of std ``z C / m``.
The server itself sees every client's (clipped) update in plaintext: the guarantee of the training phase
covers what the global models reveal to everyone else (central DP), as in DP-FedAvg.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)
from flwr.supercore.privacy_accounting import (
    GaussianPrivacyEvent,
    NeighboringRelation,
    PrivacyConfig,
    PrivacySpent,
    SamplingMethod,
)

from dphype.checks import check_delta, check_epsilon, check_int, check_positive
from dphype.privacy.accounting import (
    RDP_ORDERS,
    PrivacyReport,
    calibrate_fedavg,
    fedavg_rdp,
    rdp_delta,
    rdp_epsilon,
    vote_rdp,
)
from dphype.privacy.winner import WINNER_NOISE, winner_rdp

#: Where clients clip their updates: with ``fixedclipping_mod`` ("client") or on the server ("server").
CLIPPING: tuple[str, ...] = ("client", "server")


@dataclass(frozen=True)
class TrainingBudget:
    """The privacy budget of the final training: ``epsilon`` (at the selection's delta) for ``rounds``
    DP-FedAvg rounds with updates clipped to L2 norm ``clipping_norm`` on the ``clipping`` side."""

    epsilon: float
    rounds: int
    clipping_norm: float = 1.0
    clipping: str = "client"

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_int("rounds", self.rounds, 1)
        check_positive("clipping_norm", self.clipping_norm)
        if self.clipping not in CLIPPING:
            raise ValueError(f"clipping must be one of {', '.join(CLIPPING)}, got {self.clipping!r}")


class RunAccountant:
    """Flower's ``PrivacyAccountant`` protocol for a DP-Hype run: the selection, then DP-FedAvg rounds.

    The curve starts at the selection's RDP (noise of the survivors, :func:`vote_rdp`; for a winner release
    :func:`dphype.privacy.winner.winner_rdp` of its pure epsilon) and adds
    :func:`fedavg_rdp` for every composed Gaussian event, both under the selection's neighbouring relation;
    epsilon by :func:`rdp_epsilon` (Thm I.1), delta by :func:`rdp_delta`, on :data:`RDP_ORDERS`.
    """

    def __init__(self, selection: PrivacyReport, *, population: int, max_epsilon: float | None) -> None:
        # Flower's PrivacyConfig admits no-amplification accounting only with the add/remove label; the
        # wrapper reads only its sampling method, population and limit. This accountant composes under the
        # run's own relation (replace-one by default: twice the sensitivity, the stricter of the two).
        self._config = PrivacyConfig(target_delta=selection.delta, population_size=population,
                                     neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                     sampling_method=SamplingMethod.NO_AMPLIFICATION, max_epsilon=max_epsilon)
        self.neighbouring = selection.neighbouring
        # a winner release (argmax mode) is pure epsilon: randomized response's curve bounds it (privacy.winner)
        self._rdp = (winner_rdp(selection.epsilon, RDP_ORDERS) if selection.noise == WINNER_NOISE
                     else vote_rdp(selection.k, selection.sigma, selection.noise, neighbouring=self.neighbouring))
        self._releases = 1

    @property
    def config(self) -> PrivacyConfig:
        return self._config

    @property
    def num_releases(self) -> int:
        return self._releases

    def _with(self, event: GaussianPrivacyEvent, count: int) -> np.ndarray:
        return self._rdp + fedavg_rdp(event.noise_multiplier, count, neighbouring=self.neighbouring)

    def compose(self, event: GaussianPrivacyEvent, count: int = 1) -> None:
        self._rdp = self._with(event, count)
        self._releases += count

    def get_epsilon(self, delta: float) -> float:
        return rdp_epsilon(self._rdp, delta)[0]

    def get_delta(self, epsilon: float) -> float:
        return rdp_delta(self._rdp, epsilon)

    def get_privacy_spent(self, delta: float | None = None) -> PrivacySpent:
        delta = self._config.target_delta if delta is None else check_delta(delta)
        epsilon, order = rdp_epsilon(self._rdp, delta)
        return PrivacySpent(epsilon=epsilon, delta=delta, num_releases=self._releases,
                            accounting_method="rdp (DP-Hype selection and DP-FedAvg composed)", optimal_order=order)

    def would_exceed(self, event: GaussianPrivacyEvent, max_epsilon: float | None = None, count: int = 1) -> bool:
        limit = self._config.max_epsilon if max_epsilon is None else max_epsilon
        if limit is None:
            raise ValueError("max_epsilon must be given to the accountant or to would_exceed")
        return rdp_epsilon(self._with(event, count), self._config.target_delta)[0] > limit

    def to_dict(self) -> dict[str, Any]:
        return {"releases": self._releases, "neighbouring": self.neighbouring}

    def state_dict(self) -> dict[str, object]:
        """The composed RDP curve (on :data:`RDP_ORDERS`), the release count and the relation."""
        return {"rdp": [float(v) for v in self._rdp], "releases": self._releases, "neighbouring": self.neighbouring}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`; the relation must match and the curve may only have grown."""
        if state.get("neighbouring") != self.neighbouring:
            raise ValueError(f"state neighbouring must be {self.neighbouring!r}, got {state.get('neighbouring')!r}")
        rdp = np.asarray(state.get("rdp"), dtype=np.float64)
        if rdp.shape != self._rdp.shape or not np.all(np.isfinite(rdp) | np.isposinf(rdp)):
            raise ValueError(f"state rdp must be {len(self._rdp)} finite or +inf values, one per RDP order")
        if np.any(rdp < self._rdp):
            raise ValueError("state rdp must not be below this run's selection cost (it would forget spending)")
        releases = state.get("releases")
        if isinstance(releases, bool) or not isinstance(releases, int) or releases < 1:
            raise ValueError(f"state releases must be an integer >= 1, got {releases!r}")
        self._rdp, self._releases = rdp, releases


@dataclass(frozen=True)
class PrivateTraining:
    """The wrapped strategy, its accountant and what it was calibrated with."""

    strategy: DifferentialPrivacyClientSideFixedClipping | DifferentialPrivacyServerSideFixedClipping
    accountant: RunAccountant
    budget: TrainingBudget
    noise_multiplier: float
    sampled_clients: int

    def report(self) -> dict[str, Any]:
        """What the training phase and the whole run release, with the composed ``(epsilon, delta)``."""
        spent = self.accountant.get_privacy_spent()
        return {
            "training": {
                "private": True, "epsilon_budget": self.budget.epsilon, "delta": self.accountant.config.target_delta,
                "rounds": self.budget.rounds, "noise_multiplier": self.noise_multiplier,
                "clipping_norm": self.budget.clipping_norm, "clipping": self.budget.clipping,
                "sampled_clients": self.sampled_clients, "rounds_released": spent.num_releases - 1,
                "released": "each round's global model: the uniform average of the clients' updates clipped to "
                            f"L2 norm {self.budget.clipping_norm:g} plus Gaussian noise of std z C / m "
                            f"(z={self.noise_multiplier:.4g}, m={self.sampled_clients}); the server sees the "
                            "clipped updates themselves",
            },
            "run": {"epsilon": spent.epsilon, "delta": spent.delta, "accountant": spent.accounting_method,
                    "releases": spent.num_releases},
        }


def private_training(strategy: FedAvg, selection: PrivacyReport, budget: TrainingBudget, *,
                     sampled_clients: int) -> PrivateTraining:
    """Wrap ``strategy`` for DP final training within ``budget``, accounted together with ``selection``.

    ``sampled_clients`` is the number of nodes every round trains on (``m``; all connected nodes with
    ``fraction_train=1``). The noise multiplier ``z`` is the smallest with which ``budget.rounds`` rounds are
    ``(budget.epsilon, delta)``-DP at the selection's delta under the selection's neighbouring relation
    (:func:`calibrate_fedavg`); the accountant's limit is the composition of the selection with exactly those
    rounds, so no run spends more.
    """
    if not isinstance(strategy, FedAvg):
        raise ValueError(f"strategy must be a FedAvg (uniform averaging), got {type(strategy).__name__}")
    check_int("sampled_clients", sampled_clients, 1)
    z = calibrate_fedavg(budget.epsilon, selection.delta, budget.rounds, neighbouring=selection.neighbouring)
    population = max(selection.clients, sampled_clients)
    planned = RunAccountant(selection, population=population, max_epsilon=None)
    planned.compose(GaussianPrivacyEvent(noise_multiplier=z, sample_size=sampled_clients, population_size=population),
                    budget.rounds)
    total = planned.get_epsilon(selection.delta)
    accountant = RunAccountant(selection, population=population, max_epsilon=total * (1 + 1e-9))
    wrapper = (DifferentialPrivacyClientSideFixedClipping if budget.clipping == "client"
               else DifferentialPrivacyServerSideFixedClipping)
    wrapped = wrapper(strategy, noise_multiplier=z, clipping_norm=budget.clipping_norm,
                      num_sampled_clients=sampled_clients, accountant=accountant)
    return PrivateTraining(wrapped, accountant, budget, z, sampled_clients)
