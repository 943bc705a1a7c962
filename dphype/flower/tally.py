"""The tally node of the argmax mode (``release="argmax"``).

A tally is one member of the committee that sums the clients' sealed shares and runs a secure argmax on them.

The same ``ClientApp`` serves clients and tallies (`dphype.flower.client.register_dphype` adds
`register_tally`; a client's sealed shares are `dphype.flower.client.argmax`'s). A **tally** is a
node whose node config has ``dphype-tally-id`` (its index ``j`` in the committee), ``dphype-tally-parties`` (the
MPyC addresses of all tallies, ``host:port,...`` in committee order) and ``dphype-tally-key`` (a file with its
X25519 private key, created with mode 0600 if missing; its public key is what the server and the clients'
``dphype-tallies`` name). It answers ``query.dphype_tally`` in four stages: ``hello`` (its index and public key),
``collect`` (the request and the ciphertexts sealed to it: `dphype.secure.tally.Tally` opens and sums
them, refusing foreign or duplicate shares and a request already served), ``compute`` (starts its MPyC party
with its summed share and returns at once, so that all parties run together whatever the transport) and
``result`` (the index its party opened).

The server (`dphype.flower.server.committee.run_winner_selection`, called by
`dphype.flower.server.DPHype.start` when ``release="argmax"``) finds the configured committee among the
connected nodes (a tally that does not answer ``hello`` is unreachable: nothing is sent), runs the pre-flight
with the other nodes, collects the sealed shares, forwards each tally its ciphertexts and gets the index back.
Fewer contributors than ``ceil((1 - xi) n)``, a tally that refuses, fails or answers late:
`dphype.secure.tally.TallyError`, nothing released. The tally's state lives in its node's context
(``context.state``: the requests served, the collected job, the party's process id and output file beside the
key), so a stage may run in any process of the node, as in Flower's simulation, where a node's messages go to
whichever ClientApp actor is free.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, cast

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable

from dphype._exports import moved_getattr
from dphype.flower.wire import (
    TALLY_ACTION,
    TALLY_COLLECT,
    TALLY_COMPUTE,
    TALLY_HELLO,
    TALLY_KEY,
    TALLY_RESULT,
    TALLY_STATE,
)
from dphype.modes import RELEASE_MODES, Aggregator
from dphype.node.policy import run_ledger_path
from dphype.protocol import VoteRequest
from dphype.secure.relay import KeyPair
from dphype.secure.tally import COMMITTEE_SIZE, Tally, TallyError, party_answer, party_command, send_job

#: Node-config keys of a tally node (set by its operator, in Flower's node-config style).
TALLY_ID, TALLY_PARTIES, TALLY_KEY_FILE = "dphype-tally-id", "dphype-tally-parties", "dphype-tally-key"
#: Environment variable naming the folder of a simulated committee's keys (``tally-<j>.key``), set by the
#: operator of the simulation (``dphype demo`` makes the keys first, to check the committee before Flower starts);
#: unset, the bundled app (`dphype.app.client`) makes each run's keys in the run's folder beside the simulated
#: ledgers.
TALLY_KEYS_ENV = "DPHYPE_TALLY_KEYS"


def load_tally_key(path: str | os.PathLike[str]) -> KeyPair:
    """The tally's X25519 key pair from ``path`` (64 hex digits of the raw private key), created if missing.

    A missing file is created with mode 0600 (its folder with mode 0700) and a fresh key.

    Args:
        path: The key file (``~`` is expanded).

    Returns:
        The key pair; its ``public`` is what the server and the clients' ``dphype-tallies`` name.

    Raises:
        ValueError: If the file does not hold 64 hex digits.
    """
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
    """A tally node: its committee index, MPyC addresses and key, with its state in the node's context.

    The state holds the requests it served, the job it collected, its running MPyC party's process id and output
    file, so that any process of the node serves any stage (Flower's simulation runs a node's messages in
    whichever actor is free).

    Args:
        node_config: The node's config (`TALLY_ID`, `TALLY_PARTIES`, `TALLY_KEY_FILE`).
        state: The node's ``context.state``, where the tally keeps its own.

    Raises:
        ValueError: If the index is outside the committee the parties name, or the key file is invalid.
    """  # noqa: DOC502

    def __init__(self, node_config: dict[str, Any], state: RecordDict) -> None:
        self.index = int(node_config[TALLY_ID])
        self.parties = [a.strip() for a in str(node_config[TALLY_PARTIES]).split(",") if a.strip()]
        if not 0 <= self.index < len(self.parties):
            raise ValueError(f"node config {TALLY_ID} must be in [0, {len(self.parties) - 1}] "
                             f"({TALLY_PARTIES} names {len(self.parties)} parties)")
        self.key_file = Path(str(node_config[TALLY_KEY_FILE])).expanduser()
        self.keys = load_tally_key(self.key_file)
        self.state = state
        record = state.config_records.get(TALLY_STATE)
        self.saved: dict[str, Any] = (json.loads(str(record["json"])) if record is not None
                                      else {"served": [], "job": None, "pid": None, "out": None})

    def _save(self) -> None:
        self.state.config_records[TALLY_STATE] = ConfigRecord({"json": json.dumps(self.saved)})

    def stage(self, record: ConfigRecord) -> dict[str, Any]:
        """This tally's answer to one stage's content ``record``.

        ``hello``: its index and public key; ``collect``: opens and sums the sealed shares of the request;
        ``compute``: starts its MPyC party; ``result``: the index its party opened.

        Args:
            record: The stage's content (its ``stage`` entry names the stage).

        Returns:
            The answer to send back.

        Raises:
            TallyError: If the tally is not this request's, has nothing to compute or running, its party does not
                answer in time, the stage is unknown, or `dphype.secure.tally.Tally` refuses the shares.
        """
        stage = record.get("stage")
        if stage == TALLY_HELLO:
            return {"index": self.index, "public": self.keys.public}
        if stage == TALLY_COLLECT:
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
        if stage == TALLY_COMPUTE:
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
        if stage == TALLY_RESULT:
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
    """Add the tally stages (``query.dphype_tally``) to ``app``.

    A node without ``dphype-tally-id`` in its node config answers ``hello`` with index -1 and no key, and the
    other stages with an error (it is not a tally).

    Args:
        app: The node's ``ClientApp``.

    Returns:
        ``app``, with the tally handler.
    """

    @app.query(TALLY_ACTION)
    def tally(msg: Message, context: Context) -> Message:
        if TALLY_ID not in context.node_config:
            if msg.content.config_records[TALLY_KEY].get("stage") == TALLY_HELLO:  # a voter: no index, no key
                return Message(RecordDict({TALLY_KEY: ConfigRecord({"index": -1, "public": b""})}), reply_to=msg)
            raise TallyError("this node is not a tally (no dphype-tally-id in its node config)")
        answer = _TallyNode(dict(context.node_config), context.state).stage(msg.content.config_records[TALLY_KEY])
        return Message(RecordDict({TALLY_KEY: ConfigRecord(answer)}), reply_to=msg)

    return app


# ------------------------------------------------------------------------------- simulated committee
#: First loopback port of a simulated committee's MPyC parties (`simulated_parties`).
SIMULATED_TALLY_PORTS = 20000


def simulated_parties(run_id: int, tallies: int) -> list[str]:
    """The MPyC addresses of a simulated committee.

    ``tallies`` consecutive loopback ports from one of 4,000 blocks of 10 at and above `SIMULATED_TALLY_PORTS`,
    chosen by the run id, so that every tally of the run derives the same list without talking to the others,
    and runs side by side rarely share a port.

    Args:
        run_id: The Flower run id.
        tallies: The committee's size.

    Returns:
        The addresses, ``"127.0.0.1:port"``, in committee order.
    """
    base = SIMULATED_TALLY_PORTS + (run_id % 4000) * 10
    return [f"127.0.0.1:{base + j}" for j in range(tallies)]


def simulated_role(context: Context, clients: int, tallies: int, keys: str | os.PathLike[str]) -> None:
    """Give a simulated node of an argmax-mode run its role, in its node config (module docstring, "In simulation").

    The run has ``clients`` voters and ``tallies`` tallies: a partition at or beyond ``clients`` becomes tally
    ``partition-id - clients`` (its key ``tally-<j>.key`` in the folder ``keys``, the addresses of
    `simulated_parties`), and a voter of a federation of exactly ``clients + tallies`` nodes gets its shard
    of ``clients`` partitions, as in sum mode. A node whose operator named a role (``dphype-tally-id``), or without
    a ``partition-id``, keeps its node config.

    Args:
        context: The node's context, whose node config is updated in place.
        clients: The number of voters.
        tallies: The committee's size.
        keys: The folder of the tallies' key files.
    """
    node = context.node_config
    if TALLY_ID in node or "partition-id" not in node:
        return
    partition = int(cast(int, node["partition-id"]))
    if partition >= clients:
        index = partition - clients
        node.update({TALLY_ID: index, TALLY_PARTIES: ",".join(simulated_parties(context.run_id, tallies)),
                     TALLY_KEY_FILE: str(Path(keys) / f"tally-{index}.key")})
    elif int(cast(int, node["num-partitions"])) == clients + tallies:
        node["num-partitions"] = clients


def simulated_roles(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """A ClientApp mod that gives each simulated node of an argmax-mode run its role (`simulated_role`).

    ``ClientApp(mods=[simulated_roles])``: the tallies of a simulation need nothing else (the bundled app and
    the app ``dphype new`` writes use it).

    Only a run config that states a release whose aggregator is the tally committee (``release = "argmax"``)
    and ``clients`` (as ``flwr run`` and ``dphype demo`` give it)
    assigns roles, with the keys in `TALLY_KEYS_ENV`'s folder, or in this run's folder
    beside the simulated ledgers (`dphype.node.policy.run_ledger_path`); every node of another release keeps
    its node config.

    Args:
        msg: The incoming message.
        context: The node's context.
        call_next: The next handler.

    Returns:
        The next handler's reply.
    """
    run = context.run_config
    mode = RELEASE_MODES.get(str(run.get("release")))
    if mode is not None and mode.aggregator is Aggregator.COMMITTEE and "clients" in run:
        simulated_role(context, int(cast(int, run["clients"])), int(cast(int, run.get("tallies", COMMITTEE_SIZE))),
                       os.environ.get(TALLY_KEYS_ENV) or run_ledger_path(context.run_id).parent)
    return call_next(msg, context)



#: Public names of the server's committee driver, which lived here: importable from here for one more release.
__getattr__ = moved_getattr(__name__, {"ClientGrid": "dphype.flower.server.committee",
                                       "discover_committee": "dphype.flower.server.committee"})
