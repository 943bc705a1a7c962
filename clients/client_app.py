"""The ClientApp component of ``flwr run .`` at the repository root (``[tool.flwr.app.components]``).

It is the installed package's bundled ClientApp, :data:`dphype.app.client_app.app` (DP-Hype's pre-flight, vote and
tally handlers, plus the FedAvg train and evaluate handlers), re-exported: ``dphype demo`` runs the same object
from a wheel, so there is one copy of the code. ``__all__`` names ``app`` for Flower's check of the component
reference, which reads this file without importing it.
"""

from dphype.app.client_app import app

__all__ = ["app"]
