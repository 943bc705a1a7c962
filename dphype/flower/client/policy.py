"""A node's privacy policy in DP-Hype's client handlers: where it comes from, how a request it refuses is answered.

* :func:`node_policy` reads the policy from the node operator's own channels (never the server's);
  :func:`resolve_policy` applies a :data:`PolicySource` (``register_dphype(..., policy=...)``); :func:`simulated`
  tells a simulated node, whose operator :func:`announce_simulated` informs once per run;
* :func:`sanitized` turns an error into the refusal the server may see (a refusal by the node's own limits or
  budget becomes the coarse ``policy``, so the reply does not say which limit a request crossed; the node's log
  keeps the full reason for its operator), :func:`refused` into the pre-flight's answer;
* :func:`approved_guarantee` gives the vote the guarantee its pre-flight computed while the policy is unchanged
  (:func:`policy_fingerprint`).
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

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common import log
from flwr.common.config import parse_config_args

from dphype.flower.wire import RECORD_KEY
from dphype.node.policy import POLICY_ENV, REMEDIES, NodePolicy, PolicyError, VoteGuarantee, check_vote_request
from dphype.protocol import VoteRequest
from dphype.refusal import Refusal, as_refusal

#: Refusal codes that would tell the server which of the node's limits a request crossed.
POLICY_CODES = frozenset({"policy_epsilon", "policy_delta", "policy_clients", "lifetime_budget"})

#: Where a node's policy comes from (:func:`dphype.flower.client.register_dphype`'s ``policy``): a
#: :class:`dphype.node.policy.NodePolicy`, a function of the node's ``Context`` that returns one, or ``None``
#: (:func:`node_policy`).
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


def announce_simulated(limits: NodePolicy, run_id: int) -> None:
    """On a :func:`simulated` node, say once per run and process where its policy and ledger come from."""
    if not simulated() or run_id in _ANNOUNCED:
        return
    _ANNOUNCED.add(run_id)
    ledger = ("a per-run ledger (its budget restarts with every run; name a persistent one with dphype-ledger)"
              if limits.ledger_scope == "per-run" else "the persistent ledger named by dphype-ledger")
    log(logging.INFO, "DP-Hype: simulated node: %s at %s; policy %s. Simulated nodes inherit the environment of "
        "%s: a %s given to a later `flwr run` against it is NOT seen; stop that SuperLink to change the policy",
        ledger, limits.ledger, {k: v for k, v in limits.to_dict().items() if k != "dphype-ledger"},
        _parent_superlink(), POLICY_ENV)


def resolve_policy(policy: PolicySource, context: Context) -> NodePolicy:
    """This node's policy from ``policy``: :func:`node_policy` for ``None``, else the policy or what the function
    returns for ``context`` (:class:`dphype.node.policy.PolicyError` if that is no ``NodePolicy``)."""
    if policy is None:
        return node_policy(context)
    resolved = policy(context) if callable(policy) else policy
    if not isinstance(resolved, NodePolicy):
        raise PolicyError(f"the policy function must return a NodePolicy, got {type(resolved).__name__}")
    return resolved


def refused(msg: Message, refusal: Refusal) -> Message:
    """The pre-flight's answer to ``msg``: ``refusal`` (sanitized by :func:`sanitized`)."""
    answer = ConfigRecord({"status": "refused", "code": refusal.code, "detail": refusal.detail})
    return Message(RecordDict({RECORD_KEY: answer}), reply_to=msg)


def sanitized(what: str, err: BaseException) -> Refusal:
    """``err`` as the refusal the server may see: sanitized (:func:`dphype.refusal.as_refusal`), and a
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


def policy_fingerprint(limits: NodePolicy) -> str:
    """``limits`` as a canonical string: a guarantee computed under another policy is not reused."""
    return json.dumps(limits.to_dict(), sort_keys=True, default=str)


def approved_guarantee(checked: ConfigRecord, request: VoteRequest, limits: NodePolicy) -> VoteGuarantee:
    """The guarantee of the approved ``request`` under this node's policy ``limits``: the one the pre-flight
    computed (``checked``; the request is the approved one, bound by its digest) while the policy is unchanged,
    else :func:`dphype.node.policy.check_vote_request` afresh (which refuses what the new policy does not admit).
    Reusing it spares the vote's process the accountant's solvers; the lifetime budget is checked at charge
    time by :meth:`dphype.node.ledger.Ledger.spend` either way."""
    if checked.get("policy") != policy_fingerprint(limits):
        return check_vote_request(request, limits)
    stored = {f.name: checked[f.name] for f in dataclasses.fields(VoteGuarantee)}  # written by this node
    return VoteGuarantee(**cast(dict[str, Any], stored))
