"""DP-Hype's Flower adapters, all in one place (the rest of :mod:`dphype` imports no Flower code).

* :func:`register_dphype` -- client side: add DP-Hype's pre-flight and secure-vote handlers to your
  Message-API ``ClientApp``; your own ``@app.train()``/``@app.evaluate()``/``@app.query()`` stay yours.
  The node's privacy policy comes from its operator (``--node-config "dphype-max-epsilon=1 ..."``), never
  from the server: :mod:`dphype.node.policy`, read by :func:`node_policy`.
* :class:`DPHype` -- server side: ``DPHype(candidates, config).start(grid)`` inside your ``@app.main()``
  returns a :class:`dphype.result.DPHypeResult` (``best_params``, a ranked table, ``summary()``,
  ``save()``); then train with any Message-API strategy, passing :func:`train_config` ``(result.best_params)``,
  which the client's ``@app.train()`` reads back with :func:`selected_candidate` ``(msg)``.
* ``release="argmax"``: the tally nodes run the same ``ClientApp`` (node config :data:`TALLY_ID`,
  :data:`TALLY_PARTIES`, :data:`TALLY_KEY_FILE`; :func:`load_tally_key` gives a tally's public key); a server that
  takes the committee from the connected nodes asks :func:`discover_committee`, and trains afterwards on a
  :class:`ClientGrid`, which hides the tallies from the strategy.
* :func:`private_training` -- optional: wrap the final FedAvg in Flower's DP wrappers, calibrated to a
  training budget and accounted together with the selection; the server clips (or verifies the clients'
  clipping) and sets uniform weights itself. :func:`check_private_training` checks it before the selection.

Modules, split the way Flower splits itself: :mod:`dphype.flower.client` (the ClientApp's handlers),
:mod:`dphype.flower.server` (the ServerApp's selection), :mod:`dphype.flower.tally` (the tally node),
:mod:`dphype.flower.wire` (message types and keys), :mod:`dphype.flower.grid` (helpers both sides share),
:mod:`dphype.flower.local` (in-process grid, private local SuperLink).
"""

from typing import TYPE_CHECKING

from dphype._exports import lazy_getattr

#: Public name -> its module, imported on first use (PEP 562): a ClientApp imports the client handlers without
#: the server, the DP-FedAvg wrappers and their accountants.
_EXPORTS: dict[str, str] = {
    "register_dphype": "dphype.flower.client",
    "node_policy": "dphype.flower.client.policy",
    "selected_candidate": "dphype.flower.selected",
    "train_config": "dphype.flower.selected",
    "DPHype": "dphype.flower.server",
    "PreflightError": "dphype.flower.server.readiness",
    "ClientGrid": "dphype.flower.server.committee",
    "discover_committee": "dphype.flower.server.committee",
    "TALLY_ID": "dphype.flower.tally",
    "TALLY_KEY_FILE": "dphype.flower.tally",
    "TALLY_PARTIES": "dphype.flower.tally",
    "load_tally_key": "dphype.flower.tally",
    "ClippingError": "dphype.flower.training",
    "TrainingBudget": "dphype.flower.training",
    "check_private_training": "dphype.flower.training",
    "private_training": "dphype.flower.training",
}

if TYPE_CHECKING:
    from dphype.flower.client import register_dphype
    from dphype.flower.client.policy import node_policy
    from dphype.flower.selected import selected_candidate, train_config
    from dphype.flower.server import DPHype
    from dphype.flower.server.committee import ClientGrid, discover_committee
    from dphype.flower.server.readiness import PreflightError
    from dphype.flower.tally import TALLY_ID, TALLY_KEY_FILE, TALLY_PARTIES, load_tally_key
    from dphype.flower.training import ClippingError, TrainingBudget, check_private_training, private_training


__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())


__all__ = ["TALLY_ID", "TALLY_KEY_FILE", "TALLY_PARTIES", "ClientGrid", "ClippingError", "DPHype", "PreflightError",
           "TrainingBudget", "check_private_training", "discover_committee", "load_tally_key", "node_policy",
           "private_training", "register_dphype", "selected_candidate", "train_config"]
