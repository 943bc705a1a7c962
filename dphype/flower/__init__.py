"""DP-Hype's Flower adapters, all in one place (the rest of :mod:`dphype` imports no Flower code).

* :func:`register_dphype` -- client side: add DP-Hype's pre-flight and secure-vote handlers to your
  Message-API ``ClientApp``; your own ``@app.train()``/``@app.evaluate()``/``@app.query()`` stay yours.
  The node's privacy policy comes from its operator (``--node-config "dphype-max-epsilon=1 ..."``), never
  from the server: :mod:`dphype.node.policy`.
* :class:`DPHype` -- server side: ``DPHype(candidates, config).start(grid)`` inside your ``@app.main()``
  returns the selected candidate and its privacy report; then train with any Message-API strategy,
  passing :func:`train_config` ``(result.selected)``.
* :func:`private_training` -- optional: wrap the final FedAvg in Flower's DP wrappers, calibrated to a
  training budget and accounted together with the selection.
* :mod:`dphype.flower.secagg` -- DP-Hype's own SecAgg+ (:mod:`dphype.secure.secagg`) on the Message API.
"""

from dphype.flower.client import register_dphype
from dphype.flower.server import DPHype, PreflightError, train_config
from dphype.flower.training import TrainingBudget, private_training

__all__ = ["DPHype", "PreflightError", "TrainingBudget", "private_training", "register_dphype", "train_config"]
