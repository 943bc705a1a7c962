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
* :mod:`dphype.flower.secagg` -- DP-Hype's own SecAgg+ (:mod:`dphype.secure.secagg`) on the Message API.
"""

from typing import TYPE_CHECKING

from dphype._exports import lazy_getattr

#: Public name -> its module, imported on first use (PEP 562): a ClientApp imports the client handlers without
#: the server, the DP-FedAvg wrappers and their accountants.
_EXPORTS: dict[str, str] = {
    "register_dphype": "dphype.flower.client",
    "selected_candidate": "dphype.flower.selected",
    "train_config": "dphype.flower.selected",
    "DPHype": "dphype.flower.server",
    "PreflightError": "dphype.flower.server",
    "ClippingError": "dphype.flower.training",
    "TrainingBudget": "dphype.flower.training",
    "check_private_training": "dphype.flower.training",
    "private_training": "dphype.flower.training",
}

if TYPE_CHECKING:
    from dphype.flower.client import register_dphype
    from dphype.flower.selected import selected_candidate, train_config
    from dphype.flower.server import DPHype, PreflightError
    from dphype.flower.training import ClippingError, TrainingBudget, check_private_training, private_training


__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())


__all__ = ["ClippingError", "DPHype", "PreflightError", "TrainingBudget", "check_private_training", "private_training",
           "register_dphype", "selected_candidate", "train_config"]
