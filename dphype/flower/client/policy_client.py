"""A node's privacy policy in DP-Hype's client handlers: where it comes from, how a request it refuses is answered.

* `node_policy` reads the policy from the node operator's own channels (never the server's);
  `resolve_policy` applies a `PolicySource` (``register_dphype(..., policy=...)``); `simulated`
  tells a simulated node, whose operator `announce_simulated` informs once per run;
* `sanitized` turns an error into the refusal the server may see (a refusal by the node's own limits or
  budget becomes the coarse ``policy``, so the reply does not say which limit a request crossed; the node's log
  keeps the full reason for its operator), `refused` into the pre-flight's answer;
* `approved_guarantee` gives the vote the guarantee its pre-flight computed while the policy is unchanged
  (`policy_fingerprint`).
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
from flwr.clientapp import ClientApp
from flwr.common import log
from flwr.common.config import parse_config_args

from dphype.flower.federation import federation_set, simulated_federation, voter_name
from dphype.flower.wire import RECORD_KEY, SCORES_STATE
from dphype.node.evaluation_policy import EvaluationGuarantee, EvaluationRequest
from dphype.node.ledger import Ledger
from dphype.node.policy import (
    POLICY_ENV,
    REMEDIES,
    NodePolicy,
    PolicyError,
    VoteGuarantee,
    check_vote_request,
    run_ledger_path,
)
from dphype.node.vote_memory import VoteMemory
from dphype.protocol import VoteRequest
from dphype.refusal import REFUSAL_CODES, Refusal, as_refusal
from dphype.secure.roster import Membership

#: Refusal codes that would tell the server which of the node's limits a request crossed.
POLICY_CODES = frozenset({"policy_epsilon", "policy_delta", "policy_clients", "lifetime_budget"})

#: Where a node's policy comes from (`dphype.flower.client.register_dphype`'s ``policy``): a
#: `dphype.node.policy.NodePolicy`, a function of the node's ``Context`` that returns one, or ``None``
#: (`node_policy`).
PolicySource = NodePolicy | Callable[[Context], NodePolicy] | None


def check_registration(app: Any, policy: Any) -> None:
    """Refuse (`ValueError`) an ``app`` that is not a flwr ``ClientApp`` or a ``policy`` that is no `PolicySource`."""
    if not isinstance(app, ClientApp):
        raise ValueError(f"app must be a flwr ClientApp, got {type(app).__name__}")
    if policy is not None and not (isinstance(policy, NodePolicy) or callable(policy)):
        raise ValueError(f"policy must be a NodePolicy, a function of the context or None (read from the node "
                         f"config), got {type(policy).__name__}")


def environment_policy() -> dict[str, Any]:
    """The ``dphype-*`` keys of `dphype.node.policy.POLICY_ENV`, parsed by Flower's ``--node-config`` parser.

    Returns:
        Key -> value; empty when the variable is unset.

    Raises:
        PolicyError: If the variable does not parse or holds keys other than ``dphype-*``.
    """  # noqa: DOC503 - the ValueError raised inside is caught and re-raised as PolicyError
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
    return dict(from_env)


def node_policy(context: Context) -> NodePolicy:
    """This node's policy from its own channels, never the server's (the run config is never read).

    The ``dphype-*`` keys of ``context.node_config`` over those of `environment_policy`. A `simulated` node
    without a federation set joins the run's simulated federation
    (`dphype.flower.federation.simulated_federation`, never for deployments).

    Args:
        context: The node's Flower context.

    Returns:
        The node's policy.

    Raises:
        PolicyError: If the environment variable does not parse or holds other keys, or the merged policy is
            invalid (`dphype.node.policy.PolicyError`).
    """  # noqa: DOC502, DOC503
    from_env = environment_policy()
    merged = {**from_env, **context.node_config}
    if simulated() and not federation_set(merged) and "partition-id" in merged:  # development: no set-up
        merged.update(simulated_federation(run_ledger_path(context.run_id).parent, context.run_id,
                                           voter_name(int(cast(int, merged["partition-id"]))),
                                           int(cast(int, merged.get("num-partitions", 0)))))
    return NodePolicy.from_node_config(merged, run_id=context.run_id if simulated() else None)


def simulated() -> bool:
    """Whether this ClientApp runs inside a Ray worker of Flower's simulation engine."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        # lazy import: Ray
        from ray._private import worker

        return bool(worker.global_worker.mode == worker.WORKER_MODE)
    except Exception:  # noqa: BLE001 - a Ray without this internal: not known to be a simulation
        return False


def _parent_superlink() -> str:
    """``"flower-superlink (pid N)"``, the SuperLink this simulated node descends from (Linux ``/proc``)."""
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
    """On a `simulated` node, log once per run and process where its policy and ledger come from."""
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
    """This node's policy: `node_policy` for ``None``, else ``policy`` or what it returns for ``context``.

    Args:
        policy: The `PolicySource` given to ``register_dphype``.
        context: The node's Flower context.

    Returns:
        The node's policy.

    Raises:
        PolicyError: If the function returns no ``NodePolicy``, or `node_policy` refuses the node's own policy
            (`dphype.node.policy.PolicyError`).
    """
    if policy is None:
        return node_policy(context)
    resolved = policy(context) if callable(policy) else policy
    if not isinstance(resolved, NodePolicy):
        raise PolicyError(f"the policy function must return a NodePolicy, got {type(resolved).__name__}")
    return resolved


def refused(msg: Message, refusal: Refusal) -> Message:
    """The pre-flight's reply to ``msg`` carrying the (already `sanitized`) ``refusal``."""
    answer = ConfigRecord({"status": "refused", "code": refusal.code, "detail": refusal.detail})
    return Message(RecordDict({RECORD_KEY: answer}), reply_to=msg)


def sanitized(what: str, err: BaseException) -> Refusal:
    """``err`` as the refusal the server may see; the node's log gets the detail, the remedy and any traceback.

    Args:
        what: What was refused (``"pre-flight"``, ``"vote"``, ...), for the log.
        err: The error.

    Returns:
        The refusal to send.
    """
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
    """``limits`` as canonical JSON: a guarantee computed under another policy is not reused."""
    return json.dumps(limits.to_dict(), sort_keys=True, default=str)


def approved_guarantee(checked: ConfigRecord, request: VoteRequest, limits: NodePolicy) -> VoteGuarantee:
    """The pre-flight's guarantee while the policy is unchanged, else `dphype.node.policy.check_vote_request` anew.

    Args:
        checked: What the pre-flight stored: the guarantee's fields and the fingerprint of its policy.
        request: The approved request.
        limits: The node's policy now.

    Returns:
        The vote's guarantee.

    Raises:
        Refusal: If the policy changed and no longer admits the request (`dphype.node.policy.check_vote_request`).
    """  # noqa: DOC502
    if checked.get("policy") != policy_fingerprint(limits):
        return check_vote_request(request, limits)
    stored = {f.name: checked[f.name] for f in dataclasses.fields(VoteGuarantee)}  # written by this node
    return VoteGuarantee(**cast(dict[str, Any], stored))


def roster_digest(membership: Membership | None) -> str:
    """The digest of the node's roster, ``""`` without one: what its approval binds (`approved_membership`)."""
    return "" if membership is None else membership.roster.digest()


def describe_federation(membership: Membership | None) -> str:
    """``"roster <fingerprint> (N members)"`` or ``"unauthenticated"``: the federation, for the server's result."""
    return "unauthenticated" if membership is None else membership.roster.describe()


def approved_membership(limits: NodePolicy, approved: ConfigRecord) -> Membership | None:
    """The node's membership now, refused (``roster``) if its roster is not the one its pre-flight approved.

    Args:
        limits: The node's policy now.
        approved: What the pre-flight stored of the approval (its ``roster`` digest, `roster_digest`).

    Returns:
        The membership, or ``None`` (unauthenticated, as at the pre-flight).

    Raises:
        Refusal: ``roster`` if the roster changed (or appeared, or went) since the pre-flight; ``no_roster`` as
            `dphype.node.policy.NodePolicy.membership`.
    """  # noqa: DOC502
    membership = limits.membership()
    if roster_digest(membership) != approved.get("roster", ""):
        raise Refusal("roster", "this node's roster changed since the pre-flight approved the request: a new "
                      "pre-flight is needed")
    return membership


def cast_approved_ballot(context: Context, request: VoteRequest, limits: NodePolicy, checked: ConfigRecord, *,
                         maximize: bool, what: str, reply: Callable[[Any], dict[str, Any]] | None = None,
                         **options: Any) -> Any:
    """This node's one ballot on the ``request`` its pre-flight approved, recorded in its ledger, once per run.

    One pre-flight, one vote: the kept scores are read, the ballot cast (`dphype.release.ReleaseMode.ballot`), the
    scores dropped, and only then the guarantee charged (`dphype.node.ledger.Ledger.spend` checks the lifetime
    budget again) and the vote remembered beside the ledger (`dphype.node.vote_memory.VoteMemory`), all under the
    memory's lock. Whatever fails leaves nothing sent. A vote for a request this node already voted on in this run
    (the server re-ran it) is answered with ``reply``'s answer of that vote again, at no new charge; without
    ``reply`` it is refused (``already_voted``).

    Args:
        context: The node's context, holding the pre-flight's scores.
        request: The approved request (bound to the pre-flight by its digest: the caller checks).
        limits: The node's policy now.
        checked: What the pre-flight stored of the guarantee (`approved_guarantee`).
        maximize: Whether the task's scores are better when larger.
        what: The vote's name in the node's log (``"vote"``, ``"committee vote"``).
        reply: Makes the vote's answer from the ballot (the committee's sealed, signed shares), remembered and
            given again to a repeated vote; ``None``: the ballot is returned and never given twice.
        **options: The mode's ballot options (the SecAgg+ round's ``clipping_range``, the committee's ``voter``).

    Returns:
        ``reply``'s answer, or the ballot without ``reply``.

    Raises:
        Refusal: If the node voted on the request's approval already, voted on the request in this run and cannot
            answer again (``already_voted``), or its policy or budget no longer admits it.
    """  # noqa: DOC502
    def make_ballot() -> tuple[VoteGuarantee, Any]:
        if SCORES_STATE not in context.state.array_records:
            raise Refusal("malformed_request", "this node already voted on the approved request")
        guarantee = approved_guarantee(checked, request, limits)  # the pre-flight's, unless the policy changed
        scores = context.state.array_records[SCORES_STATE]["scores"].numpy()
        ballot = request.mode.ballot(request, scores, maximize=maximize, **options)
        del context.state.array_records[SCORES_STATE]  # the scores are gone before the vote is recorded
        return guarantee, ballot

    return released_once(context, request.digest(), limits, make_ballot, what=what, reply=reply,
                         forget=lambda: context.state.array_records.pop(SCORES_STATE, None))


def released_once(context: Context, digest: str, limits: NodePolicy,
                  release: Callable[[], tuple[VoteGuarantee | EvaluationGuarantee, Any]], *, what: str,
                  reply: Callable[[Any], dict[str, Any]] | None = None,
                  forget: Callable[[], object] = lambda: None) -> Any:
    """What this node releases on request ``digest``, charged to its ledger and remembered, once per run.

    Under the vote memory's lock (`dphype.node.vote_memory.VoteMemory`): a request this node released in this run is
    answered with the remembered answer at no new charge (``reply`` given and an answer kept), else refused
    (``already_voted``), ``forget`` dropping its private inputs either way; otherwise ``release()`` makes the values
    (and drops their private inputs), the ledger charges its guarantee (`dphype.node.ledger.Ledger.spend` checks
    the lifetime budget again) and the memory records the request, all before anything is sent.

    Args:
        context: The node's context (its run).
        digest: The request's digest.
        limits: The node's policy now (its ledger).
        release: Returns the guarantee to charge and what to send; raises `Refusal` if it cannot.
        what: The release's name in the node's log (``"vote"``, ``"committee vote"``, ``"private evaluation"``).
        reply: Makes the answer from what ``release`` returned, remembered and given again to a repeated request;
            ``None``: what ``release`` returned is the answer and is never given twice.
        forget: Drops the request's private inputs when it is repeated.

    Returns:
        The answer.

    Raises:
        Refusal: ``already_voted`` for a repeated request without a kept answer, or what ``release`` or the ledger
            raise.
    """  # noqa: DOC502
    memory, run = VoteMemory(cast(Path, limits.ledger)), int(context.run_id)
    with memory.held():
        kept = memory.recall(run, digest)
        if kept is not None:
            forget()
            if reply is None or not kept:
                raise Refusal("already_voted", REFUSAL_CODES["already_voted"])
            log(logging.INFO, "DP-Hype: the %s on this request was cast in this run: the same answer again, no new "
                "charge", what)
            return kept
        guarantee, released = release()
        spent = Ledger(cast(Path, limits.ledger)).spend(guarantee, limits, digest)
        answer = released if reply is None else reply(released)
        memory.remember(run, digest, {} if reply is None else answer)
    log(logging.INFO, "DP-Hype: %s recorded in this node's ledger (lifetime epsilon %.4g of %.4g)", what, spent,
        limits.lifetime_epsilon)
    return answer


def voted_before(context: Context, request: VoteRequest | EvaluationRequest, limits: NodePolicy) -> bool:
    """Whether this node voted on ``request`` in this run and may answer its vote again (a pre-flight's question).

    An evaluation request (`dphype.flower.client.evaluation_client`) is remembered the same way and never answered
    again.

    Args:
        context: The node's context (its run).
        request: The request.
        limits: The node's policy (its ledger, beside which the votes are remembered).

    Returns:
        ``True`` if it voted and its answer is kept (a committee vote), ``False`` if it did not vote.

    Raises:
        Refusal: ``already_voted`` if it voted and cannot answer again (a SecAgg+ vote).
    """  # noqa: DOC502
    memory = VoteMemory(cast(Path, limits.ledger))
    with memory.held():
        kept = memory.recall(int(context.run_id), request.digest())
    if kept is not None and not kept:
        raise Refusal("already_voted", REFUSAL_CODES["already_voted"])
    return kept is not None
