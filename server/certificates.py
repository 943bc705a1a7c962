"""Make a test federation's TLS files (``server/make-certificates.sh``; `dphype.node.pki`).

Usage::

    python3 server/certificates.py FOLDER [--federation NAME] [--superlink-host HOST ...] [--tallies N]

``FOLDER/ca.pem`` (the CA certificate every node and ``flwr`` verifies with, given to all operators),
``FOLDER/ca.key`` (the CA's key: keep it off the nodes), ``FOLDER/superlink.pem`` and ``superlink.key`` (the
SuperLink's server certificate for the given host names and addresses, and 127.0.0.1 and localhost) and, per
tally ``J``, ``FOLDER/tally-J/.config/`` (its MPyC party certificate, key and the CA certificate: the folder its
``--mpyc-tls`` names). For a test federation only: in production every operator makes its own key and has the
federation's CA sign it, and the CA's key never leaves its operator.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dphype.node.pki import certificate_summary, issue, issue_mpyc_party, make_ca


def main(argv: list[str] | None = None) -> int:
    """Make the files; print one line per certificate. Exit status 2 on bad arguments or an existing key."""
    parser = argparse.ArgumentParser(prog="make-certificates.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="where the files go (created; existing keys are never replaced)")
    parser.add_argument("--federation", default="dphype", help="the CA's name (default dphype)")
    parser.add_argument("--superlink-host", action="append", default=[], metavar="HOST",
                        help="a host name or IP address the SuperLink is reached at (repeatable; 127.0.0.1 "
                             "and localhost are always added: the SuperLink's own ServerApp process dials them)")
    parser.add_argument("--tallies", type=int, default=3, help="tally certificates for MPyC (default 3; 0: none)")
    args = parser.parse_args(argv)
    if not 0 <= args.tallies <= 64:
        parser.error(f"--tallies must be in [0, 64], got {args.tallies}")
    # the SuperLink's own ServerApp process dials it on 127.0.0.1, which its certificate must name too
    hosts = tuple(dict.fromkeys([*args.superlink_host, "127.0.0.1", "localhost"]))
    try:
        ca = make_ca(args.folder, f"{args.federation} federation CA")
        made = [ca.cert, issue(ca, args.folder, "superlink", common_name=hosts[0], hosts=hosts).cert]
        for j in range(args.tallies):
            folder = issue_mpyc_party(ca, args.folder / f"tally-{j}", j)
            made.append(folder / ".config" / f"party_{j}.crt")
    except (FileExistsError, ValueError) as exc:
        print(f"make-certificates.sh: {exc}", file=sys.stderr)
        return 2
    for cert in made:
        print(certificate_summary(cert))
    return 0


if __name__ == "__main__":
    sys.exit(main())
