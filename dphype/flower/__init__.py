"""DP-Hype's Flower adapters, all in one place (the rest of `dphype` imports no Flower code).

* `register_dphype` -- client side: add DP-Hype's pre-flight and secure-vote handlers to your
  Message-API ``ClientApp``; your own ``@app.train()``/``@app.evaluate()``/``@app.query()`` stay yours.
  The node's privacy policy comes from its operator (``--node-config "dphype-max-epsilon=1 ..."``), never
  from the server: `dphype.node.policy`, read by `node_policy`.
* `DPHype` -- server side: ``DPHype(candidates, config).start(grid)`` inside your ``@app.main()``
  returns a `dphype.result.DPHypeResult` (``best_params``, a ranked table, ``summary()``,
  ``save()``); then train with any Message-API strategy, passing `train_config` ``(result.best_params)``,
  which the client's ``@app.train()`` reads back with `selected_candidate` ``(msg)``.
* ``release="argmax"``: the tally nodes run the same ``ClientApp`` (node config `TALLY_ID`,
  `TALLY_PARTIES`, `TALLY_KEY_FILE`; `load_tally_key` gives a tally's public key; in simulation the mod
  `simulated_roles` makes the last partitions the tallies); a server that takes the committee from the
  connected nodes asks `connected_committee` (the committee in a committee mode, the connected tallies to set aside
  in sum mode) and trains afterwards on its ``voters`` (a `ClientGrid`, which hides the tallies from the
  strategy), with `BoundedFedAvg` when a voter may vanish mid-training.
* `private_training` -- optional: wrap the final FedAvg in Flower's DP wrappers, calibrated to a
  training budget and accounted together with the selection; the server clips (or verifies the clients'
  clipping) and sets uniform weights itself. `check_private_training` checks it before the selection.
* `PrivateEvaluation` / `register_private_evaluation` -- the final model's held-out accuracy and majority-class
  baseline, released as noisy means over SecAgg+ for a share of epsilon, accounted in every node's ledger and
  composed with the run's guarantee (`PrivateEvaluation(config)` before the selection, ``.start(grid, arrays,
  result)`` after the training; the client adds its ``evaluate(context, arrays)``).

Modules, split the way Flower splits itself: `dphype.flower.client` (the ClientApp's handlers),
`dphype.flower.server` (the ServerApp's selection), `dphype.flower.tally_node` (the tally node),
`dphype.flower.wire` (message types and keys), `dphype.flower.grid` (helpers both sides share),
`dphype.flower.local` (in-process grid, private local SuperLink).
"""

from typing import TYPE_CHECKING

from dphype._exports import lazy_getattr

#: Public name -> its module, imported on first use (PEP 562): a ClientApp imports the client handlers without
#: the server, the DP-FedAvg wrappers and their accountants.
_EXPORTS: dict[str, str] = {
    "register_dphype": "dphype.flower.client",
    "node_policy": "dphype.flower.client.policy_client",
    "selected_candidate": "dphype.flower.selected",
    "train_config": "dphype.flower.selected",
    "DPHype": "dphype.flower.server",
    "PreflightError": "dphype.flower.server.readiness",
    "ClientGrid": "dphype.flower.server.committee_server",
    "TALLY_ID": "dphype.flower.tally_node",
    "TALLY_KEY_FILE": "dphype.flower.tally_node",
    "TALLY_PARTIES": "dphype.flower.tally_node",
    "load_tally_key": "dphype.flower.tally_node",
    "simulated_roles": "dphype.flower.client.roles",
    "Committee": "dphype.flower.server.committee_server",
    "connected_committee": "dphype.flower.server.committee_server",
    "BoundedFedAvg": "dphype.flower.final_training",
    "ClippingError": "dphype.flower.final_training",
    "TrainingBudget": "dphype.flower.final_training",
    "check_private_training": "dphype.flower.final_training",
    "private_training": "dphype.flower.final_training",
    "plaintext_training": "dphype.flower.final_training",
    "run_folder": "dphype.flower.run_record",
    "save_model": "dphype.flower.run_record",
    "PrivateEvaluation": "dphype.flower.private_evaluation",
    "register_private_evaluation": "dphype.flower.client.evaluation_client",
}

if TYPE_CHECKING:
    from dphype.flower.client import register_dphype
    from dphype.flower.client.evaluation_client import register_private_evaluation
    from dphype.flower.client.policy_client import node_policy
    from dphype.flower.client.roles import simulated_roles
    from dphype.flower.final_training import (
        BoundedFedAvg,
        ClippingError,
        TrainingBudget,
        check_private_training,
        plaintext_training,
        private_training,
    )
    from dphype.flower.private_evaluation import PrivateEvaluation
    from dphype.flower.run_record import run_folder, save_model
    from dphype.flower.selected import selected_candidate, train_config
    from dphype.flower.server import DPHype
    from dphype.flower.server.committee_server import ClientGrid, Committee, connected_committee
    from dphype.flower.server.readiness import PreflightError
    from dphype.flower.tally_node import TALLY_ID, TALLY_KEY_FILE, TALLY_PARTIES, load_tally_key


__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())


__all__ = ["TALLY_ID", "TALLY_KEY_FILE", "TALLY_PARTIES", "BoundedFedAvg", "ClientGrid", "ClippingError", "Committee",
           "DPHype", "PreflightError", "PrivateEvaluation", "TrainingBudget", "check_private_training",
           "connected_committee", "load_tally_key", "node_policy", "plaintext_training",
           "private_training", "register_dphype", "register_private_evaluation", "run_folder", "save_model",
           "selected_candidate", "simulated_roles", "train_config"]
