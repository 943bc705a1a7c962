"""The bundled Flower app: DP-Hype selects the hyperparameters on Adult (or MNIST, Fashion-MNIST), then Flower's
FedAvg (or DP-FedAvg) trains with them -- the worked example of the Message API end to end.

* :mod:`dphype.app.server` -- the ServerApp (``dphype.app.server:app``), its run summary;
* :mod:`dphype.app.client` -- the ClientApp (``dphype.app.client:app``): DP-Hype's handlers plus its own
  train and evaluate handlers;
* :mod:`dphype.app.config` -- its run config, validated before any client works.

It ships inside the package, so ``dphype demo`` runs it from an installed wheel: a Flower app's
``pyproject.toml`` names these components (:data:`COMPONENTS`; the repository's own pyproject names
``server/server_app.py`` and ``clients/client_app.py``, which re-export them), and every SuperNode runs them from
its installed ``dphype``. The apps sit above the library: nothing else in
:mod:`dphype` imports them.
"""

#: The Flower components of the bundled app (``[tool.flwr.app.components]``).
COMPONENTS: dict[str, str] = {"serverapp": "dphype.app.server:app", "clientapp": "dphype.app.client:app"}
