"""DP-Hype on a client: the handlers that answer DP-Hype's messages in a user's own ``ClientApp``.

:func:`register_dphype` adds two handlers to a Message-API ``ClientApp``, under DP-Hype's own action
name, so they never see the user's ``@app.train()``, ``@app.evaluate()`` or ``@app.query()`` messages
and those never see DP-Hype's:

* ``query.dphype`` (pre-flight): parse the :class:`dphype.protocol.VoteRequest`, check it against this
  node's own candidate copy and limits (:func:`dphype.protocol.check_request`), score every candidate
  with the user's task (:func:`dphype.protocol.score_candidates`) and keep the scores in the node's
  context state; answer ``ready`` or a refusal (a reason code and a short message without data values);
* ``train.dphype`` (the secure vote, inside SecAgg+): when the protocol asks for the masked input, turn
  the kept scores into top-k votes plus a fresh noise share (:func:`dphype.protocol.noisy_vote`) and hand
  the encoded vector to SecAgg+ (:func:`dphype.flower.secagg.secure_vote_reply`). A vote for a request
  other than the one this node approved in the pre-flight is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import Scalar, log

from dphype.candidates import CandidateList
from dphype.flower.secagg import secure_vote_reply
from dphype.protocol import Refusal, VoteRequest, check_request, noisy_vote, score_candidates
from dphype.task import Task

#: Action name of DP-Hype's messages: ``query.dphype`` (pre-flight) and ``train.dphype`` (vote).
ACTION = "dphype"
#: Record key of the request in DP-Hype's messages, of the answer in pre-flight replies and of this
#: node's approved request in its context state.
RECORD_KEY = "dphype"
#: Context-state key of this node's local scores between pre-flight and vote.
SCORES_KEY = "dphype.scores"


def vote_generator() -> np.random.Generator:
    """The generator of a vote's noise share: fresh, seeded from the operating system's entropy."""
    return np.random.default_rng()


def _refused(msg: Message, refusal: Refusal) -> Message:
    answer = ConfigRecord({"status": "refused", "code": refusal.code, "detail": refusal.detail})
    return Message(RecordDict({RECORD_KEY: answer}), reply_to=msg)


def _as_refusal(err: Exception) -> Refusal:
    """Any failure as a refusal that is safe to send: the exception type, never its message."""
    return err if isinstance(err, Refusal) else Refusal("client_error", f"{type(err).__name__} on the client")


def register_dphype(
    app: ClientApp,
    task_fn: Callable[[Context], Task],
    *,
    candidates: CandidateList | Callable[[Context], CandidateList] | None = None,
    max_epsilon: float | None = None,
) -> ClientApp:
    """Let ``app`` take part in DP-Hype: answer its pre-flight and secure vote with ``task_fn(context)``.

    ``task_fn`` builds this node's task (anything with ``maximize`` and ``score(candidates)``, e.g.
    :class:`dphype.task.TorchTask`) from the node's context. ``candidates`` is this node's own copy of
    the public candidate list (or a function of the node's context that returns it): a request for
    another list is refused; without it, the list in the request is used as it is. ``max_epsilon``
    refuses requests that spend more. Returns ``app``.
    """
    if candidates is not None and not (isinstance(candidates, CandidateList) or callable(candidates)):
        raise ValueError(f"candidates must be a CandidateList, a function of the context or None, "
                         f"got {type(candidates).__name__}")

    def own_candidates(context: Context) -> CandidateList | None:
        return candidates(context) if callable(candidates) else candidates

    @app.query(ACTION)
    def preflight(msg: Message, context: Context) -> Message:
        try:
            request = VoteRequest.from_record(msg.content.config_records.get(RECORD_KEY, {}))
            check_request(request, local_candidates=own_candidates(context), max_epsilon=max_epsilon)
            task = task_fn(context)
            log(logging.INFO, "DP-Hype: scoring %d candidates on local data", len(request.candidates))
            scores = score_candidates(task, request.candidates, progress=_log_progress)
        except Exception as err:  # noqa: BLE001 - every failure is answered as a sanitized refusal
            refusal = _as_refusal(err)
            log(logging.WARNING, "DP-Hype: refusing the request (%s)", refusal)
            return _refused(msg, refusal)
        context.state.array_records[SCORES_KEY] = ArrayRecord({"scores": Array(scores)})
        context.state.config_records[RECORD_KEY] = ConfigRecord(
            {"digest": request.digest(), "maximize": bool(task.maximize)})
        return Message(RecordDict({RECORD_KEY: ConfigRecord({"status": "ready"})}), reply_to=msg)

    @app.train(ACTION)
    def vote(msg: Message, context: Context) -> Message:
        def masked_input(fit_config: dict[str, Scalar]) -> np.ndarray:
            try:
                request = VoteRequest.from_record(fit_config)
                approved = context.state.config_records.get(RECORD_KEY)
                if approved is None or approved["digest"] != request.digest():
                    raise Refusal("malformed_request", "the vote request is not the one approved in the pre-flight")
                scores = context.state.array_records[SCORES_KEY]["scores"].numpy()
                vector = noisy_vote(request, scores, maximize=bool(approved["maximize"]), rng=vote_generator())
            except Exception as err:  # noqa: BLE001
                raise RuntimeError(f"DP-Hype refusal {_as_refusal(err)}") from None
            del context.state.array_records[SCORES_KEY]  # the scores are not kept beyond the vote
            return vector

        return secure_vote_reply(msg, context, masked_input)

    return app


def _log_progress(done: int, total: int) -> None:
    log(logging.INFO, "DP-Hype: scoring progress %d/%d", done, total)
