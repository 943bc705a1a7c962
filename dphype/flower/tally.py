"""Argmax mode over Flower's Message API: sealed shares from the clients, relayed to a committee of tally nodes.

Roles (one ``ClientApp`` serves both, :func:`register_tally` beside :func:`dphype.flower.client.register_dphype`):

* a **client** answers the usual pre-flight (``query.dphype``: the node policy checks the committee and the
  pure epsilon, :func:`dphype.node.policy.check_vote_request`) and then ``train.dphype_argmax``: the request
  must be the approved one; the node records the vote in its ledger, then answers with one sealed share per
  tally (:meth:`dphype.modes.ArgmaxRelease.ballot`). The server cannot open them.
* a **tally** is a node whose node config has ``dphype-tally-id`` (its index ``j`` in the committee),
  ``dphype-tally-parties`` (the MPyC addresses of all tallies, ``host:port,...`` in committee order) and
  ``dphype-tally-key`` (a file with its X25519 private key, created with mode 0600 if missing; its public key
  is what the server and the clients' ``dphype-tallies`` name). It answers ``query.dphype_tally`` in four
  stages: ``hello`` (its index and public key), ``collect`` (the request and the ciphertexts sealed to it:
  :class:`dphype.secure.tally.Tally` opens and sums them, refusing foreign or duplicate shares and a request
  already served), ``compute`` (starts its MPyC party with its summed share and returns at once, so that all
  parties run together whatever the transport) and ``result`` (the index its party opened).

The server (:func:`run_winner_selection`, called by :meth:`dphype.flower.server.DPHype.start` when
``release="argmax"``) finds the configured committee among the connected nodes (a tally that does not answer
``hello`` is unreachable: nothing is sent), runs the pre-flight with the other nodes, collects the sealed
shares, forwards each tally its ciphertexts and gets the index back. Fewer contributors than
``ceil((1 - xi) n)``, a tally that refuses, fails or answers late: :class:`dphype.secure.tally.TallyError`,
nothing released. The tally's state lives in its node's context (``context.state``: the requests served, the
collected job, the party's process id and output file beside the key), so a stage may run in any process of
the node, as in Flower's simulation, where a node's messages go to whichever ClientApp actor is free.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import log
from flwr.serverapp.grid import Grid
from flwr.supercore.run import Run

from dphype.flower.grid import send_and_receive
from dphype.modes import Aggregator
from dphype.node.ledger import Ledger
from dphype.protocol import DPHypeResult, Refusal, VoteRequest
from dphype.secure.relay import KeyPair
from dphype.secure.tally import Tally, TallyError, agreed_index, party_answer, party_command, send_job

if TYPE_CHECKING:
    from dphype.flower.client import PolicySource
    from dphype.flower.server import DPHype

#: ``train.dphype_argmax``: a client's sealed shares. ``query.dphype_tally``: the tallies' stages.
ARGMAX_ACTION = "dphype_argmax"
TALLY_ACTION = "dphype_tally"
#: Record key of the tally stages' content and answers.
TALLY_KEY = "dphype-tally"
#: Node-config keys of a tally node.
TALLY_ID, TALLY_PARTIES, TALLY_KEY_FILE = "dphype-tally-id", "dphype-tally-parties", "dphype-tally-key"

#: Context-state record of a tally node (:class:`_TallyNode`).
STATE_KEY = "dphype-tally-state"

def load_tally_key(path: str | os.PathLike[str]) -> KeyPair:
    """The tally's X25519 key pair from ``path`` (64 hex digits of the raw private key), created if missing."""
    file = Path(path).expanduser()
    if not file.exists():
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(X25519PrivateKey.generate().private_bytes_raw().hex())
    try:
        private = X25519PrivateKey.from_private_bytes(bytes.fromhex(file.read_text().strip()))
    except ValueError as err:
        raise ValueError(f"node config {TALLY_KEY_FILE}={str(path)!r} must hold 64 hex digits") from err
    return KeyPair(private, private.public_key().public_bytes_raw())


class _TallyNode:
    """A tally node: its committee index, MPyC addresses and key, with its state in the node's context (the
    requests it served, the job it collected, its running MPyC party's process id and output file), so that any
    process of the node serves any stage (Flower's simulation runs a node's messages in whichever actor is
    free)."""

    def __init__(self, node_config: dict[str, Any], state: RecordDict) -> None:
        self.index = int(node_config[TALLY_ID])
        self.parties = [a.strip() for a in str(node_config[TALLY_PARTIES]).split(",") if a.strip()]
        if not 0 <= self.index < len(self.parties):
            raise ValueError(f"node config {TALLY_ID} must be in [0, {len(self.parties) - 1}] "
                             f"({TALLY_PARTIES} names {len(self.parties)} parties)")
        self.key_file = Path(str(node_config[TALLY_KEY_FILE])).expanduser()
        self.keys = load_tally_key(self.key_file)
        self.state = state
        record = state.config_records.get(STATE_KEY)
        self.saved: dict[str, Any] = (json.loads(str(record["json"])) if record is not None
                                      else {"served": [], "job": None, "pid": None, "out": None})

    def _save(self) -> None:
        self.state.config_records[STATE_KEY] = ConfigRecord({"json": json.dumps(self.saved)})

    def stage(self, record: ConfigRecord) -> dict[str, Any]:
        stage = record.get("stage")
        if stage == "hello":
            return {"index": self.index, "public": self.keys.public}
        if stage == "collect":
            request = VoteRequest.from_record(record)
            if request.mode.aggregator is not Aggregator.COMMITTEE or self.keys.public not in request.tallies \
                    or request.tallies.index(self.keys.public) != self.index:
                raise TallyError(f"tally {self.index} is not tally {self.index} of this request's committee")
            tally = Tally(self.index, self.keys, served=self.saved["served"])
            tally.open_round(request.digest(), len(request.candidates), request.min_survivors,
                             len(request.tallies))
            self._stop()
            contributors = cast(list[int], record["contributors"])
            for contributor, sealed in zip(contributors, cast(list[bytes], record["shares"]), strict=True):
                tally.receive(str(contributor), sealed)
            self.saved.update(job=tally.job(), served=tally.served)
            self._save()
            return {"collected": len(contributors)}
        if stage == "compute":
            job = self.saved["job"]
            if job is None:
                raise TallyError(f"tally {self.index} has collected nothing to compute")
            out = self.key_file.parent / f"party-{self.index}-{job['request'][:16]}.out"
            with open(out, "w", encoding="utf-8") as fh:  # the party answers into the file, whoever reads it
                proc = subprocess.Popen(party_command(self.index, self.parties), stdin=subprocess.PIPE, stdout=fh,
                                        stderr=subprocess.DEVNULL, text=True)
            send_job(proc, job)
            self.saved.update(job=None, pid=proc.pid, out=str(out))
            self._save()
            return {"started": True}
        if stage == "result":
            if self.saved["out"] is None:
                raise TallyError(f"tally {self.index} has no computation running")
            timeout = float(cast(float, record["timeout"]))
            out, deadline = Path(self.saved["out"]), time.monotonic() + timeout
            try:
                while (answer := party_answer(out.read_text(encoding="utf-8"), self.index)) is None:
                    if time.monotonic() > deadline:
                        raise TallyError(f"tally {self.index} did not answer within {timeout:g} s; nothing released")
                    time.sleep(0.05)
            finally:
                self._stop()
            return {"index": answer[0]}
        raise TallyError(f"unknown tally stage {stage!r}")

    def _stop(self) -> None:
        """Stop this node's party (left over from an unfinished request, or done) and forget its output."""
        pid, out = self.saved["pid"], self.saved["out"]
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)  # the party this node started (it has exited when done)
        if out is not None:
            Path(out).unlink(missing_ok=True)
        self.saved.update(pid=None, out=None)
        self._save()


def register_tally(app: ClientApp) -> ClientApp:
    """Add the tally stages (``query.dphype_tally``) to ``app``; a node without ``dphype-tally-id`` in its
    node config answers ``hello`` with index -1 and no key, and the other stages with an error (it is not a
    tally). Returns ``app``."""

    @app.query(TALLY_ACTION)
    def tally(msg: Message, context: Context) -> Message:
        if TALLY_ID not in context.node_config:
            if msg.content.config_records[TALLY_KEY].get("stage") == "hello":  # a voter: no index, no key
                return Message(RecordDict({TALLY_KEY: ConfigRecord({"index": -1, "public": b""})}), reply_to=msg)
            raise TallyError("this node is not a tally (no dphype-tally-id in its node config)")
        answer = _TallyNode(dict(context.node_config), context.state).stage(msg.content.config_records[TALLY_KEY])
        return Message(RecordDict({TALLY_KEY: ConfigRecord(answer)}), reply_to=msg)

    return app


def register_winner_vote(app: ClientApp, *, policy: PolicySource = None) -> ClientApp:
    """Add ``train.dphype_argmax`` to ``app`` (a client's sealed shares after an approved pre-flight)."""
    from dphype.flower.client import (  # noqa: PLC0415 - client imports us
        GUARANTEE_KEY,
        RECORD_KEY,
        SCORES_KEY,
        _approved_guarantee,
        _resolve,
        _sanitized,
    )

    @app.train(ARGMAX_ACTION)
    def argmax_vote(msg: Message, context: Context) -> Message:
        try:
            limits = _resolve(policy, context)
            approved = context.state.config_records.get(RECORD_KEY)
            checked = context.state.config_records.get(GUARANTEE_KEY)
            request = VoteRequest.from_record(msg.content.config_records.get(RECORD_KEY, {}))
            if (approved is None or checked is None or approved["digest"] != request.digest()
                    or SCORES_KEY not in context.state.array_records
                    or request.mode.aggregator is not Aggregator.COMMITTEE):
                raise Refusal("malformed_request", "the argmax vote request is not the one approved in the pre-flight")
            guarantee = _approved_guarantee(checked, request, limits)  # the pre-flight's, unless the policy changed
            scores = context.state.array_records[SCORES_KEY]["scores"].numpy()
            sealed = request.mode.ballot(request, scores, maximize=bool(approved["maximize"]))
            del context.state.array_records[SCORES_KEY]  # one pre-flight, one vote
            spent = Ledger(cast(Path, limits.ledger)).spend(guarantee, limits, request.digest())
        except Exception as err:  # noqa: BLE001 - the server sees the sanitized reason only
            raise _sanitized("argmax vote", err) from None
        log(logging.INFO, "DP-Hype: argmax vote recorded in this node's ledger (lifetime epsilon %.4g of %.4g)",
            spent, limits.lifetime_epsilon)
        return Message(RecordDict({RECORD_KEY: ConfigRecord({"shares": sealed})}), reply_to=msg)

    return app


# -------------------------------------------------------------------------------------------- server side
def _ask(grid: Grid, nodes: Sequence[int], content: dict[int, dict[str, Any]], timeout: float | None,
         what: str) -> dict[int, Message]:
    """Send each node its ``query.dphype_tally`` stage and return the replies by node within ``timeout``."""
    messages = [Message(RecordDict({TALLY_KEY: ConfigRecord(content[n])}), dst_node_id=n,
                        message_type=f"query.{TALLY_ACTION}") for n in nodes]
    return {reply.metadata.src_node_id: reply for reply in send_and_receive(grid, messages, timeout=timeout, what=what)}


def _answers(replies: dict[int, Message], tally_nodes: dict[int, int], stage: str) -> dict[int, dict[str, Any]]:
    """Each tally's answer to ``stage``; :class:`TallyError` naming the first tally that failed or was late."""
    out = {}
    for j, node in sorted(tally_nodes.items()):
        reply = replies.get(node)
        if reply is None:
            raise TallyError(f"tally {j} did not answer the {stage} stage in time; nothing released")
        if reply.has_error():
            raise TallyError(f"tally {j} failed the {stage} stage ({(reply.error.reason or '')[:200]}); "
                             "nothing released")
        out[j] = dict(reply.content.config_records[TALLY_KEY])
    return out


def _hello(grid: Grid, nodes: Sequence[int], timeout: float | None) -> list[tuple[int, tuple[int, bytes]]]:
    """Each answering node's ``(tally index, public key)`` to the ``hello`` stage, by node id (a voter answers
    index -1; a node that fails or is late is left out)."""
    replies = _ask(grid, nodes, {n: {"stage": "hello"} for n in nodes}, timeout, "DP-Hype tally hello")
    out = []
    for node, reply in sorted(replies.items()):
        if not reply.has_error():
            answer = reply.content.config_records[TALLY_KEY]
            out.append((node, (int(cast(int, answer["index"])), cast(bytes, answer["public"]))))
    return out


def find_committee(grid: Grid, committee: Sequence[bytes], nodes: Sequence[int],
                   timeout: float | None) -> dict[int, int]:
    """Tally index -> node id of every committee member among ``nodes`` (``hello`` stage); a member that no node
    answers for is unreachable: :class:`TallyError`, before anything is sent to the clients."""
    found = {index: node for node, (index, key) in _hello(grid, nodes, timeout)
             if key in committee and committee.index(key) == index}
    missing = [j for j in range(len(committee)) if j not in found]
    if missing:
        raise TallyError(f"tally {missing[0]} is unreachable (no connected node answered with its key); "
                         "nothing was sent to the clients")
    return found


def discover_committee(grid: Grid, clients: int, size: int, *, connect_timeout: float | None,
                       timeout: float | None) -> tuple[tuple[bytes, ...], tuple[int, ...]]:
    """The public keys of the ``size`` tally nodes among the connected nodes, in committee order, and their node
    ids (``hello`` stage), for a server that takes its committee from the nodes rather than from its operator
    (the bundled app). Waits up to ``connect_timeout`` for ``clients + size`` nodes; fewer nodes, or tally
    indices other than exactly ``0..size-1`` (a tally missing or answering twice):
    :class:`dphype.flower.server.PreflightError` / :class:`TallyError`, before anything is sent to the clients.

    The server learns the keys from the nodes themselves here, so the committee is only as trustworthy as the
    connected nodes; a client that must not rely on that pins the keys it trusts (node config
    ``dphype-tallies``, :mod:`dphype.node.policy`) and refuses any other committee in the pre-flight."""
    from dphype.flower.server import PreflightError, _wait_for_nodes  # noqa: PLC0415 - server imports us

    needed = clients + size
    try:
        _wait_for_nodes(grid, needed, connect_timeout)
    except PreflightError:
        raise PreflightError(
            f"only {len(list(grid.get_node_ids()))} nodes connected within {connect_timeout:g} s; release=argmax "
            f"needs clients + tallies = {needed} nodes ({clients} voters and {size} tally nodes); nothing was "
            f"sent: in simulation set options.num-supernodes={needed}, in a deployment start every tally's "
            "SuperNode (README, 'Releasing only the winner')") from None
    connected = sorted(grid.get_node_ids())
    log(logging.INFO, "DP-Hype tally hello: asking the %d connected nodes which of them are the %d tallies",
        len(connected), size)
    found: dict[int, tuple[int, bytes]] = {}
    for node, (index, key) in _hello(grid, connected, timeout):
        if index < 0:  # a voter
            continue
        if index in found:
            raise TallyError(f"two nodes answer as tally {index}; nothing was sent to the clients")
        found[index] = (node, key)
    if sorted(found) != list(range(size)):
        raise TallyError(f"tallies={size} needs tally nodes 0..{size - 1} to answer, got "
                         f"{len(found)} ({', '.join(map(str, sorted(found))) or 'none'}); nothing was sent to the "
                         "clients")
    return tuple(found[j][1] for j in range(size)), tuple(found[j][0] for j in range(size))


class ClientGrid(Grid):
    """``grid`` without the tally nodes (their ids hidden from :meth:`get_node_ids`): what a strategy that
    samples nodes (FedAvg) sees after an argmax-mode selection, so that no tally trains or evaluates. Its
    :meth:`send_and_receive` is :func:`dphype.flower.grid.send_and_receive` (a short poll interval)."""

    def __init__(self, grid: Grid, tally_nodes: Sequence[int]) -> None:
        self.grid, self.tally_nodes = grid, frozenset(tally_nodes)

    def set_run(self, run: Run) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        return self.grid.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.grid.get_node_ids() if n not in self.tally_nodes]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return send_and_receive(self.grid, messages, timeout=timeout)


def run_winner_selection(server: DPHype, grid: Grid, *, timeout: float | None, connect_timeout: float | None,
                         tally_timeout: float = 60.0, committee_nodes: Sequence[int] | None = None) -> DPHypeResult:
    """Argmax mode of :meth:`DPHype.start`: committee, pre-flight, sealed shares, tallies, index (module docstring).

    ``committee_nodes``: the node id of each tally in committee order, when the caller has just learnt them
    from the tallies' own ``hello`` (:func:`discover_committee`); the committee is then not asked again (one
    round trip less: on a deployment, a ClientApp process on every node). They must be connected nodes; a
    wrong one fails at its tally's first stage, since only the holder of the committee key can open the
    shares sealed to it."""
    from dphype.flower.client import RECORD_KEY  # noqa: PLC0415
    from dphype.flower.server import PreflightError, _wait_for_nodes  # noqa: PLC0415

    request, cfg = server.request, server.config
    committee = list(request.tallies)
    _wait_for_nodes(grid, cfg.clients + len(committee), connect_timeout)
    connected = sorted(grid.get_node_ids())
    if committee_nodes is None:
        tally_nodes = find_committee(grid, committee, connected, timeout)
    else:
        tally_nodes = dict(enumerate(int(n) for n in committee_nodes))
        if len(tally_nodes) != len(committee) or len(set(tally_nodes.values())) != len(committee):
            raise ValueError(f"committee_nodes must name {len(committee)} distinct nodes, one per tally in "
                             f"committee order, got {list(committee_nodes)!r}")
        absent = [n for n in tally_nodes.values() if n not in connected]
        if absent:
            raise TallyError(f"committee node {absent[0]} is not connected; nothing was sent to the clients")
    others = [n for n in connected if n not in tally_nodes.values()]
    if len(others) < cfg.clients:
        raise PreflightError(f"only {len(others)} client nodes besides the {len(committee)} tallies, fewer than "
                             f"clients={cfg.clients}; nothing was sent")
    ready = server._preflight(grid, sorted(random.sample(others, cfg.clients)), timeout)
    start = time.perf_counter()
    vote = [Message(RecordDict({RECORD_KEY: ConfigRecord(request.to_record())}), dst_node_id=n,
                    message_type=f"train.{ARGMAX_ACTION}") for n in ready]
    shares: dict[int, list[bytes]] = {}
    for reply in send_and_receive(grid, vote, timeout=timeout, what="DP-Hype argmax vote"):
        answer = None if reply.has_error() else reply.content.config_records.get(RECORD_KEY)
        sealed = None if answer is None else answer.get("shares")
        if isinstance(sealed, list) and len(sealed) == len(committee):  # anything else counts as a dropout
            shares[reply.metadata.src_node_id] = cast(list[bytes], sealed)
    if len(shares) < request.min_survivors:
        raise PreflightError(f"only {len(shares)} clients sent their shares, fewer than the minimum survivors "
                             f"{request.min_survivors}; the tallies were not asked and nothing was released")
    contributors = sorted(shares)
    record = request.to_record()
    collect = {node: {**record, "stage": "collect", "contributors": contributors,
                      "shares": [shares[c][j] for c in contributors]} for j, node in tally_nodes.items()}
    tallies = sorted(tally_nodes.values())
    _answers(_ask(grid, tallies, collect, timeout, "DP-Hype tally collect"), tally_nodes, "collect")
    _answers(_ask(grid, tallies, {n: {"stage": "compute"} for n in tallies}, timeout, "DP-Hype tally compute"),
             tally_nodes, "compute")
    results = _answers(_ask(grid, tallies, {n: {"stage": "result", "timeout": tally_timeout} for n in tallies},
                            tally_timeout + 5.0 if timeout is None else timeout, "DP-Hype tally result"),
                       tally_nodes, "result")
    index = agreed_index([int(a["index"]) for a in results.values()])
    result = request.mode.release(request, index, len(contributors))
    log(logging.INFO, "DP-Hype (argmax) selected candidate %d %s (pure epsilon=%.4g, %d contributors, %d tallies) "
        "in %.2f s after the pre-flight", index, result.selected, result.report.epsilon, len(contributors),
        len(tallies), time.perf_counter() - start)
    return result
