"""``dphype doctor``: what a SuperNode of the bundled app would enforce, checked before it joins.

Given the node config its start script builds (``clients/start-voter.sh ... --doctor`` passes it, with its TLS
files), it prints the node's policy, its roster's fingerprint and its own membership, the tallies it seals shares
to, its certificates and their validity, its ledger and remaining lifetime budget (a voter), or its committee, key
and MPyC TLS files (a tally), and exits with status 2, naming every contradiction, when the configuration cannot
work: a key set twice, each invalid or misspelt policy key, a shard outside its count, an invalid roster, an
identity that is not a member or in the other role, pinned tallies outside the roster or fewer than 3, a tally key
file that is not the roster's, a committee whose size is not the roster's tallies, a corrupt ledger or a spent
lifetime budget, a certificate that is not valid now or not signed by the CA, a tally certificate for another party
or a private key that is not its own, a missing or unreadable node key, or a node key without TLS. With ``--json`` a
refused configuration's report (``"ok": false`` and its ``problems``) is printed as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from dphype.node.ledger import Ledger, LedgerError
from dphype.node.pki import MPYC_NAME
from dphype.node.policy import (
    IDENTITY_KEY,
    POLICY_KEYS,
    ROSTER_KEY,
    UNAUTHENTICATED_KEY,
    NodePolicy,
    federation_settings,
    load_membership,
)
from dphype.refusal import Refusal
from dphype.secure.roster import RosterError
from dphype.strict_json import jsonable

if TYPE_CHECKING:
    from dphype.secure.roster import Membership

#: One ``key=value`` pair (a TOML string value in quotes may hold spaces), or a word that is not one.
_PAIR = re.compile(r"""(?P<key>[^\s=]+)=(?P<value>"(?:[^"\\]|\\.)*"|'[^']*'|\S+)|(?P<junk>\S+)""")
#: The fewest distinct tallies a voter seals shares to (`dphype.secure.committee.check_committee`).
MIN_TALLIES = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``doctor`` options.

    Args:
        parser: The sub-command's parser.
    """
    parser.add_argument("--node-config", required=True,
                        help="the node config in flower-supernode's syntax: key=value pairs with TOML values")
    parser.add_argument("--role", choices=("voter", "tally"), required=True, help="the node's role")
    parser.add_argument("--root-certificates", type=Path, default=None,
                        help="the CA file the SuperNode verifies the SuperLink with (absent: --insecure)")
    parser.add_argument("--node-key", type=Path, default=None, help="its SuperNode authentication key (with TLS)")


def parse_node_config(text: str) -> dict[str, Any]:
    """``key=value`` pairs with TOML values (``flower-supernode --node-config``'s syntax) as a dict.

    Args:
        text: The pairs, separated by spaces; string values in double quotes.

    Returns:
        Key -> value.

    Raises:
        ValueError: If a pair has no ``=``, its value is not a TOML value, or a key is set twice.
    """
    out: dict[str, Any] = {}
    for pair in _PAIR.finditer(text):
        key, value, junk = pair.group("key"), pair.group("value"), pair.group("junk")
        if junk is not None:
            raise ValueError(f"--node-config: {junk!r} is not key=value")
        if key in out:
            raise ValueError(f"--node-config: {key} is set twice (a SuperNode keeps only one value): set each key "
                             "once")
        try:
            out[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"--node-config: {key}'s value {value!r} is not a TOML value ({err})") from None
    return out


def _certificate(path: Path, problems: list[str], *, issuer: x509.Certificate | None = None,
                 name: str | None = None, key: Path | None = None) -> str:
    """One line on the certificate at ``path`` (and its private key ``key``); its contradictions in ``problems``."""
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as err:
        problems.append(f"{path}: not a readable PEM certificate ({err})")
        return f"{path}: unreadable"
    now = datetime.datetime.now(datetime.UTC)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    valid = start <= now <= end
    if now < start:
        problems.append(f"{path}: not yet valid (valid from {start:%Y-%m-%d %H:%M} UTC to {end:%Y-%m-%d}): check "
                        "this host's clock, or issue a certificate valid now")
    elif now > end:
        problems.append(f"{path}: expired on {end:%Y-%m-%d} (valid from {start:%Y-%m-%d}): issue a new one from "
                        "the CA")
    if key is not None:
        spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        try:
            private = serialization.load_pem_private_key(key.read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as err:
            problems.append(f"{key}: not a readable unencrypted PEM private key ({err})")
        else:
            if private.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
                problems.append(f"{key}: not the private key of {path} (its public key is not the certificate's): "
                                "put the certificate's own key there, or reissue the certificate for this key")
    subject = cert.subject.rfc4514_string()
    if name is not None and subject != f"CN={name}":
        problems.append(f"{path}: its subject is {subject}, but MPyC expects CN={name} for this party")
    if issuer is not None:
        try:
            cert.verify_directly_issued_by(issuer)
        except (ValueError, TypeError, InvalidSignature):
            problems.append(f"{path}: not signed by the committee's CA (mpyc_ca.crt)")
    return (f"{subject}, issued by {cert.issuer.rfc4514_string()}, until {cert.not_valid_after_utc:%Y-%m-%d} "
            f"({'valid' if valid else 'NOT VALID NOW'})")


def _invalid_keys(config: Mapping[str, Any], whole: Exception) -> list[str]:
    """Each invalid or unknown key of a voter's policy on its own line (``whole``: the policy's first error)."""
    found = []
    unknown = [str(k) for k in config if str(k).startswith("dphype-") and k not in POLICY_KEYS]
    if unknown:
        found.append(f"unknown node config key(s) {', '.join(unknown)} (known: {', '.join(POLICY_KEYS)}): correct "
                     "the misspelt key or remove it")
    for key, value in config.items():
        if key in (*POLICY_KEYS, "partition-id") and key not in (ROSTER_KEY, IDENTITY_KEY, UNAUTHENTICATED_KEY):
            try:
                NodePolicy.from_node_config({key: value})  # each key alone, as the node reads it
            except ValueError as err:
                default = f" for its default ({POLICY_KEYS[key][0]})" if key in POLICY_KEYS else ""
                found.append(f"{err}: set an allowed value, or remove {key}{default}")
    try:
        federation_settings(config)
    except ValueError as err:
        found.append(str(err))
    return found or [str(whole)]


def _check_role(report: dict[str, Any], problems: list[str], membership: Membership, role: str) -> bool:
    """Report the roster and this node's place in it; a problem unless its identity holds ``role``; whether it does."""
    report["federation"] = (f"roster {membership.roster.fingerprint} ({len(membership.roster.members)} "
                            f"members), this node: {membership.name} ({membership.member.role})")
    try:
        membership.roster.member(membership.name, role)
    except RosterError as err:
        problems.append(f"dphype-identity: {err}: this node is a {role}; use its own identity key, or add it with "
                        f"`dphype roster add ROSTER --role {role}`")
        return False
    return True


def _voter(config: Mapping[str, Any], report: dict[str, Any], problems: list[str]) -> None:
    try:
        policy = NodePolicy.from_node_config(config)
    except ValueError as err:
        problems.extend(_invalid_keys(config, err))
        return
    report["policy"] = " ".join(f"{k}={v}" for k, v in policy.to_dict().items() if k != "dphype-ledger")
    if "partition-id" in config or "num-partitions" in config:  # the bundled app's data shard
        # lazy import: Flower
        from dphype.flower.local import check_partition

        try:
            check_partition(config.get("partition-id"), config.get("num-partitions"))
        except ValueError as err:
            problems.append(f"{err}: give this node's shard, as clients/start-voter.sh does")
    try:
        membership = policy.membership()
        tallies = policy.known_tallies()
    except (Refusal, ValueError) as err:
        problems.append(getattr(err, "detail", None) or str(err))
        return
    if membership is None:
        report["federation"] = "unauthenticated (dphype-allow-unauthenticated = true: a server can invent members)"
    else:
        _check_role(report, problems, membership, "voter")
        if policy.tallies is not None:  # the pinned keys alone, then those the roster does not list
            listed = membership.roster.tally_keys()
            stray = [k for k in replace(policy, roster=None, identity=None).known_tallies() or () if k not in listed]
            if stray:
                problems.append(f"dphype-tallies pins {len(stray)} key(s) that are not tallies of the roster "
                                f"{membership.roster.fingerprint} ({', '.join(k.hex()[:16] + '...' for k in stray)}):"
                                " this node would drop them from its committee; pin the roster's tally keys, or "
                                "remove dphype-tallies (the roster's tallies are then the committee)")
    if tallies is None:
        report["tallies"] = "none pinned: this node refuses every committee vote (sum release only)"
    else:
        report["tallies"] = f"{len(tallies)}: " + ", ".join(key.hex()[:16] for key in tallies)
        if len(set(tallies)) < MIN_TALLIES:
            problems.append(f"{len(set(tallies))} tallies are trusted (dphype-tallies within the roster's "
                            f"tallies), fewer than the {MIN_TALLIES} of a committee: every committee vote would be "
                            "refused; pin keys of the roster's tallies")
    if policy.ledger is None:
        problems.append("no ledger: set partition-id or dphype-ledger")
        return
    ledger = Ledger(policy.ledger)
    try:
        entries = ledger.entries()
    except LedgerError as err:
        problems.append(f"dphype-ledger: {err}: repair it, or archive it (dphype ledger --archive --path "
                        f"{ledger.path}; its votes still count)")
        return
    spent = Ledger.composed_epsilon(entries, policy.max_delta, policy.neighbouring)
    remaining = policy.lifetime_epsilon - spent
    report["ledger"] = (f"{policy.ledger}: {len(entries)} votes, epsilon {spent:.4g} spent of "
                        f"{policy.lifetime_epsilon:g} at delta {policy.max_delta:g}, {max(remaining, 0.0):.4g} left")
    if remaining <= 0:
        problems.append(f"the lifetime budget is spent ({spent:.4g} >= dphype-lifetime-epsilon="
                        f"{policy.lifetime_epsilon:g}): every vote would be refused")


def _in_use(port: int) -> bool:
    """Whether something accepts connections on ``port`` of this host's loopback (a party could not listen there)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _tally(config: Mapping[str, Any], report: dict[str, Any], problems: list[str]) -> None:
    # lazy import: Flower
    from dphype.flower.tally_node import (
        TALLY_ID,
        TALLY_KEY_FILE,
        TALLY_PARTIES,
        TALLY_TLS,
        load_tally_key,
        mpyc_tls_folder,
    )

    index = config.get(TALLY_ID)
    parties = [a.strip() for a in str(config.get(TALLY_PARTIES, "")).split(",") if a.strip()]
    if not isinstance(index, int) or not 0 <= index < len(parties):
        problems.append(f"{TALLY_ID}={index!r} must be an index into {TALLY_PARTIES} ({len(parties)} parties)")
        return
    report["committee"] = f"tally {index} of {len(parties)}: " + ", ".join(parties)
    port = parties[index].rpartition(":")[2]
    if port.isdigit() and _in_use(int(port)):
        problems.append(f"{TALLY_PARTIES}: this tally's MPyC port {port} is in use on this host: free it, or give "
                        "the party another port in every tally's list")
    key_file = Path(str(config.get(TALLY_KEY_FILE, ""))).expanduser()
    if not key_file.is_file():
        problems.append(f"no tally key {key_file}: make it with clients/start-tally.sh --print-public-key (and have "
                        "its public key added to the roster)")
        return
    try:
        key = load_tally_key(key_file)
        membership = load_membership(*federation_settings(config))
    except (Refusal, ValueError) as err:
        problems.append(getattr(err, "detail", None) or str(err))
        return
    report["tally key"] = f"{config[TALLY_KEY_FILE]}: public {key.public.hex()}"
    if membership is None:
        report["federation"] = "unauthenticated (dphype-allow-unauthenticated = true)"
    else:
        if _check_role(report, problems, membership, "tally") and membership.member.tally_key != key.public:
            problems.append("the roster lists this tally with another key than its key file's")
        listed = membership.roster.tally_keys()
        if len(listed) != len(parties):
            problems.append(f"{TALLY_PARTIES} names {len(parties)} parties, but the roster lists {len(listed)} "
                            f"tallies: every tally's {TALLY_PARTIES} names the roster's tallies, in committee order")
    folder = config.get(TALLY_TLS)
    if folder is None:
        report["mpyc"] = "plain TCP between the tallies (no dphype-tally-tls): a private network only"
        return
    try:
        files = cast(Path, mpyc_tls_folder(folder, index)) / ".config"  # a Path: folder is set
    except ValueError as err:
        problems.append(str(err))
        return
    try:
        ca = x509.load_pem_x509_certificate((files / "mpyc_ca.crt").read_bytes())
    except (OSError, ValueError) as err:
        problems.append(f"{files / 'mpyc_ca.crt'}: not a readable CA certificate ({err})")
        return
    line = _certificate(files / f"party_{index}.crt", problems, issuer=ca, name=MPYC_NAME.format(index),
                        key=files / f"party_{index}.key")
    report["mpyc"] = f"TLS (MPyC --ssl) in {folder}: {line}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Check the node's configuration and return what it would enforce.

    Args:
        args: The parsed options.

    Returns:
        Topic -> one line (policy, federation, tallies, ledger or committee, certificates), ``ok`` and the empty
        ``problems``.

    Raises:
        ValueError: If the node config cannot be parsed or the configuration is contradictory (every problem
            named; the report, with ``--json`` as JSON, is printed first).
    """
    config = parse_node_config(args.node_config)
    report: dict[str, Any] = {"role": args.role}
    problems: list[str] = []
    if args.root_certificates is None:
        report["transport"] = "--insecure: no TLS, no SuperNode authentication (a loopback demo only)"
        if args.node_key is not None:
            problems.append(f"--node-key {args.node_key}: SuperNode authentication runs only over TLS: add "
                            "--root-certificates CA.pem (the SuperLink's CA), or drop --node-key")
    else:
        report["transport"] = f"TLS, SuperLink verified with {args.root_certificates}: " + _certificate(
            args.root_certificates, problems)
        if args.node_key is None or not args.node_key.is_file():
            problems.append(f"no SuperNode authentication key {args.node_key}: make it with --print-node-key and "
                            "have the SuperLink's operator register KEY.pub")
        else:
            _node_key(args.node_key, problems)
            report["node key"] = f"{args.node_key} (register {args.node_key}.pub with the SuperLink)"
    (_voter if args.role == "voter" else _tally)(config, report, problems)
    if problems:
        if args.json:

            print(json.dumps(jsonable({**report, "ok": False, "problems": problems}), allow_nan=False))
        else:
            print(render(report))
        raise ValueError(f"{len(problems)} contradiction(s), the node would not start: " + "; ".join(problems))
    return {**report, "ok": True, "problems": []}


def _node_key(path: Path, problems: list[str]) -> None:
    """Whether ``path`` reads as an unencrypted private key (OpenSSH or PEM), as flower-supernode loads it."""
    try:
        data = path.read_bytes()
        if b"OPENSSH PRIVATE KEY" in data:
            serialization.load_ssh_private_key(data, password=None)
        else:
            serialization.load_pem_private_key(data, password=None)
    except (OSError, ValueError, TypeError) as err:
        problems.append(f"--node-key {path}: not readable as an unencrypted private key ({err}): name this node's "
                        "authentication key (--print-node-key makes one)")


def render(report: Mapping[str, Any]) -> str:
    """The report, one ``topic: line`` per line (without ``ok`` and ``problems``)."""
    return "\n".join(f"{topic}: {line}" for topic, line in report.items() if topic not in ("ok", "problems"))
