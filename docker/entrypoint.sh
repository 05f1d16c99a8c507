#!/usr/bin/env bash
# Entrypoint of the gaudi-launch image (docker/Dockerfile); docker/README.md has the whole story.
#
#   entrypoint.sh worker             sshd in the foreground on $SSH_PORT (the leader starts ranks here)
#   entrypoint.sh leader [ARGS...]   sshd, then gaudi-launch --hostfile "$HOSTFILE" --ssh-port "$SSH_PORT"
#                                    --wait-hosts "$LEADER_WAIT_SECONDS" ARGS
#   entrypoint.sh check [ARGS...]    gaudi-launch --check-only --hostfile "$HOSTFILE" ... (pre-flight only)
#   entrypoint.sh healthcheck        exit 0 when sshd answers on $SSH_PORT (the image's HEALTHCHECK)
#
# The role may also come from $ROLE. Every path is an environment variable whose default is the
# image's (see "Settings" below), so the script runs outside a container too (tests/cluster).
#
# What it fixes in the upstream DL1 example: sshd is really started (in the foreground, so signals
# reach it and its exit status is the container's); host keys are made once per state volume (never
# baked into the image, never shared by nodes) and kept across restarts; the leader's public key is
# appended to authorized_keys once, never overwriting keys already there. Only sshd and keys live
# here: waiting for the workers, their host keys (accept-new, a changed key refused), EFA, the
# interface and the HCCL variables are the launcher's, one rule for containers and bare hosts.
#
# Exit status: sshd's (worker), gaudi-launch's (leader, check); 2 for bad input (no key, no or a bad
# hostfile, a bad setting); gaudi-launch's 3 when a host never answered or its host key changed.
set -euo pipefail

PROG=gaudi-launch-entrypoint
ROLES=" worker leader check healthcheck "

# ------------------------------------------------------------------ settings (environment)
SSH_PORT=${SSH_PORT:-3022}
SSHD=${SSHD:-/usr/sbin/sshd}                                  # the sshd binary
SSH_KEYGEN=${SSH_KEYGEN:-ssh-keygen}
SSH_STATE_DIR=${SSH_STATE_DIR:-/var/lib/gaudi-launch/ssh}     # host keys (+ leader key, known_hosts): a volume
SSHD_CONFIG_DIR=${SSHD_CONFIG_DIR:-/etc/gaudi-launch/ssh}     # generated sshd_config and ssh_config
SSHD_RUN_DIR=${SSHD_RUN_DIR:-/run/sshd}                       # sshd's privilege separation directory
SSHD_AUTHORIZED_KEYS=${SSHD_AUTHORIZED_KEYS:-${HOME:-/root}/.ssh/authorized_keys}
SSHD_STRICT_MODES=${SSHD_STRICT_MODES:-yes}
SSHD_LOG_LEVEL=${SSHD_LOG_LEVEL:-INFO}
SSHD_LISTEN_ADDRESS=${SSHD_LISTEN_ADDRESS:-}                  # empty: every address
SSH_IDENTITY=${SSH_IDENTITY:-$SSH_STATE_DIR/id_ed25519}       # the leader's private key
KNOWN_HOSTS=${KNOWN_HOSTS:-$SSH_STATE_DIR/known_hosts}        # the leader's known_hosts
SSH_CLIENT_CONFIG=${SSH_CLIENT_CONFIG:-$SSHD_CONFIG_DIR/ssh_config}
HOSTFILE=${HOSTFILE:-/etc/gaudi-launch/hostfile}
LEADER_WAIT_SECONDS=${LEADER_WAIT_SECONDS:-120}
GAUDI_LAUNCH_CMD=${GAUDI_LAUNCH_CMD:-gaudi-launch}
PYTHON=${PYTHON:-python3}                                     # an interpreter gaudi_launch is installed for
ROLE_TAG=""
SSHD_PID=""
HOST_KEYS=()
LEADER_PUB=""

log() { printf '%s%s: %s\n' "$PROG" "$ROLE_TAG" "$*" >&2; }
die() {
    local code=$1
    shift
    log "error: $*"
    exit "$code"
}

usage() {
    cat <<EOF
usage: $0 worker|leader|check|healthcheck [ARGS...]     (or set ROLE)
  worker         sshd in the foreground on \$SSH_PORT ($SSH_PORT); needs AUTHORIZED_KEY or AUTHORIZED_KEYS_FILE
  leader ARGS    sshd, then gaudi-launch --hostfile \$HOSTFILE ($HOSTFILE) --wait-hosts ... ARGS
  check [ARGS]   gaudi-launch --check-only --hostfile \$HOSTFILE ... (pre-flight only)
  healthcheck    exit 0 when sshd answers on \$SSH_PORT
Settings are environment variables: see docker/README.md.
EOF
}

# ------------------------------------------------------------------ small helpers

is_uint() { case "$1" in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac }

# Paths end up in sshd_config / ssh_config lines: refuse what those files cannot say unquoted.
check_path() {
    local name=$1 value=$2
    case "$value" in
        "") die 2 "$name is empty" ;;
        /*) ;;
        *) die 2 "$name must be an absolute path, not '$value'" ;;
    esac
    case "$value" in
        *[[:space:]\"\'%]*) die 2 "$name='$value': spaces, quotes and '%' are not supported in this path" ;;
    esac
}

fingerprint() { "$SSH_KEYGEN" -l -f "$1" 2>/dev/null | awk '{print $2, $NF}'; }

# ensure_keypair PATH TYPE COMMENT: create PATH (+ .pub) unless PATH already holds a key. Prints
# "kept" or "generated". Written under a temporary name and renamed, so a crash never leaves half a key.
ensure_keypair() {
    local key=$1 type=$2 comment=$3 tmp
    if [ -s "$key" ]; then
        if [ ! -s "$key.pub" ]; then
            "$SSH_KEYGEN" -y -f "$key" >"$key.pub.tmp$$" || die 2 "$key is not a readable private key"
            mv -f "$key.pub.tmp$$" "$key.pub"
        fi
        echo kept
        return 0
    fi
    tmp="$key.tmp$$"
    rm -f "$tmp" "$tmp.pub"
    "$SSH_KEYGEN" -q -t "$type" -N '' -C "$comment" -f "$tmp" </dev/null >/dev/null ||
        die 2 "ssh-keygen could not create $key"
    mv -f "$tmp.pub" "$key.pub"
    mv -f "$tmp" "$key"
    echo generated
}

# ssh_probe HOST PORT: 0 when an SSH server answers there (its banner); otherwise prints why not.
ssh_probe() { "$PYTHON" -m gaudi_launch.remote.hostwait "$1" "$2"; }

# ------------------------------------------------------------------ sshd (worker and leader)

setup_host_keys() {
    local type key status
    mkdir -p "$SSH_STATE_DIR" || die 2 "cannot create SSH_STATE_DIR $SSH_STATE_DIR"
    chmod 700 "$SSH_STATE_DIR" 2>/dev/null || true
    [ -w "$SSH_STATE_DIR" ] || die 2 "SSH_STATE_DIR $SSH_STATE_DIR is not writable by $(id -un)"
    for type in ed25519 ecdsa; do
        key="$SSH_STATE_DIR/ssh_host_${type}_key"
        status=$(ensure_keypair "$key" "$type" "gaudi-launch host key of $(uname -n)")
        log "host key $status: $(fingerprint "$key.pub") ($key)"
        HOST_KEYS+=("$key")
    done
}

# The leader's key appended to SSHD_AUTHORIZED_KEYS once (by key, not by line), keys there kept:
# gaudi_launch/remote/authkeys.py, which reads AUTHORIZED_KEY / AUTHORIZED_KEYS_FILE. Exit 2 on bad keys.
setup_authorized_keys() {  # REQUIRED [EXTRA_PUBKEY_FILE]
    ENTRYPOINT_LOG_TAG="$PROG$ROLE_TAG" "$PYTHON" -m gaudi_launch.remote.authkeys "$@" || exit 2
}

resolve_sshd() {
    local found
    case "$SSHD" in
        /*) ;;
        *)
            found=$(command -v "$SSHD" 2>/dev/null) || die 2 "sshd '$SSHD' not found (install openssh-server or set SSHD)"
            SSHD=$found
            ;;
    esac
    [ -x "$SSHD" ] || die 2 "sshd not found at $SSHD (install openssh-server or set SSHD)"
}

write_sshd_config() {
    local cfg="$SSHD_CONFIG_DIR/sshd_config" key
    mkdir -p "$SSHD_CONFIG_DIR" || die 2 "cannot create SSHD_CONFIG_DIR $SSHD_CONFIG_DIR"
    if [ ! -d "$SSHD_RUN_DIR" ]; then
        { mkdir -p "$SSHD_RUN_DIR" && chmod 0755 "$SSHD_RUN_DIR"; } 2>/dev/null || true
    fi
    {
        cat <<EOF
# Written by $PROG at every start: change the environment, not this file.
Port $SSH_PORT
${SSHD_LISTEN_ADDRESS:+ListenAddress $SSHD_LISTEN_ADDRESS}
PidFile none
AuthorizedKeysFile $SSHD_AUTHORIZED_KEYS
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes $SSHD_STRICT_MODES
UseDNS no
PrintMotd no
X11Forwarding no
MaxStartups 100:30:200
MaxSessions 100
LogLevel $SSHD_LOG_LEVEL
Subsystem sftp internal-sftp
EOF
        for key in "${HOST_KEYS[@]}"; do echo "HostKey $key"; done
    } >"$cfg.tmp$$"
    mv -f "$cfg.tmp$$" "$cfg"
    "$SSHD" -t -f "$cfg" || die 2 "sshd rejects the generated $cfg (see its message above)"
    SSHD_CONFIG="$cfg"
}

prepare_sshd() {  # REQUIRE_KEY [EXTRA_PUBKEY_FILE]
    resolve_sshd
    setup_authorized_keys "$@"
    setup_host_keys
    write_sshd_config
}

# ------------------------------------------------------------------ leader helpers

# The leader's key: SSH_IDENTITY as given (it may be a read-only mount), else generated there once.
# Sets LEADER_PUB to its public key file (derived into SSHD_CONFIG_DIR when there is no .pub beside it).
ensure_leader_key() {
    LEADER_PUB="$SSH_IDENTITY.pub"
    if [ -e "$SSH_IDENTITY" ]; then
        [ -r "$SSH_IDENTITY" ] || die 2 "SSH_IDENTITY=$SSH_IDENTITY is not readable by $(id -un)"
        if [ ! -s "$LEADER_PUB" ]; then
            LEADER_PUB="$SSHD_CONFIG_DIR/leader_key.pub"
            mkdir -p "$SSHD_CONFIG_DIR" || die 2 "cannot create SSHD_CONFIG_DIR $SSHD_CONFIG_DIR"
            "$SSH_KEYGEN" -y -f "$SSH_IDENTITY" >"$LEADER_PUB" </dev/null ||
                die 2 "SSH_IDENTITY=$SSH_IDENTITY is not a private key without a passphrase"
        fi
        log "leader key: $(fingerprint "$LEADER_PUB") ($SSH_IDENTITY)"
        return 0
    fi
    mkdir -p "$(dirname "$SSH_IDENTITY")" || die 2 "cannot create the directory of SSH_IDENTITY $SSH_IDENTITY"
    ensure_keypair "$SSH_IDENTITY" ed25519 "gaudi-launch leader $(uname -n)" >/dev/null
    log "leader key generated: $(fingerprint "$LEADER_PUB") ($SSH_IDENTITY)"
    log "give this public key to every worker (AUTHORIZED_KEY or AUTHORIZED_KEYS_FILE):"
    log "  $(cat "$LEADER_PUB")"
}

# The hostfile is checked by gaudi-launch's own parser, so its errors (file:line) are the launcher's.
check_hostfile() {
    local out
    [ -e "$HOSTFILE" ] ||
        die 2 "no hostfile at HOSTFILE=$HOSTFILE: mount one (docker run -v \$PWD/hostfile:$HOSTFILE:ro ...) or set HOSTFILE"
    out=$("$PYTHON" -m gaudi_launch.inputs.hostfile "$HOSTFILE" 2>&1) ||
        die 2 "bad hostfile: ${out:-$PYTHON cannot run gaudi_launch: set PYTHON to the interpreter gaudi-launch is installed for}"
}

start_background_sshd() {
    local waited=0 probe=${SSHD_LISTEN_ADDRESS:-127.0.0.1}
    # SIGTERM to sshd when its parent ends: the parent is this shell, then (same process, after the exec
    # in role_leader) gaudi-launch, so signals reach the launcher directly and sshd ends with it.
    setpriv --pdeathsig TERM -- "$SSHD" -D -e -f "$SSHD_CONFIG" </dev/null &
    SSHD_PID=$!
    until ssh_probe "$probe" "$SSH_PORT" >/dev/null; do
        kill -0 "$SSHD_PID" 2>/dev/null || die 2 "sshd exited at start (port $SSH_PORT in use? see its message above)"
        [ "$waited" -lt 50 ] || die 2 "sshd does not answer on $probe:$SSH_PORT after 10 s"
        sleep 0.2
        waited=$((waited + 1))
    done
    log "sshd listening on port $SSH_PORT (pid $SSHD_PID)"
}

write_client_config() {
    local dir
    dir=$(dirname "$SSH_CLIENT_CONFIG")
    mkdir -p "$dir" || die 2 "cannot create $dir (for SSH_CLIENT_CONFIG)"
    cat >"$SSH_CLIENT_CONFIG.tmp$$" <<EOF
# Written by $PROG: how the leader reaches the workers.
Host *
    Port $SSH_PORT
    IdentityFile $SSH_IDENTITY
    IdentitiesOnly yes
    UserKnownHostsFile $KNOWN_HOSTS
    StrictHostKeyChecking accept-new
    BatchMode yes
    ConnectTimeout 10
    LogLevel ERROR
EOF
    mv -f "$SSH_CLIENT_CONFIG.tmp$$" "$SSH_CLIENT_CONFIG"
}

launcher_argv() {  # sets LAUNCHER: the gaudi-launch command line before the user's arguments
    command -v "$GAUDI_LAUNCH_CMD" >/dev/null 2>&1 ||
        die 2 "GAUDI_LAUNCH_CMD '$GAUDI_LAUNCH_CMD' not found (pip install gaudi-launch, or set GAUDI_LAUNCH_CMD)"
    LAUNCHER=("$GAUDI_LAUNCH_CMD" --hostfile "$HOSTFILE" --ssh-port "$SSH_PORT"
        --ssh-config "$SSH_CLIENT_CONFIG" --ssh-identity "$SSH_IDENTITY")
}

# ------------------------------------------------------------------ roles

role_worker() {
    prepare_sshd 1
    log "starting sshd in the foreground on port $SSH_PORT ($SSHD_CONFIG)"
    exec "$SSHD" -D -e -f "$SSHD_CONFIG"
}

role_leader() {
    check_hostfile
    check_path SSH_IDENTITY "$SSH_IDENTITY"
    check_path KNOWN_HOSTS "$KNOWN_HOSTS"
    launcher_argv
    ensure_leader_key
    prepare_sshd 0 "$LEADER_PUB"
    start_background_sshd
    mkdir -p "$(dirname "$KNOWN_HOSTS")" || die 2 "cannot create the directory of KNOWN_HOSTS $KNOWN_HOSTS"
    write_client_config
    if [ "$LEADER_WAIT_SECONDS" -gt 0 ]; then LAUNCHER+=(--wait-hosts "$LEADER_WAIT_SECONDS"); fi
    log "running: ${LAUNCHER[*]} $*"
    exec "${LAUNCHER[@]}" "$@"
}

role_check() {
    check_hostfile
    check_path SSH_IDENTITY "$SSH_IDENTITY"
    check_path KNOWN_HOSTS "$KNOWN_HOSTS"
    [ -r "$SSH_IDENTITY" ] ||
        die 2 "no leader key at SSH_IDENTITY=$SSH_IDENTITY (run the leader once, or mount the key and set SSH_IDENTITY)"
    launcher_argv
    mkdir -p "$(dirname "$KNOWN_HOSTS")"
    write_client_config
    log "running: ${LAUNCHER[*]} --check-only $*"
    exec "${LAUNCHER[@]}" --check-only "$@"
}

role_healthcheck() {
    local addr=${SSHD_LISTEN_ADDRESS:-127.0.0.1} why
    why=$(ssh_probe "$addr" "$SSH_PORT") || die 1 "sshd does not answer on $addr:$SSH_PORT: $why"
}

main() {
    local role=""
    case "${1:-}" in
        -h | --help | help)
            usage
            exit 0
            ;;
    esac
    if [ $# -gt 0 ] && [[ $ROLES == *" $1 "* ]]; then
        role=$1
        shift
    elif [ -n "${ROLE:-}" ]; then
        role=$ROLE
    elif [ $# -gt 0 ]; then
        role=$1
    fi
    if [ -z "$role" ]; then
        usage >&2
        die 2 "no role: give worker, leader or check as the first argument or in ROLE"
    fi
    [[ $ROLES == *" $role "* ]] || {
        usage >&2
        die 2 "unknown role '$role' (worker, leader, check or healthcheck)"
    }
    ROLE_TAG=" ($role)"
    is_uint "$SSH_PORT" && [ "$SSH_PORT" -ge 1 ] && [ "$SSH_PORT" -le 65535 ] ||
        die 2 "SSH_PORT='$SSH_PORT' is not a port number"
    is_uint "$LEADER_WAIT_SECONDS" || die 2 "LEADER_WAIT_SECONDS='$LEADER_WAIT_SECONDS' is not a number of seconds"
    case "$SSHD_STRICT_MODES" in yes | no) ;; *) die 2 "SSHD_STRICT_MODES must be yes or no" ;; esac
    if [ "$role" = worker ] || [ "$role" = leader ]; then
        check_path SSH_STATE_DIR "$SSH_STATE_DIR"
        check_path SSHD_CONFIG_DIR "$SSHD_CONFIG_DIR"
        check_path SSHD_AUTHORIZED_KEYS "$SSHD_AUTHORIZED_KEYS"
    fi
    if [ "$role" = leader ] || [ "$role" = check ]; then
        check_path SSH_CLIENT_CONFIG "$SSH_CLIENT_CONFIG"
    fi
    case "$role" in
        worker)
            [ $# -eq 0 ] || die 2 "worker takes no arguments (got: $*)"
            role_worker
            ;;
        leader) role_leader "$@" ;;
        check) role_check "$@" ;;
        healthcheck) role_healthcheck ;;
    esac
}

main "$@"
