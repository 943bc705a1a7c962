"""DP-Hype's Flower adapters, all in one place (the rest of :mod:`dphype` imports no Flower code).

* :func:`register_dphype` -- client side: add DP-Hype's pre-flight and secure-vote handlers to your
  Message-API ``ClientApp``; your own ``@app.train()``/``@app.evaluate()``/``@app.query()`` stay yours.
  The node's privacy policy comes from its operator (``--node-config "dphype-max-epsilon=1 ..."``), never
  from the server: :mod:`dphype.node.policy`.
* :class:`DPHype` -- server side: ``DPHype(candidates, config).start(grid)`` inside your ``@app.main()``
  returns a :class:`dphype.result.DPHypeResult` (``best_params``, a ranked table, ``summary()``,
  ``save()``); then train with any Message-API strategy, passing :func:`train_config` ``(result.best_params)``,
  which the client's ``@app.train()`` reads back with :func:`selected_candidate` ``(msg)``.
* :func:`private_training` -- optional: wrap the final FedAvg in Flower's DP wrappers, calibrated to a
  training budget and accounted together with the selection; the server clips (or verifies the clients'
  clipping) and sets uniform weights itself. :func:`check_private_training` checks it before the selection.
* :mod:`dphype.flower.secagg` -- Flower 1.41's legacy SecAgg+ as an exact secure sum, behind two calls.
"""

from dphype.flower.client import register_dphype
from dphype.flower.selected import selected_candidate, train_config
from dphype.flower.server import DPHype, PreflightError
from dphype.flower.training import ClippingError, TrainingBudget, check_private_training, private_training

__all__ = ["ClippingError", "DPHype", "PreflightError", "TrainingBudget", "check_private_training", "private_training",
           "register_dphype", "selected_candidate", "train_config"]
