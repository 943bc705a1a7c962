#!/usr/bin/env bash
# One voting SuperNode of the bundled DP-Hype app, with a warm `dphype superexec` beside it (clients/README.md).
# Usage: clients/start-voter.sh --help
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/supernode.sh"
start_supernode voter "$@"
