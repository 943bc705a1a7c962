"""A simulation's federation: a per-run roster and identity keys for simulated nodes, so development needs no set-up.

**A development convenience, never for deployments.** In Flower's simulation (``flwr run .``, ``dphype run``,
``dphype demo``) and in the in-process `dphype.flower.local.LocalGrid`, one operator runs every node, so
`simulated_federation` gives every node of a run the same roster (`dphype.secure.roster.Roster`) without any
operator step: each member's identity key is derived (HKDF-SHA256) from a per-run secret, a file of 32 random
bytes in a private folder (mode 0700, the file 0600) created atomically by the first node of the run that needs it
and keyed by the run id, so all Ray workers of one machine agree on it. Whoever can read that folder can sign as
any simulated member: in a deployment every operator makes its own identity key (``dphype roster keygen``) and the
federation agrees on one roster file (``dphype roster init`` / ``add``), read from each node's own config.

Members: voters ``node-<partition>`` for the partitions ``0 .. voters - 1`` and tallies ``tally-<j>`` with their
X25519 committee keys. The roster file's name holds its digest, so nodes that compute the same roster share one
file and a run with other members gets another.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from dphype.files import write_once
from dphype.node.policy import IDENTITY_KEY, ROSTER_KEY, UNAUTHENTICATED_KEY
from dphype.secure.roster import IdentityKey, Member, Roster

#: The folder of a run's federation, inside the run's folder (`dphype.node.policy.run_ledger_path`'s parent).
FEDERATION_FOLDER = "federation"
_SECRET_BYTES = 32
#: The federations this process has made: (folder, run, voters, tallies) -> (roster, its file, the run's secret).
_MADE: dict[tuple[str, int, int, tuple[bytes, ...]], tuple[Roster, Path, bytes]] = {}


def voter_name(partition: int) -> str:
    """The member name of the simulated voter with ``partition``: ``"node-<partition>"``."""
    return f"node-{int(partition)}"


def tally_name(index: int) -> str:
    """The member name of simulated tally ``index``: ``"tally-<index>"``."""
    return f"tally-{int(index)}"


def federation_set(node_config: Mapping[str, Any]) -> bool:
    """Whether ``node_config`` sets a roster or the unauthenticated opt-in (the simulation then leaves it alone)."""
    return ROSTER_KEY in node_config or UNAUTHENTICATED_KEY in node_config


def _identity(secret: bytes, name: str) -> IdentityKey:
    seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=b"dphype-simulated-identity|" + name.encode()).derive(secret)
    return IdentityKey.from_seed(seed)


def simulated_federation(folder: str | os.PathLike[str], run_id: int, member: str, voters: int,
                         tally_keys: Sequence[bytes] = ()) -> dict[str, str]:
    """The node-config keys that make ``member`` a member of the run's simulated federation (module docstring).

    Args:
        folder: The run's folder (the secret, the roster and the key files go in its `FEDERATION_FOLDER`).
        run_id: The run id (the federation's name).
        member: This node's member name (`voter_name`, `tally_name`).
        voters: The number of simulated voters.
        tally_keys: The committee's X25519 public keys, in committee order (none in a run without tallies).

    Returns:
        ``dphype-roster`` and ``dphype-identity``: the roster file and this node's identity key file.

    Raises:
        ValueError: If ``member`` is not one of the run's members.
    """
    home = Path(folder).expanduser().absolute() / FEDERATION_FOLDER
    cache = (str(home), int(run_id), int(voters), tuple(tally_keys))
    if cache not in _MADE:  # once per process: a Ray worker serves many nodes of the run, each message
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_once(home / "secret", os.urandom(_SECRET_BYTES))
        secret = (home / "secret").read_bytes()
        names = [voter_name(i) for i in range(int(voters))]
        members = [Member(name, "voter", _identity(secret, name).public) for name in names]
        members += [Member(tally_name(j), "tally", _identity(secret, tally_name(j)).public, key)
                    for j, key in enumerate(tally_keys)]
        roster = Roster(f"simulation-run-{int(run_id)}", tuple(members))
        roster_file = home / f"roster-{roster.digest()[:16]}.json"
        write_once(roster_file, (roster.to_json() + "\n").encode())
        _MADE[cache] = (roster, roster_file, secret)
    roster, roster_file, secret = _MADE[cache]
    try:
        roster.member(member)
    except ValueError:
        raise ValueError(f"{member!r} is not a member of this simulation's federation ({len(roster.members)} "
                         "members)") from None
    key_file = home / f"{member}.key"
    if not key_file.exists():  # a node's first message (deriving the key costs more than the check)
        write_once(key_file, _identity(secret, member).private_pem())
    return {ROSTER_KEY: str(roster_file), IDENTITY_KEY: str(key_file)}
