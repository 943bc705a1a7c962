"""A client's refusal to take part, and the only text about a client-side failure that reaches the server.

A client that will not vote raises :class:`Refusal`; its ``code`` (one of :data:`REFUSAL_CODES`) and its
``detail`` are what the Flower adapter sends back instead of exception text. ``detail`` names the reason
and, at most, numbers computed from the server's own request; it never carries a data value (a candidate
the task choked on, a score, a file's content) nor node-private state (the node's limits, its remaining
lifetime budget, its paths). :func:`as_refusal` turns ANY exception into such a refusal: a ``Refusal``
passes unchanged, a few known exception types map to their code, everything else becomes
``client_error`` with the exception's type name only -- never its message, which may echo data (a
duplicate entry in a candidate file is reported by :class:`dphype.candidates.CandidateList` together with
the entry). The full exception stays in the client's own log.

This module sits below the protocol, the policy, the ledger and the SecAgg+ checks, which all raise it.
"""

from __future__ import annotations

#: Reason codes a client may answer with, and the fixed text that explains each.
REFUSAL_CODES: dict[str, str] = {
    "malformed_request": "the request is incomplete or invalid",
    "candidate_mismatch": "the candidate list differs from this node's own copy",
    "noise_too_small": "the announced sigma gives more epsilon than announced",
    "policy_epsilon": "the noise this node is asked to add gives more epsilon than its policy allows",
    "policy_delta": "the request's delta is above this node's limit",
    "policy_clients": "the request has fewer clients than this node requires",
    "lifetime_budget": "this vote would exceed this node's lifetime privacy budget",
    "secagg_setup": "unsafe or unexpected SecAgg+ parameters",
    "secagg_neighbours": "SecAgg+ neighbours are too few or inconsistent with the request",
    "secagg_unmask": "unsafe SecAgg+ unmasking request",
    "node_policy": "this node's privacy policy is misconfigured",
    "ledger_error": "this node's privacy ledger cannot be read or written",
    "task_error": "the client's task raised an exception while scoring",
    "score_shape": "the client's task returned scores of the wrong shape",
    "client_error": "an unexpected error on the client",
}

#: Longest ``detail`` sent to the server.
MAX_DETAIL: int = 200


class Refusal(Exception):
    """A client refuses to take part: ``code`` (from :data:`REFUSAL_CODES`) and a short ``detail`` that is
    safe to send to the server (no data values, no node-private state; see the module docstring)."""

    def __init__(self, code: str, detail: str = "") -> None:
        if code not in REFUSAL_CODES:
            raise ValueError(f"code must be one of {', '.join(REFUSAL_CODES)}, got {code!r}")
        detail = (detail or REFUSAL_CODES[code])[:MAX_DETAIL]
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


def as_refusal(err: BaseException) -> Refusal:
    """``err`` as a refusal that is safe to send: a :class:`Refusal` as it is, a candidate-list mismatch as
    ``candidate_mismatch``, a node policy or ledger error as ``node_policy`` / ``ledger_error``, anything
    else as ``client_error`` naming the exception type only."""
    from dphype.candidates import CandidateMismatchError
    from dphype.ledger import LedgerError
    from dphype.policy import PolicyError

    if isinstance(err, Refusal):
        return err
    for kind, code in ((CandidateMismatchError, "candidate_mismatch"), (PolicyError, "node_policy"),
                       (LedgerError, "ledger_error")):
        if isinstance(err, kind):
            return Refusal(code)
    return Refusal("client_error", f"{type(err).__name__} on the client")
