"""The node config of one SuperNode of the bundled app, for ``clients/start-voter.sh`` and ``clients/start-tally.sh``.

What several nodes share lives in a TOML file (``examples/``): a voter's node policy (the ``dphype-*`` keys of
:data:`dphype.node.policy.POLICY_KEYS`), a tally committee's MPyC addresses (``dphype-tally-parties``). What is
one node's own comes from the command line: a voter's data shard (``partition-id``, ``num-partitions``), a tally's
index and key file. This module merges the two, checks them before the SuperNode starts (a voter's policy as the
node will read it, :meth:`dphype.node.policy.NodePolicy.from_node_config`; a key given twice is refused), and
prints the result in Flower's ``--node-config`` syntax (a TOML file alone could not carry the per-node keys:
``flower-supernode`` takes either a file or ``key=value`` pairs).

Usage (the scripts call it; ``python3 clients/node_config.py --help``)::

    python3 clients/node_config.py voter --partition-id 0 --num-partitions 10 [--file clients/examples/policy.toml]
    python3 clients/node_config.py tally --tally-id 0 --key ~/.flwr/dphype/tally-0.key --file committee.toml
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dphype.flower.local import check_partition, node_config_string
from dphype.flower.tally_node import TALLY_ID, TALLY_KEY_FILE, TALLY_PARTIES, TALLY_TLS, load_tally_key, mpyc_tls_folder
from dphype.node.pki import make_node_key
from dphype.node.policy import IDENTITY_KEY, ROSTER_KEY, NodePolicy, federation_settings, load_membership
from dphype.refusal import Refusal


def read_file(path: str | Path) -> dict[str, Any]:
    """The keys of a node-config TOML file: top-level ``key = value`` lines with a bool, integer, float or string
    value (what Flower's node config holds)."""
    with open(path, "rb") as fh:
        values = tomllib.load(fh)
    for key, value in values.items():
        if not isinstance(value, bool | int | float | str):
            raise ValueError(f"{path}: {key} must be a bool, integer, float or string (a node config holds no "
                             f"tables or arrays), got {type(value).__name__}")
    return values


def merge(shared: Mapping[str, Any], own: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``own`` (this node's keys, from the command line) added to ``shared`` (the file's); a key in both is an
    error naming ``source``."""
    twice = sorted(set(shared) & set(own))
    if twice:
        raise ValueError(f"{source} sets {', '.join(twice)}, which this script sets from its own options: remove "
                         "them from the file")
    return {**own, **shared}


def voter_config(partition_id: int, num_partitions: int, shared: Mapping[str, Any] | None = None,
                 source: str = "the node-config file") -> dict[str, Any]:
    """A voter's node config: its shard of the bundled app's data and the shared keys (its policy); the policy is
    checked as the node will read it."""
    check_partition(partition_id, num_partitions, "--")
    config = merge(shared or {}, {"partition-id": partition_id, "num-partitions": num_partitions}, source)
    NodePolicy.from_node_config(config)  # PolicyError (a ValueError) names the key and its range
    return config


def tally_config(tally_id: int, key: str | Path, shared: Mapping[str, Any],
                 source: str = "the node-config file", mpyc_tls: str | Path | None = None) -> dict[str, Any]:
    """A tally's node config: its index and key file (:mod:`dphype.flower.tally_node`), the folder of its MPyC TLS files
    (``dphype-tally-tls``, checked; none: plain TCP between the tallies) and the committee's shared keys, which must
    name the parties' MPyC addresses (``dphype-tally-parties``)."""
    if tally_id < 0:
        raise ValueError(f"--tally-id must be >= 0, got {tally_id}")
    if not isinstance(shared.get(TALLY_PARTIES), str):
        raise ValueError(f"{source} must set {TALLY_PARTIES} = \"HOST:PORT,HOST:PORT,HOST:PORT\" (the MPyC "
                         "addresses of all tallies, in committee order, the same on every tally)")
    own: dict[str, Any] = {TALLY_ID: tally_id, TALLY_KEY_FILE: str(key)}
    if mpyc_tls is not None:
        own[TALLY_TLS] = str(mpyc_tls_folder(mpyc_tls, tally_id))
    return merge(shared, own, source)


def node_key(path: str | Path) -> Path:
    """The public key file of this SuperNode's Flower authentication key ``path`` (`dphype.node.pki.make_node_key`,
    created if missing), for the SuperLink operator's ``flwr supernode register``."""
    path = Path(path).expanduser()
    public = path.with_name(path.name + ".pub")
    if not path.exists():
        return make_node_key(path)
    if not public.is_file():
        raise ValueError(f"{path} exists without its public key {public}: restore it or remove both")
    return public


def with_federation(config: Mapping[str, Any], role: str, roster: str | None, identity: str | None,
                    tally_key: bytes | None = None) -> dict[str, Any]:
    """``config`` with this node's roster and identity key (absolute paths, as every process of the node reads
    them), checked as the node will: the key must be a member of the roster in ``role`` (a tally's with its committee
    key ``tally_key``). Without a roster the node config must allow an unauthenticated federation itself
    (``dphype-allow-unauthenticated = true``): the node would refuse every request otherwise."""
    if (roster is None) != (identity is None):
        raise ValueError("--roster FILE and --identity FILE go together: the federation's roster and this node's "
                         "identity key (dphype roster keygen)")
    own = {} if roster is None else {ROSTER_KEY: str(Path(roster).expanduser().resolve()),
                                     IDENTITY_KEY: str(Path(str(identity)).expanduser().resolve())}
    merged = merge(config, own, "the node-config file")
    membership = load_membership(*federation_settings(merged))  # Refusal no_roster, PolicyError
    if membership is not None and (membership.member.role != role or (tally_key is not None
                                                                       and membership.member.tally_key != tally_key)):
        raise ValueError(f"--identity is member {membership.name}, a {membership.member.role} of the roster"
                         f"{'' if tally_key is None else ' with another tally key'}: this node is a {role}; add it "
                         f"with `dphype roster add ROSTER --role {role}`")
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print a bundled-app SuperNode's --node-config string, checked.")
    roles = parser.add_subparsers(dest="role", required=True)
    voter = roles.add_parser("voter", help="a voting node: its data shard and policy")
    voter.add_argument("--partition-id", type=int, required=True)
    voter.add_argument("--num-partitions", type=int, required=True)
    voter.add_argument("--file", help="TOML file of shared keys (the node policy, clients/examples/policy.toml)")
    voter.add_argument("--roster", help="the federation's roster (dphype roster init / add)")
    voter.add_argument("--identity", help="this node's private identity key (dphype roster keygen)")
    tally = roles.add_parser("tally", help="a tally node: its index, key file and committee")
    tally.add_argument("--tally-id", type=int, required=True)
    tally.add_argument("--key", required=True, help="this tally's private key file (created if missing)")
    tally.add_argument("--file", required=True,
                       help="TOML file of the committee's keys (clients/examples/tally-committee.toml)")
    tally.add_argument("--roster", help="the federation's roster (dphype roster init / add)")
    tally.add_argument("--identity", help="this tally's private identity key (dphype roster keygen)")
    tally.add_argument("--mpyc-tls",
                       help="folder whose .config/ holds its MPyC TLS files (server/make-certificates.sh)")
    nodekey = roles.add_parser("node-key", help="print the public key file of a SuperNode's Flower authentication "
                               "key, creating the key (EC P-384, OpenSSH format) if missing")
    nodekey.add_argument("--key", required=True, help="the SuperNode's private authentication key file")
    public = roles.add_parser("tally-public-key", help="print a tally's public key in hex (what voters pin in "
                              "dphype-tallies), creating its key file if missing")
    public.add_argument("--key", required=True, help="the tally's private key file")
    args = parser.parse_args(argv)
    if args.role == "tally-public-key":
        print(load_tally_key(args.key).public.hex())
        return 0
    if args.role == "node-key":
        try:
            print(node_key(args.key))
        except (OSError, ValueError) as err:
            print(f"node key: {err}", file=sys.stderr)
            return 2
        return 0
    try:
        shared = read_file(args.file) if args.file else {}
        source = args.file or "the node-config file"
        if args.role == "voter":
            config = with_federation(voter_config(args.partition_id, args.num_partitions, shared, source), "voter",
                                     args.roster, args.identity)
        else:
            config = with_federation(tally_config(args.tally_id, args.key, shared, source, args.mpyc_tls), "tally",
                                     args.roster, args.identity, load_tally_key(args.key).public)
    except Refusal as err:  # no roster, and the operator did not allow an unauthenticated federation
        print(f"node config: {err.detail} (--roster FILE --identity FILE, or dphype-allow-unauthenticated = true "
              "in the node-config file)", file=sys.stderr)
        return 2
    except (OSError, ValueError) as err:  # tomllib.TOMLDecodeError and PolicyError are ValueErrors
        print(f"node config: {err}", file=sys.stderr)
        return 2
    print(node_config_string(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
