"""Run configuration of the dphype Flower apps (``[tool.flwr.app.config]`` in pyproject.toml).

Both the ServerApp and the ClientApp read the same run config; ``flwr run`` fills
it from pyproject.toml plus ``--run-config`` overrides. Keys use dashes there
(``fedavg-rounds``) and underscores here (``fedavg_rounds``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from dphype.accounting import check_budget, check_int, check_positive


@dataclass(frozen=True)
class AppConfig:
    """Everything one DP-Hype + FedAvg run needs.

    ``clients`` is the number of SuperNodes that take part (DP-Hype calibrates each
    client's noise share for it); ``accountant = "auto"`` picks the default for the
    noise kind. ``connect_timeout`` bounds the wait (seconds) for ``clients`` nodes
    to connect; ``round_timeout`` bounds each SecAgg+ stage and each FedAvg round,
    so a vanished SuperNode counts as dropped out instead of stalling the run.
    """

    dataset: str
    epsilon: float
    delta: float
    k: int
    dropout: float
    noise: str
    accountant: str
    candidates: str
    seed: int
    fedavg_rounds: int
    local_epochs: int
    clients: int
    connect_timeout: float = 600.0
    round_timeout: float = 1800.0

    def __post_init__(self) -> None:
        check_budget(self.epsilon, self.delta, self.k, clients=self.clients, dropout=self.dropout)
        for name in ("fedavg_rounds", "local_epochs"):
            check_int(name.replace("_", "-"), getattr(self, name), 1)
        for name in ("connect_timeout", "round_timeout"):
            check_positive(name.replace("_", "-"), getattr(self, name))

    @property
    def accountant_or_default(self) -> str | None:
        """The accountant, or None (default for the noise kind) for ``"auto"``."""
        return None if self.accountant == "auto" else self.accountant

    def vote_parameters(self) -> dict[str, Any]:
        """Keyword arguments of :func:`dphype.strategy.run_dphype` / ``make_vote_request`` for this run."""
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "k": self.k,
            "clients": self.clients,
            "dropout": self.dropout,
            "noise": self.noise,
            "accountant": self.accountant_or_default,
        }

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> AppConfig:
        """Parse a Flower run config; unknown keys are refused, and every field without a
        default (all but the timeouts) must be present."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        given = {key.replace("-", "_"): value for key, value in run_config.items()}
        unknown = sorted(set(given) - set(fields))
        if unknown:
            raise ValueError(f"unknown run-config keys: {', '.join(unknown)}")
        required = {n for n, f in fields.items() if f.default is dataclasses.MISSING}
        missing = sorted(required - set(given))
        if missing:
            raise ValueError(f"run config is missing: {', '.join(m.replace('_', '-') for m in missing)}")
        values: dict[str, Any] = {}
        for name, value in given.items():
            kind = fields[name].type
            if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)  # "epsilon=1" on the command line arrives as an int
            values[name] = value
        return cls(**values)
