#!/usr/bin/env bash
# A test federation's CA, the SuperLink's TLS certificate and the tallies' MPyC certificates
# (server/certificates.py; server/README.md). Usage: server/make-certificates.sh --help
set -euo pipefail
command -v python3 >/dev/null || { echo "$(basename "$0"): python3 is not on PATH: activate the environment" \
    "where dphype is installed" >&2; exit 2; }
exec python3 "$(dirname "${BASH_SOURCE[0]}")/certificates.py" "$@"
