"""DP-Hype on the server, in the shape of Flower's Message-API strategies: settings, then ``start(grid)``.

:class:`DPHype` runs DP-Hype's selection inside any ``@app.main()``:

1. on construction, everything the server can check without simulating: the configuration, the candidate
   list, the noise calibration (:func:`dphype.protocol.make_vote_request`), the secure-sum range and the SecAgg+
   graph for ``n`` and ``xi`` (:func:`dphype.flower.secagg.secagg_graph`);
2. ``start(grid)`` first asks the planner for its prediction from public parameters (:meth:`DPHype.plan`,
   :func:`dphype.selection.planner.check_plan`: a warning below one half, a refusal below
   ``config.min_success``) -- before any client works; then it waits for ``n`` nodes (logging how many are
   connected every 5 s), runs the pre-flight
   (``query.dphype``: every client checks the request against its own candidate list, task and limits,
   scores the candidates and answers ready, with its keys for the secure vote's first stage, or a reason),
   and aborts with one error counting the reasons
   when fewer than ``ceil((1 - xi) n)`` clients are ready -- nothing is sent in the vote round then;
3. one round of DP-Hype's SecAgg+ (``train.dphype``, :mod:`dphype.secure.secagg`) over the ready clients
   returns the exact noisy vote sum (:func:`dphype.flower.secagg.run_secure_sum`), unmasked only if enough
   clients contributed and every client verified that any sum it could be part of holds enough noise;
4. the release (the mode's :meth:`~dphype.modes.ReleaseMode.release`): the selection rule's pick, its confidence
   and the privacy report.

When the release mode's aggregator is the tally committee (``release="argmax"``) steps 3-4 are
:func:`dphype.flower.tally.run_winner_selection`: sealed shares to the committee of tally nodes named by
``tallies``, a secure argmax on MPyC, only the index released.

Train the final model afterwards with any Message-API strategy, passing
:func:`dphype.flower.selected.train_config` ``(result.best_params)`` as its train config.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import log
from flwr.serverapp.grid import Grid

from dphype.config import DPHypeConfig
from dphype.flower.client import ACTION, RECORD_KEY
from dphype.flower.grid import send_and_receive
from dphype.flower.secagg import RECORD_KEY as STAGE_KEY
from dphype.flower.secagg import advertise_record, check_timeout, run_secure_sum, secagg_graph
from dphype.flower.tally import run_winner_selection
from dphype.modes import Aggregator, release_modes
from dphype.node.policy import REMEDIES
from dphype.privacy.noise import client_noise_std
from dphype.protocol import REFUSAL_CODES, DPHypeResult, make_vote_request
from dphype.secure.secagg import Advertised
from dphype.secure.secagg_params import CORRUPT_FRACTION, check_corrupt_fraction
from dphype.secure.secure_sum import clip_probability
from dphype.selection.candidates import CandidateList
from dphype.selection.planner import Plan, check_plan

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
        self.num_shares = num_shares
        self.reconstruction_threshold = reconstruction_threshold
        self.corrupt_fraction = check_corrupt_fraction(corrupt_fraction)
        self._plan: Plan | None = None
        self._notes: tuple[str, ...] = ()
        # the SecAgg+ graph for n clients and the tolerated dropout: refused here, before any client works
        try:
            secagg_graph(config.clients, self.request.min_survivors, num_shares, reconstruction_threshold,
                         self.corrupt_fraction)
        except ValueError as err:
            raise ValueError(f"no SecAgg+ round can sum the votes of clients={config.clients} with "
                             f"dropout={config.dropout:g}: {err}") from None

    def plan(self) -> Plan:
        """The planner's prediction from public parameters only (:func:`dphype.selection.planner.check_plan`,
        about a second of simulation, run once on first call); ``ValueError`` below ``config.min_success``.
        :meth:`start` calls it before any client works."""
        if self._plan is None:
            cfg = self.config
            self._plan = check_plan(cfg.clients, cfg.epsilon, cfg.delta, self.candidates.feature_space(),
                                    len(self.candidates), cfg.k, dropout=cfg.dropout, min_success=cfg.min_success,
                                    rule=cfg.rule, noise=cfg.noise, accountant=cfg.accountant,
                                    neighbouring=cfg.neighbouring, release=cfg.mode, releases=release_modes())
        return self._plan

    @property
    def config(self) -> DPHypeConfig:
        return self.request.config

    @property
    def candidates(self) -> CandidateList:
        return self.request.candidates

    def __repr__(self) -> str:
        cfg = self.config
        return (f"DPHype({len(self.candidates)} candidates, release={cfg.release!r}, epsilon={cfg.epsilon:g}, "
                f"{self.request.mode.describe(self.request)})")

    def start(self, grid: Grid, *, timeout: float | None = 3600.0, connect_timeout: float | None = 600.0,
              committee_nodes: Sequence[int] | None = None) -> DPHypeResult:
        """Select one candidate privately; returns the winner with its privacy report.

        ``connect_timeout`` bounds the wait (seconds) for ``clients`` nodes to connect; ``timeout`` bounds
        the pre-flight (which includes local scoring) and each SecAgg+ stage, so a node that vanishes
        counts as a dropout instead of stalling the run (``None``: no limit). Raises :class:`PreflightError` or
        :class:`dphype.secure.secure_sum.SecureSumError` (nothing released) when too few clients take part.
        ``committee_nodes`` (argmax mode only): the tallies' node ids in committee order, as
        :func:`dphype.flower.tally.discover_committee` returns them, so the committee is not asked again.
        """
        timeout = check_timeout("timeout", timeout)
        connect_timeout = check_timeout("connect_timeout", connect_timeout)
        cfg = self.config
        if committee_nodes is not None and cfg.mode.aggregator is not Aggregator.COMMITTEE:
            raise ValueError(f"committee_nodes applies to release='argmax' only, got release={cfg.release!r}")
        plan = self.plan()
        log(logging.INFO, "Starting %r", self)
        log(logging.INFO, "DP-Hype plan: predicted chance of a good pick %.2f with the %s rule (argmax %.2f)",
            plan.success, cfg.rule, plan.success_argmax)
        for warning in plan.warnings:
            log(logging.WARNING, "DP-Hype: %s", warning)
        if cfg.mode.aggregator is Aggregator.COMMITTEE:
            return run_winner_selection(self, grid, timeout=timeout, connect_timeout=connect_timeout,
                                        committee_nodes=committee_nodes)
        log(logging.INFO, "DP-Hype: total noise std sigma=%.4g, each client's share std %.4g",
            self.request.sigma, client_noise_std(self.request.sigma, cfg.clients, cfg.dropout))
        start = time.perf_counter()
        nodes = _wait_for_nodes(grid, cfg.clients, connect_timeout)
        round_id, advertise = advertise_record(self.request.digest())
        ready = self._preflight(grid, nodes, timeout, advertise)
        sum_ = run_secure_sum(
            grid, list(ready), self.request.digest(), size=len(self.candidates), noise=cfg.noise,
            min_survivors=self.request.min_survivors, num_shares=self.num_shares,
            reconstruction_threshold=self.reconstruction_threshold, corrupt_fraction=self.corrupt_fraction,
            timeout=timeout, advertised=Advertised(round_id, ready),
        )
        clip = clip_probability(size=len(self.candidates), sigma=self.request.sigma, clients=cfg.clients,
                                dropout=cfg.dropout, noise=cfg.noise, clipping_range=sum_.clipping_range)
        released = self.request.mode.release(self.request, sum_.total, sum_.survivors)
        sel = released.selection
        assert sel is not None  # the sum release always carries the rule's selection
        result = dataclasses.replace(released, notes=self._notes, secure_sum={
            **sum_.secagg.to_dict(), "clipping_range": sum_.clipping_range, "clip_probability": clip,
            "stage_seconds": sum_.stage_seconds,
            "statement": f"a share outside the range makes its client refuse (a dropout): the release is "
                         f"(epsilon, delta + {clip:.1e})-DP; Bell et al.'s bounds: the server learns more than "
                         f"the sum {_chance(sum_.secagg.log2_insecure)}, the sum fails "
                         f"{_chance(sum_.secagg.log2_failure)}"})
        log(logging.INFO, "DP-Hype selected candidate %d %s by the %s rule (epsilon=%.4g at delta=%g, %d survivors; "
            "confidence: top-voted %.2f, within the top group %.2f, margin %.2f sigma) in %.1f s",
            result.selected_index, result.selected, sel.rule, result.report.epsilon,
            result.report.delta, sum_.survivors, sel.p_top, sel.p_top_group, sel.margin, time.perf_counter() - start)
        if sel.warning:
            log(logging.WARNING, "DP-Hype: %s", sel.warning)
        return result

    def _preflight(self, grid: Grid, nodes: list[int], timeout: float | None,
                   advertise: ConfigRecord | None = None) -> dict[int, dict[str, Any]]:
        """Send the request to ``nodes``, with the secure vote's first stage ``advertise`` if given
        (:func:`dphype.flower.secagg.advertise_record`); return the nodes that answered ready, each with its
        answer to ``advertise`` (its round keys; empty without), or raise :class:`PreflightError`."""
        content = RecordDict({RECORD_KEY: ConfigRecord(self.request.to_record())})
        if advertise is not None:
            content[STAGE_KEY] = advertise
        messages = [Message(content, dst_node_id=nid, message_type=PREFLIGHT_MESSAGE_TYPE) for nid in nodes]
        log(logging.INFO, "DP-Hype pre-flight: sending the request to %d clients (each checks it and scores "
            "the %d candidates)", len(nodes), len(self.candidates))
        replies = send_and_receive(grid, messages, timeout=timeout, what="DP-Hype pre-flight")
        ready: dict[int, dict[str, Any]] = {}
        reasons: Counter[str] = Counter()
        per_run = 0
        for reply in replies:
            answer = _answer(reply)
            if answer == "ready":
                ready[reply.metadata.src_node_id] = dict(reply.content.config_records.get(STAGE_KEY, {}))
                per_run += reply.content.config_records[RECORD_KEY].get("ledger") == "per-run"
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
        self._notes = ()
        if per_run:
            note = (f"{per_run} of {len(ready)} nodes are simulated with a per-run ledger: their lifetime budget "
                    "restarts with every run (an operator who names dphype-ledger keeps one across runs)")
            log(logging.INFO, "DP-Hype: %s", note)
            self._notes = (note,)
        return ready


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
    remedy = f"; to resolve: {REMEDIES[known]}" if known in REMEDIES else ""
    return f"refused: {known} ({str(record.get('detail', ''))[:200]}{remedy})"


def _describe(reasons: Counter[str]) -> str:
    return "; ".join(f"{count} x {reason}" for reason, count in reasons.most_common())


def _wait_for_nodes(grid: Grid, clients: int, timeout: float | None, every: float = 5.0) -> list[int]:
    """``clients`` connected node IDs (a random sample when more are connected), logging how many are connected
    every ``every`` seconds while it waits (it looks every 0.5 s, or every ``every`` s when that is shorter)."""
    start = time.monotonic()
    last_log = start
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= clients:
            return sorted(random.sample(nodes, clients))
        waited = time.monotonic() - start
        if timeout is not None and waited > timeout:
            raise PreflightError(f"only {len(nodes)} of clients={clients} nodes connected within {timeout:g} s; "
                                 "nothing was sent: start more SuperNodes, or run with clients <= the nodes you have")
        if time.monotonic() - last_log >= every:
            log(logging.INFO, "DP-Hype: waiting for nodes: %d of clients=%d connected after %.0f s%s", len(nodes),
                clients, waited, "" if timeout is None else f" (giving up after {timeout:g} s)")
            last_log = time.monotonic()
        time.sleep(min(0.5, every))
