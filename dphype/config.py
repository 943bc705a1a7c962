"""One validated DP-Hype configuration (what the server announces and every layer reads).

`DPHypeConfig` holds the privacy parameters of one selection, validated once on construction and then passed
along; `dphype.protocol.make_vote_request` turns it and a candidate list into the calibrated request every client
checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dphype.checks import DEFAULT_NOISE as DEFAULT_NOISE  # re-exported: the noise kind of a default selection
from dphype.checks import (
    check_clients,
    check_delta,
    check_dropout,
    check_epsilon_budget,
    check_k,
    check_neighbouring,
    check_probability,
)
from dphype.privacy.noise_kinds import resolve_accountant
from dphype.release import ReleaseMode, release_mode
from dphype.selection.rules import DEFAULT_RULE, check_rule

#: Run-config spelling of each field (Flower run configs use dashes).
RUN_CONFIG_KEYS: dict[str, str] = {
    "epsilon": "epsilon",
    "delta": "delta",
    "k": "k",
    "clients": "clients",
    "dropout": "dropout",
    "noise": "noise",
    "accountant": "accountant",
    "neighbouring": "neighbouring",
    "rule": "rule",
    "min_success": "min-success",
    "release": "release",
    "ballot": "ballot",
}


@dataclass(frozen=True)
class DPHypeConfig:
    """The privacy parameters of one DP-Hype selection (Algorithm 1, line 1's inputs), validated and normalised.

    Attributes:
        epsilon: The budget of the release, in ``(0, MAX_EPSILON]`` (`dphype.checks.MAX_EPSILON`).
        delta: Its ``delta``.
        k: Votes per client.
        clients: The number ``n`` of clients that take part, in ``[2, MAX_CLIENTS]``; each noise share is
            calibrated for it.
        dropout: Tolerated dropout fraction ``xi`` in ``[0, 1)``: any ``ceil((1 - xi) n)`` survivors carry the full
            noise, fewer release nothing.
        noise: A noise kind's name (`dphype.privacy.noise_kinds`; default ``"skellam"``).
        accountant: An accountant valid for the noise kind, or ``None`` / ``"auto"`` for its default; stored
            resolved.
        neighbouring: ``"replace-one"`` (the paper's, L2 sensitivity ``sqrt(2k)``) or ``"add-remove"`` (``sqrt(k)``).
        rule: The server's selection rule on a released sum (`dphype.selection.rules.rule_names`).
        min_success: Refuse to run when the planner's consensus scenario simulates a smaller chance of a good pick
            (`dphype.selection.planner.check_plan`; 0: never refuse, only warn below one half).
        release: The release mode's name (`dphype.release.RELEASE_MODES`; `mode` is the mode itself; default
            ``"sum"``). The winner-only ``"argmax"`` is ``epsilon``-DP with noise independent of ``k`` (pure but for
            its MPC sampler's delta); ``delta``, ``noise`` and ``accountant`` then concern only composition, and
            ``rule`` does not apply.
        ballot: How a client turns its scores into its ballot (`dphype.selection.voting.Ballot`); ``None`` or
            ``"default"``: the mode's `dphype.release.ReleaseMode.default_ballot`. Stored resolved and canonical;
            `replace` with a new ``release`` and no ``ballot`` takes the new mode's default.

    Raises:
        ValueError: If a field is out of range or names an unknown noise, accountant, neighbouring, rule, release
            mode or ballot.
    """

    epsilon: float
    delta: float
    k: int
    clients: int
    dropout: float = 0.0
    noise: str = DEFAULT_NOISE
    accountant: str | None = None
    neighbouring: str = "replace-one"
    rule: str = DEFAULT_RULE
    min_success: float = 0.0
    release: str = "sum"
    ballot: str | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise the validated values in place
        set_(self, "epsilon", check_epsilon_budget(self.epsilon))
        set_(self, "delta", check_delta(self.delta))
        set_(self, "k", check_k(self.k))
        set_(self, "clients", check_clients(self.clients))
        set_(self, "dropout", check_dropout(self.dropout))
        set_(self, "accountant", resolve_accountant(self.accountant, self.noise))
        set_(self, "neighbouring", check_neighbouring(self.neighbouring))
        set_(self, "rule", check_rule(self.rule))
        set_(self, "min_success", check_probability("min_success", self.min_success))
        set_(self, "release", release_mode(self.release).name)
        set_(self, "ballot", self.mode.check_ballot(self.ballot))

    @property
    def mode(self) -> ReleaseMode[Any, Any]:
        """The release mode named by ``release`` (`dphype.release.release_mode`)."""
        return release_mode(self.release)

    def replace(self, **changes: Any) -> DPHypeConfig:
        """A copy with ``changes`` applied and validated; a new ``release`` without ``ballot`` takes its default."""
        if "release" in changes and "ballot" not in changes:
            changes = {**changes, "ballot": None}
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> DPHypeConfig:
        """Read the fields from a Flower run config (keys of `RUN_CONFIG_KEYS`; other keys are ignored).

        Args:
            run_config: The Flower run config.

        Returns:
            The validated configuration.

        Raises:
            ValueError: If a required key (``epsilon``, ``delta``, ``k``, ``clients``) is missing or a value invalid.
        """
        values = read_run_config(cls, run_config, RUN_CONFIG_KEYS)
        missing = [RUN_CONFIG_KEYS[f.name] for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.name not in values]
        if missing:
            raise ValueError(f"run config is missing: {', '.join(missing)}")
        return cls(**values)


def read_run_config(cls: type, run_config: Mapping[str, Any], keys: Mapping[str, str]) -> dict[str, Any]:
    """The values of dataclass ``cls``'s fields that ``run_config`` holds under ``keys``, for ``cls(**values)``.

    An int given for a ``float`` field becomes a float (Flower parses ``--run-config "epsilon=1"`` as an int).

    Args:
        cls: The dataclass.
        run_config: The Flower run config.
        keys: Field name -> run-config key.

    Returns:
        Field name -> value, for the keys that ``run_config`` holds.
    """
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for name, key in keys.items():
        if key in run_config:
            value = run_config[key]
            if types[name] in ("float", float) and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            values[name] = value
    return values
