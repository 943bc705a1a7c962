"""A node's own privacy policy, and the check of every vote request against it.

`NodePolicy` holds the node's own limits, read from its node config (or, where Flower's simulation fixes that,
the ClientApp's environment, `POLICY_ENV`), never from the run config; the defaults are safe (`POLICY_KEYS`).
`check_vote_request` checks a vote request against them before the node scores anything: it recomputes the
epsilon of the noise it is asked to add with its own delta, accountant and neighbouring relation, at the fewest
contributors the protocol allows, and refuses above its limits. The threat model these checks enforce, item by
item, and what stays out of scope: docs/design/node-policy.md.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path
from typing import Any

from dphype.checks import NEIGHBOURING
from dphype.config import DPHypeConfig
from dphype.privacy.noise import min_survivors
from dphype.protocol import EPSILON_RTOL, VoteRequest, check_request
from dphype.refusal import Refusal
from dphype.secure.roster import IdentityKey, Membership, Roster, RosterError
from dphype.selection.candidates import CandidateList, load_candidates

#: Node-config keys (``flower-supernode --node-config "dphype-max-epsilon=1 ..."``): default and meaning.
POLICY_KEYS: dict[str, tuple[Any, str]] = {
    "dphype-max-epsilon": (1.0, "largest epsilon one vote may cost this node (at dphype-max-delta), > 0"),
    "dphype-max-delta": (1e-5, "largest delta a request may announce; this node's delta, in (0, 1)"),
    "dphype-min-clients": (10, "fewest clients, and fewest contributors ceil((1 - xi) n), a request may name, >= 2"),
    "dphype-min-neighbours": (4, "fewest other SecAgg+ neighbours this node shares its secrets with, >= 1"),
    "dphype-lifetime-epsilon": (4.0, "budget for all votes of this node, composed in RDP, at dphype-max-delta, > 0"),
    "dphype-ledger": (None, "path of this node's privacy ledger (default: $FLWR_HOME/dphype/ledger.json, or "
                      "ledger-partition-<id>.json there when the node config has a partition-id)"),
    "dphype-candidates": (None, "this node's own copy of the candidate list (path or spec; default: none)"),
    "dphype-accountant": ("auto", "auto (analytic for Gaussian, RDP for Skellam) or rdp"),
    "dphype-neighbouring": ("replace-one", "neighbouring relation of this node's guarantee: replace-one or add-remove"),
    "dphype-tallies": (None, "argmax mode: the only tallies this node seals shares to, comma-separated hex X25519 "
                       "public keys (clients/start-tally.sh --print-public-key); default: none, so this node "
                       "refuses every argmax request until its operator pins the committee"),
    "dphype-roster": (None, "the federation's roster (a file of `dphype roster init`/`add`): the members this node "
                      "accepts, its tallies pinning the committee; default: none, so this node refuses unless "
                      "dphype-allow-unauthenticated = true"),
    "dphype-identity": (None, "this node's private identity key file (`dphype roster keygen`, mode 0600); a member "
                        "of dphype-roster; needed with it"),
    "dphype-allow-unauthenticated": (False, "true: take part without a roster (no member authentication: a server "
                                     "can invent members); default false"),
}
_PREFIX = "dphype-"
#: The node-config key of the tallies a node pins (argmax mode).
TALLIES_KEY = "dphype-tallies"
#: The node-config keys of a node's federation: its roster, its identity key, and the opt-out of both.
ROSTER_KEY, IDENTITY_KEY, UNAUTHENTICATED_KEY = "dphype-roster", "dphype-identity", "dphype-allow-unauthenticated"
#: Environment variable with policy keys in ``--node-config`` syntax (``"dphype-max-epsilon=2 ..."``), read in
#: the ClientApp's process: the node operator's channel where the node config is not theirs to set (Flower's
#: simulation fixes it to ``partition-id``/``num-partitions``). Keys of the node config win over it.
POLICY_ENV = "DPHYPE_NODE_POLICY"


class PolicyError(ValueError):
    """The node's policy (its node config or a file it names) is invalid.

    Attributes:
        refusal_code: What a client tells the server (`dphype.refusal.as_refusal`).
    """

    refusal_code = "node_policy"  # what a client tells the server (dphype.refusal.as_refusal)


def _field(key: str) -> str:
    """The `NodePolicy` field of a node-config key: ``dphype-max-epsilon`` -> ``max_epsilon``."""
    return key[len(_PREFIX):].replace("-", "_")


def default_ledger_path(partition_id: int | None = None) -> Path:
    """``$FLWR_HOME/dphype/ledger.json`` (``~/.flwr``), or ``ledger-partition-<id>.json`` with a ``partition_id``."""
    name = "ledger.json" if partition_id is None else f"ledger-partition-{partition_id}.json"
    return Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr").expanduser() / "dphype" / name


def run_ledger_path(run_id: int, partition_id: int | None = None) -> Path:
    """A simulated node's per-run ledger: `default_ledger_path`'s name under ``$FLWR_HOME/dphype/runs/run-<id>/``."""
    return default_ledger_path(partition_id).parent / "runs" / f"run-{run_id}" / default_ledger_path(partition_id).name


def _number(key: str, value: Any, low: float, high: float) -> float:
    """A finite number in the open interval ``(low, high)`` (a string from the node config is parsed)."""
    try:
        x = float(value) if isinstance(value, (Real, str)) and not isinstance(value, bool) else math.nan
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and low < x < high):
        raise PolicyError(f"node config {key} must be a number in ({low:g}, {high:g}), got {value!r}")
    return x


def _integer(key: str, value: Any, low: int) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
        raise PolicyError(f"node config {key} must be an integer >= {low}, got {value!r}")
    return int(value)


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise PolicyError(f"node config {key} must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _flag(key: str, value: Any) -> bool:
    """``true`` or ``false`` (a TOML boolean from the node config, or the same word as a string)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise PolicyError(f"node config {key} must be true or false, got {value!r}")


def federation_settings(node_config: Mapping[str, Any]) -> tuple[str | None, str | None, bool]:
    """The federation keys of a voter's or tally's node config: roster, identity and the unauthenticated opt-out.

    Args:
        node_config: The node config.

    Returns:
        The roster's path, the identity key's path (each ``None`` when not set) and the opt-out.

    Raises:
        PolicyError: If a value is invalid, or only one of roster and identity is set.
    """
    roster = node_config.get(ROSTER_KEY)
    identity = node_config.get(IDENTITY_KEY)
    roster = None if roster is None else _path(ROSTER_KEY, roster)
    identity = None if identity is None else _path(IDENTITY_KEY, identity)
    if (roster is None) != (identity is None):
        raise PolicyError(f"node config {ROSTER_KEY} and {IDENTITY_KEY} go together: set both\n"
                          "the roster names the members, the identity key is this node's (dphype roster keygen)")
    return roster, identity, _flag(UNAUTHENTICATED_KEY, node_config.get(UNAUTHENTICATED_KEY, False))


def load_membership(roster: str | None, identity: str | None, allow_unauthenticated: bool) -> Membership | None:
    """A node's membership in its federation, or ``None`` when its operator allowed an unauthenticated one.

    Args:
        roster: The roster file (``dphype-roster``), or ``None``.
        identity: The node's identity key file (``dphype-identity``), or ``None``.
        allow_unauthenticated: ``dphype-allow-unauthenticated``.

    Returns:
        The membership, or ``None`` (no roster, allowed).

    Raises:
        Refusal: ``no_roster`` when there is no roster and the operator did not allow an unauthenticated federation.
        PolicyError: If the roster or the key cannot be read, or the key is not a member's.
    """
    if roster is None or identity is None:
        if allow_unauthenticated:
            return None
        raise Refusal("no_roster", "this node takes part only in a federation of known members: set "
                      f"{ROSTER_KEY} and {IDENTITY_KEY}, or {UNAUTHENTICATED_KEY} = true")
    try:
        return Roster.load(roster).membership(IdentityKey.load(identity))
    except RosterError as err:
        raise PolicyError(f"node config {ROSTER_KEY}={roster!r} / {IDENTITY_KEY}: {err}") from None


def _path(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise PolicyError(f"node config {key} must be a non-empty path (quote it: {key}=\"/path\"), got {value!r}")
    return value


@dataclass(frozen=True)
class NodePolicy:
    """What this node allows, from its node config (`from_node_config`); the fields are `POLICY_KEYS`.

    Attributes:
        max_epsilon: Largest epsilon one vote may cost this node (at ``max_delta``), > 0.
        max_delta: Largest delta a request may announce; this node's delta, in (0, 1).
        min_clients: Fewest clients, and fewest contributors ``ceil((1 - xi) n)``, a request may name, >= 2.
        min_neighbours: Fewest other SecAgg+ neighbours this node shares its secrets with, >= 1.
        lifetime_epsilon: Budget for all votes of this node, composed in RDP, at ``max_delta``, > 0.
        ledger: Absolute path of this node's privacy ledger (default: `default_ledger_path`).
        candidates: Path or spec of this node's own copy of the candidate list, or ``None``.
        accountant: ``"auto"`` (analytic for Gaussian, RDP for Skellam) or ``"rdp"``.
        neighbouring: Neighbouring relation of this node's guarantee: ``"replace-one"`` or ``"add-remove"``.
        ledger_scope: ``"persistent"`` or ``"per-run"`` (a simulated node without a named ledger).
        tallies: Argmax mode: the only tallies this node seals shares to, comma-separated hex X25519 public
            keys, or ``None`` (no committee: every argmax request is refused, unless the roster names tallies).
        roster: The federation's roster file (`dphype.secure.roster.Roster`), or ``None``.
        identity: This node's private identity key file, a member of ``roster``; set with it.
        allow_unauthenticated: Whether this node takes part without a roster (no member authentication).

    Raises:
        PolicyError: If a field is invalid (named by its node-config key).
    """

    max_epsilon: float = 1.0
    max_delta: float = 1e-5
    min_clients: int = 10
    min_neighbours: int = 4
    lifetime_epsilon: float = 4.0
    ledger: Path | None = None
    candidates: str | None = None
    accountant: str = "auto"
    neighbouring: str = "replace-one"
    ledger_scope: str = "persistent"
    tallies: str | None = None
    roster: str | None = None
    identity: str | None = None
    allow_unauthenticated: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: store the validated values
        inf = math.inf
        set_(self, "max_epsilon", _number("dphype-max-epsilon", self.max_epsilon, 0, inf))
        set_(self, "max_delta", _number("dphype-max-delta", self.max_delta, 0, 1))
        set_(self, "min_clients", _integer("dphype-min-clients", self.min_clients, 2))
        set_(self, "min_neighbours", _integer("dphype-min-neighbours", self.min_neighbours, 1))
        set_(self, "lifetime_epsilon", _number("dphype-lifetime-epsilon", self.lifetime_epsilon, 0, inf))
        ledger = default_ledger_path() if self.ledger is None else Path(self.ledger)
        set_(self, "ledger", ledger.expanduser().absolute())
        if self.candidates is not None:
            set_(self, "candidates", _path("dphype-candidates", self.candidates))
        set_(self, "accountant", _choice("dphype-accountant", self.accountant, ("auto", "rdp")))
        set_(self, "neighbouring", _choice("dphype-neighbouring", self.neighbouring, NEIGHBOURING))
        set_(self, "ledger_scope", _choice("ledger_scope", self.ledger_scope, ("persistent", "per-run")))
        if self.tallies is not None:
            _ = self._pinned_tallies()
        roster, identity, allow = federation_settings({ROSTER_KEY: self.roster, IDENTITY_KEY: self.identity,
                                                       UNAUTHENTICATED_KEY: self.allow_unauthenticated})
        set_(self, "roster", roster)
        set_(self, "identity", identity)
        set_(self, "allow_unauthenticated", allow)

    def _pinned_tallies(self) -> tuple[bytes, ...] | None:
        if self.tallies is None:
            return None
        try:
            keys = tuple(bytes.fromhex(h.strip()) for h in str(self.tallies).split(",") if h.strip())
        except ValueError:
            keys = ()
        if not keys or any(len(key) != 32 for key in keys):
            raise PolicyError("node config dphype-tallies must be comma-separated 64-digit hex X25519 public keys")
        return keys

    def known_tallies(self) -> tuple[bytes, ...] | None:
        """The tally keys this node trusts: the roster's, narrowed by ``dphype-tallies``; ``None``: no committee vote.

        Returns:
            The keys (32 bytes each), or ``None``.

        Raises:
            PolicyError: If ``tallies`` is not comma-separated 64-digit hex keys, or the roster cannot be read.
        """
        pinned = self._pinned_tallies()
        if self.roster is None:
            return pinned
        try:
            listed = Roster.load(self.roster).tally_keys()
        except RosterError as err:
            raise PolicyError(f"node config {ROSTER_KEY}={self.roster!r}: {err}") from None
        return listed if pinned is None else tuple(key for key in pinned if key in listed)

    def membership(self) -> Membership | None:
        """This node's membership (`load_membership` of its roster and identity)."""
        return load_membership(self.roster, self.identity, self.allow_unauthenticated)

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any], *, run_id: int | None = None) -> NodePolicy:
        """Read the ``dphype-*`` keys of a Flower node config; an unknown one is an error (no misspelt limit).

        A ``partition-id`` names the default ledger; a simulated node's ``run_id`` makes it `run_ledger_path`.

        Args:
            node_config: The Flower node config.
            run_id: The run id of a simulated node; ``None`` for a deployed one.

        Returns:
            The validated policy.

        Raises:
            PolicyError: If a ``dphype-*`` key is unknown or a value is invalid.
        """
        unknown = sorted(k for k in node_config if str(k).startswith(_PREFIX) and k not in POLICY_KEYS)
        if unknown:
            raise PolicyError(f"unknown node config key(s) {', '.join(unknown)}; known: {', '.join(POLICY_KEYS)}")
        values = {_field(key): node_config[key] for key in POLICY_KEYS if key in node_config}
        partition = (_integer("partition-id", node_config["partition-id"], 0) if "partition-id" in node_config
                     else None)
        if "ledger" in values:
            values["ledger"] = Path(_path("dphype-ledger", values["ledger"]))
        elif run_id is not None:
            values["ledger"], values["ledger_scope"] = run_ledger_path(run_id, partition), "per-run"
        elif partition is not None:
            values["ledger"] = default_ledger_path(partition)
        return cls(**values)

    def own_candidates(self) -> CandidateList | None:
        """The node's own copy of the candidate list, or ``None``; `PolicyError` if it cannot be loaded."""
        if self.candidates is None:
            return None
        try:
            return load_candidates(self.candidates)
        except (OSError, ValueError) as err:  # the message stays on the node (it may quote the file)
            raise PolicyError(f"node config dphype-candidates={self.candidates!r} cannot be loaded: {err}") from err

    def to_dict(self) -> dict[str, Any]:
        """Node-config key -> value (JSON-friendly, the ledger as a string)."""
        out = {key: getattr(self, _field(key)) for key in POLICY_KEYS}
        out["dphype-ledger"] = str(self.ledger)
        return out


@dataclass(frozen=True)
class VoteGuarantee:
    """What one vote costs this node: the release its noise share allows with the fewest allowed contributors.

    Attributes:
        noise: The noise kind.
        k: Votes per client.
        total_std: The std of the summed noise of the fewest allowed contributors.
        survivors: The fewest allowed contributors, ``ceil((1 - xi) n)``.
        epsilon: The release's epsilon at ``delta``.
        delta: This node's delta.
        neighbouring: This node's neighbouring relation.
    """

    noise: str
    k: int
    total_std: float
    survivors: int
    epsilon: float
    delta: float
    neighbouring: str


def check_vote_request(request: VoteRequest, policy: NodePolicy) -> VoteGuarantee:
    """Refuse a request that is not what it claims or that this node's policy does not allow (threat model 2, 10).

    In order: `dphype.protocol.check_request` with the node's candidate copy; the tally committee against the
    known tallies; the announced delta and epsilon (`dphype.release.ReleaseMode.announced_epsilon`) against the
    limits; the fewest contributors against ``min_clients``; and the worst-case epsilon recomputed at the node's
    own delta, accountant and relation (`dphype.release.ReleaseMode.node_cost`). Details carry only numbers derived
    from the request, never the node's limits.

    Args:
        request: The server's request.
        policy: This node's policy.

    Returns:
        The guarantee of one vote, at this node's delta, accountant and neighbouring relation.

    Raises:
        Refusal: ``candidate_mismatch``, ``noise_too_small`` and the other refusals of
            `dphype.protocol.check_request`; ``tally_committee``, ``policy_delta``, ``policy_epsilon`` or
            ``policy_clients``.
        PolicyError: If the policy's own candidate list or tally keys are invalid.
    """  # noqa: DOC503
    check_request(request, local_candidates=policy.own_candidates())
    mode, cfg = request.mode, request.config
    known = policy.known_tallies()
    try:
        committee = mode.aggregator.check_tallies(request.tallies, known=known)
    except ValueError as err:
        raise Refusal("tally_committee", str(err)) from None
    if committee and known is None:  # safe by default: never a committee the server names
        raise Refusal("tally_committee", "this node's operator pinned no tallies: it seals shares only to the tally "
                      "keys in its node config dphype-tallies")
    check_delta_limit(cfg, policy)
    announced = mode.announced_epsilon(request)
    if announced is not None and announced > policy.max_epsilon * (1 + EPSILON_RTOL):
        raise Refusal("policy_epsilon", f"announced epsilon {announced:.6g} is above this node's limit",
                      local=f"announced epsilon {announced:.6g} > dphype-max-epsilon={policy.max_epsilon:.6g}")
    survivors = check_clients_limit(cfg, policy)
    cost = mode.node_cost(request, survivors=survivors, delta=policy.max_delta, accountant=policy.accountant,
                          neighbouring=policy.neighbouring)
    eps = cost.epsilon
    if eps > policy.max_epsilon * (1 + EPSILON_RTOL):
        raise Refusal("policy_epsilon", f"{cost.claim} ({policy.neighbouring}), above this node's limit",
                      local=f"epsilon {eps:.4g} at dphype-max-delta={policy.max_delta:.3g} ({cost.accountant} "
                      f"accountant, {survivors} contributors) > dphype-max-epsilon={policy.max_epsilon:.6g}")
    return VoteGuarantee(noise=cost.noise, k=cfg.k, total_std=cost.total_std, survivors=survivors, epsilon=eps,
                         delta=policy.max_delta, neighbouring=policy.neighbouring)


def check_delta_limit(config: DPHypeConfig, policy: NodePolicy) -> None:
    """Refuse (``policy_delta``) a configuration whose delta is above the node's ``dphype-max-delta``."""
    if config.delta > policy.max_delta:
        raise Refusal("policy_delta", f"announced delta {config.delta:.3g} is above this node's limit",
                      local=f"announced delta {config.delta:.3g} > dphype-max-delta={policy.max_delta:.3g}")


def check_clients_limit(config: DPHypeConfig, policy: NodePolicy) -> int:
    """The fewest contributors ``ceil((1 - xi) n)``; refused (``policy_clients``) below ``dphype-min-clients``."""
    survivors = min_survivors(config.clients, config.dropout)
    if survivors < policy.min_clients:
        raise Refusal("policy_clients", f"{config.clients} clients with dropout {config.dropout:g} leave {survivors} "
                      "contributors, fewer than this node requires",
                      local=f"{survivors} contributors < dphype-min-clients={policy.min_clients}")
    return survivors


#: How to resolve each refusal, naming the setting on either side; the server may see it (it names keys and
#: remedies, never this node's values), the node logs it beside its own detail. Codes without an entry need
#: no remedy beyond their reason.
REMEDIES: dict[str, str] = {
    "policy": "lower the run's epsilon or delta, or run with more clients; otherwise the node operators read their "
              "node's log, which names the key to change (dphype-max-epsilon, dphype-max-delta, dphype-min-clients "
              "or dphype-lifetime-epsilon)",
    "policy_epsilon": "lower the run's epsilon, or the node operators raise dphype-max-epsilon in their node config",
    "policy_delta": "lower the run's delta, or the node operators raise dphype-max-delta in their node config",
    "policy_clients": f"run with more clients or a smaller dropout, or the node operators lower dphype-min-clients "
                      f"(default {POLICY_KEYS['dphype-min-clients'][0]}) in their node config",
    "lifetime_budget": "the node has spent its lifetime budget (dphype-lifetime-epsilon); only its operator can "
                       "raise it or archive its ledger (dphype ledger --archive)",
    "candidate_mismatch": "send the candidate list the nodes hold, or the node operators update dphype-candidates",
    "node_policy": "the node's operator must fix its dphype-* node config (its log names the key)",
    "ledger_error": "the node's operator must repair, or archive, the ledger named by dphype-ledger (see its log)",
    "secagg_neighbours": "use more clients or more SecAgg+ shares (num_shares), or the node operators lower "
                         "dphype-min-neighbours in their node config",
    "task_error": "the ClientApp's task raised: its traceback is in the node's log",
    "uninformative_scores": "check the ClientApp's task on that node: its scores do not rank the candidates (a "
                            "constant metric, empty local data or a failed evaluation)",
    "client_error": "an unexpected error on the node: its traceback is in the node's log",
    "noise_too_small": "the server must calibrate sigma for the announced (epsilon, delta)",
    "tally_committee": "the node operators pin the committee's tally keys in their node config, dphype-tallies="
                       "'<hex0>,<hex1>,<hex2>' (each printed by its tally's operator with clients/start-tally.sh "
                       "--print-public-key), and the server names exactly those tallies",
    "release_mode": "the server must run the stage of the release mode the nodes approved (DPHype.start does)",
    "roster": "every node and tally must run with the same roster (dphype roster show ROSTER prints its fingerprint) "
              "and send only its members' signed keys and shares; a roster that changed needs a new pre-flight",
    "no_roster": "the node operators set dphype-roster and dphype-identity in their node config (dphype roster "
                 "keygen / init / add), or explicitly dphype-allow-unauthenticated = true",
}
#: The remedies of the policy refusals where the nodes are simulated (``dphype run``, ``dphype demo``): their
#: operator's channel is the `POLICY_ENV` environment variable of the command that starts the simulation, not a
#: node config.
SIMULATED_REMEDIES: dict[str, str] = {
    "policy_epsilon": f"lower the run's epsilon, or raise the simulated nodes' limit: "
                      f"{POLICY_ENV}='dphype-max-epsilon=E' in the environment of `dphype run`",
    "policy_delta": f"lower the run's delta, or raise the simulated nodes' limit: {POLICY_ENV}='dphype-max-delta=D' in "
                    "the environment of `dphype run`",
    "policy_clients": f"run with more clients (--clients N) or a smaller dropout, or lower the simulated nodes' limit "
                      f"(default {POLICY_KEYS['dphype-min-clients'][0]}): {POLICY_ENV}='dphype-min-clients=N' in the "
                      "environment of `dphype run`",
}
