"""The bundled Flower app: DP-Hype selects the hyperparameters, then Flower's FedAvg trains with them.

DP-Hype selects on Adult (or MNIST, Fashion-MNIST), then FedAvg (or DP-FedAvg) trains -- the worked example of
the Message API end to end.

* `dphype.app.server_app` -- the ServerApp (``dphype.app.server_app:app``), its run summary;
* `dphype.app.client_app` -- the ClientApp (``dphype.app.client_app:app``): DP-Hype's handlers plus its own
  train and evaluate handlers;
* `dphype.app.run_config` -- its run config, validated before any client works.

It ships inside the package, so ``dphype demo`` runs it from an installed wheel: a Flower app's
``pyproject.toml`` names its components ``dphype.app.server_app:app`` and ``dphype.app.client_app:app`` (the app folder
``dphype demo`` writes does, `dphype.cli.demo.COMPONENTS`; the repository's own pyproject names
``server/server_app.py`` and ``clients/client_app.py``, which re-export them), and every SuperNode runs them from
its installed ``dphype``. The app sits at the top of the library, beside the command line: nothing in
`dphype` imports it (Flower loads it by those names).
"""
