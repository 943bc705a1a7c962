"""DP-Hype on the server, in the shape of Flower's Message-API strategies: settings, then ``start(grid)``.

:class:`DPHype` runs DP-Hype's selection inside any ``@app.main()``:

1. on construction, everything the server can check itself: the configuration, the candidate list, the
   noise calibration (:func:`dphype.protocol.make_vote_request`), the secure-sum range and the planner's
   prediction from public parameters (:func:`dphype.selection.planner.preflight`: a warning below one half, a refusal
   below ``config.min_success``) -- before any client works;
2. ``start(grid)`` waits for ``n`` nodes, runs the pre-flight (``query.dphype``: every client checks the
   request against its own candidate list, task and limits, scores the candidates and answers ready or a
   reason), and aborts with one error counting the reasons when fewer than ``ceil((1 - xi) n)`` clients
   are ready -- nothing is sent in the vote round then;
3. one SecAgg+ round (``train.dphype``) over the ready clients returns the exact noisy vote sum
   (:func:`dphype.flower.secagg.run_secure_sum`), unmasked only if enough clients contributed;
4. the release (:func:`dphype.protocol.release`): the selection rule's pick, its confidence and the privacy report.

With ``release="argmax"`` steps 3-4 are :func:`dphype.flower.tally.run_winner_selection`: sealed shares to the
committee of tally nodes named by ``tallies``, a secure argmax on MPyC, only the index released.

Train the final model afterwards with any Message-API strategy, passing ``result.selected`` as the train
config (see :func:`train_config`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections import Counter

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import log
from flwr.serverapp.grid import Grid

from dphype.config import DPHypeConfig
from dphype.flower.client import ACTION, RECORD_KEY
from dphype.flower.secagg import check_timeout, run_secure_sum
from dphype.flower.tally import run_winner_selection
from dphype.privacy.noise import client_noise_std
from dphype.protocol import REFUSAL_CODES, DPHypeResult, WinnerResult, make_vote_request, release
from dphype.secure.secagg_params import CORRUPT_FRACTION, check_corrupt_fraction
from dphype.secure.secure_sum import clip_probability
from dphype.selection.candidates import Candidate, CandidateList
from dphype.selection.planner import preflight

#: Message type of the pre-flight round.
PREFLIGHT_MESSAGE_TYPE = f"query.{ACTION}"


class PreflightError(RuntimeError):
    """Too few clients are ready to vote; nothing was sent in the vote round and nothing was released."""


class DPHype:
    """DP-Hype's private selection among ``candidates`` with the privacy parameters of ``config``.

    Parameters
    ----------
    candidates:
        The public, ordered candidate list (sent to every client with the request).
    config:
        The validated privacy parameters (:class:`dphype.config.DPHypeConfig`).
    num_shares, reconstruction_threshold:
        SecAgg+ parameters (Flower's ints, or fractions of the clients / of the shares); ``None`` (the
        default) uses the secure graph of :func:`dphype.secure.secagg_params.secure_parameters`, and an explicit
        choice below it is refused (:func:`dphype.flower.secagg.secagg_graph`).
    corrupt_fraction:
        Fraction of the clients assumed to collude with the server when the SecAgg+ graph is chosen or
        checked (default 1/3, :data:`dphype.secure.secagg_params.CORRUPT_FRACTION`).
    tallies:
        ``release="argmax"`` only: the committee's X25519 public keys in committee order (at least 3 distinct).
    """

    def __init__(
        self,
        candidates: CandidateList,
        config: DPHypeConfig,
        *,
        num_shares: float | None = None,
        reconstruction_threshold: float | None = None,
        corrupt_fraction: float = CORRUPT_FRACTION,
        tallies: tuple[bytes, ...] = (),
    ) -> None:
        self.request = make_vote_request(config, candidates, tallies=tallies)
        # the planner's prediction from public parameters only; refuses below config.min_success
        self.plan = preflight(config.clients, config.epsilon, config.delta, candidates.feature_space(),
                              len(candidates), config.k, dropout=config.dropout, min_success=config.min_success,
                              rule=config.rule, noise=config.noise, accountant=config.accountant,
                              neighbouring=config.neighbouring, release=config.release)
        self.num_shares = num_shares
        self.reconstruction_threshold = reconstruction_threshold
        self.corrupt_fraction = check_corrupt_fraction(corrupt_fraction)

    @property
    def config(self) -> DPHypeConfig:
        return self.request.config

    @property
    def candidates(self) -> CandidateList:
        return self.request.candidates

    def __repr__(self) -> str:
        cfg = self.config
        return (f"DPHype({len(self.candidates)} candidates, epsilon={cfg.epsilon:g}, delta={cfg.delta:g}, "
                f"k={cfg.k}, clients={cfg.clients}, dropout={cfg.dropout:g}, noise={cfg.noise!r}, rule={cfg.rule!r})")

    def start(self, grid: Grid, *, timeout: float | None = 3600.0,
              connect_timeout: float | None = 600.0) -> DPHypeResult | WinnerResult:
        """Select one candidate privately; returns the winner with its privacy report.

        ``connect_timeout`` bounds the wait (seconds) for ``clients`` nodes to connect; ``timeout`` bounds
        the pre-flight (which includes local scoring) and each SecAgg+ stage, so a node that vanishes
        counts as a dropout instead of stalling the run (``None``: no limit). Raises :class:`PreflightError` or
        :class:`dphype.secure.secure_sum.SecureSumError` (nothing released) when too few clients take part.
        """
        timeout = check_timeout("timeout", timeout)
        connect_timeout = check_timeout("connect_timeout", connect_timeout)
        cfg = self.config
        log(logging.INFO, "Starting %r", self)
        log(logging.INFO, "DP-Hype plan: predicted chance of a good pick %.2f with the %s rule (argmax %.2f)",
            self.plan.success, cfg.rule, self.plan.success_argmax)
        for warning in self.plan.warnings:
            log(logging.WARNING, "DP-Hype: %s", warning)
        if cfg.release == "argmax":
            return run_winner_selection(self, grid, timeout=timeout, connect_timeout=connect_timeout)
        log(logging.INFO, "DP-Hype: total noise std sigma=%.4g, each client's share std %.4g",
            self.request.sigma, client_noise_std(self.request.sigma, cfg.clients, cfg.dropout))
        start = time.perf_counter()
        nodes = _wait_for_nodes(grid, cfg.clients, connect_timeout)
        ready = self._preflight(grid, nodes, timeout)
        sum_ = run_secure_sum(
            grid, ready, self.request.to_record(), size=len(self.candidates), noise=cfg.noise,
            min_survivors=self.request.min_survivors, num_shares=self.num_shares,
            reconstruction_threshold=self.reconstruction_threshold, corrupt_fraction=self.corrupt_fraction,
            timeout=timeout,
        )
        clip = clip_probability(size=len(self.candidates), sigma=self.request.sigma, clients=cfg.clients,
                                dropout=cfg.dropout, noise=cfg.noise, clipping_range=sum_.clipping_range)
        result = dataclasses.replace(release(self.request, sum_.total, sum_.survivors), secure_sum={
            **sum_.secagg.to_dict(), "clipping_range": sum_.clipping_range, "clip_probability": clip,
            "statement": f"a share outside the range makes its client refuse (a dropout): the release is "
                         f"(epsilon, delta + {clip:.1e})-DP; Bell et al.'s bounds: the server learns more than "
                         f"the sum {_chance(sum_.secagg.log2_insecure)}, the sum fails "
                         f"{_chance(sum_.secagg.log2_failure)}"})
        log(logging.INFO, "DP-Hype selected candidate %d %s by the %s rule (epsilon=%.4g at delta=%g, %d survivors; "
            "confidence: top-voted %.2f, within the top group %.2f, margin %.2f sigma) in %.1f s",
            result.selected_index, result.selected, result.selection.rule, result.report.epsilon,
            result.report.delta, sum_.survivors, result.selection.p_top, result.selection.p_top_group,
            result.selection.margin, time.perf_counter() - start)
        if result.selection.warning:
            log(logging.WARNING, "DP-Hype: %s", result.selection.warning)
        return result

    def _preflight(self, grid: Grid, nodes: list[int], timeout: float | None) -> list[int]:
        """Send the request to ``nodes``; return those that answered ready, or raise :class:`PreflightError`."""
        content = RecordDict({RECORD_KEY: ConfigRecord(self.request.to_record())})
        messages = [Message(content, dst_node_id=nid, message_type=PREFLIGHT_MESSAGE_TYPE) for nid in nodes]
        log(logging.INFO, "DP-Hype pre-flight: sending the request to %d clients (each checks it and scores "
            "the %d candidates)", len(nodes), len(self.candidates))
        replies = _gather(grid, messages, timeout, "DP-Hype pre-flight")
        ready: list[int] = []
        reasons: Counter[str] = Counter()
        for reply in replies:
            answer = _answer(reply)
            if answer == "ready":
                ready.append(reply.metadata.src_node_id)
            else:
                reasons[answer] += 1
        reasons["no answer within the timeout"] += len(nodes) - len(replies)
        reasons = +reasons  # drop zero counts
        log(logging.INFO, "DP-Hype pre-flight: %d of %d clients ready%s", len(ready), len(nodes),
            "" if not reasons else "; " + _describe(reasons))
        if len(ready) < self.request.min_survivors:
            raise PreflightError(
                f"{len(nodes) - len(ready)} of {len(nodes)} clients are not ready: {_describe(reasons)}; "
                f"at least {self.request.min_survivors} must take part (clients={self.config.clients}, "
                f"dropout={self.config.dropout:g}); the vote was not started and nothing was released")
        return ready


def _gather(grid: Grid, messages: list[Message], timeout: float | None, what: str,
            every: float = 10.0) -> list[Message]:
    """Send ``messages`` and collect the replies until all arrived or ``timeout`` passed, logging the count
    every ``every`` seconds (local scoring can take minutes; the log should say what it waits for)."""
    pending = set(grid.push_messages(messages))
    start = time.monotonic()
    last_log = start
    replies: list[Message] = []
    while pending and (timeout is None or time.monotonic() - start < timeout):
        arrived = list(grid.pull_messages(pending))
        replies.extend(arrived)
        pending.difference_update(reply.metadata.reply_to_message_id for reply in arrived)
        if pending and time.monotonic() - last_log >= every:
            log(logging.INFO, "%s: %d of %d clients answered after %.0f s", what, len(replies), len(messages),
                time.monotonic() - start)
            last_log = time.monotonic()
        if pending:
            time.sleep(0.2)
    return replies


def _chance(log2_probability: float) -> str:
    """``"never"`` or ``"with probability <= 2^x"`` for a bound given as a log2 probability."""
    return "never" if log2_probability == float("-inf") else f"with probability <= 2^{log2_probability:.0f}"


def _answer(reply: Message) -> str:
    """``"ready"``, or the refusal reason of one pre-flight reply."""
    if reply.has_error():
        return f"client error ({(reply.error.reason or '')[:200]})"
    record = reply.content.config_records.get(RECORD_KEY)
    if record is None:
        return "malformed reply"
    if record.get("status") == "ready":
        return "ready"
    code = str(record.get("code"))
    known = code if code in REFUSAL_CODES else "unknown code"
    return f"refused: {known} ({str(record.get('detail', ''))[:200]})"


def _describe(reasons: Counter[str]) -> str:
    return "; ".join(f"{count} x {reason}" for reason, count in reasons.most_common())


def _wait_for_nodes(grid: Grid, clients: int, timeout: float | None) -> list[int]:
    """``clients`` connected node IDs (a random sample when more are connected)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= clients:
            return sorted(random.sample(nodes, clients))
        if deadline is not None and time.monotonic() > deadline:
            raise PreflightError(f"only {len(nodes)} of clients={clients} nodes connected within "
                                 f"{timeout:g} s; nothing was sent")
        time.sleep(0.5)


def train_config(candidate: Candidate, **extra: bool | int | float | str) -> ConfigRecord:
    """A train config that carries the selected candidate (its hyperparameters as keys) for any
    Message-API strategy's ``start(train_config=...)``, plus ``extra`` entries."""
    return ConfigRecord({**candidate, **extra})
