"""``dphype doctor``: a node's configuration printed and checked before it joins."""

from __future__ import annotations

import shutil

import pytest

from dphype.cli import main
from dphype.cli.doctor import parse_node_config
from dphype.flower.tally import load_tally_key
from dphype.node.pki import issue_mpyc_party, make_ca, make_node_key

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
    assert "none pinned: this node refuses every argmax vote" in out
    assert f"{tmp_path}/dphype/ledger-partition-0.json: 0 votes, epsilon 0 spent of 4 at delta 1e-05, 4 left" in out


def test_contradictions_are_all_named_and_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    ca = make_ca(tmp_path / "pki", "t")
    one_tally = "ab" * 32
    code, out, err = doctor(capsys, "--role", "voter", "--node-config",
                            f'{UNAUTHENTICATED} dphype-tallies="{one_tally}"',
                            "--root-certificates", str(ca.cert), "--node-key", str(tmp_path / "missing.key"))
    assert code == 2 and "tallies: 1: abababababababab" in out  # the report, then every problem
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
    code, _, err = doctor(capsys, "--role", "tally", "--node-config", f'{base} dphype-tally-tls="{wrong.parent}"')
    assert code == 2 and "MPyC expects CN=MPyC party 1" in err
    # a certificate of another CA than the committee's
    other = make_ca(tmp_path / "other", "other")
    (tmp_path / "tally-1/.config/mpyc_ca.crt").write_bytes(other.cert.read_bytes())
    code, _, err = doctor(capsys, "--role", "tally", "--node-config", f'{base} dphype-tally-tls="{tmp_path}/tally-1"')
    assert code == 2 and "not signed by the committee's CA" in err
