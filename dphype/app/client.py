"""The bundled ClientApp: DP-Hype's handlers plus the user's own train and evaluate handlers.

A worked example of the Message API: the app is a plain ``ClientApp``; `dphype.flower.register_dphype`
adds DP-Hype's pre-flight and secure-vote handlers, which score the public candidates with this node's
`dphype.ml.task.TorchTask` (its shard of the data set, from ``partition-id`` / ``num-partitions`` in
the node config, which the simulation engine also sets). Its own ``@app.train()`` and ``@app.evaluate()``
then serve the final FedAvg with the selected candidate, which arrives in the train config
(`dphype.flower.selected_candidate`).

The run config only names the data set, the partition seed and the local epochs; nothing a server names
is opened as a file, and the candidate list arrives with DP-Hype's request. The node's privacy limits are its
operator's, never the run config's: ``flower-supernode --node-config "partition-id=0 num-partitions=10
dphype-max-epsilon=1 dphype-lifetime-epsilon=4"``, or the ``DPHYPE_NODE_POLICY`` environment variable where
the node config is not the operator's to set (simulation); unset keys keep the safe defaults of
`dphype.node.policy.POLICY_KEYS` (see `dphype.flower.client.node_policy`).

Tally nodes (``release = "argmax"``, `dphype.flower.tally`) run this same app. In a deployment each is a
SuperNode whose operator names its role in the node config (string values quoted, as Flower's parser wants
them): ``flower-supernode --node-config "dphype-tally-id=0
dphype-tally-parties='host0:port0,host1:port1,host2:port2' dphype-tally-key='~/.flwr/dphype/tally-0.key'"``
(one key file per tally, so that tallies sharing a host keep apart).
In simulation, where the node config holds only ``partition-id`` and ``num-partitions``, `simulated_roles`
gives the roles (`simulated_role`): partitions ``0 .. clients-1`` vote, partitions
``clients .. clients+tallies-1`` are tallies ``0 .. tallies-1``
(so the federation needs ``options.num-supernodes = clients + tallies``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, cast

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

from dphype.flower import (
    TALLY_ID,
    TALLY_KEY_FILE,
    TALLY_PARTIES,
    load_tally_key,
    node_policy,
    register_dphype,
    selected_candidate,
)
from dphype.flower.client.policy import simulated
from dphype.flower.tally import TALLY_KEYS_ENV
from dphype.modes import RELEASE_MODES, Aggregator
from dphype.node.policy import TALLIES_KEY, run_ledger_path
from dphype.secure.tally import COMMITTEE_SIZE

if TYPE_CHECKING:  # torch is imported where a task is built: a process serving a SecAgg+ stage needs none
    from dphype.ml.task import TorchTask


def local_task(context: Context) -> TorchTask:
    """This node's task: its shard of the run's data set and the paper's model.

    Args:
        context: The node's context (``partition-id``, ``num-partitions``; the run's ``dataset``, ``seed``,
            ``local-epochs``).

    Returns:
        The task.
    """
    from dphype.ml.task import make_task

    run = context.run_config
    return make_task(str(run.get("dataset", "adult")), int(context.node_config["partition-id"]),
                     int(context.node_config["num-partitions"]), seed=int(run.get("seed", 0)),
                     epochs=int(run.get("local-epochs", 5)))


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
    """Give a simulated node of an argmax-mode run its role (module docstring), in its node config.

    The run has ``clients`` voters and ``tallies`` tallies: a partition at or beyond ``clients`` becomes tally
    ``partition-id - clients`` (its key ``tally-<j>.key`` in the folder ``keys``, the addresses of
    `simulated_parties`), and a voter of a federation of exactly ``clients + tallies`` nodes gets its shard
    of ``clients`` partitions, as in sum mode. A node whose operator named a role (``dphype-tally-id``), or without
    a ``partition-id``, keeps its node config. A voter of Flower's simulation (`dphype.flower.client.policy.simulated`)
    whose operator pinned no tallies pins the simulated committee (``dphype-tallies``, the public halves of the key
    files in ``keys``, made by the simulation's operator and never named by the server), so a simulation needs no
    set-up; a deployed voter is never given tallies: its operator pins them.

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


def _pinned_tallies(context: Context) -> str | None:
    """The tallies this node's operator pinned (node config or environment), or ``None``.

    A broken policy counts as pinned (``""``): the handlers refuse it themselves.
    """
    try:
        return node_policy(context).tallies
    except ValueError:
        return ""


def simulated_roles(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """The bundled app's mod for `simulated_role`.

    Only a run config that states a release whose aggregator is the tally committee (``release = "argmax"``)
    and ``clients`` (as ``flwr run`` and ``dphype demo`` give it)
    assigns roles, with the keys in `dphype.flower.tally.TALLY_KEYS_ENV`'s folder, or in this run's folder
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
    mode = RELEASE_MODES.get(str(run.get("release")))
    if mode is not None and mode.aggregator is Aggregator.COMMITTEE and "clients" in run:
        simulated_role(context, int(cast(int, run["clients"])), int(cast(int, run.get("tallies", COMMITTEE_SIZE))),
                       os.environ.get(TALLY_KEYS_ENV) or run_ledger_path(context.run_id).parent)
    return call_next(msg, context)


app = ClientApp(mods=[simulated_roles])
register_dphype(app, local_task)


def clip_in_private_rounds(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower's ``fixedclipping_mod`` in DP training rounds (the server's DP wrapper sends a clipping norm).

    Args:
        msg: The incoming train message.
        context: The node's context.
        call_next: The next handler.

    Returns:
        The reply, its update clipped in DP rounds.
    """
    if KEY_CLIPPING_NORM in msg.content["config"]:
        return fixedclipping_mod(msg, context, call_next)
    return call_next(msg, context)


@app.train(mods=[clip_in_private_rounds])
def train(msg: Message, context: Context) -> Message:
    """One FedAvg local update of the global model with the selected candidate (the train config).

    In DP rounds with client-side clipping the update is clipped by the mod (the server verifies its norm);
    with server-side clipping the server clips. Either way the server weighs every client the same and keeps
    none of their metrics (`dphype.flower.private_training`).

    Args:
        msg: The train message: the global model (``arrays``) and the train config (the candidate,
            ``server-round``, ``local-epochs``).
        context: The node's context.

    Returns:
        The reply: the updated model (``arrays``) and the training metrics.
    """
    from dphype.ml.training import client_round_seed

    config = msg.content.config_records["config"]
    candidate = selected_candidate(msg)
    # the same mini-batch order as dphype.ml.training.fedavg
    seed = client_round_seed(int(cast(int, context.run_config.get("seed", 0))),
                             int(cast(int, config["server-round"])) - 1,
                             int(cast(int, context.node_config["partition-id"])))
    task = local_task(context)
    state, metrics = task.fit(candidate, msg.content.array_records["arrays"].to_torch_state_dict(),
                              epochs=int(cast(int, config["local-epochs"])), seed=seed)
    return Message(RecordDict({"arrays": ArrayRecord(state), "metrics": MetricRecord(dict(metrics))}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the global model on this node's data.

    Args:
        msg: The evaluate message (the global model, ``arrays``).
        context: The node's context.

    Returns:
        The reply with the metrics.
    """
    metrics = local_task(context).evaluate(msg.content.array_records["arrays"].to_torch_state_dict())
    return Message(RecordDict({"metrics": MetricRecord(dict(metrics))}), reply_to=msg)
