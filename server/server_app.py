"""The ServerApp component of ``flwr run .`` at the repository root (``[tool.flwr.app.components]``).

It is the installed package's bundled ServerApp, :data:`dphype.app.server_app.app` (DP-Hype's selection, then FedAvg),
re-exported: ``dphype demo`` runs the same object from a wheel, so there is one copy of the code. ``__all__`` names
``app`` for Flower's check of the component reference, which reads this file without importing it, and
``candidates``, which ``dphype run`` calls to check the run config before Flower starts.
"""

from dphype.app.server_app import app, candidates

__all__ = ["app", "candidates"]
