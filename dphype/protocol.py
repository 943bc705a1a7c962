"""The DP-Hype protocol, framework-free: request, a client's noisy vote, the release, and its replay.

Data flows one way (DP-Hype Algorithm 1):

1. the server turns a validated :class:`dphype.config.DPHypeConfig` and the public candidate list into
   a :class:`VoteRequest` (line 1: the total noise std ``sigma`` is calibrated for ``(epsilon, delta, k)``;
   :func:`make_vote_request` also refuses what secure summation could not sum exactly);
2. every client checks the request (:func:`check_request`; against its own node policy and privacy
   ledger: :mod:`dphype.node.policy`, :mod:`dphype.node.ledger`), scores each candidate on its own data
   (:func:`score_candidates`, lines 2-4), votes for its top-k and adds its noise share
   (:func:`noisy_vote`, lines 5-10), and hands the encoded vector to secure summation;
3. the server decodes the exact noisy sum of the survivors and releases the selection rule's pick with a
   privacy report (:func:`release`, line 12, a :class:`dphype.result.DPHypeResult`). Everything after the
   sum is post-processing.

With ``release="argmax"`` (:mod:`dphype.privacy.winner`) the request also names the tally committee's public
keys; a client sends its noisy counts as sealed Shamir shares to the tallies (:func:`winner_vote`), the
tallies open only the winner's index (:mod:`dphype.secure.tally`) and :func:`release_winner` reports it. Its
benchmarks replay it with :func:`replay_winners`.

:func:`replay_releases` draws the same release many times from fixed votes (for benchmarks, the
DPareto oracle and the planner): one home for "what the server would see with fresh noise".

A client that will not take part raises :class:`dphype.refusal.Refusal`, whose ``code`` and ``detail`` are safe
to send to the server: they name the reason, never a data value.

No Flower import here: the Flower adapters are in :mod:`dphype.flower`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dphype.checks import MAX_CLIENTS
from dphype.config import DEFAULT_NOISE, DPHypeConfig
from dphype.ml.task import Task
from dphype.privacy.accounting import VoteRelease, calibrate, privacy_report
from dphype.privacy.accounting import epsilon as release_epsilon
from dphype.privacy.noise import check_survivors, client_noise_share, min_survivors, noise_share, summed_noise
from dphype.privacy.winner import (
    WinnerRelease,
    client_winner_share,
    noise_std,
    report_noisy_max,
    summed_winner_noise,
    winner_report,
)
from dphype.refusal import Refusal
from dphype.result import DPHypeResult
from dphype.secure.secure_sum import GAUSSIAN_SCALE, check_range, encode
from dphype.secure.tally import check_committee, client_sealed_shares
from dphype.selection.candidates import CandidateList
from dphype.selection.rules import select_release
from dphype.selection.voting import top_k_votes

#: Prefix of every key of a request record.
PREFIX = "dphype."
#: Relative slack when comparing the announced epsilon with the one recomputed from sigma.
EPSILON_RTOL = 1e-6
#: Largest ratio of an announced sigma to the one calibrated for the announced budget that a client accepts:
#: an honest server sends the calibrated sigma (:func:`make_vote_request`); far more noise is no request it
#: sends, and the client refuses it before scoring.
SIGMA_SLACK = 1.001


# --------------------------------------------------------------------------------------- the request
@dataclass(frozen=True)
class VoteRequest:
    """What the server asks every client for: one noisy top-k vote vector over ``candidates``.

    ``sigma`` is the TOTAL noise std on the released sum; each client adds a share of variance
    ``sigma^2 / ((1 - xi) n)`` (:func:`dphype.privacy.noise.client_noise_variance`). The budget in ``config``
    lets a client recompute the guarantee of the noise it is asked to add. The candidate list travels
    with the request (canonical JSON); a client compares it with its own copy by fingerprint.

    With ``config.release == "argmax"``, ``tallies`` are the committee's X25519 public keys (at least 3,
    distinct; :func:`dphype.secure.tally.check_committee`) and ``sigma`` is the total discrete Laplace std
    that ``epsilon`` implies (:func:`dphype.privacy.winner.noise_std`, for information: every client derives
    its noise from the announced ``epsilon``). In sum mode ``tallies`` is empty.
    """

    candidates: CandidateList
    config: DPHypeConfig
    sigma: float
    tallies: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.candidates, CandidateList):
            raise ValueError(f"candidates must be a CandidateList, got {type(self.candidates).__name__}")
        if not isinstance(self.config, DPHypeConfig):
            raise ValueError(f"config must be a DPHypeConfig, got {type(self.config).__name__}")
        if self.config.release == "argmax":
            object.__setattr__(self, "tallies", check_committee(self.tallies))
            expected = noise_std(self.config.epsilon, self.config.neighbouring)
            if not abs(self.sigma - expected) <= 1e-9 * expected:
                raise ValueError(f"sigma must be {expected:.12g} (the discrete Laplace std of epsilon), "
                                 f"got {self.sigma!r}")
            _ = self.winner_release  # validates k against the number of candidates
        else:
            if self.tallies:
                raise ValueError("tallies must be empty unless release is 'argmax'")
            _ = self.release  # validates sigma and k against the number of candidates (the config is validated)

    @property
    def release(self) -> VoteRelease:
        """The release this request describes, for accounting (sum mode)."""
        return VoteRelease(k=self.config.k, num_candidates=len(self.candidates), sigma=self.sigma,
                           noise=self.config.noise, neighbouring=self.config.neighbouring)

    @property
    def winner_release(self) -> WinnerRelease:
        """The winner-only release this request describes (argmax mode)."""
        return WinnerRelease(epsilon=self.config.epsilon, k=self.config.k, num_candidates=len(self.candidates),
                             neighbouring=self.config.neighbouring)

    @property
    def min_survivors(self) -> int:
        """Fewest contributing clients whose noise still adds up to ``sigma``: ``ceil((1 - xi) n)``."""
        return min_survivors(self.config.clients, self.config.dropout)

    def to_record(self) -> dict[str, Any]:
        """Flat scalar record (keys ``dphype.*``) for a Flower ``ConfigRecord``."""
        record: dict[str, Any] = {PREFIX + "candidates": self.candidates.to_json(), PREFIX + "sigma": self.sigma}
        if self.tallies:
            record[PREFIX + "tallies"] = ",".join(key.hex() for key in self.tallies)
        for field in dataclasses.fields(DPHypeConfig):
            value = getattr(self.config, field.name)
            if value is not None:
                record[PREFIX + field.name] = value
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> VoteRequest:
        """Parse :meth:`to_record`'s output; anything missing or invalid is a ``malformed_request`` refusal."""
        try:
            candidates = CandidateList.from_json(str(record[PREFIX + "candidates"]))
            config = DPHypeConfig(**{f.name: record[PREFIX + f.name] for f in dataclasses.fields(DPHypeConfig)
                                     if PREFIX + f.name in record})
            tallies = tuple(bytes.fromhex(h) for h in str(record.get(PREFIX + "tallies", "")).split(",") if h)
            return cls(candidates, config, record[PREFIX + "sigma"], tallies)
        except KeyError as err:
            raise Refusal("malformed_request", f"the request has no {err.args[0]!r}") from None
        except (TypeError, ValueError) as err:
            # Messages of these validators name parameters and ranges only; candidate values (which a
            # duplicate-entry error would echo) are not repeated.
            reason = str(err) if not str(err).startswith("duplicate candidate") else "duplicate candidates"
            raise Refusal("malformed_request", reason) from None

    def digest(self) -> str:
        """SHA-256 of the canonical record: identifies this exact request (e.g. between pre-flight and vote)."""
        blob = json.dumps(self.to_record(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def make_vote_request(config: DPHypeConfig, candidates: CandidateList, *,
                      tallies: tuple[bytes, ...] = ()) -> VoteRequest:
    """Calibrate the noise of ``config`` for ``candidates`` (Algorithm 1, line 1) and refuse up front what
    secure summation cannot sum exactly: more clients than it allows, or a ``sigma`` whose shares it
    could clip (:func:`dphype.secure.secure_sum.check_range`). In argmax mode the noise follows from
    ``epsilon`` alone (:mod:`dphype.privacy.winner`) and ``tallies`` must name the committee."""
    if not isinstance(config, DPHypeConfig):
        raise ValueError(f"config must be a DPHypeConfig, got {type(config).__name__}")
    if not isinstance(candidates, CandidateList):
        raise ValueError(f"candidates must be a CandidateList, got {type(candidates).__name__}")
    if config.release == "argmax":
        return VoteRequest(candidates, config, noise_std(config.epsilon, config.neighbouring), tuple(tallies))
    release = calibrate(config.epsilon, config.delta, config.k, num_candidates=len(candidates),
                        accountant=config.accountant, noise=config.noise, neighbouring=config.neighbouring)
    check_range(size=len(candidates), sigma=release.sigma, clients=config.clients, dropout=config.dropout,
                noise=config.noise)
    return VoteRequest(candidates, config, release.sigma)


# ------------------------------------------------------------------------------------ the client side
def check_request(request: VoteRequest, *, local_candidates: CandidateList | None = None) -> None:
    """Refuse a request for another candidate list, whose noise does not give the announced budget, or that
    no honest server sends.

    The client recomputes epsilon from the announced ``sigma`` with the announced accountant, and a
    ``local_candidates`` copy (the client's own) must have the request's fingerprint. A request for more
    clients than the secure sum allows, or with a ``sigma`` beyond :data:`SIGMA_SLACK` times the one
    calibrated for its budget, is ``malformed_request``. This checks that the request is what it claims;
    whether this node allows it is :func:`dphype.node.policy.check_vote_request`'s question (which starts
    here).
    """
    if local_candidates is not None and local_candidates.fingerprint() != request.candidates.fingerprint():
        raise Refusal("candidate_mismatch",
                      f"fingerprint {request.candidates.fingerprint()[:12]} differs from this client's "
                      f"{local_candidates.fingerprint()[:12]}")
    cfg = request.config
    if cfg.clients > MAX_CLIENTS:
        raise Refusal("malformed_request", f"clients={cfg.clients} is above the secure sum's maximum {MAX_CLIENTS}")
    if cfg.release == "argmax":
        return  # each client derives its noise from the announced epsilon: it cannot be asked for too little
    promised = release_epsilon(request.release, cfg.delta, cfg.accountant)
    if promised > cfg.epsilon * (1.0 + EPSILON_RTOL):
        raise Refusal("noise_too_small", f"sigma={request.sigma:g} gives epsilon={promised:.6g} at "
                      f"delta={cfg.delta:g}, more than the announced epsilon={cfg.epsilon:g}")
    calibrated = calibrate(cfg.epsilon, cfg.delta, cfg.k, num_candidates=len(request.candidates),
                           accountant=cfg.accountant, noise=cfg.noise, neighbouring=cfg.neighbouring).sigma
    if request.sigma > calibrated * SIGMA_SLACK:
        raise Refusal("malformed_request", f"sigma={request.sigma:g} is far above the {calibrated:.6g} calibrated "
                      "for the announced budget: no honest server sends it")


def score_candidates(task: Task, candidates: CandidateList, *,
                     progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """The task's local scores (Algorithm 1, lines 2-4) as float64 ``(p,)`` or ``(p, j)``.

    A task may have ``check(candidates)``, which looks at the public candidates only and raises
    ``ValueError`` for ones it cannot evaluate: refused as ``unsupported_candidates`` with that message (it
    names candidate keys, never data). A task whose ``score`` raises is refused as ``task_error`` (the
    exception type only: its message may carry data), one that returns another shape as ``score_shape``, one
    whose scores cannot rank the candidates (all NaN, or the same for all) as ``uninformative_scores``.
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


def noisy_vote(request: VoteRequest, scores: np.ndarray, *, maximize: bool, clipping_range: int) -> np.ndarray:
    """Top-k votes plus this client's noise share, encoded for exact secure summation (lines 5-10).

    The share comes from :func:`dphype.privacy.noise.client_noise_share` (a fresh ChaCha20 generator keyed by the
    operating system; no generator can be passed in). The result is what the client hands to SecAgg+
    (:func:`dphype.secure.secure_sum.encode`: integers, or the ``1/GAUSSIAN_SCALE`` fixed-point grid for Gaussian
    noise), refused (``ValueError``), never clipped, beyond the round's ``clipping_range``
    (:func:`dphype.secure.secure_sum.clipping_range_for` of the round's size). Benchmarks and replays draw their
    noise with :func:`replay_releases` instead.
    """
    cfg = request.config
    votes = top_k_votes(scores, cfg.k, maximize=maximize)
    share = client_noise_share(votes.size, sigma=request.sigma, clients=cfg.clients, dropout=cfg.dropout,
                               kind=cfg.noise)
    return encode(votes + share, cfg.noise, clipping_range)


# ------------------------------------------------------------------------------------- the release
def release(request: VoteRequest, noisy_sum: np.ndarray, survivors: int) -> DPHypeResult:
    """The server's post-processing of the decoded noisy sum of ``survivors`` clients (line 12, with the
    configured selection rule of :mod:`dphype.selection.rules`: the argmax, or the structure-aware rule that
    estimates the vote surface over the public candidate space from the release alone).

    Refuses (``ValueError``) fewer survivors than :attr:`VoteRequest.min_survivors`: their noise would
    not add up to ``sigma``. The report accounts for the noise that was actually summed.
    """
    survivors = check_survivors(survivors, request.config.clients, request.min_survivors)
    total = np.asarray(noisy_sum)
    if total.shape != (len(request.candidates),):
        raise ValueError(f"noisy_sum must have shape ({len(request.candidates)},), got {total.shape}")
    cfg = request.config
    report = privacy_report(request.release, cfg.delta, clients=cfg.clients, dropout=cfg.dropout,
                            survivors=survivors, accountant=cfg.accountant)
    if cfg.noise == "gaussian":
        report = dataclasses.replace(
            report, released=f"{report.released}; Gaussian shares rounded to a 1/{GAUSSIAN_SCALE} grid "
            "before summation, so the guarantee is approximate")
    # the selection rule and its confidence read only the release and public facts (post-processing)
    chosen = select_release(total, report.sigma, space=request.candidates.feature_space(), rule=cfg.rule,
                            clients=survivors, k=cfg.k)
    return DPHypeResult(selected_index=chosen.index, selected=request.candidates[chosen.index], noisy_sum=total,
                        report=report, selection=chosen, candidates=request.candidates)


def replay_releases(
    vote_sum: np.ndarray,
    *,
    sigma: float,
    clients: int,
    repetitions: int,
    rng: np.random.Generator,
    dropout: float = 0.0,
    noise: str = DEFAULT_NOISE,
    survivors: int | None = None,
    per_client: bool = False,
) -> np.ndarray:
    """``repetitions`` independent noisy sums of ``vote_sum`` as the server would receive them.

    ``vote_sum`` is the noiseless sum of the contributing clients' votes, shape ``(p,)`` (or one row per
    repetition, ``(repetitions, p)``). ``survivors`` clients (default all ``clients``) each add a share of
    variance ``sigma^2 / ((1 - xi) n)``: with ``per_client=True`` literally, one
    :func:`dphype.privacy.noise.noise_share` each, summed; otherwise their sum in one
    :func:`dphype.privacy.noise.summed_noise` draw, which has the same distribution (sums of Gaussians are
    Gaussian, of Skellams Skellam). ``noise`` defaults to the configuration's (:data:`dphype.config.DEFAULT_NOISE`).
    ``sigma == 0`` (no noise) returns the votes. Returns float64
    ``(repetitions, p)``.
    """
    votes = np.asarray(vote_sum, dtype=np.float64)
    shape = (int(repetitions), votes.shape[-1])
    out = np.broadcast_to(votes, shape).astype(np.float64, copy=True)
    if sigma == 0:
        return out
    m = clients if survivors is None else survivors
    if per_client:
        for _ in range(m):
            out += noise_share(shape, sigma=sigma, clients=clients, dropout=dropout, kind=noise, rng=rng)
    else:
        out += summed_noise(shape, sigma=sigma, clients=clients, dropout=dropout, survivors=m, kind=noise, rng=rng)
    return out


# ----------------------------------------------------------------------------- release="argmax" mode
def winner_vote(request: VoteRequest, scores: np.ndarray, *, maximize: bool) -> list[bytes]:
    """What a client sends in argmax mode: its top-k votes plus its discrete Laplace noise share
    (:func:`dphype.privacy.winner.client_winner_share`, a fresh OS-keyed ChaCha20 generator), split into
    Shamir shares (MPyC's splitter) and sealed, one ciphertext per tally in committee order
    (:func:`dphype.secure.tally.client_sealed_shares`, bound to the request's digest)."""
    cfg = request.config
    if cfg.release != "argmax":
        raise ValueError(f"winner_vote needs release 'argmax', got {cfg.release!r}")
    votes = top_k_votes(scores, cfg.k, maximize=maximize).astype(np.int64)
    share = client_winner_share(votes.size, epsilon=cfg.epsilon, neighbouring=cfg.neighbouring,
                                clients=cfg.clients, dropout=cfg.dropout)
    return client_sealed_shares(request.digest(), votes + share, request.tallies)


def release_winner(request: VoteRequest, index: int, survivors: int) -> DPHypeResult:
    """The server's record of the index the tallies opened for ``survivors`` contributors; refuses fewer
    than the minimum survivors (``ValueError``) and an index outside the candidate list."""
    cfg = request.config
    report = winner_report(request.winner_release, cfg.delta, clients=cfg.clients, dropout=cfg.dropout,
                           survivors=survivors, committee=len(request.tallies))
    if not 0 <= index < len(request.candidates):
        raise ValueError(f"index must be in [0, {len(request.candidates) - 1}], got {index}")
    return DPHypeResult(selected_index=int(index), selected=request.candidates[index], noisy_sum=None, report=report,
                        selection=None, candidates=request.candidates)


def replay_winners(
    vote_sum: np.ndarray,
    *,
    epsilon: float,
    neighbouring: str,
    clients: int,
    repetitions: int,
    rng: np.random.Generator,
    dropout: float = 0.0,
    survivors: int | None = None,
) -> np.ndarray:
    """``repetitions`` independent winner releases for the noiseless vote counts ``vote_sum`` (``(p,)`` or one
    row per repetition): the counts plus the summed discrete Laplace shares of ``survivors`` clients (default
    all), report-noisy-max with lowest-index ties, as the tallies compute it. Returns int64 ``(repetitions,)``."""
    votes = np.asarray(vote_sum)
    shape = (int(repetitions), votes.shape[-1])
    noise = summed_winner_noise(shape, epsilon=epsilon, neighbouring=neighbouring, clients=clients, dropout=dropout,
                                survivors=clients if survivors is None else survivors, rng=rng)
    return report_noisy_max(np.rint(votes).astype(np.int64) + noise).astype(np.int64)
