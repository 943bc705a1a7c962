"""The bundled ClientApp: DP-Hype's handlers plus the user's own train and evaluate handlers.

A worked example of the Message API: the app is a plain ``ClientApp``; `dphype.flower.register_dphype`
adds DP-Hype's pre-flight and secure-vote handlers, which score the public candidates with this node's
`dphype.ml.torch_task.TorchTask` (its shard of the data set, from ``partition-id`` / ``num-partitions`` in
the node config, which the simulation engine also sets). Its own ``@app.train()`` and ``@app.evaluate()``
then serve the final FedAvg with the selected candidate, which arrives in the train config
(`dphype.flower.selected_candidate`).

The run config only names the data set, the partition seed and the local epochs; nothing a server names
is opened as a file, and the candidate list arrives with DP-Hype's request. The node's privacy limits are its
operator's, never the run config's: ``flower-supernode --node-config "partition-id=0 num-partitions=10
dphype-max-epsilon=1 dphype-lifetime-epsilon=4"``, or the ``DPHYPE_NODE_POLICY`` environment variable where
the node config is not the operator's to set (simulation); unset keys keep the safe defaults of
`dphype.node.policy.POLICY_KEYS` (see `dphype.flower.client.node_policy`).

Tally nodes (``release = "argmax"``, `dphype.flower.tally_node`) run this same app. In a deployment each is a
SuperNode whose operator names its role in the node config (string values quoted, as Flower's parser wants
them): ``flower-supernode --node-config "dphype-tally-id=0
dphype-tally-parties='host0:port0,host1:port1,host2:port2' dphype-tally-key='~/.flwr/dphype/tally-0.key'"``
(one key file per tally, so that tallies sharing a host keep apart).
In simulation the mod `dphype.flower.simulated_roles` gives the roles: partitions ``0 .. clients-1`` vote,
partitions ``clients .. clients+tallies-1`` are tallies ``0 .. tallies-1`` (so the federation needs
``options.num-supernodes = clients + tallies``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

from dphype.flower import register_dphype, selected_candidate, simulated_roles
from dphype.ml.torch_task import make_task

if TYPE_CHECKING:  # torch is imported where a task is built: a process serving a SecAgg+ stage needs none
    from dphype.ml.torch_task import TorchTask


def local_task(context: Context) -> TorchTask:
    """This node's task: its shard of the run's data set and the paper's model.

    Args:
        context: The node's context (``partition-id``, ``num-partitions``; the run's ``dataset``, ``seed``,
            ``local-epochs``).

    Returns:
        The task.
    """
    run = context.run_config
    return make_task(str(run.get("dataset", "adult")), int(context.node_config["partition-id"]),
                     int(context.node_config["num-partitions"]), seed=int(run.get("seed", 0)),
                     epochs=int(run.get("local-epochs", 5)))


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
    none of their metrics (`dphype.flower.final_training`).

    Args:
        msg: The train message: the global model (``arrays``) and the train config (the candidate,
            ``server-round``, ``local-epochs``).
        context: The node's context.

    Returns:
        The reply: the updated model (``arrays``) and the training metrics.
    """
    # lazy import: torch
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
