"""``dphype doctor``: what a SuperNode of the bundled app would enforce, checked before it joins.

Given the node config its start script builds (``clients/start-voter.sh ... --doctor`` passes it, with its TLS
files), it prints the node's policy, its roster's fingerprint and its own membership, the tallies it seals
shares to, its certificates and their validity, its ledger and remaining lifetime budget (a voter), or its
committee, key and MPyC TLS files (a tally), and exits with status 2, naming every contradiction, when the
configuration cannot work: an invalid policy or roster, pinned tallies outside the roster or fewer than 3, a
spent lifetime budget, a certificate that is not valid now or not signed by the CA, a tally certificate for
another party, a missing node key.
"""

from __future__ import annotations

import argparse
import datetime
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature

#: One ``key=value`` pair (a TOML string value in quotes may hold spaces), or a word that is not one.
_PAIR = re.compile(r"""(?P<key>[^\s=]+)=(?P<value>"(?:[^"\\]|\\.)*"|'[^']*'|\S+)|(?P<junk>\S+)""")
#: The fewest distinct tallies a voter seals shares to (`dphype.secure.tally.check_committee`).
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
        ValueError: If a pair has no ``=`` or its value is not a TOML value.
    """
    out: dict[str, Any] = {}
    for pair in _PAIR.finditer(text):
        key, value, junk = pair.group("key"), pair.group("value"), pair.group("junk")
        if junk is not None:
            raise ValueError(f"--node-config: {junk!r} is not key=value")
        try:
            out[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"--node-config: {key}'s value {value!r} is not a TOML value ({err})") from None
    return out


def _certificate(path: Path, problems: list[str], *, issuer: x509.Certificate | None = None,
                 name: str | None = None) -> str:
    """One line on the certificate at ``path``; its contradictions appended to ``problems``."""
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as err:
        problems.append(f"{path}: not a readable PEM certificate ({err})")
        return f"{path}: unreadable"
    now = datetime.datetime.now(datetime.UTC)
    valid = cert.not_valid_before_utc <= now <= cert.not_valid_after_utc
    if not valid:
        problems.append(f"{path}: not valid now (valid {cert.not_valid_before_utc:%Y-%m-%d} to "
                        f"{cert.not_valid_after_utc:%Y-%m-%d}): renew it")
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


def _voter(config: Mapping[str, Any], report: dict[str, Any], problems: list[str]) -> None:
    from dphype.node.ledger import Ledger
    from dphype.node.policy import NodePolicy
    from dphype.refusal import Refusal

    try:
        policy = NodePolicy.from_node_config(config)
    except ValueError as err:
        problems.append(str(err))
        return
    report["policy"] = " ".join(f"{k}={v}" for k, v in policy.to_dict().items() if k != "dphype-ledger")
    try:
        membership = policy.membership()
        tallies = policy.known_tallies()
    except (Refusal, ValueError) as err:
        problems.append(getattr(err, "detail", None) or str(err))
        return
    if membership is None:
        report["federation"] = "unauthenticated (dphype-allow-unauthenticated = true: a server can invent members)"
    else:
        report["federation"] = (f"roster {membership.roster.fingerprint} ({len(membership.roster.members)} "
                                f"members), this node: {membership.name} ({membership.member.role})")
    if tallies is None:
        report["tallies"] = "none pinned: this node refuses every argmax vote (sum release only)"
    else:
        report["tallies"] = f"{len(tallies)}: " + ", ".join(key.hex()[:16] for key in tallies)
        if len(set(tallies)) < MIN_TALLIES:
            problems.append(f"{len(set(tallies))} tallies are trusted (dphype-tallies within the roster's "
                            f"tallies), fewer than the {MIN_TALLIES} of a committee: every argmax vote would be "
                            "refused; pin keys of the roster's tallies")
    if policy.ledger is None:
        problems.append("no ledger: set partition-id or dphype-ledger")
        return
    ledger = Ledger(policy.ledger)
    spent = ledger.spent(policy.max_delta, policy.neighbouring)
    remaining = policy.lifetime_epsilon - spent
    report["ledger"] = (f"{policy.ledger}: {len(ledger.entries())} votes, epsilon {spent:.4g} spent of "
                        f"{policy.lifetime_epsilon:g} at delta {policy.max_delta:g}, {max(remaining, 0.0):.4g} left")
    if remaining <= 0:
        problems.append(f"the lifetime budget is spent ({spent:.4g} >= dphype-lifetime-epsilon="
                        f"{policy.lifetime_epsilon:g}): every vote would be refused")


def _tally(config: Mapping[str, Any], report: dict[str, Any], problems: list[str]) -> None:
    from dphype.flower.tally import TALLY_ID, TALLY_KEY_FILE, TALLY_PARTIES, TALLY_TLS, load_tally_key
    from dphype.node.pki import MPYC_NAME
    from dphype.node.policy import federation_settings, load_membership
    from dphype.refusal import Refusal

    index = config.get(TALLY_ID)
    parties = [a.strip() for a in str(config.get(TALLY_PARTIES, "")).split(",") if a.strip()]
    if not isinstance(index, int) or not 0 <= index < len(parties):
        problems.append(f"{TALLY_ID}={index!r} must be an index into {TALLY_PARTIES} ({len(parties)} parties)")
        return
    report["committee"] = f"tally {index} of {len(parties)}: " + ", ".join(parties)
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
        report["federation"] = (f"roster {membership.roster.fingerprint} ({len(membership.roster.members)} "
                                f"members), this node: {membership.name} ({membership.member.role})")
        if membership.member.tally_key != key.public:
            problems.append("the roster lists this tally with another key than its key file's")
    folder = config.get(TALLY_TLS)
    if folder is None:
        report["mpyc"] = "plain TCP between the tallies (no dphype-tally-tls): a private network only"
        return
    files = Path(str(folder)) / ".config"
    try:
        ca = x509.load_pem_x509_certificate((files / "mpyc_ca.crt").read_bytes())
    except (OSError, ValueError) as err:
        problems.append(f"{files / 'mpyc_ca.crt'}: not a readable CA certificate ({err})")
        return
    line = _certificate(files / f"party_{index}.crt", problems, issuer=ca, name=MPYC_NAME.format(index))
    report["mpyc"] = f"TLS (MPyC --ssl) in {folder}: {line}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Check the node's configuration and return what it would enforce.

    Args:
        args: The parsed options.

    Returns:
        Topic -> one line (policy, federation, tallies, ledger or committee, certificates).

    Raises:
        ValueError: If the node config cannot be parsed or the configuration is contradictory (every problem
            named; the report is printed first).
    """
    config = parse_node_config(args.node_config)
    report: dict[str, Any] = {"role": args.role}
    problems: list[str] = []
    if args.root_certificates is None:
        report["transport"] = "--insecure: no TLS, no SuperNode authentication (a loopback demo only)"
    else:
        report["transport"] = f"TLS, SuperLink verified with {args.root_certificates}: " + _certificate(
            args.root_certificates, problems)
        if args.node_key is None or not args.node_key.is_file():
            problems.append(f"no SuperNode authentication key {args.node_key}: make it with --print-node-key and "
                            "have the SuperLink's operator register KEY.pub")
        else:
            report["node key"] = f"{args.node_key} (register {args.node_key}.pub with the SuperLink)"
    (_voter if args.role == "voter" else _tally)(config, report, problems)
    if problems:
        print(render(report))
        raise ValueError(f"{len(problems)} contradiction(s), the node would not start: " + "; ".join(problems))
    return report


def render(report: Mapping[str, Any]) -> str:
    """The report, one ``topic: line`` per line.

    Args:
        report: What `run` returned.

    Returns:
        The text.
    """
    return "\n".join(f"{topic}: {line}" for topic, line in report.items())
