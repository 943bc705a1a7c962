"""The tally committee of ``release="argmax"``: clients secret-share their ballots, tallies open only the winner.

Framework-free; the Flower adapter relays the bytes. A client checks its ballot against the request's form and seals
one Shamir share of its bits to each tally (`split_shares`, `client_sealed_shares`: bound to the request, the tally,
the run and the contributor). Each `Tally` opens its shares for one approved request, flags every invalid entry with
its reason (`Tally.invalid`), serves a request once per run and across restarts (`ServedRecord`) and hands its MPyC
party the job (`Tally.job`, `send_job`, `dphype.secure.tally_party`); the parties open only what the mode opens
(`OPENS_ARGMAX`, `OPENS_SUM`), and nothing below the floor of valid ballots.

The contract, under MPyC's model (Shamir sharing, honest majority, semi-honest tallies): the server, alone or with
one tally of three, learns nothing beyond the opening; a malicious client costs only its own ballot (left out and
named at every tally); a tally that drops or answers late aborts the run, which releases nothing. The protocol step
by step and its security: docs/design/committee.md.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from dphype.files import append_synced
from dphype.privacy.noise import COMMITTEE_TALLIES, honest_tallies
from dphype.privacy.winner import JointSampler
from dphype.secure.relay import KeyPair, RelayError, open_sealed, seal

#: Tallies in the default committee (honest majority with threshold 1).
COMMITTEE_SIZE = COMMITTEE_TALLIES
#: Bit length of MPyC's secure integers: the noisy counts (and a ballot's total) must lie in ``[-2^31, 2^31)``.
BIT_LENGTH = 32
#: MPyC's statistical security parameter for comparisons (its default): leakage probability ``2^-30``.
SEC_PARAM = 30
#: Bytes per share entry (the field prime has 64 bits).
ENTRY_BYTES = 8
#: Where the tallies' parties' output and the contributors they leave out are logged.
LOGGER = logging.getLogger(__name__)
#: What the committee opens: the winner's index (`dphype.release.ArgmaxRelease`) or the whole noisy sum
#: (`dphype.release.CommitteeSumRelease`).
OPENS_ARGMAX, OPENS_SUM = "argmax", "sum"


class TallyError(RuntimeError):
    """The committee released nothing; the message names the cause.

    Args:
        message: The cause.
        excluded: The labels of the contributors found invalid before it stopped.
    """

    def __init__(self, message: str, excluded: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.excluded = tuple(excluded)


class Form(Protocol):
    """What the tallies read of a ballot form (`dphype.selection.ballots.BallotForm`, a layer beside this one)."""

    @property
    def max_entry(self) -> int:
        """The largest entry, ``2**bits - 1``."""
        ...
    @property
    def min_total(self) -> int:
        """The smallest total."""
        ...
    @property
    def max_total(self) -> int:
        """The largest total."""
        ...

    def to_dict(self) -> dict[str, int]:
        """``{"max_entry", "min_total", "max_total"}`` as JSON values (what a tally's party reads)."""
        ...


@dataclass(frozen=True)
class Opening:
    """What the tally committee opened, the winner's index or the noisy sum, and who cast an invalid ballot.

    Attributes:
        value: The winner's index (`OPENS_ARGMAX`) or the noisy sum of the valid ballots, one integer per
            candidate (`OPENS_SUM`).
        excluded: The labels (never the content) of the contributors whose ballots were left out as invalid.
        excluded_at: Their positions in the contributor list (tells apart a label sent twice); not compared.
        unattributed: Of the contributors left out, those whose share failed in a way that may be the relay's as much
            as the sender's (`Tally.unattributable`, or no shares at all), as the server names them; ``excluded``
            then holds only the voters' own invalid ballots. Empty as the MPC opens it.
    """

    value: int | tuple[int, ...]
    excluded: tuple[str, ...] = ()
    excluded_at: tuple[int, ...] = field(default=(), compare=False)
    unattributed: tuple[str, ...] = ()


def _mpyc(module: str) -> Any:
    """``mpyc.<module>``, imported seeing only ``--no-log --no-uvloop`` (MPyC parses ``sys.argv``), logging restored."""
    name = f"mpyc.{module}"
    if name not in sys.modules:
        argv, root = sys.argv, logging.getLogger()
        handlers, level = root.handlers[:], root.level
        sys.argv = [argv[0] if argv else "dphype", "--no-log", "--no-uvloop"]
        try:
            importlib.import_module(name)  # only the committee path needs MPyC
        finally:
            sys.argv = argv
            root.handlers[:] = handlers
            root.setLevel(level)
    return sys.modules[name]


def field_modulus() -> int:
    """The prime of MPyC's ``SecInt(BIT_LENGTH)`` at ``SEC_PARAM`` (the largest Blum prime below ``2^64``)."""
    return int(_mpyc("finfields").find_prime_root(BIT_LENGTH + SEC_PARAM + 2, n=2)[0])


def threshold(parties: int) -> int:
    """MPyC's Shamir threshold ``t = (parties - 1) // 2``: the most corrupt tallies an honest majority tolerates."""
    return int(parties) - honest_tallies(parties)


def check_committee(public_keys: Sequence[bytes], *, minimum: int = COMMITTEE_SIZE,
                    known: Collection[bytes] | None = None) -> tuple[bytes, ...]:
    """Check the committee's X25519 public keys.

    Args:
        public_keys: The tallies' 32-byte raw public keys, in committee order.
        minimum: The fewest tallies accepted (never fewer than 3).
        known: The tallies this node trusts; ``None``: any.

    Returns:
        The keys as a tuple.

    Raises:
        ValueError: Too few tallies, a key that is not 32 bytes, a duplicate, or a key outside ``known``.
    """
    keys = tuple(public_keys)
    floor = max(3, int(minimum))
    if len(keys) < floor:
        raise ValueError(f"tally committee must have at least {floor} tallies, got {len(keys)}")
    for j, key in enumerate(keys):
        if not isinstance(key, bytes) or len(key) != 32:
            raise ValueError(f"tally {j}'s public key must be 32 bytes")
    if len(set(keys)) != len(keys):
        raise ValueError("tally committee has duplicate tallies (the same public key twice)")
    if known is not None:
        unknown = [j for j, key in enumerate(keys) if key not in set(known)]
        if unknown:
            raise ValueError(f"tally committee has unknown tallies (not in this node's list): {unknown}")
    return keys


def voter_id(run: int, contributor: int | str) -> str:
    """The identity a sealed share is bound to: the Flower run and the contributor's label.

    Args:
        run: The run's id.
        contributor: The contributor's roster member name, or without a roster its node id.

    Returns:
        ``"run=<run>;voter=<contributor>"``.

    Raises:
        ValueError: If ``contributor`` is empty or holds ``;`` or ``|`` (it could then pass for another).
    """
    label = str(contributor)
    if not label or ";" in label or "|" in label:
        raise ValueError(f"a contributor's identity must be non-empty without ';' or '|', got {label!r}")
    return f"run={int(run)};voter={label}"


def share_context(request_digest: str, tally: int, voter: str) -> bytes:
    """Associated data of a sealed share: the request, the tally index and the voter (`voter_id`) it is for."""
    return f"dphype-argmax-share|{request_digest}|{int(tally)}|{voter}".encode()


def split_shares(values: Any, parties: int, modulus: int) -> list[list[int]]:
    """``parties`` rows of Shamir shares of ``values`` in ``GF(modulus)`` by MPyC's ``np_random_split`` (CSPRNG)."""
    field = _mpyc("finfields").GF(modulus)
    vector = np.array([int(v) % modulus for v in np.asarray(values).reshape(-1)], dtype=object)
    rows = _mpyc("thresha").np_random_split(field, vector, threshold(parties), parties)
    return [[int(v) for v in row] for row in rows]


def open_shares(points: dict[int, Sequence[int]], modulus: int) -> list[int]:
    """The integers whose shares are ``points`` (tally index -> row), for tests; the protocol never opens counts."""
    field = _mpyc("finfields").GF(modulus)
    opened = _mpyc("thresha").recombine(field, [(j + 1, [field(int(v)) for v in row]) for j, row in points.items()])
    return [int(v) for v in opened]


def ballot_bits(ballot: Any, bits: int) -> np.ndarray:
    """The ``bits`` binary digits of each ballot entry, least significant first (entry c, digit l at ``c*bits+l``)."""
    values = np.asarray(ballot, dtype=np.int64).reshape(-1, 1)
    return ((values >> np.arange(int(bits), dtype=np.int64)) & 1).reshape(-1)


def client_sealed_shares(request_digest: str, ballot: Any, committee: Sequence[bytes], voter: str,
                         bits: int = 1) -> list[bytes]:
    """What a client sends: `split_shares` of its `ballot_bits`, share ``j`` sealed to ``committee[j]``.

    Args:
        request_digest: The request's digest.
        ballot: The ``(p,)`` ballot, already checked against its form by the client.
        committee: The tallies' public keys.
        voter: The client's identity in this run (`voter_id`).
        bits: The digits per entry of the request's ballot form (``BallotForm.bits``).

    Returns:
        One ciphertext per tally, in committee order.
    """
    keys = check_committee(committee)
    modulus = field_modulus()
    shares = split_shares(ballot_bits(ballot, bits), len(keys), modulus)
    return [seal(key, np.asarray(share, dtype=np.uint64).tobytes(), context=share_context(request_digest, j, voter))
            for j, (key, share) in enumerate(zip(keys, shares, strict=True))]


class ServedRecord:
    """A tally's append-only record of the requests it served: one JSON line ``{"run", "request"}`` each.

    Synced to disk (the file and, on creation, its folder) and read again before each round. A line that does
    not parse fails closed: the tally refuses every request until its operator repairs the file.

    Args:
        path: The record's file (created with mode 0600 on the first request served).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def entries(self) -> set[tuple[int, str]]:
        """Every ``(run, request digest)`` served; `TallyError` if the file cannot be read or a line does not parse."""
        try:
            text = self.path.read_text(encoding="utf-8") if self.path.exists() else ""
            lines = [json.loads(line) for line in text.splitlines() if line.strip()]
            return {(int(entry["run"]), str(entry["request"])) for entry in lines}
        except (OSError, ValueError, KeyError, TypeError):
            raise TallyError(f"the tally's record of served requests {self.path} cannot be read: repair it\n"
                             "(nothing is served meanwhile)") from None

    def add(self, run: int, request_digest: str) -> None:
        """Append ``(run, request_digest)`` and sync it to disk."""
        append_synced(self.path, json.dumps({"run": int(run), "request": request_digest}) + "\n")


class Tally:
    """One tally's state: its key pair, the request it is collecting for, and the requests it has served.

    Args:
        index: The tally's index in the committee.
        keys: Its X25519 key pair; ``None``: a fresh one.
        record: Its persistent record of served requests (`ServedRecord`); ``None``: kept in memory only.
    """

    def __init__(self, index: int, keys: KeyPair | None = None, record: ServedRecord | None = None) -> None:
        self.index = int(index)
        self.keys = KeyPair.generate() if keys is None else keys
        self._record = record
        self._served: set[tuple[int, str]] = set()  # what it served (the record's file is read again per round)
        self._round: dict[str, Any] | None = None

    @property
    def public(self) -> bytes:
        """The 32-byte X25519 public key clients seal their shares to."""
        return self.keys.public

    def open_round(self, request_digest: str, size: int, min_contributors: int,
                   parties: int = COMMITTEE_SIZE, *, run: int = 0, form: Form, noise: Any,
                   opens: str = OPENS_ARGMAX) -> None:
        """Start collecting ballot shares of ``size`` candidates for one approved request.

        Args:
            request_digest: The request's digest.
            size: The number of candidates ``p``.
            min_contributors: The fewest valid ballots the MPC accepts.
            parties: The committee's size.
            run: The run's id (shares are bound to it).
            form: The request's ballot form.
            noise: The committee's noise: the MPC's `dphype.privacy.winner.JointSampler`, or this tally's
                ``(size,)`` integer share.
            opens: `OPENS_ARGMAX` or `OPENS_SUM`.

        Raises:
            TallyError: The request was served in this run or is being collected, or the record cannot be read.
            ValueError: Noise of another length, or an unknown ``opens``.
        """
        served = self._served | (self._record.entries() if self._record is not None else set())
        if (int(run), request_digest) in served or (self._round is not None and self._round["request"] == request_digest
                                                     and self._round["run"] == int(run)):
            raise TallyError(f"tally {self.index} refuses a second opening for request {request_digest[:12]}")
        spec: dict[str, Any]
        if isinstance(noise, JointSampler):
            entries, spec = noise.size, {"sampler": noise.to_dict()}
        else:
            share = np.asarray(noise, dtype=np.int64).reshape(-1)
            entries, spec = share.size, {"noise": share.tolist()}
        if entries != int(size) or opens not in (OPENS_ARGMAX, OPENS_SUM):
            raise ValueError(f"the noise must have {int(size)} entries and opens must be {OPENS_ARGMAX!r} or "
                             f"{OPENS_SUM!r}")
        self._round = {"request": request_digest, "run": int(run), "size": int(size), "min": int(min_contributors),
                       "modulus": field_modulus(), "parties": int(parties), "threshold": threshold(parties),
                       "form": form.to_dict(), "width": int(size) * int(form.max_entry).bit_length(),
                       **spec, "opens": opens, "entries": []}

    def receive(self, contributor: str, sealed: bytes) -> None:
        """Open one contributor's sealed share; one that does not open for its label or does not parse is `reject`-ed.

        Args:
            contributor: The contributor's label (the share must be bound to it, `voter_id`).
            sealed: Its share for this tally (`client_sealed_shares`).

        Raises:
            TallyError: No round is open.
        """  # noqa: DOC502
        rnd = self._open()
        fingerprint = hashlib.sha256(bytes(sealed)).hexdigest()
        try:
            voter = voter_id(rnd["run"], contributor)
            plain = open_sealed(self.keys, sealed, context=share_context(rnd["request"], self.index, voter))
        except (RelayError, ValueError):
            self.reject(contributor, f"its share is not this contributor's for request {rnd['request'][:12]}, this "
                        "run and this tally (it does not open)")
            return
        share = np.frombuffer(plain, dtype=np.uint64) if len(plain) == rnd["width"] * ENTRY_BYTES else None
        if share is None or np.any(share >= np.uint64(rnd["modulus"])):
            self.reject(contributor, "its share does not parse (a wrong length or a value outside the field)",
                        sealed_by_sender=True)
            return
        rnd["entries"].append({"label": str(contributor), "row": share, "fingerprint": fingerprint, "reason": None,
                               "transit": False})

    def reject(self, contributor: str, reason: str, *, sealed_by_sender: bool = False) -> None:
        """Keep an invalid entry (zero row, ``reason``, never a share's content) for ``contributor``; needs a round.

        Args:
            contributor: The entry's label.
            reason: Why it is invalid.
            sealed_by_sender: Whether the share opened for its label, so its content is what its sender sealed; else
                (it did not open, or its roster signature failed) the relay may have made it so (`unattributable`).
        """
        rnd = self._open()
        rnd["entries"].append({"label": str(contributor), "row": None, "fingerprint": None, "reason": reason,
                               "transit": not sealed_by_sender})

    def _open(self) -> dict[str, Any]:
        """The open round; `TallyError` when there is none."""
        if self._round is None:
            raise TallyError(f"tally {self.index} has no open request")
        return self._round

    def invalid(self) -> dict[int, str]:
        """Position -> reason of the open round's invalid entries: rejected ones and every repeated label or share.

        Returns:
            Position in the round's contributor list -> reason.

        Raises:
            TallyError: No round is open.
        """  # noqa: DOC502
        entries = self._open()["entries"]
        out = {i: e["reason"] for i, e in enumerate(entries) if e["reason"] is not None}
        for key, what in (("label", "the same contributor sent twice"), ("fingerprint", "the same share twice")):
            seen: dict[str, list[int]] = {}
            for i, e in enumerate(entries):
                if e["reason"] is None:
                    seen.setdefault(e[key], []).append(i)
            for positions in seen.values():
                if len(positions) > 1:
                    out.update({i: f"{what} ({len(positions)} entries)" for i in positions if i not in out})
        return dict(sorted(out.items()))

    def unattributable(self) -> set[int]:
        """Positions of the open round's invalid entries that may be the relay's doing as much as the sender's.

        A share that did not open for its label, whose roster signature failed, or whose label or content repeats:
        the relay can make each of these from an honest voter's share (alter it, drop its signature, replay it).
        A share that opened, was signed (where the federation has a roster) and does not parse is its sender's.

        Returns:
            Positions in the round's contributor list.

        Raises:
            TallyError: No round is open.
        """  # noqa: DOC502
        entries = self._open()["entries"]
        return {i for i in self.invalid() if entries[i]["transit"] or entries[i]["reason"] is None}

    def job(self) -> dict[str, Any]:
        """Close the round: this tally's input to the MPC; the request counts as served (recorded) before it returns.

        Returns:
            The job: the share rows ordered by label (base64 little-endian uint64, zero for an invalid entry), the
            labels, the invalid positions (``"invalid"``) and reasons, those of them `unattributable`, the form, the
            noise (``"sampler"`` or ``"noise"``), the field, the request digest and the sizes.

        Raises:
            TallyError: No round is open, or fewer entries than the minimum are valid (the round is closed
                without counting as served).
        """
        rnd = self._open()
        invalid, unattributable = self.invalid(), self.unattributable()
        taken = len(rnd["entries"]) - len(invalid)
        if taken < rnd["min"]:  # the committee could not count enough: refused before the request counts as served
            first = next(iter(invalid.items()), None)
            self._round = None
            message = (f"tally {self.index} takes only {taken} of {len(rnd['entries'])} shares, under the committee's "
                       f"minimum {rnd['min']}; nothing released")
            if first is not None:
                message += f"\nleft out first: {rnd['entries'][first[0]]['label']}, {first[1]}"
            raise TallyError(message)
        self._round = None
        self._served.add((rnd["run"], rnd["request"]))
        if self._record is not None:
            self._record.add(rnd["run"], rnd["request"])
        order = sorted(range(len(rnd["entries"])), key=lambda i: rnd["entries"][i]["label"])  # stable: ties as sent
        entries = [rnd["entries"][i] for i in order]
        bad = {position: invalid[i] for position, i in enumerate(order) if i in invalid}
        rows = np.zeros((len(entries), rnd["width"]), dtype="<u8")
        for i, entry in enumerate(entries):
            if i not in bad:
                rows[i] = entry["row"]
        return {"modulus": rnd["modulus"], "bit_length": BIT_LENGTH, "threshold": rnd["threshold"],
                "parties": rnd["parties"], "request": rnd["request"],
                "contributors": [e["label"] for e in entries], "min_contributors": rnd["min"], "size": rnd["size"],
                "form": rnd["form"], "shares": base64.b64encode(rows.tobytes()).decode("ascii"),
                "invalid": sorted(bad), "reasons": [bad[i] for i in sorted(bad)],
                "unattributable": sorted(position for position, i in enumerate(order) if i in unattributable),
                **({"sampler": rnd["sampler"]} if "sampler" in rnd else {"noise": rnd["noise"]}),
                "opens": rnd["opens"]}


def _free_ports(count: int, host: str) -> list[int]:
    """``count`` distinct ports the operating system reports free on ``host``."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def party_command(index: int, addresses: Sequence[str], *, ssl: bool = False) -> list[str]:
    """The command that runs tally ``index``'s MPyC party.

    Args:
        index: The tally's index.
        addresses: Every party's ``host:port``, in committee order.
        ssl: MPyC's ``--ssl``: mutual TLS with the files in the party's ``.config/``
            (`dphype.node.pki.issue_mpyc_party`).

    Returns:
        The command line.
    """
    cmd = [sys.executable, str(Path(__file__).with_name("tally_party.py")), "--no-log", "-I", str(index)]
    cmd += ["--ssl"] if ssl else []
    for address in addresses:
        cmd += ["-P", address]
    return cmd


def spawn_party(index: int, addresses: Sequence[str]) -> subprocess.Popen[str]:
    """Start tally ``index``'s MPyC party (`party_command`) on ``addresses``; it waits for its job on stdin."""
    return subprocess.Popen(party_command(index, addresses), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def send_job(proc: subprocess.Popen[str], job: dict[str, Any], *, deadline: float,
             anchor: int) -> subprocess.Popen[str]:
    """Hand a spawned party its job (`Tally.job`) and its lifetime, and return ``proc``; it then connects to the others.

    Args:
        proc: The party's process (`spawn_party`).
        job: Its tally's job.
        deadline: Seconds the party may run from now; it is terminated then, whatever it is doing.
        anchor: The process whose death ends the party at once (`dphype.secure.tally_party.bound_lifetime`).

    Returns:
        ``proc``.
    """
    stdin = proc.stdin
    assert stdin is not None
    stdin.write(json.dumps({**job, "deadline": float(deadline), "anchor": int(anchor)}) + "\n")
    stdin.flush()
    return proc


def start_party(index: int, addresses: Sequence[str], job: dict[str, Any], *, deadline: float) -> subprocess.Popen[str]:
    """`spawn_party` and `send_job` at once, anchored to this process; returns without waiting."""
    return send_job(spawn_party(index, addresses), job, deadline=deadline, anchor=os.getpid())


def party_result(proc: subprocess.Popen[str], index: int, deadline: float,
                 timeout: float) -> tuple[Opening, dict[str, float]]:
    """Wait for tally ``index``'s party until ``deadline``; a late party is stopped.

    Args:
        proc: The party's process.
        index: The tally's index.
        deadline: When to give up, on the ``time.monotonic()`` clock.
        timeout: The whole wait the caller allowed (named in the error, not what was left of it).

    Returns:
        What the party opened and its measures (`party_answer`).

    Raises:
        TallyError: The party answered late, refused or crashed; the message names the cause.
    """
    try:
        out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        log_party_output(index, err)
        raise TallyError(f"tally {index} did not answer within {timeout:g} s{last_line(err)}; nothing "
                         "released") from None
    log_party_output(index, err)
    answer = party_answer(out, index)
    if answer is None:
        raise TallyError(f"tally {index} stopped without an answer (exit code {proc.returncode}){last_line(err)}; "
                         "nothing released")
    return answer


def log_party_output(index: int, output: str | None) -> None:
    """Log what tally ``index``'s party wrote to stderr, one record per non-empty line."""
    for line in (output or "").splitlines():
        if line.strip():
            LOGGER.warning("tally %d party: %s", index, line)


def last_line(output: str | None) -> str:
    """``" (its last words: <line>)"``, the last non-empty stderr line cut to 200 characters, or ``""``."""
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    return f" (its last words: {lines[-1][:200]})" if lines else ""


def party_answer(out: str, index: int) -> tuple[Opening, dict[str, float]] | None:
    """What a party opened, and its measures, in its output ``out``.

    Args:
        out: What the party printed so far.
        index: The tally's index (for the error message).

    Returns:
        ``(opening, measures)``, or ``None`` before its answer line is complete; the measures are seconds per
        step (``"<step> s"``), ``"bytes sent"`` and ``"peak memory"`` (bytes).

    Raises:
        TallyError: The party refused (with the contributors it found invalid, if it got that far).
    """
    lines = [line for line in out.splitlines(keepends=True) if line.startswith("{") and line.endswith("\n")]
    if not lines:
        return None
    answer = json.loads(lines[-1])
    excluded = tuple(str(label) for label in answer.get("excluded", ()))
    if "error" in answer:
        invalid = f" (invalid ballots from contributors {', '.join(excluded)})" if excluded else ""
        raise TallyError(f"tally {index} refused to open: {answer['error']}{invalid}; nothing released", excluded)
    measures = {f"{k} s": float(v) for k, v in answer.get("seconds", {}).items()}
    measures |= {key: float(answer[key]) for key in ("bytes sent", "peak memory") if key in answer}
    value = answer["value"]
    return Opening(int(value) if isinstance(value, int) else tuple(int(v) for v in value), excluded,
                   tuple(int(i) for i in answer.get("excluded_at", ()))), measures


def agreed_opening(openings: Sequence[Opening]) -> Opening:
    """The one opening every tally reported; `TallyError` if they differ."""
    if len(set(openings)) != 1:
        raise TallyError("tallies opened different results; nothing released")
    return openings[0]


def loopback_addresses(parties: int, host: str = "127.0.0.1") -> list[str]:
    """``host:port`` for ``parties`` MPyC parties on free loopback ports."""
    return [f"{host}:{port}" for port in _free_ports(parties, host)]


def run_loopback_committee(jobs: Sequence[dict[str, Any] | None], *, timeout: float = 30.0, host: str = "127.0.0.1",
                  timings: list[dict[str, float]] | None = None) -> Opening:
    """Run the tallies' MPyC parties on loopback ports; all must answer alike within ``timeout`` or all are stopped.

    Each party ends by itself at ``timeout`` too, and at once if this process dies (its anchor, `send_job`).

    Args:
        jobs: ``jobs[j]`` is tally ``j``'s `Tally.job` (``None``: that tally does not take part).
        timeout: Seconds every party has to answer.
        host: The loopback address.
        timings: When given, receives each party's measures (`party_answer`).

    Returns:
        The opening and the contributors whose ballots were invalid.

    Raises:
        TallyError: A tally did not start, answered late, refused or crashed, or the tallies disagree; the message
            names the tally.
    """
    addresses = loopback_addresses(len(jobs), host)
    procs = {j: start_party(j, addresses, job, deadline=timeout) for j, job in enumerate(jobs) if job is not None}
    missing = [j for j in range(len(jobs)) if j not in procs]
    deadline = time.monotonic() + timeout
    try:
        openings = []
        for j, proc in procs.items():
            try:
                opening, seconds = party_result(proc, j, deadline, timeout)
                openings.append(opening)
                if timings is not None:
                    timings.append(seconds)
            except TallyError as err:
                if missing:
                    raise TallyError(f"{err} (tally {missing[0]} did not start)") from None
                raise
        if missing:
            raise TallyError(f"tally {missing[0]} did not start; nothing released")
        return agreed_opening(openings)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
