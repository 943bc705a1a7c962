"""Release modes: what the server learns from the clients' votes, one class per mode behind one interface.

DP-Hype's clients vote top-k on a public candidate list and add noise shares; a release mode decides the rest
(Algorithm 1 and its variants). `ReleaseMode` is what the rest of the package calls, in the order of a run:

* description -- class data read instead of the mode's name: `ReleaseMode.aggregator` (SecAgg+ or a tally
  committee), `ReleaseMode.opens`, `ReleaseMode.forecast`, `ReleaseMode.noise_inflation`,
  `ReleaseMode.integer_noise`, `ReleaseMode.default_ballot`, `ReleaseMode.graded_ballots`;
* calibration -- `ReleaseMode.calibrate`: the request's noise std ``sigma`` (Algorithm 1, line 1);
* request -- `ReleaseMode.check_request_fields`, `ReleaseMode.accounting` (the release as the accountants describe
  it) and `ReleaseMode.check_claims` (a client's check that the noise gives the announced budget);
* node -- `ReleaseMode.announced_epsilon` and `ReleaseMode.node_cost` (what `dphype.node.policy` limits and records);
* client -- `ReleaseMode.ballot` (SecAgg+ sums encoded vectors; a committee receives sealed Shamir shares);
* server -- `ReleaseMode.release`: the result with its privacy report;
* replays -- `ReleaseMode.replay`: what the aggregator would open, from a seeded generator (benchmarks);
* wording -- `ReleaseMode.describe`; a mode travels as its `ReleaseMode.name`.

The accounting methods default to the noisy vote sum's. The modes: `SumRelease` (``"sum"``, the paper's: the noisy
vote sum over SecAgg+, picked by the selection rule), `ArgmaxRelease` (``"argmax"``: only the winner's index, a
secure argmax among tally parties, `dphype.privacy.winner`) and `CommitteeSumRelease` (``"committee-sum"``: the
noisy vote sum of the ballots a tally committee verified, with noise the tallies make). A subclass that sets
``name`` registers itself in `RELEASE_MODES`; `release_mode` refuses any other name.

The modes sit below the configuration and the protocol: they name `dphype.config.DPHypeConfig` and
`dphype.protocol.VoteRequest` in annotations only. No Flower import here.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from dphype.checks import EPSILON_RTOL, check_k
from dphype.privacy.accounting import PrivacyReport, VoteRelease, mechanism_epsilon, privacy_report, vote_sensitivity
from dphype.privacy.accounting import calibrate as calibrate_release
from dphype.privacy.accounting import epsilon as release_epsilon
from dphype.privacy.noise import (
    COMMITTEE_TALLIES,
    check_survivors,
    client_noise_share,
    client_noise_std,
    committee_noise_share,
    committee_sum_std,
    honest_tallies,
    min_survivors,
    replay_committee_sums,
    replay_noisy_sums,
    secure_generator,
)
from dphype.privacy.noise_kinds import noise_kind, noise_kind_names, resolve_accountant
from dphype.privacy.winner import (
    THRESHOLD_SHIFT,
    WINNER_NOISE,
    JointSampler,
    WinnerRelease,
    noise_parameter,
    noise_std,
    replay_winners,
    sampler_delta,
    winner_report,
)
from dphype.refusal import Refusal
from dphype.registry import Registry
from dphype.result import DPHypeResult
from dphype.secure.committee import OPENS_ARGMAX, OPENS_SUM, Opening, check_committee, client_sealed_shares
from dphype.secure.secure_sum import check_range, encode
from dphype.selection.ballots import BallotForm
from dphype.selection.planner import Forecast
from dphype.selection.rules import select_release
from dphype.selection.voting import Ballot, check_ballot

if TYPE_CHECKING:
    from dphype.config import DPHypeConfig
    from dphype.protocol import VoteRequest
    from dphype.selection.candidates import CandidateList

#: Largest ratio of an announced sigma to the calibrated one that a client accepts (an honest server sends the
#: calibrated sigma).
SIGMA_SLACK = 1.001

#: The argmax release's ballot unless the configuration names one (docs/ballots.md).
DEFAULT_ARGMAX_BALLOT = "auto"

#: Every release mode by its configuration name (``DPHypeConfig.release``), in the order they were defined (the
#: planner's recommendation goes to the first of tied modes).
RELEASE_MODES: Registry[type[ReleaseMode[Any, Any]]] = Registry(
    "release", "release mode", "set release (the configuration's release, --release, or the run config's release) to "
    "one of them")

BallotT = TypeVar("BallotT")
OpenedT = TypeVar("OpenedT")


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
                             f"({Aggregator.COMMITTEE.releases()})")
        return ()

    def releases(self) -> str:
        """The names of the registered release modes with this aggregator, comma-separated."""
        return ", ".join(mode.name for mode in RELEASE_MODES if mode.aggregator is self)


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

    The defaults are the noisy vote sum's (`VoteRelease`): a subclass sets `name`, `aggregator` and `forecast`,
    implements the abstract methods and overrides the accounting of another release. ``BallotT`` is what a client hands
    the aggregator, ``OpenedT`` what the aggregator opens for the server.
    """

    #: The configuration and wire name (``DPHypeConfig.release``, the run config's ``release``, ``--release``).
    name: ClassVar[str]
    #: What the server learns, in words (the commands' help).
    released: ClassVar[str]
    #: Where the ballots go (`Aggregator`).
    aggregator: ClassVar[Aggregator]
    #: What the committee opens (`dphype.secure.committee.OPENS_ARGMAX` or
    #: `dphype.secure.committee.OPENS_SUM`); ``None`` for SecAgg+, which opens the exact sum of what the clients send.
    opens: ClassVar[str | None] = None
    #: What the planner simulates of this release.
    forecast: ClassVar[Forecast]
    #: The released noise's std over the calibrated ``sigma``.
    noise_inflation: ClassVar[float] = 1.0
    #: Whether the noise must be of an integer kind (an MPC adds it exactly).
    integer_noise: ClassVar[bool] = False
    #: The ballot a configuration of this mode gets unless it names one (``DPHypeConfig.ballot``).
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
                f"ballot must be 'top-k' for release={self.name!r}, got {name!r}: its noise hides a whole ballot (l2 "
                "sensitivity sqrt(2k) for top-k), which a graded ballot raises as much as its counts, and the share "
                "and auto ballots' k were fitted for the winner release; set ballot='top-k' (or leave it unset) or "
                "release to a mode that takes these ballots ("
                + ", ".join(repr(n) for n, m in RELEASE_MODES.items() if m.graded_ballots) + ")")
        return name

    def resolved_ballot(self, config: DPHypeConfig, num_candidates: int | None = None) -> Ballot:
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

    def votes_per_client(self, config: DPHypeConfig, num_candidates: int) -> int:
        """The ``k`` of the ballot: a rank ballot's depth (cut to ``p``), an auto ballot's, else the config's."""
        ballot = self.resolved_ballot(config, num_candidates)
        return min(ballot.depth, int(num_candidates)) if ballot.kind == "rank" else config.k

    def sensitivity(self, config: DPHypeConfig) -> int:
        """The ballot's largest entry ``G`` (l-infinity sensitivity): 1 for top-k and auto, ``2**bits - 1`` graded."""
        return Ballot.parse(config.ballot).max_entry

    def ballot_form(self, config: DPHypeConfig, num_candidates: int | None = None) -> BallotForm:
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
    def calibrate(self, config: DPHypeConfig, candidates: CandidateList) -> float:
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
            raise ValueError(f"release={self.name!r} adds integer noise under MPC: noise must be "
                             f"{' or '.join(map(repr, integer))}, got {noise!r}; set noise={integer[0]!r} "
                             f"(--noise {integer[0]})")

    # ------------------------------------------------------------------------------------ the request
    def check_request_fields(self, request: VoteRequest) -> tuple[bytes, ...]:
        """Validate a request's tallies for the `aggregator` and its ``sigma`` and ``k``; return the tallies."""
        tallies = self.aggregator.check_tallies(request.tallies)
        self.check_sigma(request)
        return tallies

    def check_sigma(self, request: VoteRequest) -> None:
        """Refuse a noise kind the mode cannot add, a non-positive ``sigma`` or a ``k`` outside ``[1, p]``."""
        self._check_noise(request.config.noise)
        _ = self.accounting(request)  # validates sigma and k against the number of candidates

    def accounting(self, request: VoteRequest) -> VoteRelease | WinnerRelease:
        """The release ``request`` describes, for the accountants (`dphype.privacy`): the noisy vote sum by default."""
        return vote_release(request)

    def check_claims(self, request: VoteRequest) -> None:
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
            promised = release_epsilon(vote_release(request), cfg.delta, cfg.accountant)
        except (ArithmeticError, ValueError):  # a sigma so small that the accountant's arithmetic breaks down
            promised = math.inf
        if not promised <= cfg.epsilon * (1.0 + EPSILON_RTOL):
            raise Refusal("noise_too_small", f"sigma={request.sigma:g} gives epsilon={promised:.6g} at "
                          f"delta={cfg.delta:g}, more than the announced epsilon={cfg.epsilon:g}")

    # --------------------------------------------------------------------------------------- the node
    def announced_epsilon(self, request: VoteRequest) -> float | None:
        """The announced epsilon a node holds against its limit, or ``None``: only `node_cost` counts."""
        return request.config.epsilon

    @abstractmethod
    def node_cost(self, request: VoteRequest, *, survivors: int, delta: float, accountant: str,
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
    def ballot(self, request: VoteRequest, scores: np.ndarray, *, maximize: bool,
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
    def release(self, request: VoteRequest, opened: OpenedT, survivors: int) -> DPHypeResult:
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
    def replay(self, request: VoteRequest, vote_sum: np.ndarray, *, repetitions: int, rng: np.random.Generator,
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
    def describe(self, request: VoteRequest) -> str:
        """The request's parameters that apply to this mode, as ``key=value, ...``."""


def release_mode(name: Any) -> ReleaseMode[Any, Any]:
    """An instance of the mode registered as ``name`` (`RELEASE_MODES`); any other value is refused, naming them."""
    return RELEASE_MODES.get(name)()


def release_modes() -> tuple[ReleaseMode[Any, Any], ...]:
    """One instance of every registered mode, in `RELEASE_MODES` order."""
    return tuple(mode() for mode in RELEASE_MODES)


def vote_cost(request: VoteRequest, total_std: float, *, delta: float, accountant: str, neighbouring: str) -> NodeCost:
    """What a noisy vote sum with noise of std ``total_std`` costs a node (arguments of `ReleaseMode.node_cost`)."""
    cfg = request.config
    accountant = resolve_accountant(None if accountant == "auto" else accountant, cfg.noise)
    l2, l1 = vote_sensitivity(cfg.k, neighbouring)
    eps = mechanism_epsilon(l2, l1, total_std, cfg.noise, delta, accountant)
    return NodeCost(noise=cfg.noise, total_std=total_std, epsilon=eps, accountant=accountant,
                    claim=f"the requested noise gives epsilon {eps:.3g} at this node's delta")


def vote_release(request: VoteRequest) -> VoteRelease:
    """The noisy vote sum ``request`` describes."""
    cfg = request.config
    return VoteRelease(k=cfg.k, num_candidates=len(request.candidates), sigma=request.sigma, noise=cfg.noise,
                       neighbouring=cfg.neighbouring)


# ------------------------------------------------------------------------------------------------- sum
def _noisy_sum(request: VoteRequest, opened: Any) -> np.ndarray:
    """The opened noisy vote sum as an array, refused unless it has one entry per candidate."""
    total = np.asarray(opened)
    if total.shape != (len(request.candidates),):
        raise ValueError(f"noisy_sum must have shape ({len(request.candidates)},), got {total.shape}")
    return total


def _vote_sum_words(request: VoteRequest) -> str:
    """A noisy vote sum's parameters as ``key=value, ...``."""
    cfg = request.config
    return (f"delta={cfg.delta:g}, k={cfg.k}, clients={cfg.clients}, dropout={cfg.dropout:g}, "
            f"noise={cfg.noise!r}, rule={cfg.rule!r}")


def _rule_result(request: VoteRequest, total: np.ndarray, report: PrivacyReport, noise_std: float,
                 clients: int) -> DPHypeResult:
    """The configured rule on a released noisy sum (post-processing); ``noise_std`` is its whole noise's std."""
    cfg = request.config
    chosen = select_release(total, noise_std, space=request.candidates.feature_space(), rule=cfg.rule,
                            clients=clients, k=cfg.k)
    return DPHypeResult(selected_index=chosen.index, selected=request.candidates[chosen.index], noisy_sum=total,
                        report=report, selection=chosen, candidates=request.candidates)


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

    def calibrate(self, config: DPHypeConfig, candidates: CandidateList) -> float:
        """Solve ``sigma``; refuse one whose shares secure summation could clip (`check_range`)."""
        sigma = super().calibrate(config, candidates)
        check_range(size=len(candidates), sigma=sigma, clients=config.clients, dropout=config.dropout,
                    noise=config.noise)
        return sigma

    def node_cost(self, request: VoteRequest, *, survivors: int, delta: float, accountant: str,
                  neighbouring: str) -> NodeCost:
        """``survivors`` shares of variance ``sigma^2 / ((1 - xi) n)`` (Appendix A), accounted the node's way."""
        cfg = request.config
        total_std = client_noise_std(request.sigma, cfg.clients, cfg.dropout) * math.sqrt(survivors)
        return vote_cost(request, total_std, delta=delta, accountant=accountant, neighbouring=neighbouring)

    def ballot(self, request: VoteRequest, scores: np.ndarray, *, maximize: bool,
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

    def release(self, request: VoteRequest, opened: np.ndarray, survivors: int) -> DPHypeResult:
        """The configured rule on the decoded noisy sum (line 12), with the report of the noise actually summed."""
        cfg = request.config
        survivors = check_survivors(survivors, cfg.clients, request.min_survivors)
        total = _noisy_sum(request, opened)
        report = privacy_report(vote_release(request), cfg.delta, clients=cfg.clients, dropout=cfg.dropout,
                                survivors=survivors, accountant=cfg.accountant)
        kind = noise_kind(cfg.noise)
        if not kind.integer:
            report = replace(
                report, released=f"{report.released}; {kind.label} shares rounded to a 1/{kind.fixed_point_scale} "
                "grid before summation, so the guarantee is approximate")
        return _rule_result(request, total, report, report.sigma, survivors)

    def replay(self, request: VoteRequest, vote_sum: np.ndarray, *, repetitions: int, rng: np.random.Generator,
               survivors: int | None = None, per_client: bool = False) -> np.ndarray:
        """Noisy sums, float64 ``(repetitions, p)`` (`dphype.privacy.noise.replay_noisy_sums`)."""
        cfg = request.config
        return replay_noisy_sums(vote_sum, sigma=request.sigma, clients=cfg.clients, repetitions=repetitions, rng=rng,
                                 dropout=cfg.dropout, noise=cfg.noise, survivors=survivors, per_client=per_client)

    def describe(self, request: VoteRequest) -> str:
        """The sum release's parameters: delta, k, clients, dropout, noise and rule."""
        return _vote_sum_words(request)


# ----------------------------------------------------------------------------------------- the committee
class CommitteeMode(ReleaseMode[list[bytes], OpenedT]):
    """The tally committee's modes: ballots the committee verifies, noise the committee makes.

    A client shares its ballot only; the committee's noise (`tally_noise`) is added in the MPC, which checks every
    ballot, adds the valid ones and opens only `opens`.
    """

    aggregator = Aggregator.COMMITTEE
    #: What the committee opens.
    opens: ClassVar[str]

    def ballot(self, request: VoteRequest, scores: np.ndarray, *, maximize: bool,
               clipping_range: int | None = None, voter: str | None = None) -> list[bytes]:
        """The ballot, checked against the request's form, as Shamir shares of its bits sealed to each tally.

        No noise: the committee makes it. One ciphertext per tally in committee order, bound to the request's digest,
        the tally and ``voter`` (`dphype.secure.committee.client_sealed_shares`).

        Args:
            request: The approved request.
            scores: The client's scores, ``(p,)`` or ``(p, j)``.
            maximize: Whether a higher score is better.
            clipping_range: Unused.
            voter: The client's identity in its run (`dphype.secure.committee.voter_id`); required.

        Returns:
            The ciphertexts, one per tally.

        Raises:
            ValueError: Without a ``voter``, or for a ballot that breaks the form.
        """  # noqa: DOC502
        if not voter:
            raise ValueError("voter must be the client's identity in its run (dphype.secure.committee.voter_id)")
        cfg, p = request.config, len(request.candidates)
        form = self.ballot_form(cfg, p)
        votes = form.check(self.resolved_ballot(cfg, p).cast(scores, cfg.k, maximize=maximize), p)
        return client_sealed_shares(request.digest(), votes, request.tallies, voter, form.bits)

    @abstractmethod
    def tally_noise(self, request: VoteRequest) -> np.ndarray | JointSampler:
        """The committee's noise as one tally contributes it (`dphype.flower.tally_node`).

        Either the sampler the MPC draws the whole noise with, which no tally knows (`JointSampler`), or this tally's
        share from a fresh `dphype.privacy.noise.secure_generator`, such that any honest majority's shares
        (`dphype.privacy.noise.honest_tallies`) carry the release's guarantee.

        Args:
            request: The approved request.

        Returns:
            The sampler, or the int64 share (one entry per candidate).
        """


# ---------------------------------------------------------------------------------------------- argmax
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

    def calibrate(self, config: DPHypeConfig, candidates: CandidateList) -> float:
        """The discrete Laplace std that ``epsilon`` and the ballot imply (`dphype.privacy.winner.noise_std`)."""
        return noise_std(config.epsilon, config.neighbouring, self.sensitivity(config))

    def check_sigma(self, request: VoteRequest) -> None:
        """Refuse a ``sigma`` other than ``epsilon`` implies, a ``k`` outside ``[1, p]`` or a too small epsilon."""
        cfg = request.config
        expected = noise_std(cfg.epsilon, cfg.neighbouring, self.sensitivity(cfg))
        if not abs(request.sigma - expected) <= 1e-9 * expected:
            raise ValueError(f"sigma must be {expected:.12g} (the discrete Laplace std of epsilon and the ballot), "
                             f"got {request.sigma!r}")
        check_k(cfg.k, len(request.candidates))  # the configured k, whether or not the ballot votes with it
        _ = self.accounting(request)  # validates the ballot's k against the number of candidates
        _ = self.tally_noise(request)  # an epsilon too small for the committee's sampler, before any client works

    def accounting(self, request: VoteRequest) -> WinnerRelease:
        """The winner release the request describes."""
        cfg = request.config
        return WinnerRelease(epsilon=cfg.epsilon, k=self.votes_per_client(cfg, len(request.candidates)),
                             num_candidates=len(request.candidates),
                             neighbouring=cfg.neighbouring, sensitivity=self.sensitivity(cfg))

    def check_claims(self, request: VoteRequest) -> None:
        """Nothing to recompute: each tally derives the sampler from the announced epsilon and ballot."""

    def announced_epsilon(self, request: VoteRequest) -> None:
        """``None``: the node's own relation decides the cost (`node_cost`)."""
        return None

    def node_cost(self, request: VoteRequest, *, survivors: int, delta: float, accountant: str,
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

    def tally_noise(self, request: VoteRequest) -> JointSampler:
        """The committee's discrete Laplace sampler, the same at every tally."""
        cfg = request.config
        return JointSampler.for_release(len(request.candidates), cfg.epsilon, cfg.neighbouring, self.sensitivity(cfg))

    def release(self, request: VoteRequest, opened: Opening | int, survivors: int) -> DPHypeResult:
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

    def replay(self, request: VoteRequest, vote_sum: np.ndarray, *, repetitions: int, rng: np.random.Generator,
               survivors: int | None = None, per_client: bool = False) -> np.ndarray:
        """Winning indices, int64 ``(repetitions,)`` (`dphype.privacy.winner.replay_winners`)."""
        cfg = request.config
        return replay_winners(vote_sum, epsilon=cfg.epsilon, neighbouring=cfg.neighbouring, repetitions=repetitions,
                              rng=rng, sensitivity=self.sensitivity(cfg))

    def describe(self, request: VoteRequest) -> str:
        """The winner release's parameters: ballot, k, clients, dropout, relation, the committee and its noise."""
        # discrete Laplace sampled in the MPC: no run delta, noise kind or rule applies
        cfg = request.config
        parties, g = len(request.tallies), self.sensitivity(cfg)
        k = self.votes_per_client(cfg, len(request.candidates))
        return (f"ballot={cfg.ballot!r}, k={k}, clients={cfg.clients}, dropout={cfg.dropout:g}, "
                f"neighbouring={cfg.neighbouring!r}, tallies={parties}, ballots verified, committee noise std="
                f"{noise_std(cfg.epsilon, cfg.neighbouring, g):.4g} (sampled jointly in the MPC)")


# --------------------------------------------------------------------------------------- committee sum
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

    def node_cost(self, request: VoteRequest, *, survivors: int, delta: float, accountant: str,
                  neighbouring: str) -> NodeCost:
        """The noisy sum with noise of std ``sigma`` (any ``h`` tallies' shares), whatever the contributors."""
        return vote_cost(request, request.sigma, delta=delta, accountant=accountant, neighbouring=neighbouring)

    def tally_noise(self, request: VoteRequest) -> np.ndarray:
        """One tally's int64 noise share (`dphype.privacy.noise.committee_noise_share`) from the CSPRNG."""
        return committee_noise_share(len(request.candidates), sigma=request.sigma, parties=len(request.tallies),
                                     rng=secure_generator(), noise=request.config.noise)

    def release(self, request: VoteRequest, opened: Opening | np.ndarray, survivors: int) -> DPHypeResult:
        """The configured rule on the opened noisy sum of the valid ballots, with the privacy report of ``sigma``."""
        cfg = request.config
        opening = opened if isinstance(opened, Opening) else Opening(tuple(np.asarray(opened).tolist()))
        valid = check_survivors(survivors - len(opening.excluded) - len(opening.unattributed), cfg.clients,
                                request.min_valid)
        total = _noisy_sum(request, np.asarray(opening.value, dtype=np.float64))
        parties = len(request.tallies)
        noise_std = committee_sum_std(request.sigma, parties)  # all the shares added
        report = replace(
            privacy_report(vote_release(request), cfg.delta, clients=cfg.clients, dropout=cfg.dropout,
                           accountant=cfg.accountant),
            survivors=valid, client_std=0.0, ballots_verified=True, excluded=opening.excluded,
            unattributed=opening.unattributed,
            released=(f"noisy vote sum of the ballots a committee of {parties} tallies verified on MPyC; noise made "
                      f"by the tallies: any {honest_tallies(parties)} of the {parties} shares add up to the sigma "
                      f"above, all {parties} to std {noise_std:.4g}"))
        return _rule_result(request, total, report, noise_std, valid)

    def replay(self, request: VoteRequest, vote_sum: np.ndarray, *, repetitions: int, rng: np.random.Generator,
               survivors: int | None = None, per_client: bool = False) -> np.ndarray:
        """Noisy sums with the committee's noise (`dphype.privacy.noise.replay_committee_sums`)."""
        return replay_committee_sums(vote_sum, sigma=request.sigma, parties=len(request.tallies),
                                     repetitions=repetitions, rng=rng, per_tally=per_client, noise=request.config.noise)

    def describe(self, request: VoteRequest) -> str:
        """The noisy vote sum's parameters, the committee and its noise."""
        parties = len(request.tallies)
        return (f"{_vote_sum_words(request)}, tallies={parties}, ballots verified, committee noise std="
                f"{committee_sum_std(request.sigma, parties):.4g}")
