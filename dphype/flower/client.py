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
  ``ready`` or a refusal (a reason code and a short message without data values);
* ``train.dphype`` (the secure vote, inside SecAgg+): every SecAgg+ stage is checked before it is answered
  (:func:`dphype.flower.secagg.check_stage`: the setup, the neighbours, the share sources, the unmask
  lists against the approved request's ``n`` and ``xi`` and the policy's ``dphype-min-neighbours``). When
  the protocol asks for the masked input, the request must be the one approved in the pre-flight; it is
  checked again, turned into top-k votes plus a fresh noise share from the secure generator
  (:func:`dphype.protocol.noisy_vote`), recorded in the node's ledger (:meth:`dphype.node.ledger.Ledger.spend`)
  and only then handed to SecAgg+. Any refusal makes the node drop out of the round, and the server
  sees only the sanitized reason (:func:`dphype.protocol.as_refusal`).

It also adds the argmax mode's handlers (:mod:`dphype.flower.tally`): ``train.dphype_argmax`` (sealed shares
to the tally committee) and, on nodes configured as tallies, ``query.dphype_tally``.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import Scalar, log
from flwr.common.config import parse_config_args

from dphype.flower.secagg import secure_vote_reply
from dphype.flower.tally import register_tally, register_winner_vote
from dphype.ml.task import Task
from dphype.node.ledger import Ledger
from dphype.node.policy import POLICY_ENV, NodePolicy, PolicyError, check_vote_request
from dphype.protocol import Refusal, VoteRequest, as_refusal, noisy_vote, score_candidates

#: Action name of DP-Hype's messages: ``query.dphype`` (pre-flight) and ``train.dphype`` (vote).
ACTION = "dphype"
#: Record key of the request in DP-Hype's messages, of the answer in pre-flight replies and of this
#: node's approved request in its context state.
RECORD_KEY = "dphype"
#: Context-state key of this node's local scores between pre-flight and vote.
SCORES_KEY = "dphype.scores"

PolicySource = NodePolicy | Callable[[Context], NodePolicy] | None


def node_policy(context: Context) -> NodePolicy:
    """This node's policy from its own channels: the ``dphype-*`` keys of ``context.node_config``
    (``flower-supernode --node-config "dphype-max-epsilon=1 ..."``) over those of the environment variable
    :data:`dphype.node.policy.POLICY_ENV` (``DPHYPE_NODE_POLICY``, same syntax, parsed by Flower's own
    ``--node-config`` parser) in this ClientApp's process. Neither can be set by the server: the run config
    is never read. The default ledger is per ``partition-id`` (:func:`dphype.node.policy.default_ledger_path`).
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
    return NodePolicy.from_node_config({**from_env, **context.node_config})


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
    """``err`` as the refusal the server may see; the full error stays in this node's debug log."""
    refusal = as_refusal(err)
    log(logging.WARNING, "DP-Hype: refusing the %s (%s)", what, refusal)
    if refusal is not err:
        log(logging.DEBUG, "DP-Hype: the %s failed with %r", what, err)
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
            limits = _resolve(policy, context)
            request = VoteRequest.from_record(msg.content.config_records.get(RECORD_KEY, {}))
            guarantee = check_vote_request(request, limits)
            Ledger(cast(Path, limits.ledger)).check(guarantee, limits)
            task = task_fn(context)
            log(logging.INFO, "DP-Hype: scoring %d candidates on local data", len(request.candidates))
            scores = score_candidates(task, request.candidates, progress=_log_progress)
        except Exception as err:  # noqa: BLE001 - every failure is answered as a sanitized refusal
            return _refused(msg, _sanitized("request", err))
        context.state.array_records[SCORES_KEY] = ArrayRecord({"scores": Array(scores)})
        context.state.config_records[RECORD_KEY] = ConfigRecord(
            {"digest": request.digest(), "maximize": bool(task.maximize), "clients": request.config.clients,
             "dropout": request.config.dropout})
        return Message(RecordDict({RECORD_KEY: ConfigRecord({"status": "ready"})}), reply_to=msg)

    @app.train(ACTION)
    def vote(msg: Message, context: Context) -> Message:
        try:
            limits = _resolve(policy, context)
            approved = context.state.config_records.get(RECORD_KEY)
            if approved is None:
                raise Refusal("malformed_request", "no vote request was approved in a pre-flight")

            def masked_input(fit_config: dict[str, Scalar], clipping_range: int) -> np.ndarray:
                request = VoteRequest.from_record(fit_config)
                if approved["digest"] != request.digest() or SCORES_KEY not in context.state.array_records:
                    raise Refusal("malformed_request", "the vote request is not the one approved in the pre-flight")
                guarantee = check_vote_request(request, limits)
                scores = context.state.array_records[SCORES_KEY]["scores"].numpy()
                vector = noisy_vote(request, scores, maximize=bool(approved["maximize"]),
                                    clipping_range=clipping_range)
                # one pre-flight, one vote: the scores are gone before the vote is recorded
                del context.state.array_records[SCORES_KEY]
                spent = Ledger(cast(Path, limits.ledger)).spend(guarantee, limits, request.digest())
                log(logging.INFO, "DP-Hype: vote recorded in this node's ledger (lifetime epsilon %.4g of %.4g)",
                    spent, limits.lifetime_epsilon)
                return vector

            return secure_vote_reply(msg, context, masked_input, clients=int(cast(int, approved["clients"])),
                                     dropout=float(cast(float, approved["dropout"])),
                                     min_neighbours=limits.min_neighbours)
        except Exception as err:  # noqa: BLE001 - the server sees the sanitized reason only
            raise _sanitized("vote", err) from None

    register_winner_vote(app, policy=policy)  # release="argmax": sealed shares to the tallies
    register_tally(app)  # answered only on nodes configured as tallies
    return app


def _log_progress(done: int, total: int) -> None:
    log(logging.INFO, "DP-Hype: scoring progress %d/%d", done, total)
