"""The loopback profile (``simulations.deployment_profile``) reads its stages from the ServerApp's own log lines:
they must match what the server really logs, or the table silently loses its stages."""

from __future__ import annotations

import logging

from helpers import CANDS, argmax_config, argmax_grid, client_app, grid_of, scores_table
from helpers import sum_config as config

from dphype.flower import DPHype
from dphype.flower.tally_node import load_tally_key
from dphype.secure.roster import IdentityKey, Roster
from simulations.deployment_profile import stages, write_roster


def test_the_profile_finds_every_stage_in_the_servers_real_log(caplog):
    n = 6
    with caplog.at_level(logging.INFO, logger="flwr"):
        DPHype(CANDS, config(rule="max-votes")).start(grid_of(client_app(scores_table(n)), n))
    lines = [record.getMessage() for record in caplog.records]
    lines.append("DPHYPE_RESULT {}")  # the bundled app's result line, after the release (and after any warning)
    stamped = [(10.0 + i, line) for i, line in enumerate(["Starting DPHype(6 candidates, ...)", *lines])]
    table = stages(stamped, started=0.0)
    assert list(table)[:6] == ["start", "wait for nodes", "pre-flight", "secure vote", "release", "fedavg"]
    assert table["selection"] == sum(table[s] for s in ("wait for nodes", "pre-flight", "secure vote", "release"))
    # the server's per-stage seconds of the secure vote; its first stage ran inside the pre-flight
    assert {"secagg: share_keys", "secagg: masked_input", "secagg: consistency", "secagg: unmask"} <= set(table)
    assert "secagg: advertise" not in table and all(table[s] >= 0 for s in table)


def test_the_argmax_profile_finds_every_stage_in_the_servers_real_log(caplog, tmp_path):

    from dphype.flower import connected_committee

    grid, _ = argmax_grid(tmp_path)
    with caplog.at_level(logging.INFO, logger="flwr"):  # what the bundled app's ServerApp does in argmax mode
        committee = connected_committee(grid, argmax_config(), 3, connect_timeout=5, timeout=60)
        DPHype(CANDS, argmax_config(), tallies=committee.keys).start(grid, timeout=60, committee_nodes=committee.nodes)
    lines = [record.getMessage() for record in caplog.records] + ["DPHYPE_RESULT {}"]
    table = stages([(10.0 + i, line) for i, line in enumerate(lines)], started=0.0, release="argmax")
    assert list(table) == ["start", "committee", "wait for nodes", "pre-flight", "winner", "fedavg", "selection"]
    assert table["selection"] == sum(table[s] for s in ("committee", "wait for nodes", "pre-flight", "winner"))


def test_the_profiles_roster_names_every_node_and_the_committee_keys_the_tally_script_reads(tmp_path):
    home = tmp_path / "flwr-home"
    path, voters, tallies = write_roster(tmp_path, home, voters=4, tallies=3)
    roster = Roster.load(path)
    assert [m.name for m in roster.of_role("voter")] == [f"voter-{i}" for i in range(4)]
    assert roster.tally_keys() == tuple(load_tally_key(home / "dphype" / f"tally-{j}.key").public for j in range(3))
    for role, files in (("voter", voters), ("tally", tallies)):  # each identity file is its member's key
        assert [roster.member(f"{role}-{i}", role).identity for i in range(len(files))] == [
            IdentityKey.load(file).public for file in files]
    path, voters, tallies = write_roster(tmp_path / "sum", home, voters=2, tallies=0)
    assert not Roster.load(path).of_role("tally") and not tallies and len(voters) == 2
