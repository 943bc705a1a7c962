#!/usr/bin/env bash
# Submit a run of the bundled DP-Hype app to a SuperLink and stream its log; the exit status says whether it
# released a result (server/README.md).
set -uo pipefail

usage() {
    cat <<'USAGE'
Usage: server/run.sh CONNECTION [--wait SECONDS] [flwr run options, e.g. --run-config "clients=3"]

At the repository root: wait (up to SECONDS, default 120) until the SuperLink named CONNECTION in
$FLWR_HOME/config.toml (server/start-superlink.sh, server/connect.sh) answers, then
`flwr run . CONNECTION --stream OPTIONS`. The log ends with the run's summary. Exit status 0 when the ServerApp
logged its result; 1 with one last line naming the cause when the run failed (`flwr run` itself exits 0 then)
or the SuperLink did not answer; 2 for bad arguments or an unknown CONNECTION; flwr's own status when it could
not submit the run.
USAGE
}

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # die

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -gt 0 ]] || die "missing arguments"
[[ $1 != -* && $1 =~ ^[A-Za-z0-9_-]+$ ]] || die "CONNECTION (the SuperLink's name in \$FLWR_HOME/config.toml, e.g. deploy) \
must come first, got '$1'"
connection=$1
shift
wait=120
if [[ ${1:-} == --wait ]]; then
    [[ ${2:-} =~ ^[0-9]+$ ]] || die "--wait needs a number of seconds"
    wait=$2
    shift 2
fi
command -v flwr >/dev/null || { echo "$(basename "$0"): flwr is not on PATH: activate the environment where" \
    "dphype is installed" >&2; exit 2; }

wait_for_superlink "$connection" "$wait"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
flwr run . "$connection" --stream "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if (( status != 0 )); then
    echo "$(basename "$0"): flwr run exited with status $status: the run was not submitted (see above)" >&2
    exit "$status"
fi
grep -q "DPHYPE_RESULT " "$log" && exit 0
cause=$(grep -o "DP-Hype: the run failed: .*" "$log" | tail -n 1)
echo "$(basename "$0"): ${cause:-the run ended without a result: see the log above}" >&2
exit 1
