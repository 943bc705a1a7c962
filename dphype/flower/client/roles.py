"""A simulated tally committee: the ClientApp mod that gives each simulated node of an argmax-mode run its role.

In Flower's simulation every node runs the same ClientApp: `simulated_roles` makes the partitions beyond the run's
``clients`` the tallies (their keys and MPyC addresses derived locally, never from the server) and has the voters
pin that committee, as the operator of the simulation would. A deployment gives each node its role in its node
config instead (``clients/start-voter.sh``, ``clients/start-tally.sh``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import cast

from flwr.app import Context, Message
from flwr.clientapp.typing import ClientAppCallable

from dphype.flower.client.policy_client import environment_policy, node_policy, simulated
from dphype.flower.federation import federation_set, simulated_federation, tally_name, voter_name
from dphype.flower.tally_node import TALLY_ID, TALLY_KEY_FILE, TALLY_KEYS_ENV, TALLY_PARTIES, load_tally_key
from dphype.node.policy import TALLIES_KEY, run_ledger_path
from dphype.release import RELEASE_MODES
from dphype.secure.committee import COMMITTEE_SIZE

#: First loopback port of a simulated committee's MPyC parties (`simulated_parties`).
SIMULATED_TALLY_PORTS = 20000


def simulated_parties(run_id: int, tallies: int) -> list[str]:
    """``tallies`` loopback addresses from a block above `SIMULATED_TALLY_PORTS` chosen by the run id (no talk)."""
    base = SIMULATED_TALLY_PORTS + (run_id % 4000) * 10
    return [f"127.0.0.1:{base + j}" for j in range(tallies)]


def simulated_role(context: Context, clients: int, tallies: int, keys: str | os.PathLike[str]) -> None:
    """Give a simulated node of an argmax-mode run its role, in its node config.

    A partition at or beyond ``clients`` becomes tally ``partition-id - clients`` (key ``tally-<j>.key`` in
    ``keys``); a voter gets its shard of ``clients`` partitions and, in Flower's simulation without pinned
    tallies, pins the committee from the key files in ``keys`` (never from the server). A node whose operator
    named a role, or without a ``partition-id``, keeps its node config; a deployed voter is never given tallies.

    Args:
        context: The node's context, whose node config is updated in place.
        clients: The number of voters.
        tallies: The committee's size.
        keys: The folder of the tallies' key files.
    """
    node = context.node_config
    if TALLY_ID in node or "partition-id" not in node:
        return
    partition = int(cast(int, node["partition-id"]))
    if simulated() and not federation_set({**_environment_policy(), **node}):  # development: no set-up
        committee = [load_tally_key(Path(keys) / f"tally-{j}.key").public for j in range(tallies)]
        member = voter_name(partition) if partition < clients else tally_name(partition - clients)
        node.update(simulated_federation(run_ledger_path(context.run_id).parent, context.run_id, member, clients,
                                         committee))
    if partition >= clients:
        index = partition - clients
        node.update({TALLY_ID: index, TALLY_PARTIES: ",".join(simulated_parties(context.run_id, tallies)),
                     TALLY_KEY_FILE: str(Path(keys) / f"tally-{index}.key")})
        return
    if int(cast(int, node["num-partitions"])) == clients + tallies:
        node["num-partitions"] = clients
    if simulated() and _pinned_tallies(context) is None:  # the simulation's operator made the committee: it pins it
        node[TALLIES_KEY] = ",".join(load_tally_key(Path(keys) / f"tally-{j}.key").public.hex()
                                     for j in range(tallies))


def _environment_policy() -> dict[str, object]:
    """The policy keys of this node's environment, empty if they do not parse (the handlers refuse that)."""
    try:
        return environment_policy()
    except ValueError:
        return {}


def _pinned_tallies(context: Context) -> str | None:
    """The tallies this node's operator pinned, or ``None``; ``""`` for a broken policy (the handlers refuse it)."""
    try:
        return node_policy(context).tallies
    except ValueError:
        return ""


def simulated_roles(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """ClientApp mod: `simulated_role` when the run config names a committee release and ``clients``.

    The keys are in `dphype.flower.tally_node.TALLY_KEYS_ENV`'s folder, or beside the run's simulated ledgers.

    Args:
        msg: The incoming message.
        context: The node's context.
        call_next: The next handler.

    Returns:
        The next handler's reply.
    """
    run = context.run_config
    release = str(run.get("release"))
    mode = RELEASE_MODES.get(release) if release in RELEASE_MODES else None
    if mode is not None and mode.uses_committee and "clients" in run:
        simulated_role(context, int(cast(int, run["clients"])), int(cast(int, run.get("tallies", COMMITTEE_SIZE))),
                       os.environ.get(TALLY_KEYS_ENV) or run_ledger_path(context.run_id).parent)
    return call_next(msg, context)
