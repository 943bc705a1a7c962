"""``dphype roster``: keygen, init, add, show and check, and bad input named with its fix (exit status 2)."""

from __future__ import annotations

import json

import pytest

from dphype import cli
from dphype.flower.tally_node import load_tally_key
from dphype.secure.roster import Roster


def run(capsys, *argv: str) -> tuple[int, dict | str, str]:
    code = cli.main(["roster", *argv])
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    return code, (json.loads(lines[-1]) if "--json" in argv and code == 0 else out), err


def test_a_federation_is_made_with_keygen_init_add_and_show(tmp_path, capsys):
    roster = tmp_path / "roster.json"
    code, key, _ = run(capsys, "keygen", "--name", "alice", "--out", str(tmp_path / "alice.key"), "--json")
    assert code == 0 and (tmp_path / "alice.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "alice.key.pub").read_text() == key["identity"] + "\n"
    assert key["add"] == [f"dphype roster add ROSTER --name alice --role {role} --identity {key['identity']}" + tail
                          for role, tail in (("voter", ""), ("tally", ' --tally-key "$(clients/start-tally.sh '
                                                              '--print-public-key --tally-id J)"'))]
    assert run(capsys, "init", "--federation", "acme", "--out", str(roster))[0] == 0
    assert run(capsys, "add", str(roster), "--name", "alice", "--role", "voter", "--identity", key["identity"])[0] == 0
    tally_key = load_tally_key(tmp_path / "tally-0.key").public.hex()
    code, tally, _ = run(capsys, "keygen", "--name", "t0", "--role", "tally", "--out", str(tmp_path / "t0.key"),
                         "--json")
    assert [command.split(" --identity")[0] for command in tally["add"]] == [
        "dphype roster add ROSTER --name t0 --role tally"]  # the command printed for a tally is a tally's
    assert run(capsys, "add", str(roster), "--name", "t0", "--role", "tally", "--identity", tally["identity"],
               "--tally-key", tally_key)[0] == 0
    code, shown, _ = run(capsys, "show", str(roster), "--json")
    loaded = Roster.load(roster)
    assert code == 0 and shown["digest"] == loaded.digest() and shown["fingerprint"] == loaded.fingerprint
    assert [(m["name"], m["role"]) for m in shown["members"]] == [("alice", "voter"), ("t0", "tally")]
    code, text, _ = run(capsys, "show", str(roster))
    assert f"fingerprint {loaded.fingerprint}" in text and "2 members" in text
    code, found, _ = run(capsys, "check", str(roster), "--identity", str(tmp_path / "alice.key"), "--json")
    assert code == 0 and found == {"member": "alice", "role": "voter", "federation": "acme",
                                   "fingerprint": loaded.fingerprint}


def test_keygen_writes_outside_the_checkout_by_default_and_suggests_the_roles_command(tmp_path, capsys,
                                                                                        monkeypatch):
    """Without --out the key goes to $FLWR_HOME/dphype/NAME.id (mode 0600), not the current folder; the printed
    command for --role tally names the role and the tally's committee key, and works once ROSTER and J are filled."""
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))
    monkeypatch.chdir(tmp_path)
    code, text, _ = run(capsys, "keygen", "--name", "tally-0", "--role", "tally")
    key = tmp_path / "flwr" / "dphype" / "tally-0.id"
    assert code == 0 and key.stat().st_mode & 0o777 == 0o600 and sorted(p.name for p in tmp_path.iterdir()) == ["flwr"]
    (command,) = [line.strip() for line in text.splitlines() if line.strip().startswith("dphype roster add")]
    assert "--role tally" in command and "--role voter" not in command
    roster = tmp_path / "roster.json"
    run(capsys, "init", "--federation", "acme", "--out", str(roster))
    tally_key = load_tally_key(tmp_path / "tally-0.key").public.hex()
    argv = command.replace("ROSTER", str(roster)).split()[2:]
    argv[argv.index("--tally-key") + 1:] = [tally_key]
    assert run(capsys, *argv)[0] == 0 and Roster.load(roster).members[0].role == "tally"


def test_a_key_that_is_not_a_member_fails_the_check(tmp_path, capsys):
    roster = tmp_path / "roster.json"
    run(capsys, "init", "--federation", "acme", "--out", str(roster))
    run(capsys, "keygen", "--name", "bob", "--out", str(tmp_path / "bob.key"))
    code, _, err = run(capsys, "check", str(roster), "--identity", str(tmp_path / "bob.key"))
    assert code == 2 and "is not a member of roster acme" in err and "dphype roster add" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["add", "ROSTER", "--name", "x", "--role", "admin", "--identity", "KEY"], "--role must be voter or tally"),
    (["add", "ROSTER", "--name", "x", "--role", "tally", "--identity", "KEY"],
     "--tally-key is needed with --role tally"),
    (["add", "ROSTER", "--name", "x", "--role", "voter", "--identity", "abc"],
     "--identity must be a 32-byte public key"),
    (["add", "ROSTER", "--name", "a b", "--role", "voter", "--identity", "KEY"], "--name must be 1-64 letters"),
    (["add", "ROSTER", "--name", "alice", "--role", "voter", "--identity", "KEY"], "same name twice"),
    (["add", "ROSTER", "--name", "alice2", "--role", "voter", "--identity", "KEY"], "same identity key twice"),
    (["init", "--federation", "acme", "--out", "ROSTER"], "exists; a roster is never overwritten"),
    (["init", "--federation", "my federation", "--out", "NEW"], "--federation must be 1-64 letters"),
    (["keygen", "--name", "alice", "--out", "KEYFILE"], "exists; a key is never overwritten"),
    (["show", "MISSING"], "cannot be read"),
])
def test_bad_input_exits_2_naming_the_option_and_the_fix(tmp_path, capsys, argv, message):
    roster, keyfile = tmp_path / "roster.json", tmp_path / "alice.key"
    run(capsys, "init", "--federation", "acme", "--out", str(roster))
    _, key, _ = run(capsys, "keygen", "--name", "alice", "--out", str(keyfile), "--json")
    run(capsys, "add", str(roster), "--name", "alice", "--role", "voter", "--identity", key["identity"])
    before = roster.read_text()
    names = {"ROSTER": str(roster), "KEY": key["identity"], "KEYFILE": str(keyfile), "NEW": str(tmp_path / "n.json"),
             "MISSING": str(tmp_path / "missing.json")}
    code, _, err = run(capsys, *[names.get(a, a) for a in argv])
    assert code == 2 and message in err and "Traceback" not in err
    assert roster.read_text() == before  # nothing written
