# Sourced by clients/start-voter.sh and clients/start-tally.sh (not run on its own): one SuperNode of the bundled
# DP-Hype app, its node config built and checked by clients/node_config.py, its ClientApp tasks served by a warm
# `dphype superexec` (--executor forkserver, the default) or by Flower's own SuperExec (--executor subprocess).
# Run it with the environment where dphype is installed on PATH (flower-supernode, dphype and its python3).

CLIENTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {  # usage ROLE: the role's usage on stdout
    local role=$1
    if [[ $role == voter ]]; then
        cat <<'EOF'
Usage: clients/start-voter.sh --superlink HOST:PORT --port PORT --partition-id I --num-partitions N
                              (--root-certificates FILE [--node-key FILE] | --insecure)
                              [--node-config FILE.toml] [--roster FILE --identity FILE]
                              [--executor forkserver|subprocess] [--poll-interval SECONDS]
       clients/start-voter.sh --print-node-key (--partition-id I | --node-key FILE)

Start one voting SuperNode of the bundled DP-Hype app: it scores the candidates on its shard I of N of the
data set and votes, within the privacy policy of its node-config file.
EOF
    else
        cat <<'EOF'
Usage: clients/start-tally.sh --superlink HOST:PORT --port PORT --tally-id J --node-config FILE.toml
                              (--root-certificates FILE --mpyc-tls FOLDER [--node-key FILE] | --insecure)
                              [--key FILE] [--roster FILE --identity FILE]
                              [--executor forkserver|subprocess] [--poll-interval SECONDS]
       clients/start-tally.sh --print-public-key [--tally-id J | --key FILE]
       clients/start-tally.sh --print-node-key --tally-id J [--node-key FILE]

Start tally J of the committee (release = "argmax"): a SuperNode that opens the votes sealed to it and runs
its MPyC party with the other tallies; only the winner's index leaves the committee.
EOF
    fi
    cat <<'EOF'

  --superlink HOST:PORT   the SuperLink's address (server/start-superlink.sh's --host and --port)
  --port PORT             this SuperNode's Runtime API port on 127.0.0.1, where its SuperExec takes tasks;
                          distinct for every SuperNode on one host
  --root-certificates F   connect with TLS, verifying the SuperLink's certificate with this CA file, and
                          authenticate with --node-key (Flower's SuperNode authentication)
  --node-key FILE         this SuperNode's Flower authentication key (EC P-384, OpenSSH format; default
                          $FLWR_HOME/dphype/node-ROLE-I.key): the SuperLink serves only nodes whose public key its
                          operator registered. Not the roster identity (--identity), which other members verify
  --print-node-key        create the node key if missing and print its public key file (KEY.pub), which the
                          SuperLink's operator registers: server/register-nodes.sh CONNECTION KEY.pub
  --insecure              or no TLS and no node authentication: a loopback demo only (it says so when used)
EOF
    if [[ $role == voter ]]; then
        cat <<'EOF'
  --partition-id I, --num-partitions N
                          this node's shard of the bundled app's data set (0 <= I < N)
  --node-config FILE      TOML node policy (dphype-* keys: clients/examples/policy.toml; default: its defaults),
                          checked before the node starts; the ledger is $FLWR_HOME/dphype/ledger-partition-I.json
                          unless the file names dphype-ledger
EOF
    else
        cat <<'EOF'
  --tally-id J            this tally's index in the committee (0, 1, 2)
  --node-config FILE      TOML file of the committee: dphype-tally-parties, the MPyC addresses of all tallies in
                          committee order, the same file on every tally (clients/examples/tally-committee.toml)
  --key FILE              this tally's private key, created with mode 0600 if missing
                          (default: $FLWR_HOME/dphype/tally-J.key, one per tally, so tallies may share a host)
  --print-public-key      print the key's public half in hex (for voters' dphype-tallies) and exit
  --mpyc-tls FOLDER       the folder whose .config/ holds this tally's MPyC TLS files (party_J.crt, party_J.key,
                          mpyc_ca.crt; server/make-certificates.sh): the tallies' MPyC channels run over mutually
                          authenticated TLS (required with --root-certificates; with --insecure, plain TCP)
EOF
    fi
    cat <<'EOF'
  --roster FILE           the federation's roster of known members (dphype roster init / add), the same file on
                          every node: the node takes part only with its members (dphype-roster)
  --identity FILE         this node's private identity key (dphype roster keygen), a member of the roster
                          (dphype-identity); without --roster and --identity the node-config file must say
                          dphype-allow-unauthenticated = true (no member authentication: a server can invent members)
  --doctor                print what the node would enforce (its policy, roster and membership, tallies,
                          certificates, ledger and remaining budget: dphype doctor) and exit; 2 on a
                          contradiction, which also stops every start
  --executor E            forkserver (default): `flower-supernode --isolation process` beside a warm
                          `dphype superexec` that forks each task from a process that imported Flower, dphype
                          (and torch) once; subprocess: Flower's own, a fresh interpreter per message
  --poll-interval S       seconds between the warm SuperExec's task requests (default 0.5)
  -h, --help              show this help

Environment: FLWR_HOME (default ~/.flwr) holds the ledgers and tally keys; DPHYPE_WARM_DATA (a voter with the
forkserver executor; default adult, empty for none) names the data sets its SuperExec parses once for all tasks.
The script runs until the SuperNode stops; SIGTERM or Ctrl-C stops the SuperNode and its SuperExec.
EOF
}

die() {  # die ROLE MESSAGE: the message and the usage on stderr, exit status 2
    echo "$(basename "$0"): $2" >&2
    usage "$1" | sed -n '/^Usage:/,/^$/p' >&2  # the synopsis
    echo "Run with --help for every option." >&2
    exit 2
}

start_supernode() {  # start_supernode ROLE ARGS...: parse, check, start, supervise (ROLE: voter or tally)
    local role=$1
    shift
    local superlink="" port="" tls=() file="" executor=forkserver poll=()
    local partition="" partitions="" tally_id="" key="" print_key=false federation=()
    local node_key="" print_node_key=false mpyc_tls="" doctor=false
    [[ $# -gt 0 ]] || die "$role" "missing arguments"
    while [[ $# -gt 0 ]]; do
        case $1 in
            -h | --help) usage "$role"; exit 0 ;;
            --insecure) tls+=(--insecure); shift; continue ;;
            --print-public-key) [[ $role == tally ]] || die "$role" "unknown option $1"
                print_key=true; shift; continue ;;
            --print-node-key) print_node_key=true; shift; continue ;;
            --doctor) doctor=true; shift; continue ;;
        esac
        [[ $# -ge 2 && -n $2 ]] || die "$role" "option $1 needs a value"
        case $1 in
            --superlink) superlink=$2 ;;
            --port) port=$2 ;;
            --root-certificates) [[ -f $2 ]] || die "$role" "--root-certificates: no file '$2'"
                tls+=(--root-certificates "$2") ;;
            --node-config) file=$2 ;;
            --executor) executor=$2 ;;
            --roster) federation+=(--roster "$2") ;;
            --identity) federation+=(--identity "$2") ;;
            --poll-interval) poll=(--poll-interval "$2") ;;
            --partition-id) [[ $role == voter ]] || die "$role" "unknown option $1"; partition=$2 ;;
            --num-partitions) [[ $role == voter ]] || die "$role" "unknown option $1"; partitions=$2 ;;
            --tally-id) [[ $role == tally ]] || die "$role" "unknown option $1"; tally_id=$2 ;;
            --key) [[ $role == tally ]] || die "$role" "unknown option $1"; key=$2 ;;
            --node-key) node_key=$2 ;;
            --mpyc-tls) [[ $role == tally ]] || die "$role" "unknown option $1"; mpyc_tls=$2 ;;
            *) die "$role" "unknown option $1" ;;
        esac
        shift 2
    done

    local home="${FLWR_HOME:-$HOME/.flwr}"
    if [[ $role == tally ]]; then
        [[ -n $key || $tally_id =~ ^[0-9]+$ ]] || die "$role" "--tally-id J (an integer >= 0) or --key FILE is required"
        [[ -n $key ]] || key="$home/dphype/tally-$tally_id.key"
        if $print_key; then
            exec python3 "$CLIENTS_DIR/node_config.py" tally-public-key --key "$key"
        fi
        [[ $tally_id =~ ^[0-9]+$ ]] || die "$role" "--tally-id J (an integer >= 0) is required"
    fi
    if [[ -z $node_key ]]; then
        local own_id=$partition
        [[ $role == voter ]] || own_id=$tally_id
        if [[ $own_id =~ ^[0-9]+$ ]]; then
            node_key="$home/dphype/node-$role-$own_id.key"
        elif $print_node_key; then
            die "$role" "--node-key FILE, or --$([[ $role == voter ]] && echo partition || echo tally)-id to name \
the default key file, is required"
        fi  # else the missing id stops the script below
    fi
    if $print_node_key; then
        exec python3 "$CLIENTS_DIR/node_config.py" node-key --key "$node_key"
    fi
    [[ $superlink =~ ^[^[:space:]]+:[0-9]+$ ]] || die "$role" "--superlink HOST:PORT is required"
    [[ $port =~ ^[0-9]+$ ]] || die "$role" "--port PORT (an integer) is required"
    [[ ${#tls[@]} -gt 0 ]] || die "$role" "choose --insecure or --root-certificates FILE"
    [[ ${#tls[@]} -eq 1 || ${#tls[@]} -eq 2 && ${tls[0]} != --insecure ]] \
        || die "$role" "--insecure and --root-certificates exclude each other"
    if [[ ${tls[0]} == --insecure ]]; then
        echo "$(basename "$0"): --insecure: no TLS to the SuperLink and no SuperNode authentication$(
            [[ $role == tally && -z $mpyc_tls ]] && echo ", plain TCP between the tallies"): for a loopback demo" \
            "only (use --root-certificates for any other network)" >&2
    else
        if [[ -n $node_key ]]; then
            [[ -f $node_key ]] || die "$role" "no node key '$node_key': create it with --print-node-key and have \
the SuperLink's operator register the printed KEY.pub (server/register-nodes.sh) before the node starts"
            tls+=(--auth-supernode-private-key "$node_key")
        fi
        [[ $role == voter || -n $mpyc_tls ]] || die "$role" "--mpyc-tls FOLDER is required with --root-certificates \
(the tallies' MPyC channels run over TLS; server/make-certificates.sh makes the files of a test federation)"
    fi
    [[ $executor == forkserver || $executor == subprocess ]] \
        || die "$role" "--executor must be forkserver or subprocess, got '$executor'"
    [[ -z $file || -f $file ]] || die "$role" "--node-config: no file '$file'"
    local helper=(python3 "$CLIENTS_DIR/node_config.py" "$role" "${federation[@]}")
    if [[ $role == voter ]]; then
        [[ $partition =~ ^[0-9]+$ && $partitions =~ ^[0-9]+$ ]] \
            || die "$role" "--partition-id I and --num-partitions N (integers) are required"
        helper+=(--partition-id "$partition" --num-partitions "$partitions")
        [[ -z $file ]] || helper+=(--file "$file")
    else
        [[ -n $file ]] || die "$role" "--node-config FILE (the committee's dphype-tally-parties) is required"
        helper+=(--tally-id "$tally_id" --key "$key" --file "$file")
        [[ -z $mpyc_tls ]] || helper+=(--mpyc-tls "$mpyc_tls")
    fi
    for program in flower-supernode dphype python3; do
        command -v "$program" >/dev/null || { echo "$(basename "$0"): $program is not on PATH: activate the" \
            "environment where dphype is installed" >&2; exit 2; }
    done

    local node_config
    node_config=$("${helper[@]}") || exit 2  # the helper said why on stderr
    local supernode=(flower-supernode "${tls[@]}" --superlink "$superlink" --host 127.0.0.1 --port "$port"
                     --node-config "$node_config")
    echo "$(basename "$0"): node config: $node_config"
    local check=(dphype doctor --role "$role" --node-config "$node_config")
    [[ ${tls[0]} == --insecure ]] || check+=(--root-certificates "${tls[1]}" --node-key "$node_key")
    if $doctor; then
        exec "${check[@]}"
    fi
    "${check[@]}" | sed "s/^/$(basename "$0"): /" || exit 2  # what it enforces; a contradiction stops it here
    # before anything starts: on an occupied port the SuperNode would fail after its SuperExec started
    ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null \
        || die "$role" "--port $port is in use on 127.0.0.1 (another SuperNode?): every SuperNode on a host needs its own"
    if [[ $executor == subprocess ]]; then
        exec "${supernode[@]}"
    fi
    # the tasks of a voter score candidates with torch on its data set, parsed once in the fork server
    # (dphype.app.warm: $DPHYPE_WARM_DATA, default the bundled app's adult); a tally's only open shares and start
    # its MPyC party
    local preload=(dphype.app.client_app)
    [[ $role == tally ]] || preload+=(torch dphype.app.warm)
    export DPHYPE_WARM_DATA=${DPHYPE_WARM_DATA-adult}
    local pids=()
    trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' TERM INT HUP
    "${supernode[@]}" --isolation process &
    pids+=("$!")
    dphype superexec --runtime-api-address "127.0.0.1:$port" --insecure --preload "${preload[@]}" "${poll[@]}" \
        --parent-pid "${pids[0]}" &
    pids+=("$!")
    local status=0
    wait -n "${pids[@]}" || status=$?  # the first of the two to stop (or a signal) stops the other
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
    exit "$status"
}
