"""The two sides at the repository root: ``server/`` (the SuperLink operator's) and ``clients/`` (each SuperNode
operator's). Their component modules are the bundled app's objects, ``flwr run .`` packs them, their scripts refuse
bad input with a usage message, and their node-config examples are valid node configs. The scripts' end-to-end use
is ``tests/deployment/test_deployment.py`` and the deployment guide's recipe,
``tests/deployment/test_readme_deployment.py`` (slow)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from helpers import REPO

from dphype.flower.tally_node import TALLY_ID, TALLY_KEY_FILE, TALLY_PARTIES
from dphype.node.policy import POLICY_KEYS, NodePolicy, PolicyError
from dphype.secure.committee import COMMITTEE_SIZE

BIN = Path(sys.executable).parent
SCRIPTS = ["server/start-superlink.sh", "server/connect.sh", "server/run.sh", "clients/start-voter.sh",
           "clients/start-tally.sh"]
EXAMPLES = REPO / "clients" / "examples"


def run_script(script: str, *args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """A script of this checkout, with this environment's programs first on PATH and ``FLWR_HOME`` = ``home``."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(REPO)}
    if home is not None:
        env["FLWR_HOME"] = str(home)
    return subprocess.run([str(REPO / script), *args], capture_output=True, text=True, env=env, timeout=120)


def pyproject() -> dict:
    with open(REPO / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)


def test_the_components_are_the_bundled_apps_objects():
    import clients.client_app
    import dphype.app.client_app
    import dphype.app.server_app
    import server.server_app

    assert server.server_app.app is dphype.app.server_app.app
    assert clients.client_app.app is dphype.app.client_app.app
    assert pyproject()["tool"]["flwr"]["app"]["components"] == {"serverapp": "server.server_app:app",
                                                                "clientapp": "clients.client_app:app"}


def test_flower_accepts_the_components_and_packs_them_without_the_library(tmp_path):
    from flwr.common.config import validate_config

    assert validate_config(pyproject(), check_module=True, project_dir=REPO) == (True, [], [])
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "home")}
    subprocess.run([str(BIN / "flwr"), "build", "--app", str(REPO)], cwd=tmp_path, env=env, check=True,
                   capture_output=True, text=True, timeout=120)
    (fab,) = tmp_path.glob("*.fab")
    names = set(zipfile.ZipFile(fab).namelist())
    assert {"server/server_app.py", "clients/client_app.py", "README.md"} <= names
    # no file of the dphype package (it would shadow the installed one), no scripts or node configs
    assert not any(name.startswith(("dphype/", "results/")) or name.endswith((".sh", "node_config.py"))
                   for name in names), names


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_script_prints_its_usage_and_exits_non_zero_without_arguments(script):
    done = run_script(script)
    assert done.returncode == 2 and done.stdout == ""
    assert "missing arguments" in done.stderr and f"Usage: {script}" in done.stderr
    helped = run_script(script, "--help")
    assert helped.returncode == 0 and f"Usage: {script}" in helped.stdout


@pytest.mark.parametrize("script, args, message", [
    ("server/start-superlink.sh", ["--port", "9092"], "choose --insecure or all three of --ssl-ca-certfile"),
    ("server/start-superlink.sh", ["--insecure", "--port", "39091"], "`flwr run .`'s local SuperLink"),
    ("server/start-superlink.sh", ["--insecure", "--port"], "option --port needs a value"),
    ("server/connect.sh", ["deploy", "nohost", "--insecure"], "HOST:PORT expected"),
    ("server/run.sh", ["--run-config", "clients=3"], "CONNECTION (the SuperLink's name in $FLWR_HOME/config.toml"),
    ("server/run.sh", ["deploy", "--wait", "soon"], "--wait needs a number of seconds"),
    ("clients/start-voter.sh", ["--superlink", "127.0.0.1:9092", "--port", "9094", "--insecure"],
     "--partition-id I and --num-partitions N (integers) are required"),
    ("clients/start-voter.sh", ["--superlink", "127.0.0.1:9092", "--port", "9094", "--partition-id", "0",
                                "--num-partitions", "3"], "choose --insecure or --root-certificates FILE"),
    ("clients/start-voter.sh", ["--tally-id", "0"], "unknown option --tally-id"),
    # TLS needs the node's registered authentication key, and a tally its MPyC certificates
    ("clients/start-voter.sh", ["--superlink", "127.0.0.1:9092", "--port", "9094", "--partition-id", "0",
                                "--num-partitions", "3", "--root-certificates", "README.md", "--node-key", "no.key"],
     "no node key 'no.key': create it with --print-node-key"),
    ("clients/start-tally.sh", ["--superlink", "127.0.0.1:9092", "--port", "9094", "--tally-id", "0",
                                "--root-certificates", "README.md", "--node-key", "README.md"],
     "--mpyc-tls FOLDER is required with --root-certificates"),
    ("clients/start-tally.sh", ["--superlink", "127.0.0.1:9092", "--port", "9094", "--insecure", "--tally-id", "0"],
     "--node-config FILE (the committee's dphype-tally-parties) is required"),
    ("clients/start-tally.sh", ["--superlink", "127.0.0.1:9092", "--port", "9094", "--insecure", "--tally-id", "0",
                                "--node-config", "committee.toml", "--executor", "threads"],
     "--executor must be forkserver or subprocess"),
])
def test_a_script_refuses_bad_input_with_its_usage(script, args, message):
    done = run_script(script, *args)
    assert done.returncode == 2 and message in done.stderr and f"Usage: {script}" in done.stderr, done.stderr


def test_run_names_an_unknown_connection_and_a_silent_superlink(tmp_path):
    """``server/run.sh`` before any run: a connection the config does not name (exit 2), a SuperLink that does not
    answer within --wait (exit 1); each in one line that says what to do."""
    done = run_script("server/run.sh", "deploy", home=tmp_path)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"run.sh: no connection 'deploy' in {tmp_path}/config.toml: start the SuperLink with "
        "server/start-superlink.sh (it names it), or name it with server/connect.sh")
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert run_script("server/connect.sh", "deploy", f"127.0.0.1:{port}", "--insecure", home=tmp_path).returncode == 0
    done = run_script("server/run.sh", "deploy", "--wait", "1", home=tmp_path)
    assert done.returncode == 1 and done.stderr.strip().startswith(
        "run.sh: the SuperLink of connection 'deploy' does not answer after 1 s: start it"), done.stderr


def test_a_misspelt_policy_key_stops_the_voter_before_its_supernode_starts(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("dphype-max-epsilonn = 2.0\n")
    done = run_script("clients/start-voter.sh", "--superlink", "127.0.0.1:9092", "--port", "9094", "--insecure",
                      "--partition-id", "0", "--num-partitions", "3", "--node-config", str(policy), home=tmp_path)
    assert done.returncode == 2 and "unknown node config key(s) dphype-max-epsilonn" in done.stderr
    assert "flower-supernode" not in done.stdout


def test_connect_writes_the_connection_into_a_fresh_flwr_home(tmp_path):
    home = tmp_path / "home"  # a fresh FLWR_HOME has no config.toml
    assert run_script("server/connect.sh", "deploy", "127.0.0.1:9092", "--insecure", home=home).returncode == 0
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked here\n")
    assert run_script("server/connect.sh", "remote", "link.example.org:9092", "--root-certificates", str(ca),
                      home=home).returncode == 0
    superlink = tomllib.loads((home / "config.toml").read_text())["superlink"]
    assert superlink["deploy"] == {"address": "127.0.0.1:9092", "insecure": True}
    assert superlink["remote"] == {"address": "link.example.org:9092", "root-certificates": str(ca)}
    assert superlink["default"] == "local"  # Flower's own default connection is left as it is


def test_each_tally_on_a_host_gets_its_own_key_file(tmp_path):
    keys = [run_script("clients/start-tally.sh", "--print-public-key", "--tally-id", str(j), home=tmp_path)
            for j in range(2)]
    assert all(done.returncode == 0 and re.fullmatch(r"[0-9a-f]{64}\n", done.stdout) for done in keys)
    assert keys[0].stdout != keys[1].stdout
    assert sorted(p.name for p in (tmp_path / "dphype").iterdir()) == ["tally-0.key", "tally-1.key"]
    again = run_script("clients/start-tally.sh", "--print-public-key", "--tally-id", "0", home=tmp_path)
    assert again.stdout == keys[0].stdout  # the key is kept


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("policy*.toml")), ids=lambda p: p.name)
def test_the_policy_examples_are_valid_node_policies(example):
    from clients.node_config import read_file, voter_config

    shared = read_file(example)
    assert shared and set(shared) <= set(POLICY_KEYS)
    config = voter_config(3, 10, shared)
    policy = NodePolicy.from_node_config(config)
    assert policy.ledger.name == "ledger-partition-3.json"  # one ledger per voter
    assert config == {"partition-id": 3, "num-partitions": 10, **shared}


def test_the_full_policy_example_documents_every_key_at_its_default():
    from clients.node_config import read_file

    text = (EXAMPLES / "policy.toml").read_text()
    assert all(key in text for key in POLICY_KEYS)
    assert {key: POLICY_KEYS[key][0] for key in read_file(EXAMPLES / "policy.toml")} == read_file(
        EXAMPLES / "policy.toml")
    assert NodePolicy.from_node_config(read_file(EXAMPLES / "policy.toml")) == NodePolicy()


def test_the_committee_example_makes_a_tally_node_config(tmp_path):
    from clients.node_config import read_file, tally_config

    shared = read_file(EXAMPLES / "tally-committee.toml")
    assert len(str(shared[TALLY_PARTIES]).split(",")) == COMMITTEE_SIZE
    config = tally_config(1, tmp_path / "tally-1.key", shared)
    assert config == {TALLY_ID: 1, TALLY_KEY_FILE: str(tmp_path / "tally-1.key"), **shared}


def test_the_node_config_helper_refuses_what_the_node_would(tmp_path):
    from clients.node_config import main, tally_config, voter_config

    with pytest.raises(ValueError, match="sets partition-id, which this script sets"):
        voter_config(0, 3, {"partition-id": 1})
    with pytest.raises(PolicyError, match="dphype-min-clients"):
        voter_config(0, 3, {"dphype-min-clients": 1})
    with pytest.raises(ValueError, match=r"--partition-id must be in \[0, 2\]"):
        voter_config(3, 3)
    with pytest.raises(ValueError, match="must set dphype-tally-parties"):
        tally_config(0, tmp_path / "k", {})
    bad = tmp_path / "table.toml"
    bad.write_text("[dphype]\nmax-epsilon = 1.0\n")
    assert main(["voter", "--partition-id", "0", "--num-partitions", "1", "--file", str(bad)]) == 2


def test_the_server_readme_documents_every_run_config_key():
    from dphype.app.run_config import AppConfig
    from dphype.config import RUN_CONFIG_KEYS

    text = (REPO / "server" / "README.md").read_text()
    documented = set(re.findall(r"^\| `([a-z-]+)` \|", text, re.M))
    own = {f.name.replace("_", "-") for f in AppConfig.__dataclass_fields__.values() if f.name != "dphype"}
    assert documented == set(pyproject()["tool"]["flwr"]["app"]["config"]) == own | set(RUN_CONFIG_KEYS.values())


def test_the_node_config_helper_adds_the_roster_and_checks_the_nodes_membership(tmp_path, capsys):
    """``--roster FILE --identity FILE``: absolute paths in the node config, the key a member in the node's role (a
    tally's with its committee key); without them the file must allow an unauthenticated federation."""
    from clients.node_config import main
    from dphype.flower.tally_node import load_tally_key
    from dphype.secure.roster import IdentityKey, Member, Roster

    voter, tally, stranger = (IdentityKey.generate() for _ in range(3))
    committee = load_tally_key(tmp_path / "tally-0.key").public
    roster = Roster("acme", (Member("v", "voter", voter.public), Member("t", "tally", tally.public, committee)))
    roster.save(tmp_path / "roster.json")
    for name, key in (("v", voter), ("t", tally), ("s", stranger)):
        key.save(tmp_path / f"{name}.id")
    committee_file = tmp_path / "committee.toml"
    committee_file.write_text('dphype-tally-parties = "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"\n')
    shard = ["voter", "--partition-id", "0", "--num-partitions", "1"]
    assert main([*shard, "--roster", str(tmp_path / "roster.json"), "--identity", str(tmp_path / "v.id")]) == 0
    assert f'dphype-roster="{tmp_path / "roster.json"}"' in capsys.readouterr().out
    assert main(["tally", "--tally-id", "0", "--key", str(tmp_path / "tally-0.key"), "--file", str(committee_file),
                 "--roster", str(tmp_path / "roster.json"), "--identity", str(tmp_path / "t.id")]) == 0
    capsys.readouterr()
    refused = {"a stranger": [*shard, "--roster", str(tmp_path / "roster.json"), "--identity", str(tmp_path / "s.id")],
               "a tally as a voter": [*shard, "--roster", str(tmp_path / "roster.json"), "--identity",
                                      str(tmp_path / "t.id")],
               "no roster": shard,
               "a roster alone": [*shard, "--roster", str(tmp_path / "roster.json")]}
    messages = {"a stranger": "is not a member of roster acme", "a tally as a voter": "a tally of the roster",
                "no roster": "--roster FILE --identity FILE, or dphype-allow-unauthenticated = true",
                "a roster alone": "--roster FILE and --identity FILE go together"}
    for case, argv in refused.items():
        assert main(argv) == 2, case
        assert messages[case] in capsys.readouterr().err, case
    allowed = tmp_path / "open.toml"
    allowed.write_text("dphype-allow-unauthenticated = true\n")
    assert main([*shard, "--file", str(allowed)]) == 0


def test_an_occupied_port_is_refused_by_name_before_anything_starts(tmp_path):
    """The SuperLink's port and a SuperNode's Runtime API port, taken by another program: exit 2 naming the option,
    no connection named in config.toml, no SuperNode or SuperExec started."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = run_script("server/start-superlink.sh", "--insecure", "--port", port, home=tmp_path)
        assert done.returncode == 2 and f"start-superlink.sh: --port {port} is in use on 127.0.0.1" in done.stderr
        assert not (tmp_path / "config.toml").exists()
        policy = tmp_path / "policy.toml"
        policy.write_text("dphype-allow-unauthenticated = true\n")
        done = run_script("clients/start-voter.sh", "--superlink", "127.0.0.1:9092", "--port", port, "--insecure",
                          "--partition-id", "0", "--num-partitions", "3", "--node-config", str(policy), home=tmp_path)
        assert done.returncode == 2 and f"start-voter.sh: --port {port} is in use on 127.0.0.1" in done.stderr
        assert "Usage: clients/start-voter.sh" in done.stderr and not list(tmp_path.rglob("ledger*"))
        assert "flower-supernode" not in done.stdout.split("node config:")[-1]
