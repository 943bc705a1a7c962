"""The release-mode interface: what every mode answers, its registry, and the types it reads.

A release mode decides what the server learns from the clients' ballots (Algorithm 1 and its variants).
`ReleaseMode` is what the rest of the package calls, in the order of a run:

* description -- class data read instead of the mode's name: `ReleaseMode.uses_committee`, `ReleaseMode.opens`,
  `ReleaseMode.forecast`, `ReleaseMode.noise_inflation`, `ReleaseMode.integer_noise`, `ReleaseMode.default_ballot`,
  `ReleaseMode.graded_ballots`, `ReleaseMode.supernodes`;
* calibration -- `ReleaseMode.calibrate`: the request's noise std ``sigma`` (Algorithm 1, line 1);
* request -- `ReleaseMode.check_request_fields`, `ReleaseMode.accounting` (the release as the accountants describe
  it) and `ReleaseMode.check_claims` (a client's check that the noise gives the announced budget);
* node -- `ReleaseMode.announced_epsilon` and `ReleaseMode.node_cost` (what `dphype.node.policy` limits and records);
* client -- `ReleaseMode.ballot`; server -- `ReleaseMode.release`: the result with its privacy report;
* replays -- `ReleaseMode.replay`: what the aggregator would open, from a seeded generator (benchmarks);
* wording -- `ReleaseMode.describe`; a mode travels as its `ReleaseMode.name`.

The accounting methods default to the noisy vote sum's. A subclass that sets ``name`` registers itself in
`RELEASE_MODES`; `release_mode` refuses any other name. The modes read a configuration and a request through the
structural types `ReleaseConfig` and `ReleaseRequest` (`dphype.config.ReleaseConfig`, `dphype.protocol.ReleaseRequest`
have them), so the package sits below both. No Flower import here.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from dphype.checks import EPSILON_RTOL
from dphype.privacy.accounting import PrivacyReport, VoteEvent, mechanism_epsilon, vote_sensitivity
from dphype.privacy.accounting import calibrate as calibrate_release
from dphype.privacy.accounting import epsilon as release_epsilon
from dphype.privacy.noise import min_survivors
from dphype.privacy.noise_kinds import noise_kind, noise_kind_names, resolve_accountant
from dphype.privacy.winner import WinnerEvent, noise_std
from dphype.refusal import Refusal
from dphype.registry import Registry
from dphype.result import DPHypeResult
from dphype.secure.committee import COMMITTEE_SIZE, check_committee
from dphype.selection.ballots import BallotForm
from dphype.selection.candidates import CandidateList
from dphype.selection.planner import Forecast
from dphype.selection.rules import select_release
from dphype.selection.voting import Ballot, check_ballot

#: Largest ratio of an announced sigma to the calibrated one that a client accepts (an honest server sends the
#: calibrated sigma).
SIGMA_SLACK = 1.001

#: Every release mode by its configuration name (``ReleaseConfig.release``), in the order they were registered (the
#: planner's recommendation goes to the first of tied modes).
RELEASE_MODES: Registry[type[ReleaseMode[Any, Any]]] = Registry(
    "release", "release mode", "set release (the configuration's release, --release, or the run config's release) to "
    "one of them")

BallotT = TypeVar("BallotT")
OpenedT = TypeVar("OpenedT")


class ReleaseConfig(Protocol):
    """The configuration fields a mode reads (`dphype.config.ReleaseConfig` has them)."""

    @property
    def epsilon(self) -> float: ...  # noqa: D102
    @property
    def delta(self) -> float: ...  # noqa: D102
    @property
    def k(self) -> int: ...  # noqa: D102
    @property
    def noise(self) -> str: ...  # noqa: D102
    @property
    def accountant(self) -> str | None: ...  # noqa: D102
    @property
    def neighbouring(self) -> str: ...  # noqa: D102
    @property
    def clients(self) -> int: ...  # noqa: D102
    @property
    def dropout(self) -> float: ...  # noqa: D102
    @property
    def ballot(self) -> str | None: ...  # noqa: D102
    @property
    def rule(self) -> str: ...  # noqa: D102


class ReleaseRequest(Protocol):
    """The vote request's fields a mode reads (`dphype.protocol.ReleaseRequest` has them)."""

    @property
    def candidates(self) -> CandidateList: ...  # noqa: D102
    @property
    def config(self) -> ReleaseConfig: ...  # noqa: D102
    @property
    def sigma(self) -> float: ...  # noqa: D102
    @property
    def tallies(self) -> tuple[bytes, ...]: ...  # noqa: D102
    @property
    def min_survivors(self) -> int: ...  # noqa: D102
    @property
    def min_valid(self) -> int: ...  # noqa: D102
    def digest(self) -> str: ...  # noqa: D102


class Aggregator(enum.Enum):
    """Where the clients' ballots go and what comes back: the Flower server dispatches on it.

    Attributes:
        SECAGG: DP-Hype's SecAgg+ (`dphype.secure.secagg`): the server unmasks the exact (unverified) sum of the
            encoded noisy vote vectors.
        COMMITTEE: Tally parties (`dphype.secure.committee`) receive sealed Shamir shares, check every ballot, add the
            committee's noise and open only what the mode releases.
    """

    SECAGG = "SecAgg+"
    COMMITTEE = "tally committee"

    def check_tallies(self, tallies: tuple[bytes, ...], *, known: Collection[bytes] | None = None) -> tuple[bytes, ...]:
        """The request's committee: ``tallies`` checked for the committee, empty otherwise.

        Args:
            tallies: The request's tally keys.
            known: The only keys a committee may use (a node's pinned tallies); ``None``: any.

        Returns:
            The committee (`dphype.secure.committee.check_committee`), or ``()`` for SecAgg+.

        Raises:
            ValueError: If the committee is invalid, or SecAgg+ is given tallies.
        """
        if self is Aggregator.COMMITTEE:
            return check_committee(tallies, known=known)
        if tallies:
            raise ValueError(f"tallies must be empty unless release is one of the committee releases "
                             f"({committee_releases()})")
        return ()


@dataclass(frozen=True)
class NodeCost:
    """What one vote costs a node by its own accounting (`ReleaseMode.node_cost`).

    Attributes:
        noise: The noise kind.
        total_std: The std of the summed noise of the fewest allowed contributors.
        epsilon: That release's epsilon at the node's delta and relation.
        accountant: The accountant that computed it.
        claim: The public wording of that epsilon for a refusal.
    """

    noise: str
    total_std: float
    epsilon: float
    accountant: str
    claim: str


class ReleaseMode(ABC, Generic[BallotT, OpenedT]):
    """One release mode (module docstring): stateless; two instances of a class are equal.

    The defaults are the noisy vote sum's (`VoteEvent`): a subclass sets `name`, `aggregator` and `forecast`,
    implements the abstract methods and overrides the accounting of another release. ``BallotT`` is what a client hands
    the aggregator, ``OpenedT`` what the aggregator opens for the server.
    """

    #: The configuration and wire name (``ReleaseConfig.release``, the run config's ``release``, ``--release``).
    name: ClassVar[str]
    #: What the server learns, in words (the commands' help).
    released: ClassVar[str]
    #: Where the ballots go (`Aggregator`).
    aggregator: ClassVar[Aggregator]
    #: Whether a tally committee aggregates: its nodes are found, its keys travel in the request (`supernodes`).
    uses_committee: ClassVar[bool] = False
    #: What the committee opens (`dphype.secure.committee.OPENS_ARGMAX` or
    #: `dphype.secure.committee.OPENS_SUM`); ``None`` for SecAgg+, which opens the exact sum of what the clients send.
    opens: ClassVar[str | None] = None
    #: What the planner simulates of this release.
    forecast: ClassVar[Forecast]
    #: The released noise's std over the calibrated ``sigma``.
    noise_inflation: ClassVar[float] = 1.0
    #: Whether the noise must be of an integer kind (an MPC adds it exactly).
    integer_noise: ClassVar[bool] = False
    #: The ballot a configuration of this mode gets unless it names one (``ReleaseConfig.ballot``).
    default_ballot: ClassVar[str] = "top-k"
    #: Whether the mode takes graded ballots; else only ``"top-k"``.
    graded_ballots: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            RELEASE_MODES.add(cls.name, cls)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def supernodes(self, clients: int, tallies: int = COMMITTEE_SIZE) -> int:
        """The nodes a federation of ``clients`` needs for this mode: the clients, plus ``tallies`` for a committee."""
        return clients + (tallies if self.uses_committee else 0)

    def check_ballot(self, ballot: Any) -> str:
        """The configuration's ballot for this mode: `default_ballot` for ``None`` or ``"default"``, else checked.

        Args:
            ballot: The ballot's name (`dphype.selection.voting.Ballot`), ``None`` or ``"default"``.

        Returns:
            The canonical name.

        Raises:
            ValueError: For an unknown name, or a graded ballot for a mode that takes only top-k.
        """
        name = check_ballot(self.default_ballot if ballot is None or ballot == "default" else ballot)
        if Ballot.parse(name).graded and not self.graded_ballots:
            raise ValueError(
                f"ballot must be 'top-k' for release={self.name!r}, got {name!r}: set ballot='top-k' or release="
                + " or ".join(repr(n) for n, m in RELEASE_MODES.items() if m.graded_ballots)
                + "\nIts noise hides a whole ballot (l2 sensitivity sqrt(2k) for top-k), which a graded ballot raises "
                "as much as its counts, and the share and auto ballots' k were fitted for the winner release.")
        return name

    def resolved_ballot(self, config: ReleaseConfig, num_candidates: int | None = None) -> Ballot:
        """The configured ballot, a ``"share"`` or ``"auto"`` one resolved to its ``k`` (`Ballot.resolve`).

        The rules read public facts only: ``p``, the std of the release's discrete Laplace noise for a top-k ballot
        (`dphype.privacy.winner.noise_std`) and the fewest voters ``ceil((1 - xi) n)``.

        Args:
            config: The request's configuration.
            num_candidates: ``p``; required for a share or auto ballot.

        Returns:
            The ballot.

        Raises:
            ValueError: For a share or auto ballot without ``num_candidates``.
        """
        ballot = Ballot.parse(config.ballot)
        if not ballot.from_public_facts:
            return ballot
        if num_candidates is None:
            raise ValueError(f"a {ballot.kind} ballot's form needs the number of candidates: pass num_candidates")
        return ballot.resolve(num_candidates, noise_std(config.epsilon, config.neighbouring),
                              min_survivors(config.clients, config.dropout))

    def votes_per_client(self, config: ReleaseConfig, num_candidates: int) -> int:
        """The ``k`` of the ballot: a rank ballot's depth (cut to ``p``), an auto ballot's, else the config's."""
        ballot = self.resolved_ballot(config, num_candidates)
        return min(ballot.depth, int(num_candidates)) if ballot.kind == "rank" else config.k

    def sensitivity(self, config: ReleaseConfig) -> int:
        """The ballot's largest entry ``G`` (l-infinity sensitivity): 1 for top-k and auto, ``2**bits - 1`` graded."""
        return Ballot.parse(config.ballot).max_entry

    def ballot_form(self, config: ReleaseConfig, num_candidates: int | None = None) -> BallotForm:
        """The form every client's ballot must have under ``config`` (`dphype.selection.ballots`).

        Every node and tally derives it from the approved request here.

        Args:
            config: The request's configuration.
            num_candidates: ``p`` when known (a score ballot's largest total is ``p G``, a rank ballot's depth is cut to
                ``p``); required for an auto ballot.

        Returns:
            The configured ballot's form (`dphype.selection.voting.Ballot.form`).

        Raises:
            ValueError: For an auto ballot without ``num_candidates``.
        """  # noqa: DOC502
        return self.resolved_ballot(config, num_candidates).form(config.k, num_candidates)

    # ------------------------------------------------------------------------------------ calibration
    def calibrate(self, config: ReleaseConfig, candidates: CandidateList) -> float:
        """The request's ``sigma`` for ``config`` over ``candidates`` (Algorithm 1, line 1): the vote sum's by default.

        Args:
            config: The configuration.
            candidates: The public candidate list.

        Returns:
            The noise std ``sigma`` (`dphype.privacy.accounting.calibrate`).

        Raises:
            ValueError: If the budget is invalid, or the noise kind is one the mode cannot add (`integer_noise`).
        """  # noqa: DOC502
        self._check_noise(config.noise)
        return calibrate_release(config.epsilon, config.delta, config.k, num_candidates=len(candidates),
                                 accountant=config.accountant, noise=config.noise,
                                 neighbouring=config.neighbouring).sigma

    def _check_noise(self, noise: str) -> None:
        """Refuse a real noise kind for a mode whose noise an MPC adds as integers (`integer_noise`)."""
        if self.integer_noise and not noise_kind(noise).integer:
            integer = noise_kind_names(integer=True)
            raise ValueError(f"release={self.name!r} adds integer noise: noise must be "
                             f"{' or '.join(map(repr, integer))}, got {noise!r} (--noise {integer[0]})")

    # ------------------------------------------------------------------------------------ the request
    def check_request_fields(self, request: ReleaseRequest) -> tuple[bytes, ...]:
        """Validate a request's tallies for the `aggregator` and its ``sigma`` and ``k``; return the tallies."""
        tallies = self.aggregator.check_tallies(request.tallies)
        self.check_sigma(request)
        return tallies

    def check_sigma(self, request: ReleaseRequest) -> None:
        """Refuse a noise kind the mode cannot add, a non-positive ``sigma`` or a ``k`` outside ``[1, p]``."""
        self._check_noise(request.config.noise)
        _ = self.accounting(request)  # validates sigma and k against the number of candidates

    def accounting(self, request: ReleaseRequest) -> VoteEvent | WinnerEvent:
        """The release ``request`` describes, for the accountants (`dphype.privacy`): the noisy vote sum by default."""
        return vote_event(request)

    def check_claims(self, request: ReleaseRequest) -> None:
        """A client's check that the request's noise gives the announced budget and that an honest server sends it.

        By default the client recomputes epsilon from the announced ``sigma`` with the announced accountant.

        Args:
            request: The request.

        Raises:
            Refusal: ``noise_too_small`` above the announced epsilon; ``malformed_request`` for a ``sigma`` beyond
                `SIGMA_SLACK` times the calibrated one.
        """
        cfg = request.config
        calibrated = calibrate_release(cfg.epsilon, cfg.delta, cfg.k, num_candidates=len(request.candidates),
                                       accountant=cfg.accountant, noise=cfg.noise,
                                       neighbouring=cfg.neighbouring).sigma
        if request.sigma > calibrated * SIGMA_SLACK:  # first: the accountants are not asked about absurd noise
            raise Refusal("malformed_request", f"sigma={request.sigma:g} is far above the {calibrated:.6g} "
                          "calibrated for the announced budget: no honest server sends it")
        try:
            promised = release_epsilon(vote_event(request), cfg.delta, cfg.accountant)
        except (ArithmeticError, ValueError):  # a sigma so small that the accountant's arithmetic breaks down
            promised = math.inf
        if not promised <= cfg.epsilon * (1.0 + EPSILON_RTOL):
            raise Refusal("noise_too_small", f"sigma={request.sigma:g} gives epsilon={promised:.6g} at "
                          f"delta={cfg.delta:g}, more than the announced epsilon={cfg.epsilon:g}")

    # --------------------------------------------------------------------------------------- the node
    def announced_epsilon(self, request: ReleaseRequest) -> float | None:
        """The announced epsilon a node holds against its limit, or ``None``: only `node_cost` counts."""
        return request.config.epsilon

    @abstractmethod
    def node_cost(self, request: ReleaseRequest, *, survivors: int, delta: float, accountant: str,
                  neighbouring: str) -> NodeCost:
        """What one vote costs the node when only ``survivors`` contribute, recomputed the node's way.

        Args:
            request: The request.
            survivors: The fewest allowed contributors.
            delta: The node's delta.
            accountant: The node's accountant, ``"auto"`` (the noise kind's default) or a name.
            neighbouring: The node's neighbouring relation.

        Returns:
            The cost.
        """

    # ------------------------------------------------------------------------------------- the client
    @abstractmethod
    def ballot(self, request: ReleaseRequest, scores: np.ndarray, *, maximize: bool,
               clipping_range: int | None = None, voter: str | None = None) -> BallotT:
        """What a client hands the `aggregator`: its votes on ``scores``, plus its noise share where it adds one.

        A share comes from the secure generator (no generator can be passed in).

        Args:
            request: The approved request.
            scores: The client's scores, ``(p,)`` or ``(p, j)``.
            maximize: Whether a higher score is better.
            clipping_range: The SecAgg+ round's range (`dphype.secure.secure_sum.clipping_range_for`), SecAgg+ modes.
            voter: The client's identity in its run (`dphype.secure.committee.voter_id`), committee modes.

        Returns:
            The ballot.
        """

    # ------------------------------------------------------------------------------------- the server
    @abstractmethod
    def release(self, request: ReleaseRequest, opened: OpenedT, survivors: int) -> DPHypeResult:
        """The server's result from what the aggregator ``opened`` for ``survivors`` contributors.

        Args:
            request: The request.
            opened: What the aggregator opened.
            survivors: The number of contributors.

        Returns:
            The result, with its privacy report.

        Raises:
            ValueError: For fewer survivors than the request's minimum, or an ``opened`` of the wrong shape.
        """  # noqa: DOC502

    @abstractmethod
    def replay(self, request: ReleaseRequest, vote_sum: np.ndarray, *, repetitions: int, rng: np.random.Generator,
               survivors: int | None = None, per_client: bool = False) -> np.ndarray:
        """``repetitions`` draws of what the aggregator would open for the noiseless vote sum ``vote_sum``.

        Args:
            request: The request.
            vote_sum: The noiseless vote sum, ``(p,)``.
            repetitions: The number of draws.
            rng: The generator of the noise.
            survivors: The number of contributing clients (default all).
            per_client: One noise share per client (or tally) instead of one summed draw.

        Returns:
            One `release` input per row.
        """

    @abstractmethod
    def describe(self, request: ReleaseRequest) -> str:
        """The request's parameters that apply to this mode, as ``key=value, ...``."""


def release_mode(name: Any) -> ReleaseMode[Any, Any]:
    """An instance of the mode registered as ``name`` (`RELEASE_MODES`); any other value is refused, naming them."""
    return RELEASE_MODES.get(name)()


def committee_releases() -> str:
    """The names of the registered modes a tally committee aggregates, comma-separated (for messages)."""
    return ", ".join(mode.name for mode in RELEASE_MODES if mode.uses_committee)


def release_modes() -> tuple[ReleaseMode[Any, Any], ...]:
    """One instance of every registered mode, in `RELEASE_MODES` order."""
    return tuple(mode() for mode in RELEASE_MODES)


def vote_cost(request: ReleaseRequest, total_std: float, *, delta: float, accountant: str,
              neighbouring: str) -> NodeCost:
    """What a noisy vote sum with noise of std ``total_std`` costs a node (arguments of `ReleaseMode.node_cost`)."""
    cfg = request.config
    accountant = resolve_accountant(None if accountant == "auto" else accountant, cfg.noise)
    l2, l1 = vote_sensitivity(cfg.k, neighbouring)
    eps = mechanism_epsilon(l2, l1, total_std, cfg.noise, delta, accountant)
    return NodeCost(noise=cfg.noise, total_std=total_std, epsilon=eps, accountant=accountant,
                    claim=f"the requested noise gives epsilon {eps:.3g} at this node's delta")


def vote_event(request: ReleaseRequest) -> VoteEvent:
    """The noisy vote sum ``request`` describes."""
    cfg = request.config
    return VoteEvent(k=cfg.k, num_candidates=len(request.candidates), sigma=request.sigma, noise=cfg.noise,
                       neighbouring=cfg.neighbouring)


def noisy_sum_of(request: ReleaseRequest, opened: Any) -> np.ndarray:
    """The opened noisy vote sum as an array, refused unless it has one entry per candidate."""
    total = np.asarray(opened)
    if total.shape != (len(request.candidates),):
        raise ValueError(f"noisy_sum must have shape ({len(request.candidates)},), got {total.shape}")
    return total


def vote_sum_words(request: ReleaseRequest) -> str:
    """A noisy vote sum's parameters as ``key=value, ...``."""
    cfg = request.config
    return (f"delta={cfg.delta:g}, k={cfg.k}, clients={cfg.clients}, dropout={cfg.dropout:g}, "
            f"noise={cfg.noise!r}, rule={cfg.rule!r}")


def rule_result(request: ReleaseRequest, total: np.ndarray, report: PrivacyReport, noise_std: float,
                 clients: int) -> DPHypeResult:
    """The configured rule on a released noisy sum (post-processing); ``noise_std`` is its whole noise's std."""
    cfg = request.config
    chosen = select_release(total, noise_std, space=request.candidates.feature_space(), rule=cfg.rule,
                            clients=clients, k=cfg.k)
    return DPHypeResult(selected_index=chosen.index, selected=request.candidates[chosen.index], noisy_sum=total,
                        report=report, selection=chosen, candidates=request.candidates)

