"""Why a client will not take part: `Refusal`, its reason codes and a safe form of any exception.

The reason codes are `REFUSAL_CODES`; `as_refusal` makes any exception safe to send to the server.

Shared vocabulary of the client side: the protocol's request checks (`dphype.protocol`), the node's policy
and ledger (`dphype.node`), the secure sum's stages (`dphype.secure.secagg`) and the Flower client
(`dphype.flower.client`) all refuse with it, and the server names the codes it receives. A leaf module: it
imports nothing from dphype.
"""

from __future__ import annotations


class Refusal(Exception):
    """A client refuses to take part.

    ``code`` and ``detail`` are safe to send to the server: they name the reason and at most numbers derived from
    the server's own request, never a data value (a candidate the task choked on, a score, a file's content) nor
    node-private state (its limits, its remaining budget, its paths). ``local`` is for the node's own log only and
    may name exactly those; it is never sent. `as_refusal` turns any other exception into one.

    Args:
        code: The reason, a key of `REFUSAL_CODES`.
        detail: What the server is told; cut to `MAX_DETAIL` characters.
        local: What the node's own log is told (never sent).

    Raises:
        ValueError: If ``code`` is not one of `REFUSAL_CODES`.
    """

    def __init__(self, code: str, detail: str, *, local: str = "") -> None:
        if code not in REFUSAL_CODES:
            raise ValueError(f"code must be one of {', '.join(REFUSAL_CODES)}, got {code!r}")
        detail = detail[:MAX_DETAIL]
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.local = local


#: Reason codes a client may answer with, and what each means.
REFUSAL_CODES: dict[str, str] = {
    "malformed_request": "the request is incomplete or invalid",
    "candidate_mismatch": "the candidate list differs from this client's own copy",
    "noise_too_small": "the announced sigma gives more epsilon than announced",
    "policy_epsilon": "the request spends more epsilon than this client allows",
    "policy_delta": "the request's delta is above this node's limit",
    "policy_clients": "the request has fewer clients than this node requires",
    "lifetime_budget": "this vote would exceed this node's lifetime privacy budget",
    "policy": "this node's privacy policy does not admit the request (what a node tells the server for any "
              "of the four codes above)",
    "secagg_setup": "unsafe or unexpected SecAgg+ parameters",
    "secagg_neighbours": "SecAgg+ neighbours are too few or inconsistent with the request",
    "secagg_unmask": "unsafe SecAgg+ unmasking request",
    "secagg_round": "a SecAgg+ stage out of order, repeated, for another request or malformed: round aborted",
    "node_policy": "this node's privacy policy is misconfigured",
    "ledger_error": "this node's privacy ledger cannot be read or written",
    "unsupported_candidates": "the client's task cannot evaluate these candidates (e.g. a key it does not use)",
    "tally_committee": "the tally committee is too small, has duplicate tallies or tallies this node does not know, "
                       "or this node's operator pinned no tallies (dphype-tallies)",
    "release_mode": "the message belongs to another release mode (aggregator) than the request this node approved: "
                    "a request approved for the tally committee is never summed over SecAgg+, nor the reverse",
    "tally_refused": "a tally refuses the stage: malformed or out of order, a share that is not its contributor's "
                     "for this request, run and tally, a duplicate, or a request it has already served",
    "roster": "a key list, signature or sealed share is not signed by a distinct member of this node's roster, is "
              "signed under another roster (another federation), or the roster changed since the pre-flight",
    "no_roster": "this node has no roster (dphype-roster, dphype-identity) and its operator did not allow an "
                 "unauthenticated federation (dphype-allow-unauthenticated = true)",
    "already_voted": "this node voted on (or evaluated) this request in this run, and this release cannot be answered "
                     "twice (a SecAgg+ round's noise share and masks belong to one round): one answer per request and "
                     "run",
    "task_error": "the client's task raised an exception while scoring",
    "score_shape": "the client's task returned scores of the wrong shape",
    "uninformative_scores": "the client's task scored every candidate the same, or none (all NaN)",
    "client_error": "an unexpected error on the client",
}
#: Longest ``detail`` sent to the server.
MAX_DETAIL = 200


def as_refusal(err: BaseException) -> Refusal:
    """``err`` as a refusal that is safe to send.

    A `Refusal` as it is; an exception whose class names a ``refusal_code`` as that code with its fixed text; anything
    else as ``client_error`` naming the exception TYPE only, never the message (it may echo data).

    Args:
        err: Any exception.

    Returns:
        The `Refusal` to send.
    """
    if isinstance(err, Refusal):
        return err
    code = getattr(type(err), "refusal_code", None)
    if code in REFUSAL_CODES:
        return Refusal(code, REFUSAL_CODES[code])
    return Refusal("client_error", f"{type(err).__name__} on the client")
