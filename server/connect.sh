#!/usr/bin/env bash
# Name a SuperLink in $FLWR_HOME/config.toml, for `flwr run . NAME` (server/README.md).
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: server/connect.sh NAME HOST:PORT (--insecure | --root-certificates FILE)

Add (or replace) the SuperLink connection NAME in $FLWR_HOME/config.toml (default ~/.flwr/config.toml; a fresh
FLWR_HOME has none, so Flower's default file is created first), so that `flwr run . NAME` submits runs to the
SuperLink at HOST:PORT. The default connection is left as it is. server/start-superlink.sh calls this for its
own host; run it on any other host that submits runs.

  NAME                     the connection's name, e.g. deploy
  HOST:PORT                the SuperLink's address as seen from this host
  --insecure               no TLS (loopback or a trusted network only)
  --root-certificates FILE or TLS, verifying the SuperLink's certificate with this CA file
USAGE
}

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # die

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -ge 3 ]] || die "missing arguments"
name=$1 address=$2
[[ $name =~ ^[A-Za-z0-9_-]+$ ]] || die "NAME must be letters, digits, - or _, got '$name'"
[[ $address =~ ^[^[:space:]]+:[0-9]+$ ]] || die "HOST:PORT expected, got '$address'"
case "$3" in
    --insecure) [[ $# -eq 3 ]] || die "unexpected arguments after --insecure"; certificates="" ;;
    --root-certificates) [[ $# -eq 4 && -f $4 ]] || die "--root-certificates needs an existing FILE"
        certificates=$(cd "$(dirname "$4")" && pwd)/$(basename "$4") ;;
    *) die "choose --insecure or --root-certificates FILE, got '$3'" ;;
esac
command -v python3 >/dev/null || die "python3 is not on PATH: activate the environment where dphype is installed"

# Flower's own writer keeps every other connection of the file.
python3 - "$name" "$address" "$certificates" <<'PY'
import sys

from flwr.cli.flower_config import write_superlink_connection
from flwr.cli.typing import SuperLinkConnection

name, address, certificates = sys.argv[1:]
if certificates:
    connection = SuperLinkConnection(name, address=address, root_certificates=certificates)
else:
    connection = SuperLinkConnection(name, address=address, insecure=True)
write_superlink_connection(connection)
PY
echo "$(basename "$0"): connection '$name' -> $address in ${FLWR_HOME:-$HOME/.flwr}/config.toml"
