"""DP-Hype on a client: score every candidate locally, vote top-k, add a noise share.

The client half of DP-Hype's Algorithm 1 (lines 2-9) as a Flower ``NumPyClient``.
On a vote request (:class:`dphype.strategy.VoteRequest`, delivered inside the
SecAgg+ protocol) the client

1. checks that the server's candidate list is its own (fingerprint; a mismatch is
   a loud :class:`dphype.candidates.CandidateMismatchError`) and that the noise
   ``sigma`` it is asked for really gives the announced ``(epsilon, delta)`` --
   and, if the client set one, at most its own ``max_epsilon``;
2. scores every candidate on its local data with the user's task;
3. votes 1 for its ``k`` best candidates (:func:`dphype.voting.top_k_votes`);
4. adds its noise share (:func:`dphype.noise.noise_share`) drawn from OS entropy --
   never from a seed the server controls;
5. encodes the result for exact secure summation (:func:`dphype.secure_sum.encode`)
   and returns it as the fit parameters with ``num_examples = 1`` and NO metrics
   (metrics are not masked by SecAgg+).
"""

from __future__ import annotations

import inspect
import logging
import time
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
from flwr.app import Context
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod
from flwr.common import NDArrays, Scalar, log

from dphype.accounting import check_epsilon, epsilon as release_epsilon
from dphype.candidates import CandidateList
from dphype.noise import noise_share
from dphype.secure_sum import encode, secure_vote_mod
from dphype.strategy import VoteRequest
from dphype.voting import top_k_votes

if TYPE_CHECKING:
    from dphype.task import Task

#: Relative slack when comparing the announced epsilon with the one recomputed from sigma.
_EPSILON_RTOL = 1e-6


def _log_progress(done: int, total: int) -> None:
    log(logging.INFO, "DP-Hype: scoring progress %d/%d", done, total)


class DPHypeClient(NumPyClient):
    """A Flower client that answers DP-Hype vote requests for a user task.

    Parameters
    ----------
    task:
        Anything with ``maximize: bool`` and ``score(candidates) -> np.ndarray``
        (one score per candidate on this client's local data), e.g.
        :class:`dphype.task.TorchTask`.
    candidates:
        This client's copy of the public, ordered candidate list.
    max_epsilon:
        Optional local policy: refuse requests whose noise gives a larger epsilon.
    rng:
        Noise generator; by default a fresh ``numpy`` generator seeded from OS
        entropy for every vote. Pass one only in tests or local simulations.
    """

    def __init__(
        self,
        task: Task,
        candidates: CandidateList,
        *,
        max_epsilon: float | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        if not isinstance(candidates, CandidateList):
            raise ValueError(f"candidates must be a CandidateList, got {type(candidates).__name__}")
        self.task = task
        self.candidates = candidates
        self.max_epsilon = None if max_epsilon is None else check_epsilon(max_epsilon)
        self.rng = rng

    def get_parameters(self, config: dict[str, Scalar]) -> NDArrays:
        """DP-Hype has no global model; there is nothing to send."""
        return []

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """Answer a vote request with the encoded noisy vote vector (weight 1, no metrics)."""
        request = VoteRequest.from_config(config)
        return [self.noisy_votes(request)], 1, {}

    def check_request(self, request: VoteRequest) -> None:
        """Refuse a request for another candidate list or with too little noise."""
        self.candidates.check_fingerprint(request.fingerprint)
        promised = release_epsilon(request.release, request.delta, request.accountant)
        if promised > request.epsilon * (1.0 + _EPSILON_RTOL):
            raise ValueError(
                f"sigma={request.sigma:g} gives epsilon={promised:.6g} at delta={request.delta:g}, "
                f"more than the announced epsilon={request.epsilon:g}; refusing to vote"
            )
        if self.max_epsilon is not None and request.epsilon > self.max_epsilon:
            raise ValueError(
                f"requested epsilon={request.epsilon:g} exceeds this client's "
                f"max_epsilon={self.max_epsilon:g}; refusing to vote"
            )

    def score(self) -> np.ndarray:
        """Score every candidate on local data (``(p,)`` scores or ``(p, j)`` lexicographic keys, see
        :func:`dphype.voting.top_k_votes`); refuses any other shape."""
        p = len(self.candidates)
        log(logging.INFO, "DP-Hype: scoring %d candidates on local data", p)
        start = time.perf_counter()
        if "progress" in inspect.signature(self.task.score).parameters:
            raw = self.task.score(self.candidates, progress=_log_progress)
        else:
            raw = self.task.score(self.candidates)
        scores = np.asarray(raw, dtype=np.float64)
        if scores.ndim not in (1, 2) or scores.shape[0] != p or scores.size == 0:
            raise ValueError(
                f"task.score must return one score per candidate, shape ({p},), or one row of "
                f"lexicographic keys per candidate, shape ({p}, j); got shape {scores.shape}"
            )
        log(logging.INFO, "DP-Hype: scored %d candidates in %.1f s", p, time.perf_counter() - start)
        return scores

    def noisy_votes(self, request: VoteRequest) -> np.ndarray:
        """Checked request -> local scores -> top-k votes + noise share -> encoded vector."""
        self.check_request(request)
        votes = top_k_votes(self.score(), request.k, maximize=bool(self.task.maximize))
        rng = self.rng if self.rng is not None else np.random.default_rng()
        share = noise_share(
            votes.size,
            sigma=request.sigma,
            clients=request.clients,
            dropout=request.dropout,
            kind=request.noise,
            rng=rng,
        )
        return encode(votes + share, request.noise)


def make_client_app(
    task_fn: Callable[[Context], Task],
    candidates: CandidateList | Callable[[Context], CandidateList],
    *,
    max_epsilon: float | None = None,
    mods: Sequence[Mod] = (),
) -> ClientApp:
    """A ``ClientApp`` that takes part in DP-Hype through SecAgg+.

    ``task_fn(context)`` builds this node's task (e.g. from
    ``context.node_config["partition-id"]``); ``candidates`` is the public list or a
    function of the context that loads it. The app carries
    :func:`dphype.secure_sum.secure_vote_mod`, which runs Flower's ``secaggplus_mod``
    and refuses vote requests that do not come through SecAgg+; your own ``mods``
    (e.g. logging, byte counting) run before it.
    """

    def client_fn(context: Context):
        local = candidates(context) if callable(candidates) else candidates
        return DPHypeClient(task_fn(context), local, max_epsilon=max_epsilon).to_client()

    return ClientApp(client_fn=client_fn, mods=[*mods, secure_vote_mod])
