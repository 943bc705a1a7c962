#!/usr/bin/env bash
# Register SuperNodes' authentication keys with a SuperLink (Flower's SuperNode authentication; server/README.md).
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: server/register-nodes.sh CONNECTION [--wait SECONDS] KEY.pub...

Wait (up to SECONDS, default 120) until the SuperLink named CONNECTION in $FLWR_HOME/config.toml answers, then
register each SuperNode public key (`flwr supernode register KEY.pub CONNECTION`): a SuperLink started with TLS
(server/start-superlink.sh, which turns on --enable-supernode-auth) serves only registered SuperNodes. Each node's
operator makes its key and sends the public half (clients/start-voter.sh or start-tally.sh --print-node-key);
check each key's origin as you would a certificate's. Exit status 0 when every key was registered, 1 when the
SuperLink did not answer or refused a key, 2 for bad arguments.
USAGE
}

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # die, wait_for_superlink

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -gt 0 ]] || die "missing arguments"
[[ $1 != -* && $1 =~ ^[A-Za-z0-9_-]+$ ]] || die "CONNECTION (e.g. deploy) must come first, got '$1'"
connection=$1
shift
wait=120
if [[ ${1:-} == --wait ]]; then
    [[ ${2:-} =~ ^[0-9]+$ ]] || die "--wait needs a number of seconds"
    wait=$2
    shift 2
fi
[[ $# -gt 0 ]] || die "no KEY.pub given"
for key in "$@"; do [[ -f $key ]] || die "no file '$key'"; done
command -v flwr >/dev/null || { echo "$(basename "$0"): flwr is not on PATH: activate the environment where" \
    "dphype is installed" >&2; exit 2; }

wait_for_superlink "$connection" "$wait"
# Flower's own `flwr supernode register KEY.pub CONNECTION`, for every key in one process (the CLI's start-up,
# seconds on a busy host, is paid once)
python3 - "$connection" "$@" <<'PY'
import sys

import click
from flwr.cli.app import app

connection, keys = sys.argv[1], sys.argv[2:]
for key in keys:
    try:
        app(["supernode", "register", key, connection], standalone_mode=False)
    except (SystemExit, click.ClickException, click.exceptions.Exit) as exc:
        code = getattr(exc, "code", None) if not isinstance(exc, click.ClickException) else 1
        if code not in (0, None):
            print(f"register-nodes.sh: the SuperLink refused {key} (see above)", file=sys.stderr)
            sys.exit(1)
    print(f"register-nodes.sh: registered {key}")
PY
