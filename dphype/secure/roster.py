"""A federation of known members: the roster of long-term identity keys, and signatures checked against it.

Framework-free (``cryptography``'s Ed25519 only). The operators of a federation agree on one **roster**: the
federation's name and its members, each with a name, a role (``voter`` or ``tally``), a long-term Ed25519
**identity** public key and, for a tally, its X25519 committee key (`dphype.flower.tally_node.load_tally_key`). Every
node reads the roster from its own node config (``dphype-roster``), never from the server, together with its own
private identity key (``dphype-identity``); ``dphype roster`` creates and inspects both (`dphype.cli.roster`).

A member signs (`sign`, `verify`) a `SigningContext` and a payload: the roster's digest (`Roster.digest`), the
stage (one of `STAGES`: a signature made for one purpose never verifies for another), the request's digest (or
its round), the run id, and the payload's SHA-256. A signature made under another roster (another federation, or
the same one before a member was added) does not verify under this one.

Where it is used (the threat model: `dphype.node.policy`):

* SecAgg+ (`dphype.secure.secagg`): with its fresh round keys each node sends its member name and its identity's
  signature over (its node id, the round id, its three public keys) at stage ``secagg-advertise``; before any
  share leaves it, every node checks that every entry of the key list it receives is signed by a distinct roster
  voter, its own entry by itself. The server cannot invent members (Sybils fail closed); the participation
  receipts and consistency signatures are made with the round's signing key ``g_u``, which the identity signed,
  so they are a member's too.
* The committee vote (`dphype.flower.client.committee_client`, `dphype.flower.tally_node`): each sealed share carries
  its voter's signature over the ciphertext's hash and the tally index at stage ``committee-share``, and is sealed to
  the voter's member name (`dphype.secure.committee.voter_id`); a tally never opens a share of an unknown member, of a
  member twice, signed under another roster, or relabelled or re-signed by the server: it is an invalid entry, and the
  committee leaves that contributor out and names it.

Every failure raises `RosterError` (a ``ValueError``) naming what failed; its ``refusal_code`` is ``roster``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import stat
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from dphype.secure import relay

#: The members' roles: a voter votes, a tally is a member of the argmax mode's committee.
ROLES: tuple[str, ...] = ("voter", "tally")
#: The stages a member signs (`SigningContext.stage`).
STAGES: tuple[str, ...] = ("secagg-advertise", "committee-share")
#: Version of the roster's format and of every signed statement.
VERSION = 1
_LABEL = f"dphype-roster-v{VERSION}"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_KEY_BYTES = 32


class RosterError(ValueError):
    """A roster, identity key or signature is invalid, or names no member; the message says what failed.

    Attributes:
        refusal_code: What a node tells the server (`dphype.refusal.as_refusal`).
    """

    refusal_code = "roster"


def public_key_bytes(text: str, what: str = "public key") -> bytes:
    """The 32 raw bytes of a public key typed as 64 hex digits or base64 (``what`` names it in the error).

    Args:
        text: The key as the operator typed it.
        what: What the key is, for the error message.

    Returns:
        The 32 raw bytes.

    Raises:
        RosterError: If ``text`` is neither 64 hex digits nor base64 of 32 bytes.
    """
    value = str(text).strip()
    try:
        raw = bytes.fromhex(value) if len(value) == 2 * _KEY_BYTES else base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error):
        raw = b""
    if len(raw) != _KEY_BYTES:
        raise RosterError(f"{what} must be a 32-byte public key, as 64 hex digits or base64, got {value[:80]!r}\n"
                          "give the line `dphype roster keygen` or `clients/start-tally.sh --print-public-key` "
                          "prints")
    return raw


def check_name(name: Any, what: str = "member name") -> str:
    """``name`` if it is 1-64 letters, digits, ``.``, ``_`` or ``-`` starting alphanumeric; else `RosterError`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RosterError(f"{what} must be 1-64 letters, digits, '.', '_' or '-' starting with a letter or digit, "
                          f"got {name!r}\n(no spaces, ';' or '|')")
    return name


@dataclass(frozen=True)
class IdentityKey:
    """A member's private Ed25519 identity key.

    Attributes:
        public: The 32-byte raw public key (what the roster names).
    """

    _private: Ed25519PrivateKey = field(repr=False)
    public: bytes

    @classmethod
    def generate(cls) -> IdentityKey:
        """A fresh identity key from the operating system's CSPRNG."""
        return cls._of(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> IdentityKey:
        """The identity key whose raw private key is the 32-byte ``seed`` (for simulations); else `RosterError`."""
        if not isinstance(seed, bytes) or len(seed) != _KEY_BYTES:
            raise RosterError("an identity key's seed must be 32 bytes")
        return cls._of(Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def _of(cls, private: Ed25519PrivateKey) -> IdentityKey:
        return cls(private, private.public_key().public_bytes_raw())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> IdentityKey:
        """Read a private key file, PEM (PKCS#8, as `save` writes) or raw base64, readable by its owner only.

        Parsed once per version of the file (its permissions checked at every call).

        Args:
            path: The key file (``~`` is expanded).

        Returns:
            The key.

        Raises:
            RosterError: If the file is missing, readable by others, or holds no Ed25519 private key.
        """
        file = Path(path).expanduser()
        try:
            seen = file.stat()
            mode = seen.st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise RosterError(f"identity key file {str(path)!r} is readable by others (mode {mode & 0o777:o}); "
                                  f"make it private: chmod 600 {file}")
            version = (str(file.absolute()), seen.st_ino, seen.st_size, seen.st_mtime_ns)
            if version in _IDENTITIES:  # read once per version of the file (a node reads it for every message)
                return _IDENTITIES[version]
            data = file.read_bytes()
        except OSError as err:
            raise RosterError(f"identity key file {str(path)!r} cannot be read ({err.strerror}); create one with "
                              "`dphype roster keygen --name NAME --out FILE`") from None
        try:
            if data.lstrip().startswith(b"-----BEGIN"):
                private = serialization.load_pem_private_key(data, password=None)
            else:
                private = Ed25519PrivateKey.from_private_bytes(base64.b64decode(data.strip(), validate=True))
        except (ValueError, TypeError, binascii.Error):
            private = None
        if not isinstance(private, Ed25519PrivateKey):
            raise RosterError(f"identity key file {str(path)!r} must hold an Ed25519 private key: use `dphype roster "
                              "keygen`\n(PEM, or the raw 32-byte key in base64, as keygen writes it)")
        if len(_IDENTITIES) >= _IDENTITY_FILES:
            _IDENTITIES.clear()
        _IDENTITIES[version] = cls._of(private)
        return _IDENTITIES[version]

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the private key as PEM (PKCS#8) to a new file with mode 0600 (its folder 0700).

        Args:
            path: The file; it must not exist (a key is never overwritten).

        Returns:
            The file's path.

        Raises:
            RosterError: If the file exists or cannot be created.
        """
        file = Path(path).expanduser()
        pem = self.private_pem()
        try:
            file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise RosterError(f"identity key file {str(path)!r} exists; a key is never overwritten: choose another "
                              "--out\nor remove the old key if no roster names it") from None
        except OSError as err:
            raise RosterError(f"identity key file {str(path)!r} cannot be created ({err.strerror})") from None
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
            out.flush()
            os.fsync(out.fileno())
        return file

    def private_pem(self) -> bytes:
        """The private key as unencrypted PEM (PKCS#8): what `save` writes (a secret)."""
        return self._private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message``."""
        return self._private.sign(message)


@dataclass(frozen=True)
class Member:
    """One member of a roster.

    Attributes:
        name: The member's name, unique in the roster (`check_name`); a voter's contributor identity.
        role: ``"voter"`` or ``"tally"`` (`ROLES`).
        identity: Its 32-byte raw Ed25519 identity public key.
        tally_key: A tally's 32-byte raw X25519 committee key; ``None`` for a voter.

    Raises:
        RosterError: If a field is invalid, a tally has no committee key or a voter has one.
    """

    name: str
    role: str
    identity: bytes
    tally_key: bytes | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.role not in ROLES:
            raise RosterError(f"member {self.name}'s role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if not isinstance(self.identity, bytes) or len(self.identity) != _KEY_BYTES:
            raise RosterError(f"member {self.name}'s identity must be a 32-byte Ed25519 public key")
        try:
            Ed25519PublicKey.from_public_bytes(self.identity)
        except ValueError:
            raise RosterError(f"member {self.name}'s identity is not an Ed25519 public key") from None
        if self.role == "tally":
            if not isinstance(self.tally_key, bytes) or len(self.tally_key) != _KEY_BYTES:
                raise RosterError(f"tally {self.name} needs its 32-byte X25519 committee key: give --tally-key\n"
                                  "the line `clients/start-tally.sh --print-public-key` prints")
        elif self.tally_key is not None:
            raise RosterError(f"voter {self.name} has a tally key: only a member with --role tally has one")

    def to_dict(self) -> dict[str, Any]:
        """``name``, ``role``, ``identity`` and, for a tally, ``tally_key`` (keys as hex): the roster's JSON."""
        out: dict[str, Any] = {"name": self.name, "role": self.role, "identity": self.identity.hex()}
        if self.tally_key is not None:
            out["tally_key"] = self.tally_key.hex()
        return out

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> Member:
        """Inverse of `to_dict`; `RosterError` if a field is missing or invalid."""
        if not isinstance(entry, Mapping) or set(entry) - {"name", "role", "identity", "tally_key"}:
            raise RosterError("a roster member must be an object with name, role, identity and (tallies) tally_key")
        name = entry.get("name")
        try:
            identity = public_key_bytes(str(entry["identity"]), f"member {name}'s identity")
            tally = entry.get("tally_key")
            tally_key = None if tally is None else public_key_bytes(str(tally), f"member {name}'s tally_key")
            return cls(name if isinstance(name, str) else repr(name), str(entry.get("role")), identity, tally_key)
        except KeyError:
            raise RosterError(f"roster member {name!r} has no identity") from None


@dataclass(frozen=True)
class SigningContext:
    """What every signature of a member is bound to, beside its payload.

    Attributes:
        roster: The roster's digest (`Roster.digest`): a signature of another federation does not verify.
        stage: What is signed, one of `STAGES`.
        request: The digest of the request it is for.
        run: The run id.

    Raises:
        RosterError: If the stage is unknown or a field has the wrong type.
    """

    roster: str
    stage: str
    request: str
    run: int

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise RosterError(f"unknown signed stage {self.stage!r} (one of {', '.join(STAGES)})")
        if not (isinstance(self.roster, str) and isinstance(self.request, str) and isinstance(self.run, int)
                and not isinstance(self.run, bool)):
            raise RosterError("a signing context needs the roster and request digests (str) and the run id (int)")

    def statement(self, payload: bytes) -> bytes:
        """The canonical bytes signed for ``payload``: the label, the context's fields and the payload's SHA-256."""
        fields = [_LABEL, self.stage, self.roster, self.request, self.run, hashlib.sha256(payload).hexdigest()]
        return json.dumps(fields, separators=(",", ":")).encode()


def share_payload(tally: int, sealed: bytes) -> bytes:
    """What a voter signs of one sealed share at stage ``committee-share``: the tally's index and the sealed hash."""
    return f"tally={int(tally)};".encode() + hashlib.sha256(bytes(sealed)).digest()


def sign(identity: IdentityKey, context: SigningContext, payload: bytes) -> bytes:
    """``identity``'s 64-byte Ed25519 signature of ``payload`` in ``context``."""
    return identity.sign(context.statement(payload))


def verify(member: Member, context: SigningContext, payload: bytes, signature: Any) -> None:
    """Check ``member``'s signature of ``payload`` in ``context``; `RosterError` if malformed or not verifying."""
    if not isinstance(signature, bytes) or len(signature) != 64:
        raise RosterError(f"member {member.name}'s signature ({context.stage}) is missing or malformed")
    if not relay.verify(member.identity, signature, context.statement(payload)):
        raise RosterError(f"member {member.name}'s signature ({context.stage}) does not verify: check its key and "
                          "roster\nmade by another key, for another payload, request, run or stage, or under another "
                          "roster")


@dataclass(frozen=True)
class Roster:
    """A federation's members (see the module docstring).

    Attributes:
        federation: The federation's name (`check_name`).
        members: Its members, sorted by name.

    Raises:
        RosterError: If the name is invalid, or two members share a name, an identity or a tally key.
    """

    federation: str
    members: tuple[Member, ...] = ()

    def __post_init__(self) -> None:
        check_name(self.federation, "federation name")
        members = tuple(sorted(self.members, key=lambda m: m.name))
        if not all(isinstance(m, Member) for m in members):
            raise RosterError("a roster's members must be Member objects")
        listed: tuple[tuple[str, list[str]], ...] = (
            ("name", [m.name for m in members]), ("identity key", [m.identity.hex() for m in members]),
            ("tally key", [m.tally_key.hex() for m in members if m.tally_key is not None]))
        for what, keys in listed:
            repeated = {key if what == "name" else key[:16] for key, count in Counter(keys).items() if count > 1}
            if repeated:
                shown = ", ".join(sorted(repeated))
                raise RosterError(f"roster {self.federation} has the same {what} twice ({shown}): every member has "
                                  "its own name and keys")
        object.__setattr__(self, "members", members)

    def to_json(self) -> str:
        """The canonical JSON (members sorted by name, keys sorted, no spaces): what `digest` hashes."""
        body = {"version": VERSION, "federation": self.federation, "members": [m.to_dict() for m in self.members]}
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Roster:
        """Parse a roster's JSON (`to_json` or `save`'s file); `RosterError` if it does not parse or is invalid."""
        try:
            body = json.loads(text)
        except ValueError as err:
            raise RosterError(f"a roster must be JSON ({err})") from None
        if not isinstance(body, dict) or body.get("version") != VERSION or not isinstance(body.get("members"), list):
            raise RosterError(f"a roster must be a JSON object with version {VERSION}, federation and members, as "
                              "`dphype roster init` writes it")
        federation = body.get("federation")
        return cls(federation if isinstance(federation, str) else repr(federation),
                   tuple(Member.from_dict(m) for m in body["members"]))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Roster:
        """Read a roster file (parsed once per version of the file).

        Args:
            path: The file (``~`` is expanded).

        Returns:
            The roster.

        Raises:
            RosterError: If the file cannot be read or is not a valid roster (the message names the file).
        """
        file = Path(path).expanduser()
        try:
            seen = file.stat()
            version = (str(file.absolute()), seen.st_ino, seen.st_size, seen.st_mtime_ns)
            if version not in _LOADED:  # read once per version of the file (a node reads it for every message)
                _LOADED.clear()
                _LOADED[version] = file.read_text(encoding="utf-8")
            text = _LOADED[version]
        except OSError as err:
            raise RosterError(f"roster file {str(path)!r} cannot be read ({err.strerror}); create one with "
                              "`dphype roster init --federation NAME --out FILE`") from None
        try:
            return _parsed(text)
        except RosterError as err:
            raise RosterError(f"roster file {str(path)!r}: {err}") from None

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the roster as indented JSON (`to_json`'s content), replacing the file atomically; returns its path."""
        file = Path(path).expanduser()
        file.parent.mkdir(parents=True, exist_ok=True)
        aside = file.with_name(f".{file.name}.{os.getpid()}.tmp")
        aside.write_text(json.dumps(json.loads(self.to_json()), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(aside, file)
        return file

    def digest(self) -> str:
        """SHA-256 (hex) of the canonical JSON: names this exact roster (a member more or less is another digest)."""
        return self._digest

    @cached_property
    def _digest(self) -> str:
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    @cached_property
    def _by_name(self) -> dict[str, Member]:
        return {m.name: m for m in self.members}

    @property
    def fingerprint(self) -> str:
        """The digest's first 16 hex digits in groups of 4 (``"3f2a-09bc-77d1-e4a0"``), to compare by eye."""
        head = self.digest()[:16]
        return "-".join(head[i:i + 4] for i in range(0, 16, 4))

    def describe(self) -> str:
        """``"roster <fingerprint> (N members)"``: what a result says of an authenticated federation."""
        return f"roster {self.fingerprint} ({len(self.members)} members)"

    def with_member(self, member: Member) -> Roster:
        """A new roster with ``member`` added; `RosterError` if its name or a key is already in it."""
        return Roster(self.federation, (*self.members, member))

    def member(self, name: Any, role: str | None = None) -> Member:
        """The member named ``name``, with ``role`` when given.

        Args:
            name: The member's name.
            role: The role it must have; ``None``: any.

        Returns:
            The member.

        Raises:
            RosterError: If no member has that name, or it has another role.
        """
        found = self._by_name.get(name) if isinstance(name, str) else None
        if found is None:
            raise RosterError(f"{str(name)[:64]!r} is not a member of roster {self.federation} ({self.fingerprint})")
        if role is not None and found.role != role:
            raise RosterError(f"member {found.name} of roster {self.federation} is a {found.role}, not a {role}")
        return found

    def of_role(self, role: str) -> tuple[Member, ...]:
        """The members with ``role``, sorted by name."""
        return tuple(m for m in self.members if m.role == role)

    def tally_keys(self) -> tuple[bytes, ...]:
        """The tallies' X25519 committee keys in member order: the only tallies a voter with this roster seals to."""
        return tuple(m.tally_key for m in self.of_role("tally") if m.tally_key is not None)

    def by_identity(self, public: bytes) -> Member:
        """The member whose raw Ed25519 identity key is ``public``; `RosterError` if none."""
        found = next((m for m in self.members if m.identity == public), None)
        if found is None:
            raise RosterError(f"the identity key {public.hex()[:16]}... is not a member of roster {self.federation}: "
                              f"add it with `dphype roster add`\n(roster fingerprint {self.fingerprint}); or use "
                              "this federation's key")
        return found

    def context(self, stage: str, request: str, run: int) -> SigningContext:
        """A `SigningContext` under this roster."""
        return SigningContext(self.digest(), stage, request, run)

    def check_signed(self, name: Any, role: str, context: SigningContext, payload: bytes, signature: Any) -> Member:
        """The member ``name`` of ``role`` after checking its signature of ``payload`` in ``context``.

        Args:
            name: The claimed signer's member name.
            role: The role it must have.
            context: The context (its roster must be this one).
            payload: What it must have signed.
            signature: The signature.

        Returns:
            The member.

        Raises:
            RosterError: An unknown member or another role, a context of another roster, or a signature that does
                not verify.
        """
        member = self.member(name, role)
        if context.roster != self.digest():
            raise RosterError(f"a signature under roster {context.roster[:16]} checked against roster "
                              f"{self.fingerprint}: another federation, or the roster changed")
        verify(member, context, payload, signature)
        return member

    def check_distinct_signers(self, entries: Iterable[tuple[Any, bytes, Any]], role: str,
                               context: SigningContext) -> list[Member]:
        """Check that every ``(name, payload, signature)`` is signed by a distinct member of ``role``.

        Args:
            entries: The signed entries.
            role: The role every signer must have.
            context: Their signing context.

        Returns:
            The signers, in the order of ``entries``.

        Raises:
            RosterError: A name repeats, or an entry fails `check_signed`.
        """
        listed = list(entries)
        key = _entries_key(self.digest(), role, context, listed)
        if key in _CHECKED:  # the same list checked before in this process (a simulation's nodes share one)
            return list(_CHECKED[key])
        seen: set[str] = set()
        signers = []
        for name, payload, signature in listed:
            if name in seen:
                raise RosterError(f"member {str(name)[:64]} appears twice: each member takes part once")
            signers.append(self.check_signed(name, role, context, payload, signature))
            seen.add(signers[-1].name)
        if key is not None:
            if len(_CHECKED) >= _CHECKED_LISTS:
                _CHECKED.pop(next(iter(_CHECKED)))
            _CHECKED[key] = tuple(signers)
        return signers

    def membership(self, identity: IdentityKey) -> Membership:
        """This node's membership by its private ``identity`` key; `RosterError` if the key is not a member's."""
        return Membership(self, identity, self.by_identity(identity.public))


#: The roster file last read, by (path, inode, size, modification time): its text.
_LOADED: dict[tuple[str, int, int, int], str] = {}
#: Identity keys read in this process, by version of their file (`IdentityKey.load`; a simulation's worker process
#: serves many nodes, each with its own file).
_IDENTITIES: dict[tuple[str, int, int, int], IdentityKey] = {}
_IDENTITY_FILES = 1 << 13

#: Signed lists that passed `Roster.check_distinct_signers` in this process, by `_entries_key`: a verdict depends on
#: nothing else, so the nodes of a simulation that share a process check the key list they all receive once.
_CHECKED: dict[bytes, tuple[Member, ...]] = {}
_CHECKED_LISTS = 8


def _entries_key(roster: str, role: str, context: SigningContext, entries: list[tuple[Any, Any, Any]]) -> bytes | None:
    """SHA-256 of everything `Roster.check_distinct_signers` reads (``None`` if an entry is not str, bytes, bytes)."""
    digest = hashlib.sha256(json.dumps([roster, role, context.statement(b"").decode()]).encode())
    for name, payload, signature in entries:
        if not (isinstance(name, str) and isinstance(payload, bytes) and isinstance(signature, bytes)):
            return None
        label = name.encode()
        digest.update(b"".join(len(part).to_bytes(8, "big") + part for part in (label, payload, signature)))
    return digest.digest()


@lru_cache(maxsize=8)
def _parsed(text: str) -> Roster:
    """`Roster.from_json` of ``text``, once per process for the same text (a roster is immutable)."""
    return Roster.from_json(text)


@dataclass(frozen=True)
class Membership:
    """A node's place in its federation: the roster, its own identity key and its member entry.

    Attributes:
        roster: The federation's roster (from the node's own config).
        identity: The node's private identity key.
        member: Its entry in the roster.
    """

    roster: Roster
    identity: IdentityKey = field(repr=False)
    member: Member

    @property
    def name(self) -> str:
        """The node's member name (its contributor identity)."""
        return self.member.name

    def sign(self, stage: str, request: str, run: int, payload: bytes) -> bytes:
        """This node's signature of ``payload`` at ``stage`` for ``request`` in ``run``, under its roster."""
        return sign(self.identity, self.roster.context(stage, request, run), payload)
