"""The tally committee of ``release="argmax"``: clients secret-share their ballots, tallies open only the winner.

Protocol (framework-free; the Flower adapter relays the bytes):

1. The committee is ``parties >= 3`` tallies with X25519 public keys (`check_committee`: no duplicates,
   honest majority ``t = (parties - 1) // 2 >= 1``, and, when the node pins its tallies, only known keys).
2. Each client checks its ballot against the request's form (`dphype.selection.ballots`; no noise: the
   committee makes it) and splits its bits (`ballot_bits`) into Shamir shares modulo the prime ``p`` of MPyC's
   secure integers with MPyC's own splitter (`split_shares`: degree ``t = (parties - 1) // 2``, x-coordinates
   ``1 .. parties``, random coefficients from the operating system's CSPRNG, so any ``t`` shares are
   independent of the ballot: one for 3 tallies). Share ``j`` is sealed to tally ``j``'s key under a context that
   binds the request digest, ``j`` and the voter (`voter_id`: the run and the contributor's identity;
   `client_sealed_shares`, `dphype.secure.relay`), and the server relays the ciphertexts: it cannot read them,
   and a ciphertext for another request, tally, run or contributor does not open. The contributor's identity is its
   roster member name, and each share carries the member's signature (`dphype.secure.roster.share_payload`,
   checked by the tally node, `dphype.flower.tally_node`); without a roster it is the Flower node id the server's
   SuperLink assigned to it (what the tally sees as the share's label). A server cannot relabel one client's
   share as another's, nor replay it in another run.
3. Each `Tally` opens its ciphertexts for one approved request and keeps every contributor's share row in the
   order relayed (nothing is summed before the ballots are checked); a share that fails (it does not open for its
   label, does not parse, repeats a label or a ciphertext, or its roster signature did not verify at the tally node,
   `Tally.reject`) is an invalid entry with its reason (`Tally.invalid`), never a refusal of the round. It takes
   the committee's
   noise for the request's release mode (`dphype.modes.CommitteeMode.tally_noise`: the argmax release's sampler,
   `dphype.privacy.winner.JointSampler`, which every tally derives from the request; the committee sum's Skellam
   share, drawn by its node with the CSPRNG)
   and refuses a second round for a request it has already served in that run (`Tally.job`); a round in which it
   could take fewer shares than the floor is refused before it counts as served (the MPC never runs: the request
   may be collected again over another set). With a ``record``
   (the tally node keeps one beside its key, `ServedRecord`) what it served persists across runs and restarts: checked
   before anything is opened, appended and synced before its job leaves.
4. The tallies run MPyC (`dphype.secure.tally_party`): they check that they agree on the request, the
   contributors (at least the floor of valid ballots, `dphype.privacy.noise.min_valid_ballots`), the ballot form
   and the committee, take their share rows as MPyC secure integers (MPyC's parties hold exactly such Shamir
   shares), leave out every contributor invalid at any one tally (each party sends its tally's flags, all take the
   union: the same set at every tally), check every ballot (one random linear
   combination opened as zero or not; only if not, which ballots are invalid: `Opening.excluded`), add the valid
   ballots and the noise (sampled jointly inside the MPC, or every tally's share), and open only what the release
   mode opens: the index of
   ``mpc.np_argmax`` (ties to the lowest index; `OPENS_ARGMAX`) or the whole noisy sum (`OPENS_SUM`).

Security (MPyC's model: Shamir secret sharing, honest majority, semi-honest parties). The server sees
ciphertexts and the index. One tally sees uniformly random shares and the index; the server colluding with
one tally learns nothing more. Two colluding tallies (of three) can reconstruct every ballot (out of scope, as
the honest majority assumption). A malicious client cannot make an invalid ballot count (it is left out and its
contributor named), deal shares that lie on no polynomial of degree ``t`` or differ between tallies (the same),
send bytes that do not open at some tally, another member's label or a bad signature (the same, at every tally),
nor hide a boost in noise (it adds none); nor can it stop the release: it costs its own ballot only, and the
committee opens while at least `dphype.privacy.noise.min_valid_ballots` valid ballots remain (below it, nothing).
That floor protects no voter's privacy (the noise does not depend on the count); it keeps the release a decision
of most of the federation. A malicious tally can change the result or abort
(MPyC is secure against semi-honest parties only; an abort releases nothing); the MPC channels are MPyC's TCP
connections, which must run over a private network or MPyC's ``--ssl`` in a deployment. A tally that drops or
answers late aborts the run: `run_loopback_committee` raises `TallyError` naming it and no index is released;
each party's stderr is logged (`log_party_output`) and an error names its last line.
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
#: What the committee opens: the winner's index (`dphype.modes.ArgmaxRelease`) or the whole noisy sum
#: (`dphype.modes.CommitteeSumRelease`).
OPENS_ARGMAX, OPENS_SUM = "argmax", "sum"


class TallyError(RuntimeError):
    """The secure argmax did not run; nothing was released. The message names the cause.

    Args:
        message: The cause.
        excluded: The contributors whose ballots the committee found invalid before it stopped (their labels).
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
        """The form as plain JSON values (what a tally's party reads).

        Returns:
            ``{"max_entry": ..., "min_total": ..., "max_total": ...}``.
        """
        ...


@dataclass(frozen=True)
class Opening:
    """What the tally committee opened, the winner's index or the noisy sum, and who cast an invalid ballot.

    Attributes:
        value: The winner's index (`OPENS_ARGMAX`) or the noisy sum of the valid ballots, one integer per
            candidate (`OPENS_SUM`).
        excluded: The contributors whose ballots the committee found invalid and left out (their labels, never
            their content).
        excluded_at: Their positions in the tallies' contributor list (a label the relay sent twice is told apart
            by it); not compared.
    """

    value: int | tuple[int, ...]
    excluded: tuple[str, ...] = ()
    excluded_at: tuple[int, ...] = field(default=(), compare=False)


def _mpyc(module: str) -> Any:
    """``mpyc.<module>`` (``finfields``, ``thresha``), imported without MPyC's side effects on this (host) process.

    Importing the ``mpyc`` package parses ``sys.argv`` as MPyC options (a host's own ``--out`` is an
    ambiguous MPyC option and exits), configures the root logger and installs uvloop's event loop policy. The
    import sees only ``--no-log --no-uvloop``; the root logger's handlers and level are restored afterwards.
    """
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
    """The prime of the secure integers: MPyC's own choice for ``SecInt(BIT_LENGTH)`` at ``SEC_PARAM``.

    ``mpyc.finfields.find_prime_root(l + k + 2)``, the largest Blum prime below ``2^64``.

    Returns:
        The prime.
    """
    return int(_mpyc("finfields").find_prime_root(BIT_LENGTH + SEC_PARAM + 2, n=2)[0])


def threshold(parties: int) -> int:
    """MPyC's default Shamir threshold for ``parties`` parties: ``(parties - 1) // 2`` (honest majority).

    The most corrupt tallies it tolerates: ``parties`` less `dphype.privacy.noise.honest_tallies`.

    Args:
        parties: The number of tallies, ``>= 3``.

    Returns:
        The polynomial degree ``t``.
    """
    return int(parties) - honest_tallies(parties)


def check_committee(public_keys: Sequence[bytes], *, minimum: int = COMMITTEE_SIZE,
                    known: Collection[bytes] | None = None) -> tuple[bytes, ...]:
    """Check the committee's X25519 public keys.

    Args:
        public_keys: The tallies' 32-byte raw public keys, in committee order.
        minimum: The fewest tallies accepted (never fewer than 3: honest majority with threshold 1).
        known: The tallies this node trusts; ``None``: any.

    Returns:
        The keys as a tuple.

    Raises:
        ValueError: Too few tallies, a key that is not 32 bytes, a duplicate, or a key outside ``known``; the
            message names the cause.
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
    """The identity a sealed share is bound to: the run and the contributor.

    The contributor is its roster member name (`dphype.secure.roster`), or without a roster its Flower node id
    (assigned by the SuperLink); the label under which the server relays the share to the tallies. The run is the
    Flower run id both sides see in their context.

    Args:
        run: The run's id.
        contributor: The contributor's identity (its node id).

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
    """Associated data of a sealed share: the request, the tally and the voter (`voter_id`) it is for.

    Args:
        request_digest: The request's digest.
        tally: The tally's index.
        voter: The voter's identity in its run (`voter_id`).

    Returns:
        The context bytes.
    """
    return f"dphype-argmax-share|{request_digest}|{int(tally)}|{voter}".encode()


def split_shares(values: Any, parties: int, modulus: int) -> list[list[int]]:
    """Shamir shares of the integer vector ``values`` in ``GF(modulus)`` for ``parties`` tallies.

    One row per tally (x-coordinates ``1 .. parties``, degree `threshold`), by MPyC's own
    ``mpyc.thresha.np_random_split`` (coefficients from ``secrets.randbelow``): exactly the sharing MPyC's
    parties hold, so a tally's row (summed over the clients) is its share of the count vector.

    Args:
        values: The ``(p,)`` signed integer vector.
        parties: The number of tallies.
        modulus: The field's prime (`field_modulus`).

    Returns:
        ``parties`` rows of ``p`` field elements.
    """
    field = _mpyc("finfields").GF(modulus)
    vector = np.array([int(v) % modulus for v in np.asarray(values).reshape(-1)], dtype=object)
    rows = _mpyc("thresha").np_random_split(field, vector, threshold(parties), parties)
    return [[int(v) for v in row] for row in rows]


def open_shares(points: dict[int, Sequence[int]], modulus: int) -> list[int]:
    """The signed integers whose Shamir shares are ``points`` (MPyC's ``mpyc.thresha.recombine``).

    What any ``threshold + 1`` tallies together could reconstruct. For tests and benchmarks that check the
    secure argmax; the protocol never opens the counts.

    Args:
        points: Tally index -> its share vector.
        modulus: The field's prime.

    Returns:
        The ``p`` signed integers.
    """
    field = _mpyc("finfields").GF(modulus)
    opened = _mpyc("thresha").recombine(field, [(j + 1, [field(int(v)) for v in row]) for j, row in points.items()])
    return [int(v) for v in opened]


def ballot_bits(ballot: Any, bits: int) -> np.ndarray:
    """The binary digits of every entry of ``ballot``, least significant first: what a client secret-shares.

    Entry ``c``'s digit ``l`` is at ``c * bits + l``; the committee recombines an entry as ``sum_l 2^l x_l``, so an
    entry in ``[0, 2**bits - 1]`` is exactly one whose digits are bits (`dphype.secure.tally_party`).

    Args:
        ballot: The ``(p,)`` ballot, entries in ``[0, 2**bits - 1]``.
        bits: The digits per entry, ``>= 1``.

    Returns:
        The int64 ``(p * bits,)`` digits.
    """
    values = np.asarray(ballot, dtype=np.int64).reshape(-1, 1)
    return ((values >> np.arange(int(bits), dtype=np.int64)) & 1).reshape(-1)


def client_sealed_shares(request_digest: str, ballot: Any, committee: Sequence[bytes], voter: str,
                         bits: int = 1) -> list[bytes]:
    """What a client sends in argmax mode: `split_shares` of its ballot's bits (`ballot_bits`), each share sealed.

    No noise: the committee adds it and checks the ballot's form (`dphype.secure.tally_party`).
    Share ``j`` is sealed to ``committee[j]`` under `share_context` (bound to the request, ``j`` and ``voter``).

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
    """A tally's persistent record of the requests it has served: one JSON line ``{"run", "request"}`` each.

    Append-only, synced to disk (the file and, when it is created, its folder) before the tally's job leaves,
    and read again before a round opens, so that neither a restart of the tally's node nor a new run of the
    same server makes it serve a request twice. Kept beside the tally's key (`dphype.flower.tally_node`). A line
    that does not parse fails closed: the tally refuses every request until its operator repairs the file.

    Args:
        path: The record's file (created with mode 0600 on the first request served).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def entries(self) -> set[tuple[int, str]]:
        """Every ``(run, request digest)`` served so far.

        Returns:
            The pairs.

        Raises:
            TallyError: If the file cannot be read or a line does not parse (nothing is served then).
        """
        try:
            text = self.path.read_text(encoding="utf-8") if self.path.exists() else ""
            lines = [json.loads(line) for line in text.splitlines() if line.strip()]
            return {(int(entry["run"]), str(entry["request"])) for entry in lines}
        except (OSError, ValueError, KeyError, TypeError):
            raise TallyError(f"the tally's record of served requests {self.path} cannot be read; its operator "
                             "must repair it (nothing is served meanwhile)") from None

    def add(self, run: int, request_digest: str) -> None:
        """Append ``(run, request_digest)`` and sync it to disk.

        Args:
            run: The run's id.
            request_digest: The request's digest.
        """
        created = not self.path.exists()
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps({"run": int(run), "request": request_digest}) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            folder = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)


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
        """The X25519 public key clients seal their shares to.

        Returns:
            The 32-byte raw public key.
        """
        return self.keys.public

    def open_round(self, request_digest: str, size: int, min_contributors: int,
                   parties: int = COMMITTEE_SIZE, *, run: int = 0, form: Form, noise: Any,
                   opens: str = OPENS_ARGMAX) -> None:
        """Start collecting ballot shares of ``size`` candidates for one approved request of a committee.

        Args:
            request_digest: The request's digest.
            size: The number of candidates ``p`` (a share holds ``p * bits`` digits of the ballot).
            min_contributors: The fewest valid ballots the MPC accepts.
            parties: The committee's size.
            run: The run's id: shares are bound to it (`voter_id`) and a request is served once per run.
            form: The request's ballot form (every tally derives it from the approved request).
            noise: The committee's noise for the request's release (`dphype.modes.CommitteeMode.tally_noise`):
                the sampler the MPC draws it with (`dphype.privacy.winner.JointSampler`, the same at every tally),
                or this tally's ``(size,)`` integer share, drawn with the CSPRNG.
            opens: What the committee opens, `OPENS_ARGMAX` or `OPENS_SUM`.

        Raises:
            TallyError: The request was already served in this run (by this tally's record) or is being
                collected: one round per request and run; or the record cannot be read.
            ValueError: A noise share or sampler of another length, or an unknown ``opens``.
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
        """Open one contributor's sealed share of the current request; a share that fails marks its contributor.

        Every share is kept, one entry per share (the MPC's contributor list, ordered by label in `job`). A share
        that does not open for its label (another request, tally, run or contributor), repeats another's content,
        shares its label with another opened share, has the wrong length or a value outside the field is its
        contributor's doing (or the relay's): the entry is kept as invalid with a zero row and its reason, and the
        committee leaves that contributor's ballot out and names it (`dphype.secure.tally_party`: a contributor
        invalid at any one tally is left out at all of them), so one contributor cannot stop the release.

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
            self.reject(contributor, "its share does not parse (a wrong length or a value outside the field)")
            return
        rnd["entries"].append({"label": str(contributor), "row": share, "fingerprint": fingerprint, "reason": None})

    def reject(self, contributor: str, reason: str) -> None:
        """Keep an entry for ``contributor`` whose share this tally does not take (its ballot is left out).

        For the tally node's own checks before a share is opened (a roster signature that does not verify).

        Args:
            contributor: The contributor's label.
            reason: Why (for the tally's log; never a share's content).

        Raises:
            TallyError: No round is open.
        """  # noqa: DOC502
        rnd = self._open()
        rnd["entries"].append({"label": str(contributor), "row": None, "fingerprint": None, "reason": reason})

    def _open(self) -> dict[str, Any]:
        """The open round; `TallyError` when there is none."""
        if self._round is None:
            raise TallyError(f"tally {self.index} has no open request")
        return self._round

    def invalid(self) -> dict[int, str]:
        """The entries of the open round this tally found invalid so far, by position, with the reason.

        Besides the entries `receive` and `reject` marked: every opened share whose label or content another opened
        share repeats (the same contributor twice, or one ballot under two labels): all of them.

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

    def job(self) -> dict[str, Any]:
        """Close the round: this tally's input to the MPC (`dphype.secure.tally_party`).

        Every contributor's share row as it came, ordered by label (entries with one label in the order received; the
        MPC checks each ballot before anything is summed), the positions in that order of the entries this tally
        found invalid (`invalid`), and the committee's noise
        (its sampler, or this tally's share). The request now counts as served in its run, in the record (synced to
        disk) before the job is returned.

        Returns:
            The job: the share rows (base64 of little-endian uint64, one row per entry, zero for an invalid one), the
            contributors' labels in that order and the positions of the invalid entries (``"invalid"``),
            the ballot form, the noise (``"sampler"``, the committee's joint sampler, or ``"noise"``, this tally's
            share), the field, the request digest and the sizes.

        Raises:
            TallyError: No round is open, or fewer entries than the round's minimum are valid at this tally (the round
                is closed, the request not counted as served: nothing of it reaches the MPC).
        """
        rnd = self._open()
        invalid = self.invalid()
        taken = len(rnd["entries"]) - len(invalid)
        if taken < rnd["min"]:  # the committee could not count enough: refused before the request counts as served
            first = next(iter(invalid.items()), None)
            why = "" if first is None else f" (left out first: {rnd['entries'][first[0]]['label']}, {first[1]})"
            self._round = None
            raise TallyError(f"tally {self.index} takes only {taken} of {len(rnd['entries'])} shares, fewer than the "
                             f"committee's minimum of valid ballots {rnd['min']}{why}; nothing released")
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
    """The command that runs tally ``index``'s MPyC party (one per tally host in a deployment).

    Args:
        index: The tally's index.
        addresses: Every party's ``host:port``, in committee order.
        ssl: MPyC's ``--ssl``: mutually authenticated TLS between the parties, with the files MPyC reads from
            ``.config/`` in the party's working directory (`dphype.node.pki.issue_mpyc_party`).

    Returns:
        The command line.
    """
    cmd = [sys.executable, str(Path(__file__).with_name("tally_party.py")), "--no-log", "-I", str(index)]
    cmd += ["--ssl"] if ssl else []
    for address in addresses:
        cmd += ["-P", address]
    return cmd


def spawn_party(index: int, addresses: Sequence[str]) -> subprocess.Popen[str]:
    """Start tally ``index``'s MPyC party (`party_command`); it imports MPyC and waits for its job.

    Args:
        index: The tally's index.
        addresses: Every party's ``host:port``, in committee order.

    Returns:
        The party's process.
    """
    return subprocess.Popen(party_command(index, addresses), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def send_job(proc: subprocess.Popen[str], job: dict[str, Any]) -> subprocess.Popen[str]:
    """Hand a spawned party its job (`Tally.job`); it then connects to the others and computes.

    Args:
        proc: The party's process (`spawn_party`).
        job: The tally's job.

    Returns:
        ``proc``.
    """
    stdin = proc.stdin
    assert stdin is not None
    stdin.write(json.dumps(job) + "\n")
    stdin.flush()
    return proc


def start_party(index: int, addresses: Sequence[str], job: dict[str, Any]) -> subprocess.Popen[str]:
    """`spawn_party` and `send_job` at once; returns without waiting.

    Args:
        index: The tally's index.
        addresses: Every party's ``host:port``, in committee order.
        job: The tally's job.

    Returns:
        The party's process.
    """
    return send_job(spawn_party(index, addresses), job)


def party_result(proc: subprocess.Popen[str], index: int, deadline: float,
                 timeout: float) -> tuple[Opening, dict[str, float]]:
    """Wait for tally ``index``'s party until ``deadline`` (``time.monotonic()``).

    On a late answer, a refusal or a crash the party is stopped.

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
    """Log what tally ``index``'s party wrote to stderr (MPyC's messages, a traceback), one record per line.

    Args:
        index: The tally's index.
        output: What the party wrote (``None`` or empty: nothing to log).
    """
    for line in (output or "").splitlines():
        if line.strip():
            LOGGER.warning("tally %d party: %s", index, line)


def last_line(output: str | None) -> str:
    """``" (its last words: <line>)"`` for a party's stderr, the last non-empty line cut to 200 characters.

    Args:
        output: What the party wrote to stderr.

    Returns:
        The clause, or ``""`` when it wrote nothing.
    """
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    return f" (its last words: {lines[-1][:200]})" if lines else ""


def party_answer(out: str, index: int) -> tuple[Opening, dict[str, float]] | None:
    """What a party opened, and its measures, in its output ``out``.

    Args:
        out: What the party printed so far.
        index: The tally's index (for the error message).

    Returns:
        ``(opening, measures)``, or ``None`` before its answer line is complete; the measures are the party's
        seconds per step (``"import s"``, ``"connect s"``, ``"check s"``, ``"argmax s"``), the bytes it sent to
        the other parties (``"bytes sent"``) and its peak resident memory in bytes (``"peak memory"``).

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
    """The one opening (index and excluded contributors) every tally reported.

    Args:
        openings: What each tally opened.

    Returns:
        The opening.

    Raises:
        TallyError: They differ.
    """
    if len(set(openings)) != 1:
        raise TallyError("tallies opened different results; nothing released")
    return openings[0]


def loopback_addresses(parties: int, host: str = "127.0.0.1") -> list[str]:
    """``host:port`` for ``parties`` MPyC parties on free loopback ports.

    Args:
        parties: The number of parties.
        host: The loopback address.

    Returns:
        The addresses.
    """
    return [f"{host}:{port}" for port in _free_ports(parties, host)]


def run_loopback_committee(jobs: Sequence[dict[str, Any] | None], *, timeout: float = 30.0, host: str = "127.0.0.1",
                  timings: list[dict[str, float]] | None = None) -> Opening:
    """Run the tallies' MPyC parties on this machine (loopback ports): the checked, noisy argmax.

    Every party must answer within ``timeout`` seconds with the same opening; otherwise all parties are stopped
    (nothing is released).

    Args:
        jobs: ``jobs[j]`` is tally ``j``'s `Tally.job` (``None``: that tally does not take part, as when it is
            unreachable).
        timeout: Seconds every party has to answer.
        host: The loopback address.
        timings: When given, receives each party's measures (`party_answer`: seconds, bytes sent, peak memory).

    Returns:
        The opened index and the contributors whose ballots were invalid.

    Raises:
        TallyError: A tally did not start, answered late, refused (too few valid ballots among them) or crashed, or
            the tallies opened different results; the message names the tally that failed.
    """
    addresses = loopback_addresses(len(jobs), host)
    procs = {j: start_party(j, addresses, job) for j, job in enumerate(jobs) if job is not None}
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
