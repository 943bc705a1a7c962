"""The bundled Flower app: DP-Hype selects the hyperparameters, then Flower's FedAvg (or DP-FedAvg) trains.

`dphype.app.server_app` is the ServerApp, `dphype.app.client_app` the ClientApp, `dphype.app.run_config` its run config.
It ships inside the package so that ``dphype demo`` runs it from an installed wheel: an app's ``pyproject.toml``
names ``dphype.app.server_app:app`` and ``dphype.app.client_app:app`` (`dphype.cli.demo.COMPONENTS`). Nothing in
`dphype` imports it.
"""
