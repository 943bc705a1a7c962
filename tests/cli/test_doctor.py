"""``dphype doctor``: a node's configuration printed and checked before it joins."""

from __future__ import annotations

import json
import shutil
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dphype.cli import main
from dphype.cli.doctor import parse_node_config
from dphype.flower.tally_node import load_tally_key
from dphype.node.ledger import Ledger
from dphype.node.pki import issue_mpyc_party, make_ca, make_node_key
from dphype.node.policy import NodePolicy, VoteGuarantee
from dphype.secure.roster import IdentityKey, Member, Roster

UNAUTHENTICATED = "partition-id=0 num-partitions=3 dphype-allow-unauthenticated=true dphype-min-clients=3"


def doctor(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["doctor", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_node_config_syntax_round_trips():
    assert parse_node_config('a=1 b="x y" c=true d=0.5') == {"a": 1, "b": "x y", "c": True, "d": 0.5}
    with pytest.raises(ValueError, match="not key=value"):
        parse_node_config("lonely")
    with pytest.raises(ValueError, match="not a TOML value"):
        parse_node_config("a=not-toml")


def test_a_voter_prints_its_policy_federation_and_ledger(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    code, out, _ = doctor(capsys, "--role", "voter", "--node-config", UNAUTHENTICATED)
    assert code == 0
    assert "--insecure: no TLS, no SuperNode authentication (a loopback demo only)" in out
    assert "dphype-min-clients=3" in out and "federation: unauthenticated" in out
    assert "none pinned: this node refuses every committee vote" in out
    assert f"{tmp_path}/dphype/ledger-partition-0.json: 0 votes, epsilon 0 spent of 4 at delta 1e-05, 4 left" in out


def test_contradictions_are_all_named_and_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    ca = make_ca(tmp_path / "pki", "t")
    one_tally = "ab" * 32
    code, out, err = doctor(capsys, "--role", "voter", "--node-config",
                            f'{UNAUTHENTICATED} dphype-tallies="{one_tally}"',
                            "--root-certificates", str(ca.cert), "--node-key", str(tmp_path / "missing.key"))
    assert code == 2 and "tallies: 1: abababababababab" in out  # the report, then every problem
    assert not (tmp_path / "dphype").exists()  # it only looked: no ledger folder, no lock file left behind
    assert "2 contradiction(s)" in err and "no SuperNode authentication key" in err
    assert "fewer than the 3 of a committee" in err
    make_node_key(tmp_path / "node.key")
    code, out, err = doctor(capsys, "--role", "voter", "--node-config", UNAUTHENTICATED,
                            "--root-certificates", str(ca.cert), "--node-key", str(tmp_path / "node.key"))
    assert code == 0 and "TLS, SuperLink verified with" in out and "(valid)" in out


def test_a_tally_checks_its_mpyc_certificate(tmp_path, capsys):
    ca = make_ca(tmp_path / "pki", "t")
    for j in range(2):
        issue_mpyc_party(ca, tmp_path / f"tally-{j}", j)
    base = (f'dphype-tally-id=1 dphype-tally-parties="h:1,h:2,h:3" dphype-tally-key="{tmp_path}/t1.key" '
            "dphype-allow-unauthenticated=true")
    code, _, err = doctor(capsys, "--role", "tally", "--node-config", base)
    assert code == 2 and "no tally key" in err and not (tmp_path / "t1.key").exists()  # the doctor makes no key
    load_tally_key(tmp_path / "t1.key")
    base = (f'dphype-tally-id=1 dphype-tally-parties="h:1,h:2,h:3" dphype-tally-key="{tmp_path}/t1.key" '
            "dphype-allow-unauthenticated=true")
    code, out, _ = doctor(capsys, "--role", "tally", "--node-config", f'{base} dphype-tally-tls="{tmp_path}/tally-1"')
    assert code == 0 and "mpyc: TLS (MPyC --ssl)" in out and "CN=MPyC party 1" in out
    assert "committee: tally 1 of 3" in out
    code, out, _ = doctor(capsys, "--role", "tally", "--node-config", base)
    assert code == 0 and "plain TCP between the tallies" in out
    # party 0's certificate in party 1's place: another party's name
    wrong = tmp_path / "wrong/.config"
    shutil.copytree(tmp_path / "tally-0/.config", wrong)
    (wrong / "party_0.crt").rename(wrong / "party_1.crt")
    (wrong / "party_0.key").rename(wrong / "party_1.key")
    code, _, err = doctor(capsys, "--role", "tally", "--node-config", f'{base} dphype-tally-tls="{wrong.parent}"')
    assert code == 2 and "MPyC expects CN=MPyC party 1" in err
    # a certificate of another CA than the committee's
    other = make_ca(tmp_path / "other", "other")
    (tmp_path / "tally-1/.config/mpyc_ca.crt").write_bytes(other.cert.read_bytes())
    code, _, err = doctor(capsys, "--role", "tally", "--node-config", f'{base} dphype-tally-tls="{tmp_path}/tally-1"')
    assert code == 2 and "not signed by the committee's CA" in err


# ------------------------------------------------------------------------------- a federation with a roster
@pytest.fixture
def fed(tmp_path, monkeypatch):
    """2 voters and 3 tallies in a roster in ``tmp_path``, their identity and tally keys, a private FLWR_HOME."""
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    members = []
    for i in range(2):
        key = IdentityKey.generate()
        key.save(tmp_path / f"voter-{i}.id")
        members.append(Member(f"voter-{i}", "voter", key.public))
    tally_keys = []
    for j in range(3):
        key = IdentityKey.generate()
        key.save(tmp_path / f"tally-{j}.id")
        tally_keys.append(load_tally_key(tmp_path / f"tally-{j}.key").public)
        members.append(Member(f"tally-{j}", "tally", key.public, tally_keys[-1]))
    IdentityKey.generate().save(tmp_path / "stranger.id")
    roster = Roster("acme", tuple(members))
    roster.save(tmp_path / "roster.json")
    return {"dir": tmp_path, "roster": roster, "tally_keys": tally_keys}


def voter(fed, identity: str = "voter-0.id", extra: str = "") -> list[str]:
    d = fed["dir"]
    return ["--role", "voter", "--node-config", f"partition-id=0 num-partitions=3 dphype-min-clients=3 "
            f"dphype-roster='{d / 'roster.json'}' dphype-identity='{d / identity}' {extra}".strip()]


def tally(fed, j: int = 1, identity: str | None = None, key: str | None = None, parties: int = 3,
          extra: str = "") -> list[str]:
    d = fed["dir"]
    addresses = ",".join(f"127.0.0.1:{7000 + p}" for p in range(parties))
    return ["--role", "tally", "--node-config", f"dphype-tally-id={j} dphype-tally-parties='{addresses}' "
            f"dphype-tally-key='{d / (key or f'tally-{j}.key')}' dphype-roster='{d / 'roster.json'}' "
            f"dphype-identity='{d / (identity or f'tally-{j}.id')}' {extra}".strip()]


def refused(capsys, *argv: str) -> list[str]:
    """The problems of a refused configuration (exit status 2), one string each, from its ``--json`` report."""
    code, out, err = doctor(capsys, *argv, "--json")
    assert code == 2, (out, err)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["ok"] is False and report["problems"]
    assert f"{len(report['problems'])} contradiction(s), the node would not start" in err
    return report["problems"]


def test_a_voter_and_a_tally_of_a_roster_pass_and_report_json(fed, capsys):
    code, out, err = doctor(capsys, *voter(fed), "--json")
    report = json.loads(out.strip().splitlines()[-1])
    assert code == 0, err
    assert report["ok"] is True and report["problems"] == []
    assert f"roster {fed['roster'].fingerprint} (5 members), this node: voter-0 (voter)" == report["federation"]
    assert report["tallies"].startswith("3: ")
    code, out, err = doctor(capsys, *tally(fed))
    assert code == 0, err
    assert "this node: tally-1 (tally)" in out and "ok:" not in out and "problems:" not in out


@pytest.mark.parametrize(("argv", "expected"), [
    (lambda f: voter(f, identity="stranger.id"), ["node config dphype-roster="]),
    (lambda f: voter(f, identity="tally-0.id"),
     ["dphype-identity: member tally-0 of roster acme is a tally, not a voter: this node is a voter"]),
    (lambda f: tally(f, identity="voter-1.id"),
     ["dphype-identity: member voter-1 of roster acme is a voter, not a tally: this node is a tally"]),
    (lambda f: tally(f, j=1, identity="tally-2.id"), ["the roster lists this tally with another key"]),
    (lambda f: tally(f, j=3, key="tally-1.key"), ["dphype-tally-id=3 must be an index into dphype-tally-parties"]),
    (lambda f: tally(f, parties=4), ["dphype-tally-parties names 4 parties, but the roster lists 3 tallies"]),
    (lambda f: ["--role", "voter", "--node-config", "partition-id=0 num-partitions=3"],
     ["this node takes part only in a federation of known members"]),
    (lambda f: ["--role", "tally", "--node-config", f"dphype-tally-id=0 dphype-tally-parties='h:1,h:2,h:3' "
                f"dphype-tally-key='{f['dir'] / 'tally-0.key'}'"],
     ["this node takes part only in a federation of known members"]),
    (lambda f: voter(f, extra="dphype-max-delta=2 dphype-accountant='exact' dphype-max-epsilom=2"),
     ["unknown node config key(s) dphype-max-epsilom (known: dphype-max-epsilon, ",
      "node config dphype-max-delta must be a number in (0, 1), got 2: set an allowed value, or remove "
      "dphype-max-delta for its default (1e-05)",
      "node config dphype-accountant must be one of auto, rdp, got 'exact': set an allowed value"]),
    (lambda f: ["--role", "voter", "--node-config",
                "partition-id=-1 dphype-allow-unauthenticated='maybe'"],
     ["node config partition-id must be an integer >= 0, got -1: set an allowed value, or remove partition-id",
      "node config dphype-allow-unauthenticated must be true or false, got 'maybe'"]),
    (lambda f: [*voter(f), "--node-key", str(f["dir"] / "voter-0.id")],
     ["SuperNode authentication runs only over TLS: add --root-certificates CA.pem"]),
    (lambda f: ["--role", "voter", "--node-config", "partition-id=3 num-partitions=3 "
                "dphype-allow-unauthenticated=true"],
     ["partition-id must be in [0, 2] for num-partitions 3, got 3: give this node's shard"]),
    (lambda f: ["--role", "voter", "--node-config", "partition-id=1 dphype-allow-unauthenticated=true"],
     ["partition-id and num-partitions must be integers, got 1 and None\n(this node's shard of the data and the number "
      "of shards)"]),
], ids=["identity-not-in-roster", "voter-with-a-tally-identity", "tally-with-a-voter-identity",
        "tally-key-not-its-roster-entry", "tally-id-out-of-range", "parties-not-the-roster-tallies",
        "voter-without-roster", "tally-without-roster", "invalid-and-misspelt-keys", "invalid-partition-and-flag",
        "node-key-without-tls", "partition-out-of-range", "partition-without-num-partitions"])
def test_each_contradiction_is_refused_on_its_own(fed, capsys, argv, expected):
    """Each expected problem is one entry of ``problems``, in that order, and there is no other."""
    problems = refused(capsys, *argv(fed))
    assert len(problems) == len(expected), problems
    assert all(part in problem for part, problem in zip(expected, problems, strict=True)), problems


def test_a_tally_whose_mpyc_port_is_in_use_is_refused_before_it_starts(fed, capsys):
    """The party listens on its own entry of the parties list only during a release: an occupied port is named at
    start (by the doctor check its start script runs), not when the first release fails."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = tally(fed)
        argv[3] = argv[3].replace("127.0.0.1:7001", f"127.0.0.1:{port}")
        (problem,) = refused(capsys, *argv)
    assert problem.startswith(f"dphype-tally-parties: this tally's MPyC port {port} is in use on this host")


def test_a_key_set_twice_is_refused(capsys):
    with pytest.raises(ValueError, match="dphype-max-epsilon is set twice"):
        parse_node_config("dphype-max-epsilon=1 dphype-max-epsilon=8")
    code, _, err = doctor(capsys, "--role", "voter", "--node-config", f"{UNAUTHENTICATED} dphype-min-clients=4")
    assert code == 2 and "--node-config: dphype-min-clients is set twice" in err


def test_pinned_tallies_outside_the_roster_are_refused(fed, capsys):
    stray = load_tally_key(fed["dir"] / "other.key").public.hex()
    pinned = ",".join([fed["tally_keys"][0].hex(), fed["tally_keys"][1].hex(), stray])
    problems = refused(capsys, *voter(fed, extra=f"dphype-tallies='{pinned}'"))
    assert problems[0].startswith(f"dphype-tallies pins 1 key(s) that are not tallies of the roster "
                                  f"{fed['roster'].fingerprint} ({stray[:16]}...)")
    assert "2 tallies are trusted" in problems[1] and "fewer than the 3 of a committee" in problems[1]
    pinned = ",".join(k.hex() for k in fed["tally_keys"])
    assert doctor(capsys, *voter(fed, extra=f"dphype-tallies='{pinned}'"))[0] == 0


def spend(path: Path, total_std: float, votes: int) -> Ledger:
    ledger = Ledger(path)
    vote = VoteGuarantee(noise="gaussian", k=5, total_std=total_std, survivors=10, epsilon=1.0, delta=1e-5,
                         neighbouring="replace-one")
    for v in range(votes):
        ledger.spend(vote, NodePolicy(lifetime_epsilon=1e6), f"request-{v}")
    return ledger


def test_an_overspent_or_corrupt_ledger_is_refused(fed, capsys):
    ledger = spend(fed["dir"] / "home" / "dphype" / "ledger-partition-0.json", total_std=3.0, votes=3)
    spent = ledger.spent(1e-5)
    assert spent > 4.0
    (problem,) = refused(capsys, *voter(fed))
    assert problem.startswith(f"the lifetime budget is spent ({spent:.4g} >= dphype-lifetime-epsilon=4)")
    assert doctor(capsys, *voter(fed, extra="dphype-lifetime-epsilon=1000.0"))[0] == 0
    ledger.path.write_text(ledger.path.read_text().replace('"k": 5', '"k": 6'))  # the checksum no longer holds
    (problem,) = refused(capsys, *voter(fed, extra="dphype-lifetime-epsilon=1000.0"))
    assert problem.startswith(f"dphype-ledger: ledger {ledger.path} is corrupt (checksum mismatch)")
    assert "dphype ledger --archive" in problem


# --------------------------------------------------------------------------------------------- certificates
def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def self_signed(path: Path, *, start_days: float, end_days: float) -> str:
    """A CA certificate valid from ``start_days`` to ``end_days`` from now, made with cryptography."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(_name("acme CA")).issuer_name(_name("acme CA"))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now + timedelta(days=start_days)).not_valid_after(now + timedelta(days=end_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


def test_an_expired_or_not_yet_valid_certificate_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    make_node_key(tmp_path / "node.key")
    tls = ["--node-key", str(tmp_path / "node.key"), "--root-certificates"]
    expired = self_signed(tmp_path / "old.pem", start_days=-30, end_days=-1)
    (problem,) = refused(capsys, "--role", "voter", "--node-config", UNAUTHENTICATED, *tls, expired)
    assert problem.startswith(f"{expired}: expired on ") and "issue a new one from the CA" in problem
    early = self_signed(tmp_path / "new.pem", start_days=2, end_days=30)
    (problem,) = refused(capsys, "--role", "voter", "--node-config", UNAUTHENTICATED, *tls, early)
    assert problem.startswith(f"{early}: not yet valid (valid from ") and "check this host's clock" in problem
    valid = self_signed(tmp_path / "ca.pem", start_days=-1, end_days=30)
    assert doctor(capsys, "--role", "voter", "--node-config", UNAUTHENTICATED, *tls, valid)[0] == 0


def test_an_unreadable_node_key_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    ca = make_ca(tmp_path / "pki", "t")
    (problem,) = refused(capsys, "--role", "voter", "--node-config", UNAUTHENTICATED, "--root-certificates",
                         str(ca.cert), "--node-key", str(ca.cert))
    assert problem.startswith(f"--node-key {ca.cert}: not readable as an unencrypted private key")


def test_an_mpyc_key_that_is_not_its_certificates_or_files_without_their_ca_are_refused(fed, capsys):
    ca = make_ca(fed["dir"] / "pki", "t")
    folder = fed["dir"] / "tally-1-tls"
    issue_mpyc_party(ca, folder, 1)
    assert doctor(capsys, *tally(fed, extra=f"dphype-tally-tls='{folder}'"))[0] == 0
    wrong = folder / ".config" / "party_1.key"
    wrong.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (problem,) = refused(capsys, *tally(fed, extra=f"dphype-tally-tls='{folder}'"))
    assert problem.startswith(f"{wrong}: not the private key of {folder / '.config' / 'party_1.crt'}")
    (folder / ".config" / "mpyc_ca.crt").unlink()
    (problem,) = refused(capsys, *tally(fed, extra=f"dphype-tally-tls='{folder}'"))
    assert "missing mpyc_ca.crt" in problem


def test_a_lifetime_budget_spent_exactly_to_its_limit_is_reported_because_its_next_vote_would_be_refused(fed,
                                                                                                       capsys):
    ledger = spend(fed["dir"] / "home" / "dphype" / "ledger-partition-0.json", total_std=3.0, votes=3)
    spent = ledger.spent(1e-5)  # the doctor's own composition at the default delta and relation: exactly equal
    (problem,) = refused(capsys, *voter(fed, extra=f"dphype-lifetime-epsilon={spent!r}"))
    assert problem.startswith(f"the lifetime budget is spent ({spent:.4g} >= dphype-lifetime-epsilon=")
