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
for key in "$@"; do
    if ! out=$(flwr supernode register "$key" "$connection" 2>&1); then
        echo "$(basename "$0"): the SuperLink refused $key: $(tail -n 3 <<<"$out")" >&2
        exit 1
    fi
    echo "$(basename "$0"): registered $key"
done
