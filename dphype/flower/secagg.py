"""Flower SecAgg+ as DP-Hype's exact secure sum (the adapter of :mod:`dphype.secure.secure_sum`).

Flower 1.41 has SecAgg+ only on its legacy path: the server-side ``SecAggPlusWorkflow`` drives a legacy
``Strategy`` through a ``LegacyContext`` and the client-side ``secaggplus_mod`` wraps a handler that
returns a legacy ``FitRes``. This module keeps all of that behind two calls:

* server: :func:`run_secure_sum` runs one SecAgg+ round over given nodes and returns the exact sum of
  their encoded vectors (:func:`dphype.secure.secure_sum.decode_sum`) and the number of contributors, or raises
  :class:`dphype.secure.secure_sum.SecureSumError` -- never unmasking fewer than ``min_survivors`` vectors;
* client: :func:`secure_vote_reply` answers one SecAgg+ stage message once the client's own checks of it
  passed (:func:`check_stage`, :mod:`dphype.secure.guard`), computing the vector only when the protocol
  asks for the masked input.

DP-Hype's messages carry their own message type (:data:`VOTE_MESSAGE_TYPE`, a named ``train`` action), so
they are routed to DP-Hype's handlers and never reach the user's own ``@app.train()``; the legacy
SecAgg+ code checks for the plain ``train`` type, which this adapter presents to it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    Status,
    log,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key, Stage
from flwr.compat.common import recorddict_compat as compat
from flwr.server import ServerConfig
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState
from flwr.serverapp.grid import Grid
from flwr.supercore.run import Run

from dphype.checks import check_positive
from dphype.flower.secagg_fast import ScalableSecAggPlusWorkflow, SecAggPlusState, scalable_secaggplus_mod
from dphype.protocol import Refusal
from dphype.secure.guard import SecAggSetup, check_neighbours, check_setup, check_share_sources, check_unmask
from dphype.secure.secagg_params import CORRUPT_FRACTION, SecAggParameters, check_parameters, secure_parameters
from dphype.secure.secure_sum import (
    CLIPPING_RANGE,
    MAX_WEIGHT,
    MODULUS_RANGE,
    SecureSumError,
    TooFewSurvivorsError,
    clipping_range_for,
    decode_sum,
)

#: Message type of DP-Hype's SecAgg+ vote round (``train`` category, action ``dphype``).
VOTE_MESSAGE_TYPE = f"{MessageType.TRAIN}.dphype"


def check_timeout(name: str, seconds: Any) -> float | None:
    """Return a wait limit in seconds: ``None`` (no limit) or a finite number > 0.

    A deployed SuperNode that vanishes never answers, so without a limit the server
    would wait for it forever; with one, SecAgg+ goes on with the clients that answered
    and the survivor check decides whether anything is released.
    """
    return None if seconds is None else check_positive(name, seconds)


# ---------------------------------------------------------------------------------------- server side
class ExactSumWorkflow(ScalableSecAggPlusWorkflow):
    """SecAgg+ configured for exact integer sums, refusing to unmask too few survivors.

    ``min_survivors`` is checked after the masked vectors are collected and
    *before* the unmasking stage: if fewer clients contributed, the server never
    learns their (under-noised) sum and :class:`TooFewSurvivorsError` is raised.
    ``clipping_range`` is the run's ``C(n)`` (:func:`dphype.secure.secure_sum.clipping_range_for`),
    with ``Q = 2C``; the stages run on :mod:`dphype.flower.secagg_fast`.
    """

    def __init__(
        self,
        *,
        min_survivors: int,
        num_shares: float,
        reconstruction_threshold: float,
        timeout: float | None = None,
        clipping_range: int = CLIPPING_RANGE,
    ) -> None:
        super().__init__(
            num_shares,
            reconstruction_threshold,
            max_weight=MAX_WEIGHT,
            clipping_range=float(clipping_range),
            quantization_range=2 * clipping_range,
            modulus_range=MODULUS_RANGE,
            timeout=timeout,
        )
        self.min_survivors = min_survivors
        #: The clients' error replies of the round (Flower's ``WorkflowState.failures``), for the error message.
        self.failures: list[Exception] = []

    def setup_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        """Flower's stage 0: parameters to every client, public keys back."""
        self.failures = state.failures  # the same list: the later stages append to it
        proceed = super().setup_stage(grid, context, state)
        log(logging.INFO, "DP-Hype secure vote: %d of %d clients sent their public keys",
            len(state.active_node_ids), len(state.sampled_node_ids))
        return proceed

    def share_keys_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        """Flower's stage 1, then forget the clients that left before it ended.

        Survivors add pairwise masks only with clients whose key shares reached
        them, i.e. with clients that answered both stage 0 and stage 1. Flower
        1.41 keeps every sampled client in ``sampled_node_ids`` and, in the unmask
        stage, asks the survivors for key shares of a client lost in stage 0 or 1,
        which they never received: every survivor fails and the round halts. A
        client lost that early contributed no mask, so it is simply not part of
        the sum; one lost later is unmasked as usual.
        """
        proceed = super().share_keys_stage(grid, context, state)
        state.sampled_node_ids = set(state.active_node_ids)
        return proceed

    def collect_masked_vectors_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        """Flower's stage 2: every client computes its vote vector and sends it masked."""
        proceed = super().collect_masked_vectors_stage(grid, context, state)
        log(logging.INFO, "DP-Hype secure vote: masked vote vectors received from %d clients",
            len(state.active_node_ids))
        return proceed

    def unmask_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        """Check the survivor count, then unmask the sum (Flower's stage 3)."""
        survivors = len(state.active_node_ids)
        if survivors < self.min_survivors:
            raise TooFewSurvivorsError(
                f"only {survivors} of {len(state.nid_to_neighbours)} clients submitted a "
                f"masked vote vector, fewer than the {self.min_survivors} required by the "
                f"dropout tolerance; the sum was not unmasked and nothing was released. "
                f"Client failures: {_failure_summary(state.failures)}"
            )
        log(logging.INFO, "DP-Hype secure vote: %d survivors (at least %d required), unmasking the sum",
            survivors, self.min_survivors)
        return super().unmask_stage(grid, context, state)


def _failure_summary(failures: Iterable[BaseException]) -> str:
    """The clients' error replies counted by reason (a DP-Hype client's reason is a sanitized refusal).

    Flower 1.41's stage 2 records each error reply twice (wrapping the same ``Error``): counted once."""
    errors = {id(f.args[0] if f.args else f): f.args[0] if f.args else f for f in failures}
    reasons: Counter[str] = Counter()
    for error in errors.values():
        reasons[str(getattr(error, "reason", error))[:300]] += 1
    return "; ".join(f"{count} x {reason}" for reason, count in reasons.most_common())[:2000] or "none reported"


class _SumStrategy(Strategy):
    """The legacy strategy SecAgg+ drives: fixed nodes, one fit config, decode the unmasked mean."""

    def __init__(self, proxies: list[ClientProxy], fit_config: dict[str, Scalar], *, size: int,
                 noise: str) -> None:
        self.proxies = proxies
        self.fit_config = fit_config
        self.size = size
        self.noise = noise
        self.total: np.ndarray | None = None
        self.survivors = 0

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return ndarrays_to_parameters([])

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        return [(proxy, FitIns(parameters, dict(self.fit_config))) for proxy in self.proxies]

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[tuple[ClientProxy, FitRes] | BaseException]
                      ) -> tuple[Parameters | None, dict[str, Scalar]]:
        arrays = parameters_to_ndarrays(results[0][1].parameters)
        if len(arrays) != 1 or arrays[0].shape != (self.size,):
            raise SecureSumError(
                f"secure sum has shape {[a.shape for a in arrays]}, expected one vector of length "
                f"{self.size}: a client sent a wrong-length vector; nothing released"
            )
        self.total = decode_sum(arrays[0], len(results), self.noise)
        self.survivors = len(results)
        return None, {}

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        return []

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[tuple[ClientProxy, EvaluateRes] | BaseException]
                           ) -> tuple[float | None, dict[str, Scalar]]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return None


class _TypedGrid(Grid):
    """``grid`` that sends every message with DP-Hype's vote message type (everything else delegated)."""

    def __init__(self, grid: Grid, message_type: str) -> None:
        self.grid = grid
        self.message_type = message_type

    def set_run(self, run: Run) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        return self.grid.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        typed = list(messages)
        for msg in typed:
            msg.metadata.message_type = self.message_type
        return self.grid.send_and_receive(typed, timeout=timeout)


@dataclass(frozen=True)
class SecureSum:
    """The exact sum of the contributors' encoded vectors (int64 for Skellam, float64 for Gaussian),
    with the SecAgg+ graph it ran on and the failure bounds that graph achieves."""

    total: np.ndarray
    survivors: int
    seconds: float
    secagg: SecAggParameters
    clipping_range: int


def secagg_graph(clients: int, min_survivors: int, num_shares: float | None,
                 reconstruction_threshold: float | None, corrupt_fraction: float) -> SecAggParameters:
    """The round's SecAgg+ graph: the secure one by default, an explicit choice only if it is as secure.

    The tolerated dropout is ``(n - min_survivors) / n``, so the graph stays correct with exactly the
    survivors the release needs (:func:`dphype.secure.secagg_params.secure_parameters`); an explicit
    ``num_shares`` / ``reconstruction_threshold`` below that is refused (:func:`check_parameters`). Either
    way the threshold exceeds half the shares, the rule every client checks before sharing its secrets
    (:func:`dphype.secure.secagg_params.check_share_threshold`), so clients never refuse an honest graph.
    """
    dropout = (clients - min_survivors) / clients
    if num_shares is None and reconstruction_threshold is None:
        return secure_parameters(clients, dropout=dropout, corrupt_fraction=corrupt_fraction, majority=True)
    if num_shares is None or reconstruction_threshold is None:
        raise ValueError("num_shares and reconstruction_threshold must be given together (or neither: secure)")
    return check_parameters(clients, num_shares, reconstruction_threshold, dropout=dropout,
                            corrupt_fraction=corrupt_fraction, majority=True)


def run_secure_sum(
    grid: Grid,
    node_ids: Iterable[int],
    fit_config: dict[str, Scalar],
    *,
    size: int,
    noise: str,
    min_survivors: int,
    num_shares: float | None = None,
    reconstruction_threshold: float | None = None,
    corrupt_fraction: float = CORRUPT_FRACTION,
    timeout: float | None = None,
) -> SecureSum:
    """One SecAgg+ round over ``node_ids`` (each answers with an encoded vector of length ``size``).

    ``fit_config`` travels to every node with the masked-input stage. The SecAgg+ graph is
    :func:`secagg_graph`'s: secure against a server colluding with ``corrupt_fraction`` of the clients
    by default; an explicit ``num_shares`` / ``reconstruction_threshold`` (Flower's ints or fractions)
    below that is refused. ``timeout`` bounds each stage in seconds (``None``: wait for every reply).
    Raises :class:`TooFewSurvivorsError` (sum not unmasked) when fewer than
    ``min_survivors`` nodes contributed, :class:`SecureSumError` when the protocol halted.
    """
    nodes = sorted(set(node_ids))
    timeout = check_timeout("timeout", timeout)
    if not 1 <= min_survivors <= len(nodes):
        raise TooFewSurvivorsError(
            f"only {len(nodes)} clients can take part, fewer than the {min_survivors} required; nothing was sent")
    graph = secagg_graph(len(nodes), min_survivors, num_shares, reconstruction_threshold, corrupt_fraction)
    run_id = grid.run.run_id
    strategy = _SumStrategy([GridClientProxy(nid, grid, run_id) for nid in nodes], fit_config, size=size,
                            noise=noise)
    # A private context: the workflow keeps its bookkeeping in the state, which must not leak into the
    # ServerApp's own context.
    context = LegacyContext(Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                            config=ServerConfig(num_rounds=1), strategy=strategy)
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: 1})
    context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        ndarrays_to_parameters([]), keep_input=True)
    clipping_range = clipping_range_for(len(nodes))
    workflow = ExactSumWorkflow(
        min_survivors=min_survivors,
        # an explicit choice goes to Flower as given (its rules differ for ints and fractions)
        **(graph.flower_arguments() if num_shares is None else
           {"num_shares": num_shares, "reconstruction_threshold": reconstruction_threshold}),
        timeout=timeout,
        clipping_range=clipping_range,
    )
    start = time.perf_counter()
    workflow(_TypedGrid(grid, VOTE_MESSAGE_TYPE), context)
    if strategy.total is None:
        raise SecureSumError(
            "secure aggregation halted before the sum was unmasked (too few clients answered "
            f"or too few key shares); nothing was released. Client failures: {_failure_summary(workflow.failures)}"
        )
    return SecureSum(strategy.total, strategy.survivors, time.perf_counter() - start, graph, clipping_range)


# ---------------------------------------------------------------------------------------- client side
def check_stage(msg: Message, context: Context, *, clients: int, dropout: float, min_neighbours: int) -> None:
    """This client's checks of one SecAgg+ stage message (:mod:`dphype.secure.guard`), run before the stage
    is answered: raises :class:`dphype.protocol.Refusal`, so nothing of the stage leaves the client.

    ``clients`` and ``dropout`` are the announced ``n`` and ``xi`` of the request this client approved,
    ``min_neighbours`` its policy's. Stage 0 checks the setup in the message; the later stages check
    the message against what the client stored in stage 0 and 1 (Flower's ``SecAggPlusState``).
    """
    configs = msg.content.config_records[RECORD_KEY_CONFIGS]
    stage = configs.get(Key.STAGE)
    if stage == Stage.SETUP:
        check_setup(SecAggSetup.from_config(configs), clients=clients, dropout=dropout)
        return
    record = context.state.config_records.get(RECORD_KEY_STATE)
    if record is None or stage not in (Stage.SHARE_KEYS, Stage.COLLECT_MASKED_VECTORS, Stage.UNMASK):
        raise Refusal("secagg_setup", "a SecAgg+ stage without a setup, or an unknown stage")
    state = SecAggPlusState(**record)
    try:
        if stage == Stage.SHARE_KEYS:
            pairs = {int(nid): cast(list[bytes], pair) for nid, pair in configs.items() if nid != Key.STAGE}
            keys = {nid: (pair[0], pair[1]) for nid, pair in pairs.items()}
        else:
            listed = {key: [int(nid) for nid in cast(list[int], configs[key])]
                      for key in (Key.SOURCE_LIST, Key.ACTIVE_NODE_ID_LIST, Key.DEAD_NODE_ID_LIST) if key in configs}
    except (TypeError, ValueError, IndexError, KeyError):
        raise Refusal("secagg_neighbours", f"malformed {stage} message") from None
    if stage == Stage.SHARE_KEYS:
        check_neighbours(SecAggSetup.from_config(record), state.nid, keys, clients=clients, dropout=dropout,
                         min_neighbours=min_neighbours)
    elif stage == Stage.COLLECT_MASKED_VECTORS:
        check_share_sources(state.nid, listed.get(Key.SOURCE_LIST, []), state.public_keys_dict,
                            threshold=state.threshold)
    else:
        check_unmask(state.nid, listed.get(Key.ACTIVE_NODE_ID_LIST, []), listed.get(Key.DEAD_NODE_ID_LIST, []),
                     state.rd_seed_share_dict, threshold=state.threshold, clients=clients, dropout=dropout,
                     sample_num=state.sample_num)


def secure_vote_reply(
    msg: Message,
    context: Context,
    masked_input: Callable[[dict[str, Scalar], int], np.ndarray],
    *,
    clients: int,
    dropout: float,
    min_neighbours: int,
) -> Message:
    """Answer one SecAgg+ stage message of the vote round, after this client's checks of it (:func:`check_stage`).

    Only the masked-input stage calls ``masked_input(fit_config, clipping_range)``, which returns this
    client's encoded vector within the round's ``clipping_range`` (:func:`dphype.secure.secure_sum.clipping_range_for`
    of the round's size, checked in stage 0); SecAgg+ masks it before it leaves (weight
    ``num_examples = 1``, no metrics: metrics are not masked). A message that is not a SecAgg+ stage is
    refused: answering it would send the vector in plaintext. Refusals raise
    :class:`dphype.protocol.Refusal` before the stage's reply is built.
    """
    if RECORD_KEY_CONFIGS not in msg.content.config_records:
        raise Refusal("secagg_setup", "refusing a DP-Hype vote request outside SecAgg+: the votes would reach "
                      "the server in plaintext")
    check_stage(msg, context, clients=clients, dropout=dropout, min_neighbours=min_neighbours)

    def handler(stage_msg: Message, ctxt: Context) -> Message:
        fitins = compat.recorddict_to_fitins(stage_msg.content, keep_input=True)
        state = ctxt.state.config_records[RECORD_KEY_STATE]
        vector = masked_input(fitins.config, int(cast(float, state["clipping_range"])))
        fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([vector]), 1, {})
        return Message(compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=stage_msg)

    own_type = msg.metadata.message_type
    msg.metadata.message_type = MessageType.TRAIN  # the legacy mod handles plain train messages only
    reply = scalable_secaggplus_mod(msg, context, handler)
    reply.metadata.message_type = own_type
    return reply
