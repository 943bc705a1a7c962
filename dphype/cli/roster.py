"""``dphype roster``: create and inspect a federation's roster and its members' identity keys (`dphype.secure.roster`).

* ``dphype roster keygen --name N [--role voter|tally] [--out KEYFILE]``: a new private identity key (mode 0600;
  never overwritten; by default ``$FLWR_HOME/dphype/N.id``, outside any checkout), its public key in
  ``KEYFILE.pub`` (hex), and the command that adds it to the roster in its role (both roles' without ``--role``);
* ``dphype roster init --federation F --out ROSTER``: an empty roster;
* ``dphype roster add ROSTER --name N --role voter|tally --identity PUB [--tally-key PUB]``: one member more (a
  tally with its X25519 committee key, `clients/start-tally.sh --print-public-key`);
* ``dphype roster show ROSTER``: the federation, its members and roles, its digest and fingerprint;
* ``dphype roster check ROSTER --identity KEYFILE``: whether this key is a member (exit status 2 if not).

Every operator of the federation runs with the same roster file (compare ``show``'s fingerprint) and names it and
its own key in its node config: ``dphype-roster = "/path/roster.json"``, ``dphype-identity = "/path/key"``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from dphype.secure.roster import ROLES, IdentityKey, Member, Roster, RosterError, check_name, public_key_bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``roster`` actions and their options.

    Args:
        parser: The sub-command's parser.
    """
    actions = parser.add_subparsers(dest="action", required=True, metavar="{keygen,init,add,show,check}")
    keygen = actions.add_parser("keygen", help="make a member's private identity key (mode 0600)")
    keygen.add_argument("--name", required=True, help="the member's name in the roster (letters, digits, . _ -)")
    keygen.add_argument("--role", choices=ROLES, default=None,
                        help="the member's role, for the roster command it prints (default: both roles' commands)")
    keygen.add_argument("--out", default=None, help="the new private key file (never overwritten; default "
                        "$FLWR_HOME/dphype/NAME.id, FLWR_HOME defaulting to ~/.flwr)")
    init = actions.add_parser("init", help="write an empty roster")
    init.add_argument("--federation", required=True, help="the federation's name (letters, digits, . _ -)")
    init.add_argument("--out", required=True, help="the roster file to write (not overwritten)")
    add = actions.add_parser("add", help="add a member to a roster")
    add.add_argument("roster", help="the roster file")
    add.add_argument("--name", required=True, help="the member's name")
    add.add_argument("--role", required=True, help="voter or tally")
    add.add_argument("--identity", required=True, help="its Ed25519 public key (hex or base64; `roster keygen` prints "
                     "it)")
    add.add_argument("--tally-key", default=None, help="a tally's X25519 committee key (hex or base64; "
                     "clients/start-tally.sh --print-public-key prints it)")
    show = actions.add_parser("show", help="list a roster's members and its digest and fingerprint")
    show.add_argument("roster", help="the roster file")
    check = actions.add_parser("check", help="is this identity key a member of the roster?")
    check.add_argument("roster", help="the roster file")
    check.add_argument("--identity", required=True, help="the private identity key file")
    for action in (keygen, init, add, show, check):  # also after the action's own options
        action.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                            help="print one JSON object as the last line")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run one ``roster`` action.

    Args:
        args: The parsed options.

    Returns:
        What the action made or found (printed as text, or JSON with ``--json``).

    Raises:
        RosterError: For bad input (a ``ValueError``: exit status 2): a name, role or key that is invalid, a file
            that exists or cannot be read, a member already in the roster, a key that is not a member (``check``);
            the message names the option and the fix.
    """
    if args.action == "keygen":
        name = check_name(args.name, "--name")
        key = IdentityKey.generate()
        path = key.save(args.out if args.out is not None else default_identity_file(name))
        public = path.with_name(path.name + ".pub")
        public.write_text(key.public.hex() + "\n", encoding="utf-8")
        return {"name": name, "key_file": str(path), "public_file": str(public), "identity": key.public.hex(),
                "add": [add_command(name, role, key.public.hex()) for role in ((args.role,) if args.role else ROLES)]}
    if args.action == "init":
        roster = Roster(check_name(args.federation, "--federation"))
        if Path(args.out).expanduser().exists():
            raise RosterError(f"--out {args.out} exists; a roster is never overwritten: choose another --out\n"
                              "or add members to it with `dphype roster add` (init never overwrites)")
        return _described(roster, roster.save(args.out))
    roster = Roster.load(args.roster)
    if args.action == "add":
        if args.role not in ROLES:
            raise RosterError(f"--role must be voter or tally, got {args.role!r}")
        if (args.role == "tally") != (args.tally_key is not None):
            raise RosterError("--tally-key is needed with --role tally and only then: give it for a tally only\n"
                              "(the tally's X25519 committee key, clients/start-tally.sh --print-public-key)")
        member = Member(check_name(args.name, "--name"), args.role, public_key_bytes(args.identity, "--identity"),
                        None if args.tally_key is None else public_key_bytes(args.tally_key, "--tally-key"))
        try:
            roster = roster.with_member(member)
        except RosterError as err:
            raise RosterError(f"cannot add {member.name} to {args.roster}: {err}") from None
        return _described(roster, roster.save(args.roster))
    if args.action == "show":
        return _described(roster, Path(args.roster))
    member = roster.by_identity(IdentityKey.load(args.identity).public)
    return {"member": member.name, "role": member.role, "federation": roster.federation,
            "fingerprint": roster.fingerprint}


def default_identity_file(name: str) -> Path:
    """Where ``keygen`` writes ``name``'s key without ``--out``: ``$FLWR_HOME/dphype/NAME.id`` (``~/.flwr``)."""
    return Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr") / "dphype" / f"{name}.id"


def add_command(name: str, role: str, identity: str) -> str:
    """The ``dphype roster add`` command that adds the member ``name`` in ``role`` (a tally with its committee key).

    Args:
        name: The member's name.
        role: ``voter`` or ``tally``.
        identity: Its public identity key (hex).

    Returns:
        The command line.
    """
    tally = ' --tally-key "$(clients/start-tally.sh --print-public-key --tally-id J)"' if role == "tally" else ""
    return f"dphype roster add ROSTER --name {name} --role {role} --identity {identity}{tally}"


def _described(roster: Any, path: Path) -> dict[str, Any]:
    """A roster as ``show`` prints it: its file, federation, digest, fingerprint and members."""
    return {"roster": str(path), "federation": roster.federation, "digest": roster.digest(),
            "fingerprint": roster.fingerprint, "members": [m.to_dict() for m in roster.members]}


def render(result: dict[str, Any]) -> str:
    """The action's result as text.

    Args:
        result: What `run` returned.

    Returns:
        The text.
    """
    if "add" in result:  # keygen
        return (f"wrote the private identity key of {result['name']} to {result['key_file']} (mode 0600; keep it "
                f"secret, name it in dphype-identity) and its public key to {result['public_file']}\nidentity: "
                f"{result['identity']}\nadd it to the federation's "
                "roster:\n" + "\n".join(f"  {command}" for command in result["add"]))
    if "member" in result:  # check
        return (f"{result['member']} ({result['role']}) is a member of federation {result['federation']} "
                f"(roster {result['fingerprint']})")
    lines = [f"roster {result['roster']}: federation {result['federation']}, {len(result['members'])} members",
             f"fingerprint {result['fingerprint']} (digest {result['digest']})"]
    for m in result["members"]:
        tally = f", tally key {m['tally_key']}" if "tally_key" in m else ""
        lines.append(f"  {m['name']:<24} {m['role']:<6} identity {m['identity']}{tally}")
    return "\n".join(lines)
