"""The tally node of the argmax mode (``release="argmax"``): one member of the committee (`dphype.secure.committee`).

The same ``ClientApp`` serves clients and tallies (`dphype.flower.client.register_dphype` adds `register_tally`).
A **tally** is a node whose node config has ``dphype-tally-id`` (its index ``j``), ``dphype-tally-parties`` (all
tallies' MPyC addresses in committee order) and ``dphype-tally-key`` (its X25519 private key file, created with
mode 0600 if missing). It answers ``query.dphype_tally`` in four stages: ``hello`` (its index and public key),
``collect`` (the ciphertexts sealed to it, opened by `dphype.secure.committee.Tally`; it answers with the positions
it did not take, and those of them that may be the relay's doing, `dphype.secure.committee.Tally.unattributable`),
``compute`` (starts its MPyC party and returns at once, so that all parties run together whatever the transport;
the party ends by the stage's ``timeout``, the server's ``tally_timeout``, or as soon as this node's process does,
`node_process`, whether or not ``result`` ever comes) and ``result`` (what its party opened and the contributors
left out). The party's stderr goes to a file beside its answer and into this node's log when the result is read.

The tally's round lives in ``context.state`` (the job, the party's process id and output file), so a stage may
run in any process of the node; the requests it served live in a `dphype.secure.committee.ServedRecord` beside its
key (`served_record_path`), so a request is never served twice in one run, across restarts too.

With a roster (``dphype-roster``, ``dphype-identity`` in its node config, `dphype.secure.roster`) a tally is a
member with its committee key, and ``collect`` opens only shares labelled with distinct roster voters' names and
signed by them for this tally, request and run (any other share is an invalid entry: its contributor is left out
and named), for a request whose every tally is in the roster (``roster`` otherwise); without one it refuses every
stage (``no_roster``) unless its operator sets ``dphype-allow-unauthenticated = true``, and then takes node ids as
the contributors' labels.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, cast

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import log

from dphype.files import write_once
from dphype.flower.wire import (
    MAX_RESULT_WAIT,
    TALLY_ACTION,
    TALLY_COLLECT,
    TALLY_COMPUTE,
    TALLY_HELLO,
    TALLY_KEY,
    TALLY_RESULT,
    TALLY_STAGES,
    TALLY_STATE,
)
from dphype.node.policy import federation_settings, load_membership
from dphype.protocol import VoteRequest
from dphype.refusal import Refusal, as_refusal
from dphype.release import CommitteeMode
from dphype.secure.committee import (
    ServedRecord,
    Tally,
    TallyError,
    last_line,
    log_party_output,
    party_answer,
    party_command,
    send_job,
)
from dphype.secure.relay import KeyPair
from dphype.secure.roster import RosterError, share_payload

#: Node-config keys of a tally node (set by its operator, in Flower's node-config style).
TALLY_ID, TALLY_PARTIES, TALLY_KEY_FILE = "dphype-tally-id", "dphype-tally-parties", "dphype-tally-key"
#: Node config key: the folder whose ``.config/`` holds this tally's MPyC TLS files (``party_J.crt``,
#: ``party_J.key``, ``mpyc_ca.crt``; `dphype.node.pki.issue_mpyc_party`); its party then runs with MPyC's
#: ``--ssl`` in that folder. Absent: plain TCP between the parties (a private network only).
TALLY_TLS = "dphype-tally-tls"
#: Environment variable naming the folder of a simulated committee's keys (``tally-<j>.key``), set by the
#: operator of the simulation (``dphype demo`` makes the keys first, to check the committee before Flower starts);
#: unset, the bundled app (`dphype.app.client_app`) makes each run's keys in the run's folder beside the simulated
#: ledgers.
TALLY_KEYS_ENV = "DPHYPE_TALLY_KEYS"


def _stderr_file(out: Path) -> Path:
    """Where a party's stderr goes: beside its answer file ``out``, ``.err`` for ``.out``."""
    return out.with_suffix(".err")


def node_process() -> int:
    """The process whose death ends this node's MPyC party: the one that starts this node's ClientApp tasks.

    A deployed node serves each message in a ClientApp process of its own (it exits once the compute stage has
    answered, while the party runs on), started by the node's SuperExec; a simulated node's ClientApp runs in a Ray
    worker started by Ray's raylet. Either way the parent of the process serving the stage lives as long as the
    node (or the simulation) does: it is the party's anchor (`dphype.secure.tally_party.bound_lifetime`).
    """
    return os.getppid()


def _wait(record: ConfigRecord, stage: str) -> float:
    """Stage ``stage``'s ``timeout``: finite seconds in ``(0, MAX_RESULT_WAIT]``; else ``malformed_request``."""
    timeout = record.get("timeout")
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not 0 < timeout <= MAX_RESULT_WAIT):  # NaN fails the comparison too
        raise Refusal("malformed_request", f"{stage} needs a 'timeout' in (0, {MAX_RESULT_WAIT:g}] seconds")
    return float(timeout)


def served_record_path(key_file: str | os.PathLike[str]) -> Path:
    """The tally's record of served requests, beside its key: ``<key file>.served``."""
    file = Path(key_file).expanduser()
    return file.with_name(file.name + ".served")


def mpyc_tls_folder(value: Any, index: int) -> Path | None:
    """The folder of `TALLY_TLS` (``None`` if unset), checked to hold tally ``index``'s MPyC TLS files.

    Args:
        value: The node config's `TALLY_TLS` value, or ``None``.
        index: The tally's index ``J``.

    Returns:
        The folder's absolute path, or ``None``.

    Raises:
        ValueError: If a file is missing, naming the key and the fix.
    """
    if value is None:
        return None
    folder = Path(str(value)).expanduser().absolute()
    missing = [name for name in (f"party_{index}.crt", f"party_{index}.key", "mpyc_ca.crt")
               if not (folder / ".config" / name).is_file()]
    if missing:
        raise ValueError(f"node config {TALLY_TLS}={str(value)!r} lacks tally {index}'s MPyC TLS files: put them in "
                         f"its .config/\nmissing {', '.join(missing)}: the folder's .config/ must hold them "
                         "(server/make-certificates.sh makes them for a test federation)")
    return folder


def load_tally_key(path: str | os.PathLike[str]) -> KeyPair:
    """The tally's X25519 key pair from ``path`` (64 hex digits of the raw private key), created if missing.

    A missing file is created with mode 0600 (its folder 0700); processes that create it at once agree on one key.

    Args:
        path: The key file (``~`` is expanded).

    Returns:
        The key pair; its ``public`` is what the server and the clients' ``dphype-tallies`` name.

    Raises:
        ValueError: If the file does not hold 64 hex digits, or others may read it (as an identity key's,
            `dphype.secure.roster.IdentityKey.load`).
    """
    file = Path(path).expanduser()
    if not file.exists():  # written aside, then linked: a concurrent reader never sees half a key
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_once(file, X25519PrivateKey.generate().private_bytes_raw().hex().encode())
    mode = file.stat().st_mode & 0o777
    if mode & 0o077:
        raise ValueError(f"node config {TALLY_KEY_FILE}={str(path)!r} is readable by others (mode {mode:o}): "
                         f"chmod 600 {file}\nOthers could open the shares sealed to this tally.")
    try:
        private = X25519PrivateKey.from_private_bytes(bytes.fromhex(file.read_text().strip()))
    except ValueError as err:
        raise ValueError(f"node config {TALLY_KEY_FILE}={str(path)!r} must hold 64 hex digits") from err
    return KeyPair(private, private.public_key().public_bytes_raw())


class _TallyNode:
    """A tally node: its committee index, MPyC addresses and key, with its state in the node's context.

    The state holds the job it collected, its running MPyC party's process id and output file, so that any
    process of the node serves any stage (Flower's simulation runs a node's messages in whichever actor is free);
    the requests it served are in its persistent record (`served_record_path`).

    Args:
        node_config: The node's config (`TALLY_ID`, `TALLY_PARTIES`, `TALLY_KEY_FILE`).
        state: The node's ``context.state``, where the tally keeps its own.
        run: The run's id (``context.run_id``), which the shares are bound to.

    Raises:
        ValueError: If the index is outside the committee the parties name, the key file is invalid, or the node's
            roster or identity key is (`dphype.node.policy.PolicyError`).
        Refusal: ``no_roster`` without a roster unless its operator allowed it (``dphype-allow-unauthenticated``);
            ``roster`` if its identity is not a tally of its roster with its key file's key.
    """  # noqa: DOC502

    def __init__(self, node_config: dict[str, Any], state: RecordDict, run: int) -> None:
        self.index = int(node_config[TALLY_ID])
        self.parties = [a.strip() for a in str(node_config[TALLY_PARTIES]).split(",") if a.strip()]
        if not 0 <= self.index < len(self.parties):
            raise ValueError(f"node config {TALLY_ID} must be in [0, {len(self.parties) - 1}] "
                             f"({TALLY_PARTIES} names {len(self.parties)} parties)")
        self.key_file = Path(str(node_config[TALLY_KEY_FILE])).expanduser()
        self.keys = load_tally_key(self.key_file)
        self.tls = mpyc_tls_folder(node_config.get(TALLY_TLS), self.index)
        self.membership = load_membership(*federation_settings(node_config))
        if self.membership is not None and self.membership.member.tally_key != self.keys.public:
            raise Refusal("roster", f"tally {self.index}'s identity is not a tally of its roster: add it with "
                          f"`dphype roster add --role tally`\n(the identity: its key file's key, {TALLY_KEY_FILE}); "
                          "its operator must add it")
        self.record = ServedRecord(served_record_path(self.key_file))
        self.run = int(run)
        self.state = state
        record = state.config_records.get(TALLY_STATE)
        self.saved: dict[str, Any] = (json.loads(str(record["json"])) if record is not None
                                      else {"job": None, "pid": None, "out": None})

    def _save(self) -> None:
        self.state.config_records[TALLY_STATE] = ConfigRecord({"json": json.dumps(self.saved)})

    def stage(self, record: ConfigRecord) -> dict[str, Any]:
        """This tally's answer to one stage's content ``record``.

        ``hello``: its index and public key; ``collect``: opens the sealed shares of the request and draws its noise
        share (`dphype.release.CommitteeMode.tally_noise`); ``compute``: starts its MPyC party; ``result``: what its
        party opened and the contributors whose ballots were invalid, waiting at most the server's ``timeout`` (a
        finite number of seconds in ``(0, MAX_RESULT_WAIT]``).

        Args:
            record: The stage's content (its ``stage`` entry names the stage).

        Returns:
            The answer to send back.

        Raises:
            Refusal: ``tally_refused`` if the tally is not this request's, the request was served in this run
                (its record), fewer shares than the committee's floor are valid here, there is nothing to compute
                or running, its party does not answer in time, or the stage is unknown;
                ``malformed_request`` if a field of the stage is missing, of the wrong type or out of range.
            TallyError: The tally's own refusals (`register_tally` answers them as ``tally_refused``).
        """  # noqa: DOC502
        stage = record.get("stage")
        if stage == TALLY_HELLO:
            return {"index": self.index, "public": self.keys.public}
        if stage == TALLY_COLLECT:
            request = VoteRequest.from_record(record)
            mode = request.mode
            if not isinstance(mode, CommitteeMode):
                raise Refusal("release_mode", "a tally collects shares only for a request whose release is the "
                              "tally committee's")
            if request.roster and (self.membership is None or request.roster != self.membership.roster.digest()):
                raise Refusal("roster", "the request names another federation's roster than this tally's")
            if self.keys.public not in request.tallies or request.tallies.index(self.keys.public) != self.index:
                raise TallyError(f"tally {self.index} is not tally {self.index} of this request's committee")
            contributors, shares = record.get("contributors"), record.get("shares")
            label = int if self.membership is None else str  # node ids, or roster member names
            if not (isinstance(contributors, list) and isinstance(shares, list) and len(contributors) == len(shares)
                    and all(isinstance(c, label) and not isinstance(c, bool) for c in contributors)
                    and all(isinstance(b, bytes) for b in shares)):
                raise Refusal("malformed_request", "collect needs 'contributors' and 'shares' (bytes), one share "
                              f"per contributor\n'contributors': {label.__name__}: node ids, or roster member names "
                              "in a federation with a roster")
            unsigned = self._check_signed(request, cast(list[str], contributors), cast(list[bytes], shares),
                                          record.get("signatures"))
            tally = Tally(self.index, self.keys, record=self.record)
            tally.open_round(request.digest(), len(request.candidates), request.min_valid,
                             len(request.tallies), run=self.run,
                             form=mode.ballot_form(request.config, len(request.candidates)),
                             noise=mode.tally_noise(request), opens=mode.opens)
            self._stop()
            for i, (contributor, sealed) in enumerate(zip(contributors, shares, strict=True)):
                if i in unsigned:
                    tally.reject(str(contributor), unsigned[i])
                else:
                    tally.receive(str(contributor), cast(bytes, sealed))
            job = tally.job()
            for i, reason in zip(job["invalid"], job["reasons"], strict=True):
                log(logging.WARNING, "DP-Hype tally %d leaves out contributor %s: %s", self.index,
                    job["contributors"][i], reason)
            self.saved.update(job=job)
            self._save()
            return {"collected": len(contributors), "invalid": list(job["invalid"]),
                    "unattributable": list(job["unattributable"])}
        if stage == TALLY_COMPUTE:
            timeout = _wait(record, TALLY_COMPUTE)
            job = self.saved["job"]
            if job is None:
                raise TallyError(f"tally {self.index} has collected nothing to compute")
            out = self.key_file.parent / f"party-{self.index}-{job['request'][:16]}.out"
            # the party answers into the file, whoever reads it; its stderr beside it, for the tally's log
            with open(out, "w", encoding="utf-8") as fh, open(_stderr_file(out), "w", encoding="utf-8") as err:
                proc = subprocess.Popen(party_command(self.index, self.parties, ssl=self.tls is not None),
                                        cwd=self.tls, stdin=subprocess.PIPE, stdout=fh, stderr=err, text=True)
            send_job(proc, job, deadline=timeout, anchor=node_process())
            self.saved.update(job=None, pid=proc.pid, out=str(out))
            self._save()
            return {"started": True}
        if stage == TALLY_RESULT:
            timeout = _wait(record, TALLY_RESULT)
            if self.saved["out"] is None:
                raise TallyError(f"tally {self.index} has no computation running")
            out, deadline = Path(self.saved["out"]), time.monotonic() + float(timeout)
            try:
                while (answer := party_answer(out.read_text(encoding="utf-8"), self.index)) is None:
                    if time.monotonic() > deadline:
                        raise TallyError(f"tally {self.index} did not answer within {timeout:g} s"
                                         f"{last_line(self._party_stderr())}; nothing released")
                    time.sleep(0.05)
            finally:
                log_party_output(self.index, self._party_stderr())
                self._stop()
            value = answer[0].value
            return {"value": value if isinstance(value, int) else list(value), "excluded": list(answer[0].excluded),
                    "excluded_at": list(answer[0].excluded_at)}
        raise Refusal("malformed_request", f"unknown tally stage (one of {', '.join(TALLY_STAGES)})")

    def _check_signed(self, request: VoteRequest, contributors: list[str], shares: list[bytes],
                      signatures: Any) -> dict[int, str]:
        """With a roster: the request's tallies are the roster's; which shares are not signed by their labelled voter.

        For this tally, request and run. A request whose committee is not the roster's, or a collect without one
        signature entry per share, is refused (``roster``; nothing is opened); a share whose signature does not
        verify (missing, garbage, another member's, another run's or federation's, or a label that is not a voter)
        is its contributor's (or the relay's) doing: its entry is returned, never opened, and the committee leaves
        that contributor out (`dphype.secure.committee.Tally.reject`).

        Returns:
            Position -> why its signature does not verify (empty without a roster).
        """
        if self.membership is None:
            return {}
        roster = self.membership.roster
        listed = set(roster.tally_keys())
        if any(key not in listed for key in request.tallies):
            raise Refusal("roster", "the request's committee names a tally that is not in this tally's roster")
        if not (isinstance(signatures, list) and len(signatures) == len(shares)):
            raise Refusal("roster", "collect needs one roster signature per share ('signatures')")
        context = roster.context("committee-share", request.digest(), self.run)
        unsigned = {}
        for i, (name, sealed, signature) in enumerate(zip(contributors, shares, signatures, strict=True)):
            try:
                if not isinstance(signature, bytes):
                    raise RosterError(f"the signature of {name!r}'s share is not bytes")
                roster.check_signed(name, "voter", context, share_payload(self.index, sealed), signature)
            except RosterError as err:
                unsigned[i] = f"its roster signature does not verify: {err}"
        return unsigned

    def _party_stderr(self) -> str:
        """What this node's party wrote to stderr so far (empty when it wrote nothing or none is running)."""
        out = self.saved["out"]
        with contextlib.suppress(OSError):
            return _stderr_file(Path(out)).read_text(encoding="utf-8") if out is not None else ""
        return ""

    def _stop(self) -> None:
        """Stop this node's party (left over from an unfinished request, or done) and forget its output."""
        pid, out = self.saved["pid"], self.saved["out"]
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)  # the party this node started (it has exited when done)
        if out is not None:
            Path(out).unlink(missing_ok=True)
            _stderr_file(Path(out)).unlink(missing_ok=True)
        self.saved.update(pid=None, out=None)
        self._save()


def register_tally(app: ClientApp) -> ClientApp:
    """Add the tally stages (``query.dphype_tally``) to ``app``.

    A node without ``dphype-tally-id`` in its node config answers ``hello`` with index -1 and no key, and the
    other stages with an error (it is not a tally). Every error reaches the server as a refusal
    (`dphype.refusal`): ``tally_refused`` with the tally's own reason, ``malformed_request`` for a malformed or
    out-of-range field, ``release_mode`` for a request of another release mode.

    Args:
        app: The node's ``ClientApp``.

    Returns:
        ``app``, with the tally handler.
    """

    @app.query(TALLY_ACTION)
    def tally(msg: Message, context: Context) -> Message:
        if TALLY_ID not in context.node_config:
            stage = msg.content.config_records.get(TALLY_KEY)
            if stage is not None and stage.get("stage") == TALLY_HELLO:  # a voter: no index, no key
                return Message(RecordDict({TALLY_KEY: ConfigRecord({"index": -1, "public": b""})}), reply_to=msg)
            raise Refusal("tally_refused", "this node is not a tally (no dphype-tally-id in its node config)")
        try:
            stage = msg.content.config_records.get(TALLY_KEY)
            if stage is None:
                raise Refusal("malformed_request", f"a tally stage carries its content under {TALLY_KEY!r}")
            answer = _TallyNode(dict(context.node_config), context.state, context.run_id).stage(stage)
        except TallyError as err:  # our own messages: the cause, never a share's content
            raise Refusal("tally_refused", str(err)) from None
        except Exception as err:  # noqa: BLE001 - anything else as its refusal code (the request's own included)
            raise as_refusal(err) from None
        return Message(RecordDict({TALLY_KEY: ConfigRecord(answer)}), reply_to=msg)

    return app
