"""The server side of the bundled DP-Hype app: what the SuperLink's operator runs (see ``server/README.md``).

:mod:`server.server_app` is the ServerApp component of ``flwr run .`` at the repository root; the code is the
installed package's :mod:`dphype.app.server_app`. ``start-superlink.sh`` starts a SuperLink, ``connect.sh`` names it
in ``$FLWR_HOME/config.toml`` for ``flwr run``.
"""
