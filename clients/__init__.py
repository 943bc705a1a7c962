"""The client side of the bundled DP-Hype app: what each SuperNode's operator runs (see ``clients/README.md``).

:mod:`clients.client_app` is the ClientApp component of ``flwr run .`` at the repository root; the code is the
installed package's :mod:`dphype.app.client_app`. ``start-voter.sh`` and ``start-tally.sh`` start a voting SuperNode
and a tally SuperNode, with the node config :mod:`clients.node_config` builds and checks; ``examples/`` holds
node-config files.
"""
