"""A node's persistent privacy ledger: every vote it contributed, composed against its lifetime budget.

Each vote is recorded (`Ledger.spend`) BEFORE the client's masked vector is sent, under an exclusive
lock, after checking that the composition of all recorded votes and the new one stays within the node's
lifetime budget; a crash between recording and sending counts the vote as spent. Votes compose in RDP on
`dphype.privacy.accounting.RDP_ORDERS`, each by its noise kind (`dphype.privacy.noise_kinds.NoiseKind.stated_rdp`:
dp_accounting's Gaussian event, the Skellam bound, a winner's randomized response), converted once with Thm I.1 at
the node's delta. A repeated, identical
request in another run is a new release and costs budget again; in one run a node votes once per request
(`dphype.node.vote_memory`). The private evaluation of the final model (`dphype.node.evaluation_policy`) is
recorded the same way, as an entry with ``"release": "evaluation"`` (`dphype.privacy.evaluation.evaluation_rdp`).

File format (JSON, UTF-8), version 1::

    {"format": "dphype-ledger", "version": 1,
     "entries": [{"time": "2025-01-01T12:00:00+00:00", "request": "<sha256 of the request>",
                  "noise": "skellam", "k": 5, "total_std": 12.84, "survivors": 50,
                  "epsilon": 0.9993, "delta": 1e-05, "neighbouring": "replace-one", "release": "vote"}, ...],
     "checksum": "<sha256 of the canonical JSON of entries>"}

An entry describes the release in the worst case the request allowed (`dphype.node.policy.VoteGuarantee`):
``total_std`` is the std of the summed noise of the fewest allowed contributors; ``epsilon`` is that vote
alone at ``delta`` with the node's accountant then (for reading; the composition uses the mechanism, under
the node's current neighbouring relation and delta). ``checksum`` guards against truncation and edits.

Writes are atomic (temporary file in the same directory, ``fsync``, ``os.replace``, ``fsync`` of the
directory) and serialised by ``fcntl.flock`` on ``<ledger>.lock`` across the ClientApp processes of one
node, so the file is never left half-written. A ledger that cannot be read, parsed or verified refuses
every vote (`LedgerError`, fail closed) until the operator repairs or removes it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from dphype.checks import NEIGHBOURING, check_delta, check_int
from dphype.files import exclusive_lock
from dphype.node.evaluation_policy import EvaluationGuarantee
from dphype.node.policy import (
    POLICY_KEYS,
    TALLIES_KEY,
    NodePolicy,
    VoteGuarantee,
    check_vote_request,
    default_ledger_path,
)
from dphype.privacy.accounting import RDP_ORDERS
from dphype.privacy.evaluation import EVALUATION_RELEASE, evaluation_rdp
from dphype.privacy.noise_kinds import any_noise_kind, noise_kind_names
from dphype.privacy.winner import epsilon_with_samplers  # registers the winner's noise kind
from dphype.protocol import EPSILON_RTOL, VoteRequest
from dphype.refusal import REFUSAL_CODES, Refusal

FORMAT = "dphype-ledger"
VERSION = 1
#: Seconds to wait for another ClientApp process of this node to release the ledger.
LOCK_TIMEOUT = 30.0


class LedgerError(RuntimeError):
    """The ledger cannot be read, verified or written; every vote is refused until it is repaired.

    Attributes:
        refusal_code: What a client tells the server (`dphype.refusal.as_refusal`).
    """

    refusal_code = "ledger_error"  # what a client tells the server (dphype.refusal.as_refusal)


@dataclass(frozen=True)
class LedgerEntry(VoteGuarantee):
    """One recorded vote: its `dphype.node.policy.VoteGuarantee`, when, and for which request.

    Attributes:
        time: When it was recorded (ISO 8601, UTC, seconds).
        request: The SHA-256 digest of the request (empty for a pre-flight check).
        release: ``"vote"``, or ``"evaluation"`` (`dphype.privacy.evaluation.EVALUATION_RELEASE`: the private
            evaluation of the final model, whose ``k`` counts the values sent); entries of older ledgers without the
            field are votes.

    Raises:
        ValueError: A field is invalid.
    """

    time: str
    request: str
    release: str = "vote"

    def __post_init__(self) -> None:
        ok = (
            isinstance(self.time, str) and isinstance(self.request, str)
            and self.release in ("vote", EVALUATION_RELEASE)
            and self.noise in noise_kind_names(shares=False)
            and (self.release == "vote" or self.noise in noise_kind_names())  # an evaluation is a sum of shares
            and self.neighbouring in NEIGHBOURING
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (self.k, self.survivors))
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                    for v in (self.total_std, self.epsilon, self.delta))
            and self.total_std > 0 and self.epsilon >= 0 and 0 < self.delta < 1
        )
        if not ok:
            raise ValueError("invalid ledger entry")

    def rdp(self, neighbouring: str) -> np.ndarray:
        """RDP curve of this release under ``neighbouring`` on `RDP_ORDERS` (a vote: its noise kind's `stated_rdp`)."""
        if self.release == EVALUATION_RELEASE:
            return evaluation_rdp(self.total_std, self.noise, RDP_ORDERS)
        return any_noise_kind(self.noise).stated_rdp(RDP_ORDERS, k=self.k, sigma=self.total_std, epsilon=self.epsilon,
                                                    stated=self.neighbouring, neighbouring=neighbouring)


@contextlib.contextmanager
def ledger_lock(lock_file: Path, what: str) -> Iterator[None]:
    """`dphype.files.exclusive_lock` for up to `LOCK_TIMEOUT` seconds; its failures as `LedgerError` naming ``what``.

    Args:
        lock_file: The lock's file.
        what: The file it guards, as the error names it.

    Yields:
        Nothing; the lock is held meanwhile.

    Raises:
        LedgerError: The lock cannot be opened or another process holds it too long.
    """
    try:
        with exclusive_lock(lock_file, LOCK_TIMEOUT):
            yield
    except TimeoutError:
        raise LedgerError(f"{what} is locked by another process") from None
    except OSError as err:
        raise LedgerError(f"{what} cannot be opened: {err}") from err


def _checksum(entries: list[dict[str, Any]]) -> str:
    blob = json.dumps(entries, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class Ledger:
    """The privacy ledger file at ``path`` (created on the first vote; its directory with mode 0700).

    Args:
        path: The ledger file (``~`` expanded, made absolute).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser().absolute()

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r})"

    # ------------------------------------------------------------------------------------- file access
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the exclusive lock on ``<ledger>.lock`` (waits up to `LOCK_TIMEOUT` seconds)."""
        with ledger_lock(Path(f"{self.path}.lock"), f"ledger {self.path}"):
            yield

    def _read(self) -> list[LedgerEntry]:
        """Parse and verify the file (caller holds the lock); a missing file is an empty ledger."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except OSError as err:
            raise LedgerError(f"ledger {self.path} cannot be read: {err}") from err
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError("not a dphype ledger")
            if data.get("version") != VERSION:
                raise ValueError(f"version {data.get('version')!r} is not {VERSION}")
            raw = data["entries"]
            if set(data) != {"format", "version", "entries", "checksum"} or not isinstance(raw, list):
                raise ValueError("unexpected structure")
            if data["checksum"] != _checksum(raw):
                raise ValueError("checksum mismatch")
            names = {f.name for f in fields(LedgerEntry)}
            if not all(isinstance(e, dict) and set(e) | {"release"} == names for e in raw):  # older: no release
                raise ValueError("an entry has missing or unknown fields")
            return [LedgerEntry(**e) for e in raw]
        except (ValueError, KeyError, TypeError) as err:
            raise LedgerError(f"ledger {self.path} is corrupt ({err}); every vote is refused until an operator "
                              "repairs or removes it") from err

    def _write(self, entries: list[LedgerEntry]) -> None:
        """Replace the file atomically (caller holds the lock)."""
        raw = [asdict(e) for e in entries]
        data = {"format": FORMAT, "version": VERSION, "entries": raw, "checksum": _checksum(raw)}
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(data, fh, indent=1, allow_nan=False)
                    fh.write("\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as err:
            raise LedgerError(f"ledger {self.path} cannot be written: {err}") from err

    # ------------------------------------------------------------------------------------------ the API
    def entries(self) -> list[LedgerEntry]:
        """All recorded votes, oldest first; `LedgerError` if the file cannot be read or verified or is locked.

        A ledger with no file has no votes: reading it creates nothing (no lock file, no folder), as
        ``dphype doctor`` only looks. A file appears whole (`_write` replaces it atomically), so no lock is needed
        to see that it is not there.
        """
        if not self.path.exists():
            return []
        with self._locked():
            return self._read()

    @staticmethod
    def composed_epsilon(entries: list[LedgerEntry], delta: float, neighbouring: str) -> float:
        """Epsilon at ``delta`` of ``entries`` composed in RDP (sampled noise adds its sampler's delta); 0 for none."""
        if not entries:
            return 0.0
        sampled = sum(any_noise_kind(e.noise).sampled for e in entries)
        return epsilon_with_samplers(sum(e.rdp(neighbouring) for e in entries), check_delta(delta), sampled)

    def spent(self, delta: float, neighbouring: str = "replace-one") -> float:
        """Epsilon at ``delta`` of every vote recorded so far (`composed_epsilon` of `entries`)."""
        return self.composed_epsilon(self.entries(), delta, neighbouring)

    def _after(self, entries: list[LedgerEntry], new: LedgerEntry, policy: NodePolicy) -> float:
        total = self.composed_epsilon([*entries, new], policy.max_delta, policy.neighbouring)
        if total > policy.lifetime_epsilon * (1 + EPSILON_RTOL):  # the slack of the request check
            raise Refusal("lifetime_budget", REFUSAL_CODES["lifetime_budget"],
                          local=f"lifetime epsilon would be {total:.4g} > dphype-lifetime-epsilon="
                                f"{policy.lifetime_epsilon:g} at delta {policy.max_delta:g} after {len(entries)} "
                                f"recorded votes in {self.path}; the operator may raise dphype-lifetime-epsilon or "
                                f"archive this ledger and start a new one (dphype ledger --path {self.path} "
                                "--archive), knowing the old votes still count against this node's data")
        return total

    def check(self, guarantee: VoteGuarantee, policy: NodePolicy) -> float:
        """The lifetime epsilon after this vote, without recording it; refused (``lifetime_budget``) as `spend`."""
        with self._locked():
            return self._after(self._read(), _entry(guarantee, ""), policy)

    def spend(self, guarantee: VoteGuarantee, policy: NodePolicy, request: str) -> float:
        """Record the vote durably if it stays within the lifetime budget; call right before the vote is sent.

        Args:
            guarantee: The vote's worst-case guarantee.
            policy: The node's policy (lifetime budget, delta, neighbouring relation).
            request: The request's digest.

        Returns:
            The lifetime epsilon after this vote.

        Raises:
            dphype.refusal.Refusal: ``lifetime_budget``: the vote would exceed ``policy.lifetime_epsilon``.
            LedgerError: The ledger cannot be read, verified or written.
        """  # noqa: DOC502
        with self._locked():
            entries = self._read()
            new = _entry(guarantee, request)
            total = self._after(entries, new, policy)
            self._write([*entries, new])
            return total


    def archive(self) -> Path:
        """Move this ledger aside, under the lock, to ``<name>.archived-<UTC time>.json`` (`ARCHIVE_WARNING`).

        Returns:
            The archived file's path.

        Raises:
            LedgerError: There is no ledger, or it cannot be read or verified.
        """
        with self._locked():
            if not self.path.exists():
                raise LedgerError(f"ledger {self.path} does not exist; nothing to archive")
            self._read()  # a corrupt ledger is archived too, but only after it was read (the error names it)
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
            target = self.path.with_name(f"{self.path.stem}.archived-{stamp}{self.path.suffix}")
            os.replace(self.path, target)
            return target


#: What archiving a ledger means, printed by ``dphype ledger --archive``.
ARCHIVE_WARNING = ("archiving a ledger is the node operator's decision: the votes it recorded were released and "
                   "still count against this node's data; the node's lifetime budget starts again from zero, so "
                   "its guarantee over all runs is the composition of the archived ledgers and the new one")


def ledger_files(root: Path | None = None) -> list[Path]:
    """Every ledger file (persistent, per-run, archived) under ``root`` (``$FLWR_HOME/dphype``), sorted."""
    root = default_ledger_path().parent if root is None else root
    return sorted(path for path in root.rglob("*.json") if path.name.startswith("ledger")) if root.exists() else []


def _counts(entries: list[LedgerEntry]) -> dict[str, int]:
    """``{"votes": ..., "evaluations": ...}``: the recorded releases of each kind."""
    evaluations = sum(entry.release == EVALUATION_RELEASE for entry in entries)
    return {"votes": len(entries) - evaluations, "evaluations": evaluations}


def _entry(guarantee: VoteGuarantee, request: str) -> LedgerEntry:
    release = EVALUATION_RELEASE if isinstance(guarantee, EvaluationGuarantee) else "vote"
    return LedgerEntry(**asdict(guarantee), time=datetime.now(UTC).isoformat(timespec="seconds"),
                       request=request, release=release)


def admitting_policy(request: VoteRequest, *, votes: int = 1) -> dict[str, Any]:
    """Node-config keys of the strictest policy (beyond the defaults) that admits ``votes`` votes of ``request``.

    For simulations whose operator runs every node and chose the request (``dphype demo``, the benchmarks), never
    a substitute for a real node's own limits: the request's epsilon, delta and committee, ``dphype-min-clients``
    at most its contributors, ``dphype-min-neighbours`` 1 (the graph is the same operator's choice; every other
    SecAgg+ check applies) and the lifetime budget of ``votes`` such votes on a fresh ledger.

    Args:
        request: The vote request.
        votes: How many such votes the policy admits, ``>= 1``.

    Returns:
        The ``dphype-*`` node-config keys and their values.

    Raises:
        ValueError: ``votes`` is not an integer ``>= 1``.
    """  # noqa: DOC502
    check_int("votes", votes, 1)
    cfg = request.config
    keys: dict[str, Any] = {
        "dphype-max-epsilon": cfg.epsilon,
        "dphype-max-delta": cfg.delta,
        "dphype-min-clients": min(POLICY_KEYS["dphype-min-clients"][0], request.min_survivors),
        "dphype-min-neighbours": 1,
    }
    if request.tallies:  # the operator made the committee it names: its nodes pin exactly that one
        keys[TALLIES_KEY] = ",".join(key.hex() for key in request.tallies)
    guarantee = check_vote_request(request, NodePolicy.from_node_config(keys))
    lifetime = Ledger.composed_epsilon([_entry(guarantee, "")] * votes, cfg.delta, guarantee.neighbouring)
    return {**keys, "dphype-lifetime-epsilon": lifetime}


# -------------------------------------------------------------------------------------- dphype ledger
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``dphype ledger`` options on ``parser``."""
    parser.add_argument("--path", default=None,
                        help="ledger file (default: $FLWR_HOME/dphype/ledger.json, FLWR_HOME defaults to ~/.flwr)")
    parser.add_argument("--partition-id", type=int, default=None,
                        help="the node's partition-id, if its node config has one: the default file is then "
                        "$FLWR_HOME/dphype/ledger-partition-<id>.json")
    parser.add_argument("--delta", type=float, default=1e-5, help="delta of the composed epsilon (default 1e-5)")
    parser.add_argument("--neighbouring", choices=NEIGHBOURING, default="replace-one",
                        help="neighbouring relation of the composed epsilon (default replace-one)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--list", action="store_true",
                        help="list every ledger under $FLWR_HOME/dphype (persistent, per-run simulations, archived)")
    action.add_argument("--archive", action="store_true",
                        help="move the ledger named by --path aside and start a new one (the operator's decision: "
                        "its votes still count against the node's data)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Show a node's ledger: the votes it recorded and their composed epsilon at ``--delta`` (no file: no votes).

    ``--list`` lists every ledger file; ``--archive`` moves the ledger named by ``--path`` aside.

    Args:
        args: The parsed ``dphype ledger`` options.

    Returns:
        The command's result (printed as text, or as JSON with ``--json``).

    Raises:
        ValueError: An option is invalid, ``--archive`` lacks ``--path``, or the ledger is corrupt (exit
            status 2).
    """
    if args.partition_id is not None:
        check_int("partition-id", args.partition_id, 0)
    delta = check_delta(args.delta)
    if args.list:
        rows = []
        for path in ledger_files():
            row: dict[str, Any]
            try:
                entries = Ledger(path).entries()
                row = {**_counts(entries), "epsilon": Ledger.composed_epsilon(entries, delta, args.neighbouring)}
            except LedgerError as err:
                row = {"votes": None, "epsilon": None, "error": str(err).split("(", 1)[-1].rstrip(")")[:60]}
            rows.append({"path": str(path), **row})
        return {"root": str(default_ledger_path().parent), "delta": delta, "ledgers": rows}
    if args.archive:
        if args.path is None:
            raise ValueError("--archive needs --path FILE: name the ledger to archive (dphype ledger --list shows "
                             "them)")
        print(f"dphype ledger: warning: {ARCHIVE_WARNING}", file=sys.stderr)
        try:
            archived = Ledger(args.path).archive()
        except LedgerError as err:
            raise ValueError(str(err)) from err
        return {"path": str(Path(args.path).expanduser().absolute()), "archived_to": str(archived),
                "warning": ARCHIVE_WARNING}
    ledger = Ledger(args.path if args.path is not None else default_ledger_path(args.partition_id))
    try:
        entries = ledger.entries() if ledger.path.exists() else []
    except LedgerError as err:
        raise ValueError(str(err)) from err
    return {
        "path": str(ledger.path),
        "exists": ledger.path.exists(),
        **_counts(entries),
        "epsilon": Ledger.composed_epsilon(entries, delta, args.neighbouring),
        "delta": delta,
        "neighbouring": args.neighbouring,
        "entries": [asdict(e) for e in entries],
    }
