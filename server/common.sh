# Sourced by the server/ scripts (not run): what they share. Each script defines its own `usage` first.

die() {  # die MESSAGE: the message and the script's synopsis on stderr, exit status 2
    echo "$(basename "$0"): $1" >&2
    usage | sed -n '/^Usage:/,/^$/p' >&2  # the synopsis
    echo "Run with --help for every option." >&2
    exit 2
}

listening() {  # listening HOST PORT: whether something accepts connections on HOST:PORT (0.0.0.0: on loopback)
    local host=$1
    case $host in 0.0.0.0 | :: | "[::]") host=127.0.0.1 ;; esac
    (exec 3<>"/dev/tcp/$host/$2") 2>/dev/null
}

wait_for_superlink() {  # wait_for_superlink CONNECTION SECONDS: until `flwr ls CONNECTION` answers; exit 2 for an
                        # unknown CONNECTION, 1 when it does not answer within SECONDS
    local connection=$1 deadline=$((SECONDS + $2)) answer
    until answer=$(flwr ls "$connection" 2>&1); do  # the SuperLink may still be starting
        if [[ $answer == *"'$connection' not found"* ]]; then
            echo "$(basename "$0"): no connection '$connection' in ${FLWR_HOME:-$HOME/.flwr}/config.toml: start the" \
                "SuperLink with server/start-superlink.sh (it names it), or name it with server/connect.sh" >&2
            exit 2
        fi
        if (( SECONDS >= deadline )); then
            echo "$(basename "$0"): the SuperLink of connection '$connection' does not answer after $2 s: start it" \
                "(server/start-superlink.sh), or check its address in ${FLWR_HOME:-$HOME/.flwr}/config.toml" >&2
            exit 1
        fi
        sleep 1
    done
}
