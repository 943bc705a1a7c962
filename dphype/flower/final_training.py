"""Optional private final training: Flower's DP-FedAvg wrappers, calibrated and accounted with the selection.

After DP-Hype has selected a candidate, `private_training` wraps the user's Message-API ``FedAvg`` in
Flower's ``DifferentialPrivacyServerSideFixedClipping`` (the default: the server clips every update) or
``DifferentialPrivacyClientSideFixedClipping`` (clients clip with ``fixedclipping_mod``), with the noise
multiplier that makes ``rounds`` rounds ``(epsilon, delta)``-DP for the training budget
(`dphype.privacy.accounting.calibrate_fedavg`, dp_accounting).

The training guarantee rests on two facts about every update, and the server establishes both itself instead
of trusting the clients: each client's weight is the same (the wrappers set FedAvg's weight metric of every
reply to 1, whatever the client sent), and each update's L2 norm is at most the clipping norm. With
server-side clipping the server clips; with client-side clipping it *verifies* each update's norm and refuses
the round (`ClippingError`: nothing aggregated, nothing released, the report marked not private) when one
exceeds the norm by more than float32 rounding (`CLIP_TOLERANCE`), then projects the accepted updates onto
the norm ball so the sensitivity is exactly the clipping norm. `check_private_training` checks every
other precondition of the accountant before the selection starts.

The wrapper runs in Flower's *accounted mode* with `RunAccountant`, which starts from the selection's
own RDP curve (its noise kind's, `dphype.privacy.noise_kinds.NoiseKind.stated_rdp`) and composes every training round
(`dphype.privacy.accounting.fedavg_rdp`), so the run has one ``(epsilon, delta)`` for both phases. Accounted
mode makes Flower refuse a round that would exceed that total, aggregate only when every sampled client
replied (a round with a missing or failed reply is skipped and releases nothing), and log the composed spend
after each round. The training rounds alone are also accounted by Flower's own ``RdpAccountant``
(`flower_training_spent`), and the report gives both epsilons of the training phase.

What each phase releases: the selection releases only the noisy vote sum; each training round releases the
global model, the uniform average of the clients' clipped updates plus Gaussian noise of std ``z C / m``.
The server itself sees every client's update in plaintext: the guarantee of the training phase covers what
the global models reveal to everyone else (central DP), as in DP-FedAvg.

`BoundedFedAvg` is the ``FedAvg`` whose wait for its ``min_available_nodes`` is bounded: Flower's own sampling
waits for them without limit, so a voter cut off mid-training would stop the run for good.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import (
    GaussianPrivacyEvent,
    NeighboringRelation,
    PrivacyAccountant,
    PrivacyConfig,
    PrivacySpent,
    RdpAccountant,
    SamplingMethod,
)
from flwr.serverapp.grid import Grid
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)
from flwr.supercore.differential_privacy import get_norm

from dphype.checks import check_delta, check_epsilon_budget, check_int, check_neighbouring, check_positive
from dphype.flower.server.readiness import PreflightError, wait_for_nodes
from dphype.privacy.accounting import (
    RDP_ORDERS,
    PrivacyReport,
    calibrate_fedavg,
    check_rdp_curve,
    fedavg_epsilon,
    fedavg_rdp,
    rdp_delta,
    rdp_epsilon,
)
from dphype.privacy.noise_kinds import any_noise_kind
from dphype.privacy.winner import epsilon_with_samplers, sampler_delta  # registers the winner's noise kind

#: Where updates are clipped: on the server ("server", the default) or by the clients with ``fixedclipping_mod``
#: ("client"; the server verifies every update's norm).
CLIPPING: tuple[str, ...] = ("server", "client")
#: Relative slack of the server's norm check of client-clipped updates: a client that clipped exactly still
#: sends float32 parameters, whose difference from the global model can exceed the norm by rounding.
CLIP_TOLERANCE = 1e-4


class TrainingError(RuntimeError):
    """Too few voters are connected to go on training (`BoundedFedAvg`); the rounds so far stand."""


class BoundedFedAvg(FedAvg):
    """Flower's ``FedAvg`` whose wait for ``min_available_nodes`` ends after ``wait`` seconds.

    Before a round samples its nodes it waits at most ``wait`` s for ``min_available_nodes``; then, with at least
    ``fewest`` connected, it goes on with those (and lowers its minimums to them for the later rounds, so a node that
    is gone is not waited for again), with fewer it raises `TrainingError`.

    Args:
        fewest: The fewest connected nodes it goes on with (an integer ``>= 1``); ``min_available_nodes`` keeps
            the run from going on with fewer when the two are equal (private training: Flower's accounted mode
            needs every sampled node).
        wait: Seconds to wait for ``min_available_nodes`` before going on with fewer (``> 0``).
        **kwargs: Flower's ``FedAvg`` keyword arguments.

    ``fewest`` or ``wait`` out of range is refused with a ``ValueError`` naming it (`dphype.checks`).
    """

    def __init__(self, *, fewest: int, wait: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fewest = check_int("fewest", fewest, 1)
        self.wait = check_positive("wait", wait)

    def _connected(self, grid: Grid) -> None:
        """Wait for ``min_available_nodes`` at most `wait` s; go on with ``fewest`` or more, else `TrainingError`."""
        try:
            wait_for_nodes(grid, self.min_available_nodes, self.wait)
            return
        except PreflightError:
            nodes = list(grid.get_node_ids())
        if len(nodes) < self.fewest:
            raise TrainingError(
                f"only {len(nodes)} of {self.min_available_nodes} training nodes connected (< {self.fewest}): "
                "restart the voters' SuperNodes, or run again\n"
                f"FedAvg waited {self.wait:g} s for the {self.fewest} it can go on with; the training stopped (the "
                "rounds so far stand)")
        log(logging.WARNING, "DP-Hype: %d of the %d nodes FedAvg trains on are connected after %g s; going on with "
            "them (at least %d)", len(nodes), self.min_available_nodes, self.wait, self.fewest)
        self.min_available_nodes = self.min_train_nodes = len(nodes)
        self.min_evaluate_nodes = min(self.min_evaluate_nodes, len(nodes))

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Flower's ``configure_train`` after a bounded wait for the nodes."""
        if self.fraction_train > 0.0:
            self._connected(grid)
        return super().configure_train(server_round, arrays, config, grid)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Flower's ``configure_evaluate`` after a bounded wait for the nodes."""
        if self.fraction_evaluate > 0.0:
            self._connected(grid)
        return super().configure_evaluate(server_round, arrays, config, grid)


class ClippingError(ValueError):
    """A client's update exceeds the clipping norm in a private round.

    The round is refused (nothing is aggregated or released) and the run's report is marked not private.
    """


@dataclass(frozen=True)
class TrainingBudget:
    """The privacy budget of the final training.

    Attributes:
        epsilon: The training's epsilon at the selection's delta, in ``(0, 100]`` (`dphype.checks.MAX_EPSILON`).
        rounds: The DP-FedAvg rounds, an integer ``>= 1``.
        clipping_norm: The L2 norm every update is clipped to, ``> 0``.
        clipping: Where updates are clipped, one of `CLIPPING`: ``"server"`` (the server clips) or ``"client"``
            (the clients clip with ``fixedclipping_mod``; the server verifies).

    Raises:
        ValueError: If a field is out of its range, or ``clipping`` is not one of `CLIPPING`.
    """

    epsilon: float
    rounds: int
    clipping_norm: float = 1.0
    clipping: str = "server"

    def __post_init__(self) -> None:
        check_epsilon_budget(self.epsilon)
        check_int("rounds", self.rounds, 1)
        check_positive("clipping_norm", self.clipping_norm)
        if self.clipping not in CLIPPING:
            raise ValueError(f"clipping must be one of {', '.join(CLIPPING)}, got {self.clipping!r}")


class RunAccountant:
    """Flower's ``PrivacyAccountant`` protocol for a DP-Hype run: the selection, then DP-FedAvg rounds.

    The curve starts at the selection's RDP (its noise kind's `dphype.privacy.noise_kinds.NoiseKind.stated_rdp`: a
    winner release's is `dphype.privacy.winner.winner_rdp`, and its MPC sampler adds its delta) and adds
    `fedavg_rdp` for every composed Gaussian event, both under the selection's neighbouring relation; epsilon by
    `rdp_epsilon`, delta by `rdp_delta`, on `RDP_ORDERS`.

    Args:
        selection: The selection's privacy report (its delta, relation and noise start the curve).
        population: The number of clients (Flower's ``PrivacyConfig``; no sampling amplification is used).
        max_epsilon: The run's limit, which Flower's accounted mode enforces; ``None``: none.
    """

    def __init__(self, selection: PrivacyReport, *, population: int, max_epsilon: float | None) -> None:
        # Flower's PrivacyConfig admits no-amplification accounting only with the add/remove label; the
        # wrapper reads only its sampling method, population and limit. This accountant composes under the
        # run's own relation (replace-one by default: twice the sensitivity, the stricter of the two).
        self._config = PrivacyConfig(target_delta=selection.delta, population_size=population,
                                     neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                     sampling_method=SamplingMethod.NO_AMPLIFICATION, max_epsilon=max_epsilon)
        self.neighbouring = selection.neighbouring
        kind = any_noise_kind(selection.noise)  # a winner release's curve is its pure epsilon's (privacy.winner)
        self._rdp = kind.stated_rdp(RDP_ORDERS, k=selection.k, sigma=selection.sigma, epsilon=selection.epsilon,
                                    stated=selection.neighbouring, neighbouring=self.neighbouring)
        self._releases = 1
        self._sampled = int(kind.sampled)  # a sampled noise's delta (privacy.winner.sampler_delta)
        self._added: list[str] = []  # the other releases composed (compose_release), by name

    @property
    def config(self) -> PrivacyConfig:
        """The ``PrivacyConfig`` the wrapper reads: the selection's delta, the population, no sampling, the limit."""
        return self._config

    @property
    def num_releases(self) -> int:
        """The releases composed so far: the selection, every training round and every `compose_release`."""
        return self._releases

    @property
    def added_releases(self) -> tuple[str, ...]:
        """The names of the releases composed with `compose_release` (neither the selection nor a training round)."""
        return tuple(self._added)

    def compose_release(self, name: str, rdp: np.ndarray) -> None:
        """Add another release's RDP curve on `RDP_ORDERS` under this run's relation (the private evaluation)."""
        self._rdp = self._rdp + check_rdp_curve(rdp, name=f"{name} rdp")
        self._releases += 1
        self._added.append(name)

    def _with(self, event: GaussianPrivacyEvent, count: int) -> np.ndarray:
        return self._rdp + fedavg_rdp(event.noise_multiplier, count, neighbouring=self.neighbouring)

    def compose(self, event: GaussianPrivacyEvent, count: int = 1) -> None:
        """Add ``count`` DP-FedAvg rounds of ``event`` to the curve (`fedavg_rdp`)."""
        self._rdp = self._with(event, count)
        self._releases += count

    def get_epsilon(self, delta: float) -> float:
        """The run's epsilon so far at ``delta`` (`dphype.privacy.winner.epsilon_with_samplers`)."""
        return epsilon_with_samplers(self._rdp, delta, self._sampled)

    def get_delta(self, epsilon: float) -> float:
        """The run's delta so far at ``epsilon`` (`rdp_delta`)."""
        return rdp_delta(self._rdp, epsilon) + sampler_delta(epsilon, self._sampled)

    def get_privacy_spent(self, delta: float | None = None) -> PrivacySpent:
        """The run's spend so far at ``delta`` (``None``: the selection's), in Flower's ``PrivacySpent``."""
        delta = self._config.target_delta if delta is None else check_delta(delta)
        order = rdp_epsilon(self._rdp, delta)[1]
        phases = ", ".join(["DP-Hype selection", "DP-FedAvg", *self._added])
        return PrivacySpent(epsilon=self.get_epsilon(delta), delta=delta, num_releases=self._releases,
                            accounting_method=f"rdp ({phases} composed)", optimal_order=order)

    def would_exceed(self, event: GaussianPrivacyEvent, max_epsilon: float | None = None, count: int = 1) -> bool:
        """Whether ``count`` more rounds of ``event`` take the epsilon above ``max_epsilon`` (or the accountant's)."""
        limit = self._config.max_epsilon if max_epsilon is None else max_epsilon
        if limit is None:
            raise ValueError("max_epsilon must be given to the accountant or to would_exceed")
        return epsilon_with_samplers(self._with(event, count), self._config.target_delta, self._sampled) > limit

    def to_dict(self) -> dict[str, Any]:
        """A summary for logs: ``{"releases": ..., "neighbouring": ...}``."""
        return {"releases": self._releases, "neighbouring": self.neighbouring}

    def state_dict(self) -> dict[str, object]:
        """``{"rdp": [...], "releases": ..., "neighbouring": ...}`` (on `RDP_ORDERS`) for `load_state_dict`."""
        return {"rdp": [float(v) for v in self._rdp], "releases": self._releases, "neighbouring": self.neighbouring}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore `state_dict`; the relation must match and the curve may only have grown.

        Args:
            state: What `state_dict` returned.

        Raises:
            ValueError: If the relation differs, the curve is invalid or below this run's selection cost, or the
                release count is not an integer ``>= 1``.
        """  # noqa: DOC502
        if state.get("neighbouring") != self.neighbouring:
            raise ValueError(f"state neighbouring must be {self.neighbouring!r}, got {state.get('neighbouring')!r}")
        rdp = check_rdp_curve(state.get("rdp"), name="state rdp")
        if np.any(rdp < self._rdp):
            raise ValueError("state rdp must not be below this run's selection cost (it would forget spending)")
        releases = state.get("releases")
        if isinstance(releases, bool) or not isinstance(releases, int) or releases < 1:
            raise ValueError(f"state releases must be an integer >= 1, got {releases!r}")
        self._rdp, self._releases = rdp, releases


def flower_training_spent(noise_multiplier: float, rounds: int, *, sampled_clients: int, population: int,
                          delta: float, neighbouring: str) -> PrivacySpent:
    """The DP-FedAvg rounds alone, accounted by Flower's own ``RdpAccountant`` on `RDP_ORDERS`.

    Flower's accountant knows add/remove only, so a replace-one round enters as multiplier ``z / 2`` (as
    `fedavg_rdp` does); its epsilon equals `dphype.privacy.accounting.fedavg_epsilon`'s.

    Args:
        noise_multiplier: Flower's noise multiplier ``z``, ``> 0``.
        rounds: The rounds released, ``>= 1``.
        sampled_clients: The nodes every round trains on (``m``).
        population: The clients of the run, ``>= sampled_clients``.
        delta: The delta, in ``(0, 1)``.
        neighbouring: ``"replace-one"`` or ``"add-remove"``.

    Returns:
        Flower's ``PrivacySpent`` of the rounds at ``delta``.

    Raises:
        ValueError: If an argument is out of its range (Flower's or ours).
    """  # noqa: DOC502
    check_int("rounds", rounds, 1)
    effective = check_positive("noise_multiplier", noise_multiplier)
    if check_neighbouring(neighbouring) == "replace-one":
        effective /= 2.0
    config = PrivacyConfig(target_delta=check_delta(delta), population_size=population,
                           neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                           sampling_method=SamplingMethod.NO_AMPLIFICATION)
    accountant: PrivacyAccountant = RdpAccountant(config, orders=tuple(float(a) for a in RDP_ORDERS))
    accountant.compose(GaussianPrivacyEvent(noise_multiplier=effective, sample_size=sampled_clients,
                                            population_size=population), rounds)
    return accountant.get_privacy_spent()


def _uniform_weights(replies: list[Message], key: str) -> None:
    """Replace every reply's metrics by FedAvg's weight 1 under ``key``.

    DP-FedAvg averages uniformly, so the
    server sets the weights instead of trusting what a client reports, and no client metric (outside the
    guarantee) is aggregated into the run's results.
    """
    for reply in replies:
        if reply.has_error():
            continue
        for name in list(reply.content.metric_records):
            del reply.content[name]
        reply.content["metrics"] = MetricRecord({key: 1})


def _updates(replies: list[Message], sent: list[np.ndarray]) -> list[tuple[Message, str, list[np.ndarray]]]:
    """Every reply's arrays (per array record) as numpy arrays, checked against the shapes sent."""
    out = []
    for reply in replies:
        if reply.has_error():
            continue
        for name, record in reply.content.array_records.items():
            arrays = record.to_numpy_ndarrays()
            if [a.shape for a in arrays] != [a.shape for a in sent]:
                raise ClippingError(f"node {reply.metadata.src_node_id} sent arrays of other shapes than the global "
                                    "model; the round is refused")
            out.append((reply, name, arrays))
    return out


def _project(reply: Message, name: str, arrays: list[np.ndarray], sent: list[np.ndarray], norm: float) -> None:
    """Replace ``reply``'s array record ``name`` by the global model plus its update clipped to L2 ``norm``."""
    update = [np.subtract(a, b, dtype=np.float64) for a, b in zip(arrays, sent)]
    scale = min(1.0, norm / max(get_norm(update), 1e-300))
    record = reply.content.array_records[name]
    clipped = [(b + u * scale).astype(a.dtype) for a, b, u in zip(arrays, sent, update)]
    reply.content[name] = ArrayRecord(dict(zip(record.keys(), (Array(c) for c in clipped))))


class _ServerClipping(DifferentialPrivacyServerSideFixedClipping):
    """Flower's server-side clipping wrapper, with the clients' weights set to 1 by the server."""

    def aggregate_train(self, server_round: int, replies: Any) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        _uniform_weights(replies, cast(FedAvg, self.strategy).weighted_by_key)
        return super().aggregate_train(server_round, replies)


class _VerifiedClientClipping(DifferentialPrivacyClientSideFixedClipping):
    """Flower's client-side clipping wrapper, with every update's norm verified by the server.

    A reply whose update (its arrays minus the global model sent) has an L2 norm above ``clipping_norm``
    times ``1 + CLIP_TOLERANCE`` makes the whole round refused (`ClippingError`, recorded in
    `refused`); accepted updates are projected onto the norm ball (a no-op up to rounding), and every
    client's weight is set to 1.

    Args:
        *args: Flower's ``DifferentialPrivacyClientSideFixedClipping`` arguments.
        **kwargs: Flower's ``DifferentialPrivacyClientSideFixedClipping`` keyword arguments.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sent: list[np.ndarray] = []
        #: Refused rounds: (round, nodes above the norm, largest norm seen).
        self.refused: list[tuple[int, int, float]] = []
        self.largest_norm = 0.0

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Any:
        self._sent = arrays.to_numpy_ndarrays()
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Any) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        updates = _updates(replies, self._sent)
        norms = [get_norm([np.subtract(a, b, dtype=np.float64) for a, b in zip(arrays, self._sent)])
                 for _, _, arrays in updates]
        limit = self.clipping_norm * (1.0 + CLIP_TOLERANCE)
        above = sorted({reply.metadata.src_node_id for (reply, _, _), n in zip(updates, norms) if n > limit})
        self.largest_norm = max([self.largest_norm, *norms])
        if above:
            self._pop_pending_event(server_round)  # the round releases nothing and is not accounted
            self.refused.append((server_round, len(above), max(norms)))
            message = (f"round {server_round} refused: {len(above)} of {len(updates)} updates exceed the clipping "
                       f"norm {self.clipping_norm:g} (largest L2 norm {max(norms):.4g}; nodes {above[:10]}); nothing "
                       "was aggregated or released and the run is not private. Clip on the clients with Flower's "
                       "fixedclipping_mod, or use TrainingBudget(clipping='server')")
            log(logging.ERROR, "DP-Hype private training: %s", message)
            raise ClippingError(message)
        for (reply, name, arrays) in updates:
            _project(reply, name, arrays, self._sent, self.clipping_norm)
        _uniform_weights(replies, cast(FedAvg, self.strategy).weighted_by_key)
        return super().aggregate_train(server_round, replies)


@dataclass(frozen=True)
class PrivateTraining:
    """The wrapped strategy, its accountant and what it was calibrated with.

    Attributes:
        strategy: The user's ``FedAvg`` in Flower's DP wrapper (server- or client-side clipping).
        accountant: The run's accountant (selection and training composed).
        budget: The training budget.
        noise_multiplier: The calibrated noise multiplier ``z``.
        sampled_clients: The nodes every round trains on (``m``).
    """

    strategy: DifferentialPrivacyClientSideFixedClipping | DifferentialPrivacyServerSideFixedClipping
    accountant: RunAccountant
    budget: TrainingBudget
    noise_multiplier: float
    sampled_clients: int

    @property
    def refused(self) -> list[tuple[int, int, float]]:
        """Rounds refused because a client-clipped update exceeded the norm: (round, nodes, largest norm)."""
        return list(getattr(self.strategy, "refused", []))

    def _clipping(self) -> str:
        norm = self.budget.clipping_norm
        if self.budget.clipping == "server":
            return f"server-side: the server clipped every update to L2 norm {norm:g}"
        if self.refused:
            rounds = ", ".join(f"round {r} ({m} updates, largest norm {x:.4g})" for r, m, x in self.refused)
            return (f"client-side, verified by the server: updates ABOVE the norm {norm:g} in {rounds}; that round "
                    "was refused and nothing of it released")
        largest = cast(_VerifiedClientClipping, self.strategy).largest_norm
        return (f"client-side (fixedclipping_mod), verified by the server: every update's L2 norm was at most "
                f"{norm:g} (largest {largest:.4g}, within float32 rounding of {CLIP_TOLERANCE:g}) before it was "
                "aggregated")

    def report(self) -> dict[str, Any]:
        """What the training phase and the whole run release, with the composed ``(epsilon, delta)``.

        A run with a refused round (an update above the clipping norm) is reported as not private.

        Returns:
            ``{"training": {...}, "run": {...}}``: the training's budget, noise, clipping, what each round
            released and the epsilon of its released rounds alone (``epsilon``: ours, ``epsilon_flower``:
            Flower's ``RdpAccountant``; ``None`` if not private or none released); the run's epsilon (``None``
            if not private), delta, accountant and release count.
        """
        spent = self.accountant.get_privacy_spent()
        private = not self.refused
        rounds = spent.num_releases - 1 - len(self.accountant.added_releases)
        delta = self.accountant.config.target_delta
        ours = flower = None  # the training phase alone: our accountant and Flower's RdpAccountant
        if private and rounds > 0:
            ours = fedavg_epsilon(self.noise_multiplier, rounds, delta, neighbouring=self.accountant.neighbouring)
            flower = flower_training_spent(self.noise_multiplier, rounds, sampled_clients=self.sampled_clients,
                                           population=self.accountant.config.population_size, delta=delta,
                                           neighbouring=self.accountant.neighbouring).epsilon
        return {
            "training": {
                "private": private, "epsilon_budget": self.budget.epsilon,
                "delta": self.accountant.config.target_delta,
                "rounds": self.budget.rounds, "noise_multiplier": self.noise_multiplier,
                "clipping_norm": self.budget.clipping_norm, "clipping": self._clipping(),
                "weights": "uniform: the server set every client's weight to 1 and kept no client metric",
                "sampled_clients": self.sampled_clients, "rounds_released": rounds,
                "epsilon": ours, "epsilon_flower": flower,
                "released": "each round's global model: the uniform average of the clients' updates clipped to "
                            f"L2 norm {self.budget.clipping_norm:g} plus Gaussian noise of std z C / m "
                            f"(z={self.noise_multiplier:.4g}, m={self.sampled_clients}); the server sees the "
                            "updates themselves",
            },
            "run": {"epsilon": spent.epsilon if private else None, "delta": spent.delta,
                    "accountant": spent.accounting_method if private else
                    "none: a client's update exceeded the clipping norm, the training is not private",
                    "releases": spent.num_releases},
        }


#: What ordinary FedAvg releases (`plaintext_training` says it plainly).
PLAINTEXT_TRAINING = ("plaintext model updates of every participating client in every FedAvg round (ordinary "
                      "FedAvg): no DP guarantee covers them; set train-epsilon > 0 to train privately")


def plaintext_training(delta: float, rounds: int, *, client_evaluation: bool = False) -> dict[str, Any]:
    """What a run that trains with ordinary FedAvg after the selection releases, in `PrivateTraining.report`'s shape.

    Args:
        delta: The selection's delta.
        rounds: FedAvg's rounds.
        client_evaluation: Whether clients also evaluate the global model on their own data each round (their
            un-noised metrics are released too).

    Returns:
        ``{"training": {"private": False, "released": ...}, "run": {"epsilon": None, ...}}``: no guarantee covers
        the run as a whole.
    """
    released = PLAINTEXT_TRAINING + ("; and each evaluating client's un-noised loss and accuracy on its own data "
                                     "after every round" if client_evaluation else "")
    return {"training": {"private": False, "released": released},
            "run": {"epsilon": None, "delta": delta, "accountant": "none: the training is not private",
                    "releases": 1 + rounds}}


def check_private_training(strategy: FedAvg, budget: TrainingBudget, *, delta: float, neighbouring: str,
                           sampled_clients: int) -> float:
    """Every precondition of the training accountant that the server can check before the selection starts.

    ``strategy`` must be a ``FedAvg`` (uniform averaging) that trains on every connected node each round
    (``fraction_train`` 1: accounted without sampling amplification, and Flower's accounted mode needs exactly
    ``sampled_clients`` replies) and evaluates on none (``fraction_evaluate`` 0: client metrics would leave in
    plaintext, outside the guarantee); ``budget`` must be reachable in ``budget.rounds`` rounds at ``delta``.
    Client weights need no check: the wrappers set them (`private_training`).

    Args:
        strategy: The user's strategy.
        budget: The training budget.
        delta: The selection's delta.
        neighbouring: The selection's neighbouring relation.
        sampled_clients: The nodes every round trains on (``m``).

    Returns:
        The calibrated noise multiplier ``z``.

    Raises:
        ValueError: If a precondition fails (the strategy's type or fractions, ``min_train_nodes``, the budget's
            type, ``sampled_clients``, ``delta``, ``neighbouring``) or the budget is unreachable.
    """  # noqa: DOC502
    if not isinstance(strategy, FedAvg):
        raise ValueError(f"strategy must be a FedAvg (uniform averaging), got {type(strategy).__name__}")
    if not isinstance(budget, TrainingBudget):
        raise ValueError(f"budget must be a TrainingBudget, got {type(budget).__name__}")
    check_int("sampled_clients", sampled_clients, 1)
    if strategy.fraction_train != 1.0:
        raise ValueError(f"fraction_train must be 1.0 in private training, got {strategy.fraction_train:g}; set 1.0\n"
                         "every node trains each round: the accountant assumes no sampling")
    if strategy.fraction_evaluate != 0.0:
        raise ValueError(f"fraction_evaluate must be 0.0 in private training, got {strategy.fraction_evaluate:g}; "
                         "set 0.0\nclient evaluation metrics would leave in plaintext, outside the guarantee")
    if strategy.min_train_nodes > sampled_clients:
        raise ValueError(f"min_train_nodes must be at most sampled_clients={sampled_clients}, got "
                         f"{strategy.min_train_nodes}")
    return calibrate_fedavg(budget.epsilon, check_delta(delta), budget.rounds,
                            neighbouring=check_neighbouring(neighbouring))


def private_training(strategy: FedAvg, selection: PrivacyReport, budget: TrainingBudget, *,
                     sampled_clients: int) -> PrivateTraining:
    """Wrap ``strategy`` for DP final training within ``budget``, accounted together with ``selection``.

    ``z`` is `check_private_training`'s (call it before the selection to fail before any client works); the
    accountant's limit is the selection composed with exactly ``budget.rounds`` rounds, so no run spends more.

    Args:
        strategy: The user's ``FedAvg`` (``fraction_train=1``, ``fraction_evaluate=0``).
        selection: The selection's privacy report.
        budget: The training budget.
        sampled_clients: The nodes every round trains on (``m``).

    Returns:
        The wrapped strategy with its accountant, budget, ``z`` and ``m``.

    Raises:
        ValueError: If a precondition fails (`check_private_training`).
    """  # noqa: DOC502
    z = check_private_training(strategy, budget, delta=selection.delta, neighbouring=selection.neighbouring,
                               sampled_clients=sampled_clients)
    population = max(selection.clients, sampled_clients)
    planned = RunAccountant(selection, population=population, max_epsilon=None)
    planned.compose(GaussianPrivacyEvent(noise_multiplier=z, sample_size=sampled_clients, population_size=population),
                    budget.rounds)
    total = planned.get_epsilon(selection.delta)
    accountant = RunAccountant(selection, population=population, max_epsilon=total * (1 + 1e-9))
    wrapper = _VerifiedClientClipping if budget.clipping == "client" else _ServerClipping
    wrapped = wrapper(strategy, noise_multiplier=z, clipping_norm=budget.clipping_norm,
                      num_sampled_clients=sampled_clients, accountant=accountant)
    return PrivateTraining(wrapped, accountant, budget, z, sampled_clients)
