#!/usr/bin/env bash
# One tally SuperNode of the bundled DP-Hype app's committee (release = "argmax"), its key file its own
# (clients/README.md). Usage: clients/start-tally.sh --help
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/supernode.sh"
start_supernode tally "$@"
