#!/usr/bin/env bash
# Start a Flower SuperLink for the bundled DP-Hype app and name it in $FLWR_HOME/config.toml (server/README.md).
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: server/start-superlink.sh (--ssl-ca-certfile CA --ssl-certfile CERT --ssl-keyfile KEY | --insecure)
                                 [--host HOST] [--port PORT] [--database FILE]
                                 [--connection NAME] [--address HOST:PORT]

Start a SuperLink (one port for the SuperNodes and for `flwr run`) that runs the app with the dphype installed
here (--disable-runtime-dependency-installation: Flower would otherwise `uv sync` the app's dependencies into
a runtime environment of its own, and dphype is not on a package registry), after naming it as connection NAME
in $FLWR_HOME/config.toml (server/connect.sh), so that `flwr run . NAME --stream` submits a run to it.

  --ssl-ca-certfile, --ssl-certfile, --ssl-keyfile
                          TLS with these files (Flower's flags; server/make-certificates.sh makes a test
                          federation's), the connection verifying with the CA file, and SuperNode
                          authentication on (--enable-supernode-auth): only the SuperNodes whose keys are
                          registered (server/register-nodes.sh) are served
  --insecure              or no TLS and no SuperNode authentication: a loopback demo only (it says so)
  --host HOST             interface to listen on (default 127.0.0.1; 0.0.0.0 for SuperNodes on other hosts)
  --port PORT             port (default 9092); not 39091-39093, where `flwr run .`'s local SuperLink listens
  --database FILE         the SuperLink's state (default $FLWR_HOME/superlink/state.db)
  --connection NAME       the connection written to $FLWR_HOME/config.toml (default deploy)
  --address HOST:PORT     the address it names (default HOST:PORT, or 127.0.0.1:PORT for --host 0.0.0.0)
  -h, --help              show this help

Environment: FLWR_HOME (default ~/.flwr). The script runs until the SuperLink stops (it becomes the SuperLink).
USAGE
}

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # die, listening

[[ $# -gt 0 ]] || die "missing arguments"
host=127.0.0.1 port=9092 database="" connection=deploy address="" insecure=false ca="" cert="" keyfile=""
while [[ $# -gt 0 ]]; do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --insecure) insecure=true; shift; continue ;;
    esac
    [[ $# -ge 2 && -n $2 ]] || die "option $1 needs a value"
    case $1 in
        --host) host=$2 ;;
        --port) port=$2 ;;
        --database) database=$2 ;;
        --connection) connection=$2 ;;
        --address) address=$2 ;;
        --ssl-ca-certfile) ca=$2 ;;
        --ssl-certfile) cert=$2 ;;
        --ssl-keyfile) keyfile=$2 ;;
        *) die "unknown option $1" ;;
    esac
    shift 2
done

[[ $port =~ ^[0-9]+$ ]] && (( port > 0 && port < 65536 )) || die "--port must be an integer in [1, 65535], got '$port'"
(( port < 39091 || port > 39093 )) || die "--port $port is where \`flwr run .\`'s local SuperLink listens; choose another"
[[ -n $host && $host != *[[:space:]]* ]] || die "--host must be a host name or address"
if $insecure; then
    [[ -z $ca$cert$keyfile ]] || die "--insecure and the --ssl-* files exclude each other"
    tls=(--insecure)
    connect_tls=(--insecure)
    echo "$(basename "$0"): --insecure: no TLS and no SuperNode authentication: for a loopback demo only (use" \
        "the --ssl-* files for any other network)" >&2
else
    [[ -n $ca && -n $cert && -n $keyfile ]] \
        || die "choose --insecure or all three of --ssl-ca-certfile, --ssl-certfile and --ssl-keyfile"
    for f in "$ca" "$cert" "$keyfile"; do [[ -f $f ]] || die "no file '$f'"; done
    tls=(--ssl-ca-certfile "$ca" --ssl-certfile "$cert" --ssl-keyfile "$keyfile" --enable-supernode-auth)
    connect_tls=(--root-certificates "$ca")
fi
command -v flower-superlink >/dev/null \
    || die "flower-superlink is not on PATH: activate the environment where dphype is installed"
# before anything is written: an occupied port would fail the SuperLink after its connection was named
! listening "$host" "$port" || die "--port $port is in use on $host (another SuperLink?): stop it, or choose a free port"

export FLWR_HOME="${FLWR_HOME:-$HOME/.flwr}"
[[ -n $database ]] || database="$FLWR_HOME/superlink/state.db"
mkdir -p "$(dirname "$database")"
if [[ -z $address ]]; then
    case $host in
        0.0.0.0 | :: | "[::]") address="127.0.0.1:$port" ;;
        *) address="$host:$port" ;;
    esac
fi
"$(dirname "${BASH_SOURCE[0]}")/connect.sh" "$connection" "$address" "${connect_tls[@]}"
exec flower-superlink "${tls[@]}" --disable-runtime-dependency-installation --database "$database" \
    --host "$host" --port "$port"
