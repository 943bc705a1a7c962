"""DP-Hype on a client: the handlers that answer DP-Hype's messages in a user's own ``ClientApp``.

:func:`register_dphype` adds two handlers to a Message-API ``ClientApp``, under DP-Hype's own action
name, so they never see the user's ``@app.train()``, ``@app.evaluate()`` or ``@app.query()`` messages
and those never see DP-Hype's. Both enforce this node's own privacy policy (:class:`dphype.node.policy.NodePolicy`,
set by whoever runs the node, never by the server; :func:`node_policy`) against an active server
(threat model: :mod:`dphype.node.policy`):

* ``query.dphype`` (pre-flight): parse the :class:`dphype.protocol.VoteRequest`, check it against the
  policy (:func:`dphype.node.policy.check_vote_request`: the node's candidate copy, its epsilon, delta and
  minimum clients, the guarantee of the noise it is asked to add) and the node's lifetime budget
  (:meth:`dphype.node.ledger.Ledger.check`), then score every candidate with the user's task
  (:func:`dphype.protocol.score_candidates`) and keep the scores in the node's context state; answer
  ``ready`` or a refusal (a reason code and a short message without data values). A pre-flight that carries
  the secure vote's first stage (``advertise``, :func:`dphype.flower.secagg.advertise_record`) gets this
  node's fresh round keys beside ``ready``, bound to the request just approved;
* ``train.dphype`` (the secure vote): the stages of DP-Hype's SecAgg+ (:mod:`dphype.secure.secagg`, through
  :func:`dphype.flower.secagg.secure_vote_reply`). The round is bound at its first stage (answered in the
  pre-flight, or in a restart's ``advertise``) to the request approved in the pre-flight, with that request's
  ``n`` and ``xi`` and the policy's ``dphype-min-neighbours``; every stage is checked before it is answered,
  and a stage out of order, repeated or for another request aborts the round. In the masked-input stage, once
  the neighbours' shares have been decrypted and checked, the request is turned into top-k votes plus a fresh
  noise share from the secure generator (:meth:`dphype.modes.SumRelease.ballot`), its guarantee recorded in the
  node's ledger (:meth:`dphype.node.ledger.Ledger.spend`, which checks the lifetime budget again) and only
  then masked and sent. The guarantee is the one the pre-flight computed for this request (bound to it by its
  digest) under this node's policy, kept in the context state; if the policy changed since, the request is
  checked again (:func:`_approved_guarantee`). A pre-flight that arrives during a round past its ``advertise``
  stage is refused and aborts it (one still at ``advertise`` has sent public keys only and is replaced). Any
  refusal makes the node drop out of the round, and the server sees only the sanitized reason
  (:func:`_sanitized`).

Refusals reach the server coarse: the node's own limits and budget (``policy_*``, ``lifetime_budget``)
become the single code ``policy``, so the reply does not say which limit a request crossed; the node's
log keeps the full reason for its operator.

It also adds the argmax mode's handlers (:mod:`dphype.flower.tally`): ``train.dphype_argmax`` (sealed shares
to the tally committee) and, on nodes configured as tallies, ``query.dphype_tally``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shlex
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import log
from flwr.common.config import parse_config_args

from dphype.flower.secagg import RECORD_KEY as STAGE_KEY
from dphype.flower.secagg import abort_round, round_in_progress, secure_vote_reply, stage_reply
from dphype.flower.tally import register_tally, register_winner_vote
from dphype.ml.task import Task
from dphype.node.ledger import Ledger
from dphype.node.policy import POLICY_ENV, REMEDIES, NodePolicy, PolicyError, VoteGuarantee, check_vote_request
from dphype.protocol import Refusal, VoteRequest, as_refusal, score_candidates
from dphype.secure.secagg import Approval

#: Action name of DP-Hype's messages: ``query.dphype`` (pre-flight) and ``train.dphype`` (vote).
ACTION = "dphype"
#: Record key of the request in DP-Hype's messages, of the answer in pre-flight replies and of this
#: node's approved request in its context state.
RECORD_KEY = "dphype"
#: Context-state key of this node's local scores between pre-flight and vote.
SCORES_KEY = "dphype.scores"
#: Context-state key of the approved request itself (its record, :meth:`dphype.protocol.VoteRequest.to_record`).
REQUEST_KEY = "dphype.request"
#: Context-state key of the approved request's guarantee (:class:`dphype.node.policy.VoteGuarantee`) and of the
#: policy it was computed under.
GUARANTEE_KEY = "dphype.guarantee"
#: Refusal codes that would tell the server which of the node's limits a request crossed.
POLICY_CODES = frozenset({"policy_epsilon", "policy_delta", "policy_clients", "lifetime_budget"})

PolicySource = NodePolicy | Callable[[Context], NodePolicy] | None


def node_policy(context: Context) -> NodePolicy:
    """This node's policy from its own channels: the ``dphype-*`` keys of ``context.node_config``
    (``flower-supernode --node-config "dphype-max-epsilon=1 ..."``) over those of the environment variable
    :data:`dphype.node.policy.POLICY_ENV` (``DPHYPE_NODE_POLICY``, same syntax, parsed by Flower's own
    ``--node-config`` parser) in this ClientApp's process. Neither can be set by the server: the run config
    is never read. The default ledger is per ``partition-id`` (:func:`dphype.node.policy.default_ledger_path`),
    and per run as well on a :func:`simulated` node without a ``dphype-ledger``
    (:func:`dphype.node.policy.run_ledger_path`).
    Raises :class:`dphype.node.policy.PolicyError` for an invalid policy.
    """
    text = os.environ.get(POLICY_ENV, "").strip()
    syntax = (f"{POLICY_ENV} must hold dphype-* keys in --node-config syntax "
              "('dphype-max-epsilon=2 dphype-ledger=\"/path\"')")
    try:
        pairs = shlex.split(text)
        # every pair must parse: Flower's parser skips what it cannot match (and opens a lone .toml path)
        if any("=" not in pair or pair.endswith("=") for pair in pairs):
            raise ValueError("a pair has no value")
        from_env = parse_config_args([text]) if pairs else {}
        if len(from_env) != len(pairs):
            raise ValueError("a key repeats or a pair does not parse")
    except Exception as err:  # noqa: BLE001 - Flower raises click's exception for a malformed string
        raise PolicyError(f"{syntax}: {err}") from None
    if not all(str(key).startswith("dphype-") for key in from_env):
        raise PolicyError(f"{POLICY_ENV} may hold dphype-* keys only, got {', '.join(map(str, from_env))}")
    merged = {**from_env, **context.node_config}
    return NodePolicy.from_node_config(merged, run_id=context.run_id if simulated() else None)


def simulated() -> bool:
    """Whether this ClientApp runs as a simulated node: inside a Ray worker of Flower's simulation engine (the
    only backend of Flower 1.41's simulation), not in a SuperNode's ClientApp process or in process."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        from ray._private import worker

        return bool(worker.global_worker.mode == worker.WORKER_MODE)
    except Exception:  # noqa: BLE001 - a Ray without this internal: not known to be a simulation
        return False


def _parent_superlink() -> str:
    """The SuperLink process this simulated node descends from, as ``"flower-superlink (pid N)"``, found by
    walking the parent processes (Linux ``/proc``); a description of where to look elsewhere."""
    pid = os.getpid()
    for _ in range(16):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            break
        if "superlink" in command:
            return f"{command.split()[0].rsplit('/', 1)[-1]} (pid {pid})"
        if pid <= 1:
            break
    return "the local SuperLink that started this simulation"


_ANNOUNCED: set[int] = set()


def _announce_simulated(limits: NodePolicy, run_id: int) -> None:
    """Say once per run and process where a simulated node's policy and ledger come from."""
    if run_id in _ANNOUNCED:
        return
    _ANNOUNCED.add(run_id)
    ledger = ("a per-run ledger (its budget restarts with every run; name a persistent one with dphype-ledger)"
              if limits.ledger_scope == "per-run" else "the persistent ledger named by dphype-ledger")
    log(logging.INFO, "DP-Hype: simulated node: %s at %s; policy %s. Simulated nodes inherit the environment of "
        "%s: a %s given to a later `flwr run` against it is NOT seen; stop that SuperLink to change the policy",
        ledger, limits.ledger, {k: v for k, v in limits.to_dict().items() if k != "dphype-ledger"},
        _parent_superlink(), POLICY_ENV)


def _resolve(policy: PolicySource, context: Context) -> NodePolicy:
    if policy is None:
        return node_policy(context)
    resolved = policy(context) if callable(policy) else policy
    if not isinstance(resolved, NodePolicy):
        raise PolicyError(f"the policy function must return a NodePolicy, got {type(resolved).__name__}")
    return resolved


def _refused(msg: Message, refusal: Refusal) -> Message:
    answer = ConfigRecord({"status": "refused", "code": refusal.code, "detail": refusal.detail})
    return Message(RecordDict({RECORD_KEY: answer}), reply_to=msg)


def _sanitized(what: str, err: BaseException) -> Refusal:
    """``err`` as the refusal the server may see: sanitized (:func:`dphype.protocol.as_refusal`), and a
    refusal by the node's own limits or budget as the coarse ``policy`` (the server learns neither the limit
    nor the budget left). This node's log gets everything: the refusal, the node-only detail (the limit that
    refused, the budget left), the remedy naming the key to change and, for an error of the task or the
    client code, the full traceback."""
    refusal = as_refusal(err)
    local = f"; on this node: {refusal.local}" if refusal.local else ""
    remedy = f"; to resolve: {REMEDIES[refusal.code]}" if refusal.code in REMEDIES else ""
    log(logging.WARNING, "DP-Hype: refusing the %s (%s%s%s)", what, refusal, local, remedy)
    cause = err if refusal is not err else err.__cause__
    if cause is not None:
        trace = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
        log(logging.ERROR, "DP-Hype: the %s failed on this node with:\n%s", what, trace.rstrip())
    if refusal.code in POLICY_CODES:
        return Refusal("policy", "this node's privacy policy does not admit the request")
    return refusal


def register_dphype(app: ClientApp, task_fn: Callable[[Context], Task], *, policy: PolicySource = None) -> ClientApp:
    """Let ``app`` take part in DP-Hype: answer its pre-flight and secure vote with ``task_fn(context)``,
    within this node's privacy policy. Returns ``app``.

    ``task_fn`` builds this node's task (anything with ``maximize`` and ``score(candidates)``, e.g.
    :class:`dphype.ml.task.TorchTask`) from the node's context. ``policy`` is this node's
    :class:`dphype.node.policy.NodePolicy`:

    * ``None`` (the default, and what a deployed app should use): read it where the node's operator sets
      it, :func:`node_policy` (``--node-config`` keys, else the ``DPHYPE_NODE_POLICY`` environment
      variable, else the safe defaults of :data:`dphype.node.policy.POLICY_KEYS`);
    * a function of the node's ``Context`` that returns one (e.g. one policy per simulated node);
    * a ``NodePolicy``, for a process that runs a single node (its ledger file is the node's).

    The candidate list always arrives in the request; the policy's ``candidates`` key is the node's own
    copy, which a request must match.
    """
    if not isinstance(app, ClientApp):
        raise ValueError(f"app must be a flwr ClientApp, got {type(app).__name__}")
    if not callable(task_fn):
        raise ValueError(f"task_fn must be a function of the node's Context, got {type(task_fn).__name__}")
    if policy is not None and not (isinstance(policy, NodePolicy) or callable(policy)):
        raise ValueError(f"policy must be a NodePolicy, a function of the context or None (read from the node "
                         f"config), got {type(policy).__name__}")

    @app.query(ACTION)
    def preflight(msg: Message, context: Context) -> Message:
        try:
            if round_in_progress(context):
                raise Refusal("secagg_round", "a pre-flight arrived during a vote round; the round was aborted")
            limits = _resolve(policy, context)
            if simulated():
                _announce_simulated(limits, context.run_id)
            request = VoteRequest.from_record(msg.content.config_records.get(RECORD_KEY, {}))
            guarantee = check_vote_request(request, limits)
            Ledger(cast(Path, limits.ledger)).check(guarantee, limits)
            task = task_fn(context)
            log(logging.INFO, "DP-Hype: scoring %d candidates on local data", len(request.candidates))
            scores = score_candidates(task, request.candidates, progress=_log_progress)
        except Exception as err:  # noqa: BLE001 - every failure is answered as a sanitized refusal
            _forget(context)
            return _refused(msg, _sanitized("request", err))
        _forget(context)
        context.state.array_records[SCORES_KEY] = ArrayRecord({"scores": Array(scores)})
        context.state.config_records[REQUEST_KEY] = ConfigRecord(request.to_record())
        context.state.config_records[GUARANTEE_KEY] = ConfigRecord(
            {**dataclasses.asdict(guarantee), "policy": _policy_fingerprint(limits)})
        context.state.config_records[RECORD_KEY] = ConfigRecord(
            {"digest": request.digest(), "maximize": bool(task.maximize), "clients": request.config.clients,
             "dropout": request.config.dropout})
        answer = RecordDict({RECORD_KEY: ConfigRecord({"status": "ready", "ledger": limits.ledger_scope})})
        advertise = msg.content.config_records.get(STAGE_KEY)
        if advertise is not None:  # the secure vote's first stage rides on the pre-flight
            try:
                answer[STAGE_KEY] = stage_reply(advertise, context, _approval(request, limits), _no_vote)
            except Exception as err:  # noqa: BLE001 - answered as a sanitized refusal
                _forget(context)
                return _refused(msg, _sanitized("request", err))
        return Message(answer, reply_to=msg)

    @app.train(ACTION)
    def vote(msg: Message, context: Context) -> Message:
        try:
            limits = _resolve(policy, context)
            approved = context.state.config_records.get(RECORD_KEY)
            record = context.state.config_records.get(REQUEST_KEY)
            checked = context.state.config_records.get(GUARANTEE_KEY)
            if approved is None or record is None or checked is None:
                raise Refusal("malformed_request", "no vote request was approved in a pre-flight")
            request = VoteRequest.from_record(record)
            digest = str(approved["digest"])
            if request.digest() != digest:
                raise Refusal("malformed_request", "the stored request is not the one approved in the pre-flight")
            approval = _approval(request, limits)

            def cast_vote(clipping_range: int) -> np.ndarray:
                if SCORES_KEY not in context.state.array_records:
                    raise Refusal("malformed_request", "this node already voted on the approved request")
                guarantee = _approved_guarantee(checked, request, limits)
                scores = context.state.array_records[SCORES_KEY]["scores"].numpy()
                vector = request.mode.ballot(request, scores, maximize=bool(approved["maximize"]),
                                             clipping_range=clipping_range)
                # one pre-flight, one vote: the scores are gone before the vote is recorded
                del context.state.array_records[SCORES_KEY]
                spent = Ledger(cast(Path, limits.ledger)).spend(guarantee, limits, digest)
                log(logging.INFO, "DP-Hype: vote recorded in this node's ledger (lifetime epsilon %.4g of %.4g)",
                    spent, limits.lifetime_epsilon)
                return vector

            return secure_vote_reply(msg, context, approval, cast_vote)
        except Exception as err:  # noqa: BLE001 - the server sees the sanitized reason only
            raise _sanitized("vote", err) from None

    register_winner_vote(app, policy=policy)  # release="argmax": sealed shares to the tallies
    register_tally(app)  # answered only on nodes configured as tallies
    return app


def _forget(context: Context) -> None:
    """Drop any earlier approval, its scores and any round: a pre-flight starts afresh."""
    abort_round(context)
    context.state.array_records.pop(SCORES_KEY, None)
    for key in (RECORD_KEY, REQUEST_KEY, GUARANTEE_KEY):
        context.state.config_records.pop(key, None)


def _approval(request: VoteRequest, limits: NodePolicy) -> Approval:
    """What this node approved of ``request`` for its secure vote round, with its policy's ``min_neighbours``."""
    return Approval(request=request.digest(), clients=request.config.clients, survivors=request.min_survivors,
                    size=len(request.candidates), min_neighbours=limits.min_neighbours)


def _no_vote(clipping_range: int) -> np.ndarray:
    """The vote callback of the pre-flight's ``advertise`` stage, which casts no vote."""
    raise Refusal("secagg_round", "no vote is cast in the pre-flight")


def _policy_fingerprint(limits: NodePolicy) -> str:
    return json.dumps(limits.to_dict(), sort_keys=True, default=str)


def _approved_guarantee(checked: ConfigRecord, request: VoteRequest, limits: NodePolicy) -> VoteGuarantee:
    """The guarantee of the approved ``request`` under this node's policy ``limits``: the one the pre-flight
    computed (``checked``; the request is the approved one, bound by its digest) while the policy is unchanged,
    else :func:`dphype.node.policy.check_vote_request` afresh (which refuses what the new policy does not admit).
    Reusing it spares the vote's process the accountant's solvers; the lifetime budget is checked at charge
    time by :meth:`dphype.node.ledger.Ledger.spend` either way."""
    if checked.get("policy") != _policy_fingerprint(limits):
        return check_vote_request(request, limits)
    stored = {f.name: checked[f.name] for f in dataclasses.fields(VoteGuarantee)}  # written by this node
    return VoteGuarantee(**cast(dict[str, Any], stored))


def _log_progress(done: int, total: int) -> None:
    log(logging.INFO, "DP-Hype: scoring progress %d/%d", done, total)
