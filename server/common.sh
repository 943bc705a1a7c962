# Sourced by the server/ scripts (not run): what they share. Each script defines its own `usage` first.

die() {  # die MESSAGE: the message and the script's synopsis on stderr, exit status 2
    echo "$(basename "$0"): $1" >&2
    usage | sed -n '/^Usage:/,/^$/p' >&2  # the synopsis
    echo "Run with --help for every option." >&2
    exit 2
}
