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
from dphype.modes import RELEASE_MODES, Aggregator
from dphype.node.policy import TALLIES_KEY, run_ledger_path
from dphype.secure.committee import COMMITTEE_SIZE

#: First loopback port of a simulated committee's MPyC parties (`simulated_parties`).
SIMULATED_TALLY_PORTS = 20000


def simulated_parties(run_id: int, tallies: int) -> list[str]:
    """The MPyC addresses of a simulated committee.

    ``tallies`` consecutive loopback ports from one of 4,000 blocks of 10 at and above `SIMULATED_TALLY_PORTS`,
    chosen by the run id, so that every tally of the run derives the same list without talking to the others,
    and runs side by side rarely share a port.

    Args:
        run_id: The Flower run id.
        tallies: The committee's size.

    Returns:
        The addresses, ``"127.0.0.1:port"``, in committee order.
    """
    base = SIMULATED_TALLY_PORTS + (run_id % 4000) * 10
    return [f"127.0.0.1:{base + j}" for j in range(tallies)]


def simulated_role(context: Context, clients: int, tallies: int, keys: str | os.PathLike[str]) -> None:
    """Give a simulated node of an argmax-mode run its role, in its node config (module docstring, "In simulation").

    The run has ``clients`` voters and ``tallies`` tallies: a partition at or beyond ``clients`` becomes tally
    ``partition-id - clients`` (its key ``tally-<j>.key`` in the folder ``keys``, the addresses of
    `simulated_parties`), and a voter of a federation of exactly ``clients + tallies`` nodes gets its shard
    of ``clients`` partitions, as in sum mode. A node whose operator named a role (``dphype-tally-id``), or without
    a ``partition-id``, keeps its node config. A voter of Flower's simulation
    (`dphype.flower.client.policy_client.simulated`) whose operator pinned no tallies pins the simulated committee
    (``dphype-tallies``: the public halves of the key files in ``keys``, made by the simulation's operator and never
    named by the server), so a simulation needs no set-up; a deployed voter is never given tallies: its operator pins
    them.

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
    """The policy keys of this node's environment (`dphype.flower.client.policy_client.environment_policy`).

    None if it does not parse (the handlers refuse it themselves).
    """
    try:
        return environment_policy()
    except ValueError:
        return {}


def _pinned_tallies(context: Context) -> str | None:
    """The tallies this node's operator pinned (node config or environment), or ``None``.

    A broken policy counts as pinned (``""``): the handlers refuse it themselves.
    """
    try:
        return node_policy(context).tallies
    except ValueError:
        return ""


def simulated_roles(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """A ClientApp mod that gives each simulated node of an argmax-mode run its role (`simulated_role`).

    ``ClientApp(mods=[simulated_roles])``: the tallies of a simulation need nothing else (the bundled app and
    the app ``dphype new`` writes use it).

    Only a run config that states a release whose aggregator is the tally committee (``release = "argmax"``)
    and ``clients`` (as ``flwr run`` and ``dphype demo`` give it)
    assigns roles, with the keys in `dphype.flower.tally_node.TALLY_KEYS_ENV`'s folder, or in this run's folder
    beside the simulated ledgers (`dphype.node.policy.run_ledger_path`); every node of another release keeps
    its node config.

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
    if mode is not None and mode.aggregator is Aggregator.COMMITTEE and "clients" in run:
        simulated_role(context, int(cast(int, run["clients"])), int(cast(int, run.get("tallies", COMMITTEE_SIZE))),
                       os.environ.get(TALLY_KEYS_ENV) or run_ledger_path(context.run_id).parent)
    return call_next(msg, context)
