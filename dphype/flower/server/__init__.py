"""DP-Hype on the server, in the shape of Flower's Message-API strategies: settings, then ``start(grid)``.

The server side, in the package: this module (`DPHype`), `dphype.flower.server.readiness` (waiting
for nodes, the pre-flight, `dphype.flower.server.readiness.PreflightError`),
`dphype.flower.server.secagg_server` (the SecAgg+ round) and `dphype.flower.server.committee_server` (the argmax
mode's committee). The message types and keys are `dphype.flower.wire`'s.

`DPHype` runs DP-Hype's selection inside any ``@app.main()``:

1. on construction, everything the server can check without simulating: the configuration, the candidate
   list, the noise calibration (`dphype.protocol.make_vote_request`), the secure-sum range and the SecAgg+
   graph for ``n`` and ``xi`` (`dphype.flower.server.secagg_server.secagg_graph`);
2. ``start(grid)`` first asks the planner for its prediction from public parameters (`DPHype.plan`,
   `dphype.selection.planner.check_plan`: a warning below one half, a refusal below
   ``config.min_success``) -- before any client works; then it waits for ``n`` nodes (logging how many are
   connected every 5 s), runs the pre-flight
   (``query.dphype``: every client checks the request against its own candidate list, task and limits,
   scores the candidates and answers ready, with its keys for the secure vote's first stage, or a reason),
   and aborts with one error counting the reasons
   when fewer than ``ceil((1 - xi) n)`` clients are ready -- nothing is sent in the vote round then;
3. one round of DP-Hype's SecAgg+ (``train.dphype``, `dphype.secure.secagg`) over the ready clients
   returns the exact noisy vote sum (`dphype.flower.server.secagg_server.run_secure_sum`), unmasked only if enough
   clients contributed and every client verified that any sum it could be part of holds enough noise;
4. the release (the mode's `dphype.release.ReleaseMode.release`): the selection rule's pick, its confidence
   and the privacy report.

When the release mode's aggregator is the tally committee (``release="argmax"``) steps 3-4 are
`dphype.flower.server.committee_server.run_committee_selection`: sealed shares to the committee of tally nodes named
by ``tallies``, a secure argmax on MPyC, only the index released.

Train the final model afterwards with any Message-API strategy, passing
`dphype.flower.selected.train_config` ``(result.best_params)`` as its train config.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from flwr.app import ConfigRecord
from flwr.common import log
from flwr.serverapp.grid import Grid

from dphype.config import DPHypeConfig
from dphype.flower.grid import check_timeout
from dphype.flower.server.committee_server import TALLY_TIMEOUT, check_tally_timeout, run_committee_selection
from dphype.flower.server.readiness import run_preflight, wait_for_nodes
from dphype.flower.server.secagg_server import advertise_record, run_secure_sum, secagg_graph
from dphype.privacy.noise import client_noise_std
from dphype.protocol import DPHypeResult, make_vote_request, selection_plan
from dphype.release import Aggregator, committee_releases
from dphype.secure.roster import Roster
from dphype.secure.secagg import Advertised
from dphype.secure.secagg_params import CORRUPT_FRACTION, check_corrupt_fraction
from dphype.secure.secure_sum import clip_probability
from dphype.selection.candidates import CandidateList
from dphype.selection.planner import Plan


class DPHype:
    """DP-Hype's private selection among ``candidates`` with the privacy parameters of ``config``.

    Everything the server can check without simulating is checked on construction (module docstring, step 1).

    Args:
        candidates: The public, ordered candidate list (sent to every client with the request).
        config: The validated privacy parameters (`dphype.config.DPHypeConfig`).
        num_shares: SecAgg+ parameter (Flower's int, or a fraction of the clients); ``None`` (the default) uses
            the secure graph of `dphype.secure.secagg_params.secure_parameters`, and an explicit choice below it
            is refused (`dphype.flower.server.secagg_server.secagg_graph`).
        reconstruction_threshold: SecAgg+ parameter (Flower's int, or a fraction of the shares); ``None`` and
            refusals as for ``num_shares``.
        corrupt_fraction: Fraction of the clients assumed to collude with the server when the SecAgg+ graph is
            chosen or checked (default 1/3, `dphype.secure.secagg_params.CORRUPT_FRACTION`).
        tallies: ``release="argmax"`` only: the committee's X25519 public keys in committee order (at least 3
            distinct).
        roster: The federation's roster (`dphype.secure.roster.Roster`, or its digest) the server expects: the
            request names its digest, and a node with another roster, or none, refuses it in the pre-flight before
            it scores anything; ``None``: each node binds its own roster (the result says which one voted).

    Raises:
        ValueError: If the request cannot be made (`dphype.protocol.make_vote_request`), ``corrupt_fraction`` is
            out of range, or no SecAgg+ round can sum the votes of ``config.clients`` with its dropout.
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
        roster: Roster | str | None = None,
    ) -> None:
        if config.mode.uses_committee and not tallies:
            raise ValueError(f"release={config.release!r} needs the tally keys, got none: pass "
                             "DPHype(candidates, config, tallies=committee.keys)\nwith committee = "
                             "dphype.flower.connected_committee(grid, config), which finds the tally nodes; in "
                             "simulation give the ClientApp the mod dphype.flower.simulated_roles and run it with "
                             "`dphype run` (`dphype new --release argmax` writes such an app); in a deployment "
                             "start 3 tally SuperNodes (clients/start-tally.sh)")
        digest = roster.digest() if isinstance(roster, Roster) else (roster or "")
        self.request = make_vote_request(config, candidates, tallies=tallies, roster=digest)
        self.num_shares = num_shares
        self.reconstruction_threshold = reconstruction_threshold
        self.corrupt_fraction = check_corrupt_fraction(corrupt_fraction)
        self._plan: Plan | None = None
        self._notes: tuple[str, ...] = ()
        self._tally_timeout = TALLY_TIMEOUT
        self._federation: str | None = None
        # the SecAgg+ graph for n clients and the tolerated dropout: refused here, before any client works
        try:
            secagg_graph(config.clients, self.request.min_survivors, num_shares, reconstruction_threshold,
                         self.corrupt_fraction)
        except ValueError as err:
            raise ValueError(f"no SecAgg+ round can sum the votes of clients={config.clients} with "
                             f"dropout={config.dropout:g}: {err}") from None

    def plan(self) -> Plan:
        """The planner's prediction from public parameters only (`dphype.selection.planner.check_plan`), cached.

        Returns:
            The plan (cached).

        Raises:
            ValueError: If the scenario's simulated chance of a good pick is below ``config.min_success``.
        """  # noqa: DOC502
        if self._plan is None:
            self._plan = selection_plan(self.config, self.candidates)
        return self._plan

    @property
    def config(self) -> DPHypeConfig:
        """The request's privacy parameters."""
        return self.request.config

    @property
    def candidates(self) -> CandidateList:
        """The public candidate list."""
        return self.request.candidates

    def __repr__(self) -> str:
        cfg = self.config
        return (f"DPHype({len(self.candidates)} candidates, release={cfg.release!r}, epsilon={cfg.epsilon:g}, "
                f"{self.request.mode.describe(self.request)})")

    def start(self, grid: Grid, *, timeout: float | None = 3600.0, connect_timeout: float | None = 600.0,
              committee_nodes: Sequence[int] | None = None, tally_timeout: float = TALLY_TIMEOUT) -> DPHypeResult:
        """Select one candidate privately; a node that vanishes counts as a dropout.

        Args:
            grid: The ServerApp's grid.
            timeout: Bounds (seconds) the pre-flight (which includes local scoring) and each SecAgg+ stage
                (``None``: no limit).
            connect_timeout: Bounds the wait (seconds) for ``clients`` nodes to connect (``None``: no limit).
            committee_nodes: Argmax mode only: the tallies' node ids in committee order, as
                `dphype.flower.connected_committee` returns them, so the committee is not asked
                again; empty or ``None``: none given (the only choice in sum mode).
            tally_timeout: Committee releases only: seconds each tally's MPyC party has to check the ballots and open
                the result (`dphype.flower.server.committee_server.run_committee_selection`), a finite number in ``(0,
                86400]``.

        Returns:
            The result, with the pre-flight's notes.

        Raises:
            ValueError: If a timeout is invalid, ``committee_nodes`` is given outside argmax mode, or the plan is
                below ``config.min_success``.
            dphype.flower.server.readiness.PreflightError: When too few clients are ready (nothing released).
            dphype.secure.secure_sum.SecureSumError: When too few clients contribute to the sum (nothing
                released).
        """  # noqa: DOC502, DOC503
        timeout = check_timeout("timeout", timeout)
        connect_timeout = check_timeout("connect_timeout", connect_timeout)
        tally_timeout = check_tally_timeout(tally_timeout)
        cfg = self.config
        committee_nodes = tuple(committee_nodes or ()) or None  # empty: a mode without a committee, or ask it
        if committee_nodes is not None and not cfg.mode.uses_committee:
            raise ValueError(f"committee_nodes applies to the committee releases "
                             f"({committee_releases()}) only, got release={cfg.release!r}")
        plan = self.plan()
        log(logging.INFO, "Starting %r", self)
        # the planner's advice, once per run, in one line; its details go into the result (`DPHypeResult.plan`)
        log(logging.WARNING if plan.warnings else logging.INFO, "DP-Hype plan: %s", plan.advice())
        votes = cfg.mode.votes_per_client(cfg, len(self.candidates))
        if votes != cfg.k:
            log(logging.WARNING, "DP-Hype: the %r ballot votes for %d candidates per client, not the configured k=%d "
                "(set ballot='top-k' to vote with k=%d)", cfg.ballot, votes, cfg.k, cfg.k)
        drive = {Aggregator.SECAGG: self._sum_over_secagg, Aggregator.COMMITTEE: self._select_over_committee}
        self._tally_timeout = tally_timeout
        result = drive[cfg.mode.aggregator](grid, timeout, connect_timeout, committee_nodes)
        return dataclasses.replace(result, notes=self._notes, federation=self._federation, plan=plan.to_dict())

    def _select_over_committee(self, grid: Grid, timeout: float | None, connect_timeout: float | None,
                               committee_nodes: Sequence[int] | None) -> DPHypeResult:
        """Steps 3-4 for a mode whose aggregator is the tally committee (`run_committee_selection`)."""
        return run_committee_selection(grid, self.request, preflight=self._preflight, timeout=timeout,
                                    connect_timeout=connect_timeout, committee_nodes=committee_nodes,
                                    tally_timeout=self._tally_timeout)

    def _sum_over_secagg(self, grid: Grid, timeout: float | None, connect_timeout: float | None,
                         committee_nodes: Sequence[int] | None) -> DPHypeResult:
        """Steps 2-4 over SecAgg+: the pre-flight with the round's first stage, the round, the mode's release."""
        cfg = self.config
        log(logging.INFO, "DP-Hype: total noise std sigma=%.4g, each client's share std %.4g",
            self.request.sigma, client_noise_std(self.request.sigma, cfg.clients, cfg.dropout))
        start = time.perf_counter()
        nodes = wait_for_nodes(grid, cfg.clients, connect_timeout)
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
        result = dataclasses.replace(released, secure_sum={
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
        """`dphype.flower.server.readiness.run_preflight` of this request over ``nodes``; keeps its notes."""
        ready, self._notes, self._federation = run_preflight(grid, self.request, nodes, timeout, advertise)
        return ready


def _chance(log2_probability: float) -> str:
    """``"never"`` or ``"with probability <= 2^x"`` for a bound given as a log2 probability."""
    return "never" if log2_probability == float("-inf") else f"with probability <= 2^{log2_probability:.0f}"
