"""Release modes: what the server learns from the clients' votes, one class per mode behind one small interface.

DP-Hype's clients vote top-k on a public candidate list and add noise shares; a release mode decides the rest
(Algorithm 1 and its variants). :class:`ReleaseMode` is the interface the rest of the package calls, in the
order of a run:

* calibration -- :meth:`ReleaseMode.calibrate`: the request's noise std ``sigma`` (Algorithm 1, line 1);
* the request -- :meth:`ReleaseMode.check_request_fields` (what :class:`dphype.protocol.VoteRequest` validates:
  its tallies and ``sigma``), :meth:`ReleaseMode.accounting` (the release as the accountants describe it) and
  :meth:`ReleaseMode.check_claims` (a client's check that the noise gives the announced budget);
* the node -- :meth:`ReleaseMode.announced_epsilon` and :meth:`ReleaseMode.node_cost`: what the node's policy
  limits (:func:`dphype.node.policy.check_vote_request`) and its ledger records;
* the client -- :meth:`ReleaseMode.ballot`: what it hands its aggregator (:class:`Aggregator`: SecAgg+ sums
  encoded vectors, the tally committee receives sealed Shamir shares);
* the server -- :meth:`ReleaseMode.release`: the result with its privacy report, from what the aggregator opened;
* replays -- :meth:`ReleaseMode.replay`: what the aggregator would open, drawn from a seeded generator
  (benchmarks; the math is in :mod:`dphype.privacy`, where the planner and the oracles call it);
* the planner -- :attr:`ReleaseMode.forecast` (:class:`dphype.selection.planner.Forecast`);
* wording and JSON -- :meth:`ReleaseMode.describe`; a mode is stored and sent as its :attr:`ReleaseMode.name`,
  the configuration's ``release`` (:attr:`dphype.config.DPHypeConfig.mode` reads it back).

The modes: :class:`SumRelease` (``"sum"``, the paper's: the noisy vote sum over SecAgg+, picked by the selection
rule) and :class:`ArgmaxRelease` (``"argmax"``: only the winner's index, a secure argmax among tally parties,
:mod:`dphype.privacy.winner`). :data:`RELEASE_MODES` maps each name to its class (a subclass that sets ``name``
registers itself); :func:`release_mode` looks one up. Nothing else in the package compares a mode's name.

Layers: the modes sit below the configuration and the protocol (the configuration validates its ``release`` here),
so they read a configuration and a request through the structural types :class:`Settings` and :class:`Request`,
which :class:`dphype.config.DPHypeConfig` and :class:`dphype.protocol.VoteRequest` satisfy. No Flower import here.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from dphype.checks import EPSILON_RTOL, resolve_accountant
from dphype.privacy.accounting import VoteRelease, mechanism_epsilon, privacy_report, vote_sensitivity
from dphype.privacy.accounting import calibrate as calibrate_release
from dphype.privacy.accounting import epsilon as release_epsilon
from dphype.privacy.noise import check_survivors, client_noise_share, client_noise_std, replay_noisy_sums
from dphype.privacy.winner import (
    THRESHOLD_SHIFT,
    WINNER_NOISE,
    WinnerRelease,
    client_winner_share,
    noise_parameter,
    noise_std,
    replay_winners,
    winner_report,
)
from dphype.refusal import Refusal
from dphype.result import DPHypeResult
from dphype.secure.secure_sum import GAUSSIAN_SCALE, check_range, encode
from dphype.secure.tally import check_committee, client_sealed_shares
from dphype.selection.planner import Forecast
from dphype.selection.rules import select_release
from dphype.selection.voting import top_k_votes

if TYPE_CHECKING:
    from dphype.selection.candidates import CandidateList

#: Largest ratio of an announced sigma to the one calibrated for the announced budget that a client accepts
#: (sum release): an honest server sends the calibrated sigma (:meth:`SumRelease.calibrate`); far more noise is no
#: request it sends, and the client refuses it before scoring.
SIGMA_SLACK = 1.001

#: Every release mode by its configuration name (``DPHypeConfig.release``), in the order they were defined (the
#: planner's recommendation goes to the first of tied modes).
RELEASE_MODES: dict[str, type[ReleaseMode[Any, Any]]] = {}

BallotT = TypeVar("BallotT")
OpenedT = TypeVar("OpenedT")


class Settings(Protocol):
    """What a mode reads of a configuration: :class:`dphype.config.DPHypeConfig`'s fields (the configuration sits
    above the modes, so the modes name only what they read)."""

    @property
    def epsilon(self) -> float: ...
    @property
    def delta(self) -> float: ...
    @property
    def k(self) -> int: ...
    @property
    def clients(self) -> int: ...
    @property
    def dropout(self) -> float: ...
    @property
    def noise(self) -> str: ...
    @property
    def accountant(self) -> str | None: ...
    @property
    def neighbouring(self) -> str: ...
    @property
    def rule(self) -> str: ...


class Request(Protocol):
    """What a mode reads of a request: :class:`dphype.protocol.VoteRequest` (the protocol sits above the modes)."""

    @property
    def candidates(self) -> CandidateList: ...
    @property
    def config(self) -> Settings: ...
    @property
    def sigma(self) -> float: ...
    @property
    def tallies(self) -> tuple[bytes, ...]: ...
    @property
    def min_survivors(self) -> int: ...
    def digest(self) -> str: ...


class Aggregator(enum.Enum):
    """Where the clients' ballots go and what comes back: the Flower server dispatches on it.

    ``SECAGG``: DP-Hype's SecAgg+ (:mod:`dphype.secure.secagg`); each client sends an encoded noisy vote vector and
    the server unmasks their exact sum. ``COMMITTEE``: a committee of tally parties (:mod:`dphype.secure.tally`,
    whose public keys the request names); each client seals Shamir shares of its noisy votes to them and they open
    only what the mode releases.
    """

    SECAGG = "SecAgg+"
    COMMITTEE = "tally committee"

    def check_tallies(self, tallies: tuple[bytes, ...], *, known: Collection[bytes] | None = None) -> tuple[bytes, ...]:
        """The request's committee: ``tallies`` checked (:func:`dphype.secure.tally.check_committee`, at least 3
        distinct, within ``known`` when given) for the committee, empty otherwise; ``ValueError`` names the cause."""
        if self is Aggregator.COMMITTEE:
            return check_committee(tallies, known=known)
        if tallies:
            names = " or ".join(repr(name) for name, mode in RELEASE_MODES.items()
                                if mode.aggregator is Aggregator.COMMITTEE)
            raise ValueError(f"tallies must be empty unless release is {names}")
        return ()


@dataclass(frozen=True)
class NodeCost:
    """What one vote costs a node by its own accounting (:meth:`ReleaseMode.node_cost`): the noise kind, the std of
    the summed noise of the fewest allowed contributors, that release's epsilon at the node's delta and relation,
    the accountant that computed it, and ``claim``, the public wording of that epsilon for a refusal."""

    noise: str
    total_std: float
    epsilon: float
    accountant: str
    claim: str


class ReleaseMode(ABC, Generic[BallotT, OpenedT]):
    """One release mode (module docstring): a stateless object; two instances of a class are equal.

    A subclass sets :attr:`name` (registering it in :data:`RELEASE_MODES`), :attr:`aggregator` and
    :attr:`forecast`, and implements the abstract methods. ``BallotT`` is what a client hands the aggregator,
    ``OpenedT`` what the aggregator opens for the server.
    """

    #: The configuration and wire name (``DPHypeConfig.release``, the run config's ``release``, ``--release``).
    name: ClassVar[str]
    #: Where the ballots go (:class:`Aggregator`).
    aggregator: ClassVar[Aggregator]
    #: What the planner simulates of this release.
    forecast: ClassVar[Forecast]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            if cls.name in RELEASE_MODES:
                raise ValueError(f"release mode {cls.name!r} is already registered by {RELEASE_MODES[cls.name]}")
            RELEASE_MODES[cls.name] = cls

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def to_json(self) -> str:
        """The mode as JSON data: its :attr:`name` (:func:`release_mode` reads it back)."""
        return self.name

    # ------------------------------------------------------------------------------------ calibration
    @abstractmethod
    def calibrate(self, config: Settings, candidates: CandidateList) -> float:
        """The request's ``sigma`` for ``config`` over ``candidates`` (Algorithm 1, line 1); ``ValueError`` for what
        the aggregator could not release exactly."""

    # ------------------------------------------------------------------------------------ the request
    def check_request_fields(self, request: Request) -> tuple[bytes, ...]:
        """Validate a request's fields for this mode (``ValueError``): its tallies for the :attr:`aggregator`,
        then ``sigma`` and ``k`` (:meth:`check_sigma`); returns the tallies as the request keeps them."""
        tallies = self.aggregator.check_tallies(request.tallies)
        self.check_sigma(request)
        return tallies

    @abstractmethod
    def check_sigma(self, request: Request) -> None:
        """``ValueError`` for a ``sigma`` (or ``k``) this mode's request cannot carry."""

    @abstractmethod
    def accounting(self, request: Request) -> VoteRelease | WinnerRelease:
        """The release ``request`` describes, for the accountants (:mod:`dphype.privacy`)."""

    @abstractmethod
    def check_claims(self, request: Request) -> None:
        """A client's check that the request's noise gives the announced budget and that an honest server sends it
        (:class:`dphype.refusal.Refusal`: ``noise_too_small``, ``malformed_request``); called by
        :func:`dphype.protocol.check_request`."""

    # --------------------------------------------------------------------------------------- the node
    @abstractmethod
    def announced_epsilon(self, request: Request) -> float | None:
        """The announced epsilon a node holds against its limit before it recomputes the cost (``None``: only the
        recomputed :meth:`node_cost` counts)."""

    @abstractmethod
    def node_cost(self, request: Request, *, survivors: int, delta: float, accountant: str,
                  neighbouring: str) -> NodeCost:
        """What one vote costs the node when only ``survivors`` (the fewest allowed) contribute, recomputed with the
        node's own ``delta``, ``accountant`` (``"auto"`` or a name) and ``neighbouring`` relation."""

    # ------------------------------------------------------------------------------------- the client
    @abstractmethod
    def ballot(self, request: Request, scores: np.ndarray, *, maximize: bool,
               clipping_range: int | None = None) -> BallotT:
        """What a client hands the :attr:`aggregator`: its top-k votes on ``scores`` plus its noise share from the
        secure generator (no generator can be passed in). ``clipping_range``: the SecAgg+ round's range
        (:func:`dphype.secure.secure_sum.clipping_range_for`), for SecAgg+ modes."""

    # ------------------------------------------------------------------------------------- the server
    @abstractmethod
    def release(self, request: Request, opened: OpenedT, survivors: int) -> DPHypeResult:
        """The server's result from what the aggregator ``opened`` for ``survivors`` contributors, with its privacy
        report; ``ValueError`` for fewer survivors than the request's minimum or an ``opened`` of the wrong shape."""

    @abstractmethod
    def replay(self, request: Request, vote_sum: np.ndarray, *, repetitions: int, rng: np.random.Generator,
               survivors: int | None = None, per_client: bool = False) -> np.ndarray:
        """``repetitions`` draws of what the aggregator would open for the noiseless vote sum ``vote_sum`` of
        ``survivors`` clients (default all) with noise from ``rng`` (one summed draw, or with ``per_client=True``
        one share per client): one :meth:`release` input per row."""

    @abstractmethod
    def describe(self, request: Request) -> str:
        """The request's parameters that apply to this mode, as ``key=value, ...`` (the server's description)."""


def release_mode(name: Any) -> ReleaseMode[Any, Any]:
    """The release mode registered as ``name`` (:data:`RELEASE_MODES`); ``ValueError`` naming the parameter, the
    allowed names and the fix for any other value."""
    mode = RELEASE_MODES.get(name) if isinstance(name, str) else None
    if mode is None:
        raise ValueError(f"release must be one of {', '.join(RELEASE_MODES)}, got {name!r}: set release (the "
                         "configuration's release, --release, or the run config's release) to one of them")
    return mode()


def release_modes() -> tuple[ReleaseMode[Any, Any], ...]:
    """One instance of every registered mode, in :data:`RELEASE_MODES` order (what the planner compares)."""
    return tuple(mode() for mode in RELEASE_MODES.values())


# ------------------------------------------------------------------------------------------------- sum
class SumRelease(ReleaseMode[np.ndarray, np.ndarray]):
    """The paper's release: the noisy vote sum over SecAgg+, then the configured selection rule.

    ``sigma`` is the TOTAL noise std on the released sum, calibrated for ``(epsilon, delta, k)`` with the
    configured noise and accountant; each client adds a share of variance ``sigma^2 / ((1 - xi) n)``
    (:func:`dphype.privacy.noise.client_noise_variance`). Everything after the sum is post-processing.
    """

    name = "sum"
    aggregator = Aggregator.SECAGG
    forecast = Forecast.NOISY_SUM

    def calibrate(self, config: Settings, candidates: CandidateList) -> float:
        """Solve ``sigma`` (:func:`dphype.privacy.accounting.calibrate`) and refuse one whose shares secure
        summation could clip (:func:`dphype.secure.secure_sum.check_range`)."""
        sigma = calibrate_release(config.epsilon, config.delta, config.k, num_candidates=len(candidates),
                                  accountant=config.accountant, noise=config.noise,
                                  neighbouring=config.neighbouring).sigma
        check_range(size=len(candidates), sigma=sigma, clients=config.clients, dropout=config.dropout,
                    noise=config.noise)
        return sigma

    def check_sigma(self, request: Request) -> None:
        _ = self.accounting(request)  # validates sigma and k against the number of candidates

    def accounting(self, request: Request) -> VoteRelease:
        cfg = request.config
        return VoteRelease(k=cfg.k, num_candidates=len(request.candidates), sigma=request.sigma, noise=cfg.noise,
                           neighbouring=cfg.neighbouring)

    def check_claims(self, request: Request) -> None:
        """The client recomputes epsilon from the announced ``sigma`` with the announced accountant
        (``noise_too_small`` above the announced epsilon), and refuses a ``sigma`` beyond :data:`SIGMA_SLACK` times
        the calibrated one (``malformed_request``)."""
        cfg = request.config
        promised = release_epsilon(self.accounting(request), cfg.delta, cfg.accountant)
        if promised > cfg.epsilon * (1.0 + EPSILON_RTOL):
            raise Refusal("noise_too_small", f"sigma={request.sigma:g} gives epsilon={promised:.6g} at "
                          f"delta={cfg.delta:g}, more than the announced epsilon={cfg.epsilon:g}")
        calibrated = calibrate_release(cfg.epsilon, cfg.delta, cfg.k, num_candidates=len(request.candidates),
                                       accountant=cfg.accountant, noise=cfg.noise,
                                       neighbouring=cfg.neighbouring).sigma
        if request.sigma > calibrated * SIGMA_SLACK:
            raise Refusal("malformed_request", f"sigma={request.sigma:g} is far above the {calibrated:.6g} "
                          "calibrated for the announced budget: no honest server sends it")

    def announced_epsilon(self, request: Request) -> float:
        return request.config.epsilon

    def node_cost(self, request: Request, *, survivors: int, delta: float, accountant: str,
                  neighbouring: str) -> NodeCost:
        """``survivors`` shares of variance ``sigma^2 / ((1 - xi) n)`` (Appendix A), accounted at the node's delta
        with its accountant (``"auto"``: the default for the noise kind) and relation."""
        cfg = request.config
        total_std = client_noise_std(request.sigma, cfg.clients, cfg.dropout) * math.sqrt(survivors)
        accountant = resolve_accountant(None if accountant == "auto" else accountant, cfg.noise)
        l2, l1 = vote_sensitivity(cfg.k, neighbouring)
        eps = mechanism_epsilon(l2, l1, total_std, cfg.noise, delta, accountant)
        return NodeCost(noise=cfg.noise, total_std=total_std, epsilon=eps, accountant=accountant,
                        claim=f"the requested noise gives epsilon {eps:.3g} at this node's delta")

    def ballot(self, request: Request, scores: np.ndarray, *, maximize: bool,
               clipping_range: int | None = None) -> np.ndarray:
        """Top-k votes plus this client's noise share (:func:`dphype.privacy.noise.client_noise_share`), encoded for
        exact secure summation (lines 5-10; :func:`dphype.secure.secure_sum.encode`: integers, or the
        ``1/GAUSSIAN_SCALE`` grid for Gaussian noise), refused (``ValueError``), never clipped, beyond the round's
        ``clipping_range``, which SecAgg+ ballots need."""
        if clipping_range is None:
            raise ValueError("clipping_range must be the SecAgg+ round's (dphype.secure.secure_sum.clipping_range_for)")
        cfg = request.config
        votes = top_k_votes(scores, cfg.k, maximize=maximize)
        share = client_noise_share(votes.size, sigma=request.sigma, clients=cfg.clients, dropout=cfg.dropout,
                                   kind=cfg.noise)
        return encode(votes + share, cfg.noise, clipping_range)

    def release(self, request: Request, opened: np.ndarray, survivors: int) -> DPHypeResult:
        """The configured selection rule on the decoded noisy sum (line 12; :mod:`dphype.selection.rules`: the
        argmax, or the structure-aware rule), with the privacy report of the noise actually summed. Refuses fewer
        survivors than :attr:`dphype.protocol.VoteRequest.min_survivors`: their noise would not add up to
        ``sigma``."""
        cfg = request.config
        survivors = check_survivors(survivors, cfg.clients, request.min_survivors)
        total = np.asarray(opened)
        if total.shape != (len(request.candidates),):
            raise ValueError(f"noisy_sum must have shape ({len(request.candidates)},), got {total.shape}")
        report = privacy_report(self.accounting(request), cfg.delta, clients=cfg.clients, dropout=cfg.dropout,
                                survivors=survivors, accountant=cfg.accountant)
        if cfg.noise == "gaussian":
            report = replace(
                report, released=f"{report.released}; Gaussian shares rounded to a 1/{GAUSSIAN_SCALE} grid "
                "before summation, so the guarantee is approximate")
        # the selection rule and its confidence read only the release and public facts (post-processing)
        chosen = select_release(total, report.sigma, space=request.candidates.feature_space(), rule=cfg.rule,
                                clients=survivors, k=cfg.k)
        return DPHypeResult(selected_index=chosen.index, selected=request.candidates[chosen.index], noisy_sum=total,
                            report=report, selection=chosen, candidates=request.candidates)

    def replay(self, request: Request, vote_sum: np.ndarray, *, repetitions: int, rng: np.random.Generator,
               survivors: int | None = None, per_client: bool = False) -> np.ndarray:
        """Noisy sums, float64 ``(repetitions, p)`` (:func:`dphype.privacy.noise.replay_noisy_sums`)."""
        cfg = request.config
        return replay_noisy_sums(vote_sum, sigma=request.sigma, clients=cfg.clients, repetitions=repetitions, rng=rng,
                                 dropout=cfg.dropout, noise=cfg.noise, survivors=survivors, per_client=per_client)

    def describe(self, request: Request) -> str:
        cfg = request.config
        return (f"delta={cfg.delta:g}, k={cfg.k}, clients={cfg.clients}, dropout={cfg.dropout:g}, "
                f"noise={cfg.noise!r}, rule={cfg.rule!r}")


# ---------------------------------------------------------------------------------------------- argmax
class ArgmaxRelease(ReleaseMode[list[bytes], int]):
    """Only the winner's index: report-noisy-max over the vote counts with client-made discrete Laplace noise,
    computed by a tally committee under MPC (:mod:`dphype.privacy.winner`, :mod:`dphype.secure.tally`).

    Pure ``epsilon``-DP with noise independent of ``k``; ``sigma`` is the total discrete Laplace std that
    ``epsilon`` implies (:func:`dphype.privacy.winner.noise_std`, for information: every client derives its noise
    from the announced ``epsilon``). ``delta``, ``noise`` and ``accountant`` concern only the composition with
    other releases, and the selection rule does not apply.
    """

    name = "argmax"
    aggregator = Aggregator.COMMITTEE
    forecast = Forecast.WINNER

    def calibrate(self, config: Settings, candidates: CandidateList) -> float:
        return noise_std(config.epsilon, config.neighbouring)

    def check_sigma(self, request: Request) -> None:
        cfg = request.config
        expected = noise_std(cfg.epsilon, cfg.neighbouring)
        if not abs(request.sigma - expected) <= 1e-9 * expected:
            raise ValueError(f"sigma must be {expected:.12g} (the discrete Laplace std of epsilon), "
                             f"got {request.sigma!r}")
        _ = self.accounting(request)  # validates k against the number of candidates

    def accounting(self, request: Request) -> WinnerRelease:
        cfg = request.config
        return WinnerRelease(epsilon=cfg.epsilon, k=cfg.k, num_candidates=len(request.candidates),
                             neighbouring=cfg.neighbouring)

    def check_claims(self, request: Request) -> None:
        """Nothing to recompute: each client derives its noise from the announced epsilon, so it cannot be asked
        for too little."""

    def announced_epsilon(self, request: Request) -> None:
        """``None``: the noise parameter follows from the announced epsilon and relation, and the node's own relation
        decides what it costs (:meth:`node_cost`)."""
        return None

    def node_cost(self, request: Request, *, survivors: int, delta: float, accountant: str,
                  neighbouring: str) -> NodeCost:
        """Pure ``epsilon_node = -shift log t`` under the node's relation (:data:`THRESHOLD_SHIFT`), whatever its
        delta and accountant; ``total_std`` is the request's ``sigma`` (the fewest contributors' noise)."""
        cfg = request.config
        eps = -THRESHOLD_SHIFT[neighbouring] * math.log(noise_parameter(cfg.epsilon, cfg.neighbouring))
        return NodeCost(noise=WINNER_NOISE, total_std=request.sigma, epsilon=eps, accountant="pure epsilon",
                        claim=f"the requested winner release gives pure epsilon {eps:.3g}")

    def ballot(self, request: Request, scores: np.ndarray, *, maximize: bool,
               clipping_range: int | None = None) -> list[bytes]:
        """Top-k votes plus this client's discrete Laplace share
        (:func:`dphype.privacy.winner.client_winner_share`), split into Shamir shares and sealed, one ciphertext
        per tally in committee order (:func:`dphype.secure.tally.client_sealed_shares`, bound to the request's
        digest). ``clipping_range`` does not apply."""
        cfg = request.config
        votes = top_k_votes(scores, cfg.k, maximize=maximize).astype(np.int64)
        share = client_winner_share(votes.size, epsilon=cfg.epsilon, neighbouring=cfg.neighbouring,
                                    clients=cfg.clients, dropout=cfg.dropout)
        return client_sealed_shares(request.digest(), votes + share, request.tallies)

    def release(self, request: Request, opened: int, survivors: int) -> DPHypeResult:
        """The server's record of the index the tallies opened; refuses an index outside the candidate list."""
        cfg = request.config
        report = winner_report(self.accounting(request), cfg.delta, clients=cfg.clients, dropout=cfg.dropout,
                               survivors=survivors, committee=len(request.tallies))
        if not 0 <= opened < len(request.candidates):
            raise ValueError(f"index must be in [0, {len(request.candidates) - 1}], got {opened}")
        return DPHypeResult(selected_index=int(opened), selected=request.candidates[opened], noisy_sum=None,
                            report=report, selection=None, candidates=request.candidates)

    def replay(self, request: Request, vote_sum: np.ndarray, *, repetitions: int, rng: np.random.Generator,
               survivors: int | None = None, per_client: bool = False) -> np.ndarray:
        """Winning indices, int64 ``(repetitions,)`` (:func:`dphype.privacy.winner.replay_winners`)."""
        cfg = request.config
        return replay_winners(vote_sum, epsilon=cfg.epsilon, neighbouring=cfg.neighbouring, clients=cfg.clients,
                              repetitions=repetitions, rng=rng, dropout=cfg.dropout, survivors=survivors,
                              per_client=per_client)

    def describe(self, request: Request) -> str:
        # pure epsilon, discrete Laplace: no delta, noise kind or rule applies
        cfg = request.config
        return (f"k={cfg.k}, clients={cfg.clients}, dropout={cfg.dropout:g}, neighbouring={cfg.neighbouring!r}, "
                f"tallies={len(request.tallies)}")
