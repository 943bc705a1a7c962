"""The bundled ClientApp: DP-Hype's handlers plus the user's own train and evaluate handlers.

A plain ``ClientApp``: `dphype.flower.register_dphype` adds DP-Hype's pre-flight and vote handlers, which score
the candidates with this node's `dphype.ml.torch_task.TorchTask` (its shard from ``partition-id`` / ``num-partitions``
in the node config); ``@app.train()`` and ``@app.evaluate()`` serve the final FedAvg with the selected candidate;
`dphype.flower.register_private_evaluation` answers the private evaluation of the final model with `held_out`: its
accuracy and the majority-class baseline on the node's held-out rows (its shard of the data set's test split, which
no node trains on).

The run config names only the data set, the partition seed and the local epochs; nothing a server names is
opened as a file. The node's privacy limits are its operator's (`dphype.flower.client.node_policy`), never the
run config's.

Tally nodes (`dphype.flower.tally_node`) run this same app: in a deployment the operator names the role in the node
config (``dphype-tally-id``, ``dphype-tally-parties``, ``dphype-tally-key``; one key file per tally); in
simulation `dphype.flower.simulated_roles` makes partitions ``clients .. clients+tallies-1`` the tallies (so
``options.num-supernodes = clients + tallies``).
"""

from __future__ import annotations

from typing import cast

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

from dphype.flower import register_dphype, register_private_evaluation, selected_candidate, simulated_roles
from dphype.ml.data import dataset_spec
from dphype.ml.reference import majority_accuracy
from dphype.ml.torch_task import TorchTask, load_cached, make_task


def local_task(context: Context) -> TorchTask:
    """This node's task: its shard of the run's data set and the paper's model."""
    run = context.run_config
    return make_task(str(run.get("dataset", "adult")), int(context.node_config["partition-id"]),
                     int(context.node_config["num-partitions"]), seed=int(run.get("seed", 0)),
                     epochs=int(run.get("local-epochs", 5)))


def held_out(context: Context, arrays: ArrayRecord) -> tuple[float, float]:
    """The final model's accuracy and the majority-class baseline on this node's shard of the test split."""
    dataset = str(context.run_config.get("dataset", "adult"))
    test = load_cached(dataset)[1]
    rows = test.subset(np.arange(int(cast(int, context.node_config["partition-id"])), len(test.y),
                                 int(cast(int, context.node_config["num-partitions"]))))
    accuracy = TorchTask(rows, dataset_spec(dataset).model).evaluate(arrays.to_torch_state_dict())["accuracy"]
    return float(accuracy), majority_accuracy(rows.y)


app = ClientApp(mods=[simulated_roles])
register_dphype(app, local_task)
register_private_evaluation(app, held_out)


def clip_in_private_rounds(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower's ``fixedclipping_mod`` in DP training rounds (the server's DP wrapper sends a clipping norm)."""
    if KEY_CLIPPING_NORM in msg.content["config"]:
        return fixedclipping_mod(msg, context, call_next)
    return call_next(msg, context)


@app.train(mods=[clip_in_private_rounds])
def train(msg: Message, context: Context) -> Message:
    """One FedAvg local update of the global model with the selected candidate (in DP rounds, clipped by the mod)."""
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
    """Loss and accuracy of the global model on this node's data."""
    metrics = local_task(context).evaluate(msg.content.array_records["arrays"].to_torch_state_dict())
    return Message(RecordDict({"metrics": MetricRecord(dict(metrics))}), reply_to=msg)
