"""The DP-Hype protocol, framework-free: the request, its checks, and a client's scores.

Data flows one way (DP-Hype Algorithm 1); what is released, and how, is the configuration's release mode
(`dphype.release`):

1. the server turns a validated `dphype.config.DPHypeConfig` and the public candidate list into a `VoteRequest`
   (line 1: ``sigma`` is the mode's `dphype.release.ReleaseMode.calibrate`);
2. every client checks the request (`check_request`, then its node policy and privacy ledger, `dphype.node`),
   scores each candidate on its own data (`score_candidates`, lines 2-4) and hands its ballot
   (`dphype.release.ReleaseMode.ballot`, lines 5-10) to the mode's aggregator (SecAgg+, or the tally committee the
   request names);
3. the server turns what the aggregator opened into a `dphype.result.DPHypeResult` with a privacy report
   (`dphype.release.ReleaseMode.release`, line 12). Everything after the aggregation is post-processing.

A client that will not take part raises `dphype.refusal.Refusal`, whose ``code`` and ``detail`` name the reason,
never a data value. No Flower import here.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dphype.checks import EPSILON_RTOL as EPSILON_RTOL  # re-exported: the request's slack, also the node's
from dphype.checks import MAX_CLIENTS, check_k
from dphype.config import DPHypeConfig
from dphype.privacy.noise import min_survivors, min_valid_ballots
from dphype.refusal import Refusal
from dphype.release import SIGMA_SLACK as SIGMA_SLACK  # re-exported: the sum release's slack on sigma
from dphype.release import ReleaseMode, release_modes
from dphype.result import DPHypeResult as DPHypeResult  # re-exported: what a mode's release returns
from dphype.selection.candidates import CandidateList
from dphype.selection.planner import Plan, check_plan
from dphype.task import Task

#: Prefix of every key of a request record.
PREFIX = "dphype."


# --------------------------------------------------------------------------------------- the request
@dataclass(frozen=True)
class VoteRequest:
    """What the server asks every client for: one ballot over ``candidates``, released as the mode says.

    The budget in ``config`` lets a client recompute the guarantee of the noise it is asked for. The candidate list
    travels with the request (canonical JSON); a client compares it with its own copy by fingerprint. The mode
    validates the fields (`dphype.release.ReleaseMode.check_request_fields`). A node with another roster than
    ``roster``, or none, refuses the request; an empty ``roster`` lets each node bind its own roster to its approval.

    Attributes:
        candidates: The public candidate list the clients score.
        config: The validated run configuration.
        sigma: The total noise std the mode calibrated; each client adds a share of it.
        tallies: The tally committee's X25519 public keys (32 bytes each, committee order; at least 3, distinct), or
            empty when the aggregator is SecAgg+.
        roster: The digest of the roster the server expects its nodes to share (64 hex digits,
            `dphype.secure.roster.Roster.digest`), or empty.

    Raises:
        ValueError: If ``candidates`` or ``config`` has the wrong type, ``roster`` is not a digest, or the mode
            rejects a field.
    """

    candidates: CandidateList
    config: DPHypeConfig
    sigma: float
    tallies: tuple[bytes, ...] = ()
    roster: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.candidates, CandidateList):
            raise ValueError(f"candidates must be a CandidateList, got {type(self.candidates).__name__}")
        if not isinstance(self.config, DPHypeConfig):
            raise ValueError(f"config must be a DPHypeConfig, got {type(self.config).__name__}")
        object.__setattr__(self, "tallies", self.mode.check_request_fields(self))  # the config is validated
        if not (self.roster == "" or (isinstance(self.roster, str) and len(self.roster) == 64
                                      and all(c in "0123456789abcdef" for c in self.roster))):
            raise ValueError(f"roster must be a roster's digest (64 lowercase hex digits, `dphype roster show`) or "
                             f"empty, got {str(self.roster)[:80]!r}")

    @property
    def mode(self) -> ReleaseMode[Any, Any]:
        """The release mode of this request (`dphype.config.DPHypeConfig.mode`)."""
        return self.config.mode

    @property
    def min_survivors(self) -> int:
        """Fewest contributing clients whose noise still adds up to ``sigma``: ``ceil((1 - xi) n)``."""
        return min_survivors(self.config.clients, self.config.dropout)

    @property
    def min_valid(self) -> int:
        """Fewest valid ballots a committee release counts (`dphype.privacy.noise.min_valid_ballots`)."""
        return min_valid_ballots(self.config.clients, self.config.dropout)

    def to_record(self) -> dict[str, Any]:
        """Flat scalar record (keys ``dphype.*``) for a Flower ``ConfigRecord``: candidates, sigma, tallies, config."""
        record: dict[str, Any] = {PREFIX + "candidates": self.candidates.to_json(), PREFIX + "sigma": self.sigma}
        if self.tallies:
            record[PREFIX + "tallies"] = ",".join(key.hex() for key in self.tallies)
        if self.roster:
            record[PREFIX + "roster"] = self.roster
        return {**record, **config_record(self.config, PREFIX)}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> VoteRequest:
        """Parse `to_record`'s output.

        Args:
            record: A request record.

        Returns:
            The request.

        Raises:
            Refusal: ``malformed_request``, if a key is missing or a value is invalid (the message names parameters and
                ranges, never candidate values).
        """
        try:
            candidates = CandidateList.from_json(str(record[PREFIX + "candidates"]))
            config = config_from_record(record, PREFIX)
            tallies = tuple(bytes.fromhex(h) for h in str(record.get(PREFIX + "tallies", "")).split(",") if h)
            return cls(candidates, config, record[PREFIX + "sigma"], tallies, str(record.get(PREFIX + "roster", "")))
        except KeyError as err:
            raise Refusal("malformed_request", f"the request has no {err.args[0]!r}") from None
        except (TypeError, ValueError) as err:
            # Messages of these validators name parameters and ranges only; candidate values (which a
            # duplicate-entry error would echo) are not repeated.
            reason = str(err) if not str(err).startswith("duplicate candidate") else "duplicate candidates"
            raise Refusal("malformed_request", reason) from None

    def digest(self) -> str:
        """SHA-256 of the canonical record, 64 hex characters: identifies this exact request."""
        blob = json.dumps(self.to_record(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def config_record(config: DPHypeConfig, prefix: str) -> dict[str, Any]:
    """``config``'s fields as flat scalar entries ``prefix + name`` (``None`` left out), for a request record."""
    return {prefix + field.name: getattr(config, field.name) for field in dataclasses.fields(DPHypeConfig)
            if getattr(config, field.name) is not None}


def config_from_record(record: Mapping[str, Any], prefix: str) -> DPHypeConfig:
    """The `dphype.config.DPHypeConfig` of `config_record`'s entries; its checks' ``ValueError`` if one is invalid."""
    return DPHypeConfig(**{field.name: record[prefix + field.name] for field in dataclasses.fields(DPHypeConfig)
                           if prefix + field.name in record})


def make_vote_request(config: DPHypeConfig, candidates: CandidateList, *,
                      tallies: tuple[bytes, ...] = (), roster: str = "") -> VoteRequest:
    """Calibrate the noise of ``config`` for ``candidates`` with its release mode (Algorithm 1, line 1).

    The mode refuses up front what its aggregator could not release exactly (e.g. a ``sigma`` whose shares secure
    summation could clip); ``tallies`` are left out unless the aggregator is the tally committee.

    Args:
        config: The validated run configuration.
        candidates: The public candidate list.
        tallies: The tally committee's X25519 public keys, in committee order.
        roster: The digest of the roster the server expects its nodes to share, or empty.

    Returns:
        The request, with the calibrated ``sigma``.

    Raises:
        ValueError: If ``config`` or ``candidates`` has the wrong type, or the mode cannot calibrate or release it.
    """  # noqa: DOC502
    if not isinstance(config, DPHypeConfig):
        raise ValueError(f"config must be a DPHypeConfig, got {type(config).__name__}")
    if not isinstance(candidates, CandidateList):
        raise ValueError(f"candidates must be a CandidateList, got {type(candidates).__name__}")
    mode = config.mode
    committee = tuple(tallies) if mode.uses_committee else ()
    return VoteRequest(candidates, config, mode.calibrate(config, candidates), committee, roster)


def precheck_request(config: DPHypeConfig, candidates: CandidateList) -> None:
    """What a selection refuses before the tally committee's keys are known: ``k``, the calibration, the plan.

    ``k`` is checked against the candidates whether or not the ballot votes with it; the mode calibrates the noise
    (`dphype.release.ReleaseMode.calibrate`); the planner refuses a federation too small to select
    (`selection_plan`, against ``config.min_success``). A server checks it before it waits for any node;
    ``dphype run`` before Flower starts.

    Args:
        config: The validated run configuration.
        candidates: The public candidate list.

    Raises:
        ValueError: If ``k`` is outside ``[1, len(candidates)]``, the mode cannot calibrate the noise, or the
            federation is too small to select (naming the size that would do).
    """  # noqa: DOC502
    check_k(config.k, len(candidates))
    config.mode.calibrate(config, candidates)
    selection_plan(config, candidates)


# ------------------------------------------------------------------------------------ the client side
def check_request(request: VoteRequest, *, local_candidates: CandidateList | None = None) -> None:
    """Refuse a request for another candidate list, whose noise does not give its budget, or no honest server sends.

    A ``local_candidates`` copy must have the request's fingerprint; more clients than the secure sum allows is
    ``malformed_request``; then the mode checks its claims (`dphype.release.ReleaseMode.check_claims`). Whether this
    node allows the request is `dphype.node.policy.check_vote_request`'s question.

    Args:
        request: The server's request.
        local_candidates: The client's own copy of the candidate list, if it has one.

    Raises:
        Refusal: ``candidate_mismatch``, ``malformed_request``, or the mode's refusal of the request's claims.
    """
    if local_candidates is not None and local_candidates.fingerprint() != request.candidates.fingerprint():
        raise Refusal("candidate_mismatch",
                      f"fingerprint {request.candidates.fingerprint()[:12]} differs from this client's "
                      f"{local_candidates.fingerprint()[:12]}")
    cfg = request.config
    if cfg.clients > MAX_CLIENTS:
        raise Refusal("malformed_request", f"clients={cfg.clients} is above the secure sum's maximum {MAX_CLIENTS}")
    request.mode.check_claims(request)


def score_candidates(task: Task, candidates: CandidateList, *,
                     progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """The task's local scores (Algorithm 1, lines 2-4) as float64 ``(p,)`` or ``(p, j)``.

    A task's optional ``check(candidates)`` looks at the public candidates only; its ``ValueError`` is refused as
    ``unsupported_candidates`` with its message (it names keys, never data). A raising ``score`` is ``task_error``
    (the exception type only: its message may carry data), another shape ``score_shape``, scores that cannot rank
    the candidates (all NaN, or all equal) ``uninformative_scores``.

    Args:
        task: The client's task (``score(candidates)``, optionally ``check`` and a ``progress`` keyword).
        candidates: The public candidate list.
        progress: Called with ``(done, total)`` while scoring, if the task's ``score`` takes ``progress``.

    Returns:
        The scores.

    Raises:
        Refusal: ``unsupported_candidates``, ``task_error``, ``score_shape`` or ``uninformative_scores``.
    """
    p = len(candidates)
    check = getattr(task, "check", None)
    if check is not None:
        try:
            check(candidates)
        except ValueError as err:
            raise Refusal("unsupported_candidates", str(err)) from None
    try:
        if progress is not None and "progress" in inspect.signature(task.score).parameters:
            raw = task.score(candidates, progress=progress)
        else:
            raw = task.score(candidates)
        scores = np.asarray(raw, dtype=np.float64)
    except Refusal:
        raise
    except Exception as err:  # noqa: BLE001 - any failure of user code becomes a sanitized refusal
        raise Refusal("task_error", f"task.score raised {type(err).__name__}") from err
    if scores.ndim not in (1, 2) or scores.shape[0] != p or scores.size == 0:
        raise Refusal("score_shape", f"task.score must return shape ({p},) or ({p}, j); got {scores.shape}")
    if not np.isfinite(scores).any():
        raise Refusal("uninformative_scores", f"task.score returned no finite score for the {p} candidates")
    if p > 1 and np.all((scores == scores[0]) | (np.isnan(scores) & np.isnan(scores[0]))):
        raise Refusal("uninformative_scores", f"task.score gave all {p} candidates the same score: its top-k vote "
                      "would only repeat the list order")
    return scores


@functools.lru_cache(maxsize=8)
def selection_plan(config: DPHypeConfig, candidates: CandidateList) -> Plan:
    """The planner's check of a selection (`dphype.selection.planner.check_plan`), from public parameters only.

    What `dphype.flower.DPHype.plan` and `dphype.flower.connected_committee` run, and ``dphype run`` before Flower
    starts where the run config names the candidates;
    cached (the planner's simulation is seeded: the same arguments give the same plan).

    Args:
        config: The selection's configuration.
        candidates: The public candidate list.

    Returns:
        The plan.

    Raises:
        ValueError: If the scenario's simulated chance of a good pick is below ``config.min_success`` (a federation
            too small to select), naming the number of clients that would reach it.
    """  # noqa: DOC502
    return check_plan(config.clients, config.epsilon, config.delta, candidates.feature_space(), len(candidates),
                      config.mode.votes_per_client(config, len(candidates)), dropout=config.dropout,
                      min_success=config.min_success, rule=config.rule, noise=config.noise,
                      accountant=config.accountant, neighbouring=config.neighbouring, release=config.mode,
                      releases=release_modes(), ballot=config.ballot)
