#!/usr/bin/env bash
# Entrypoint of the gaudi-launch image (docker/Dockerfile); docker/README.md has the whole story.
#
#   entrypoint.sh worker             sshd in the foreground on $SSH_PORT (the leader starts ranks here)
#   entrypoint.sh leader [ARGS...]   sshd, wait until every host of $HOSTFILE answers on $SSH_PORT,
#                                    record their host keys, write the EFA .deepspeed_env (EFA only),
#                                    then gaudi-launch --hostfile "$HOSTFILE" --ssh-port "$SSH_PORT" ARGS
#   entrypoint.sh check [ARGS...]    gaudi-launch --check-only --hostfile "$HOSTFILE" ... (pre-flight only)
#   entrypoint.sh healthcheck        exit 0 when sshd answers on $SSH_PORT (the image's HEALTHCHECK)
#
# The role may also come from $ROLE. Every path is an environment variable whose default is the
# image's (see "Settings" below), so the script runs outside a container too (tests/cluster).
#
# What it fixes in the upstream DL1 example: sshd is really started (in the foreground, so signals
# reach it and its exit status is the container's); host keys are made once per state volume (never
# baked into the image, never shared by nodes) and kept across restarts; the leader's public key is
# appended to authorized_keys once, never overwriting keys already there.
#
# Exit status: sshd's (worker), gaudi-launch's (leader, check); 2 for bad input (no key, no or a bad
# hostfile, a bad setting); 3 when a host never answered or its host key changed.
set -euo pipefail

PROG=gaudi-launch-entrypoint
ROLES=" worker leader check healthcheck "

# ------------------------------------------------------------------ settings (environment)
SSH_PORT=${SSH_PORT:-3022}
SSHD=${SSHD:-/usr/sbin/sshd}                                  # the sshd binary
SSH_KEYGEN=${SSH_KEYGEN:-ssh-keygen}
SSH_KEYSCAN=${SSH_KEYSCAN:-ssh-keyscan}
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
EFA_SYSFS=${EFA_SYSFS:-/sys/class/infiniband}
FI_INFO=${FI_INFO:-fi_info}
HCCL_OFI_WRAPPER=${HCCL_OFI_WRAPPER:-/opt/hccl_ofi_wrapper}
EFA_LIBS=${EFA_LIBS:-/opt/amazon/openmpi/lib:/opt/amazon/efa/lib}
if [ -z "${DEEPSPEED_ENV_FILE:-}" ]; then
    case "${DS_ENV_FILE:-.deepspeed_env}" in
        /*) DEEPSPEED_ENV_FILE=$DS_ENV_FILE ;;
        *) DEEPSPEED_ENV_FILE=${HOME:-/root}/${DS_ENV_FILE:-.deepspeed_env} ;;
    esac
fi

ROLE_TAG=""
SSHD_PID=""
CHILD_PID=""
PROBE_PIDS=()
HOST_KEYS=()
HOSTS=()
LEADER_PUB=""
PROBE_DIR=""

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
  leader ARGS    sshd, wait for every host of \$HOSTFILE ($HOSTFILE), then gaudi-launch ... ARGS
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
ssh_probe() {
    local out rc
    # shellcheck disable=SC2016  # $1/$2 are expanded by the inner bash, on purpose
    if out=$(timeout 3 bash -c '
        exec 3<>"/dev/tcp/$1/$2" || exit 1
        IFS= read -r -t 2 banner <&3 || { echo "connected, but no SSH banner within 2 s"; exit 1; }
        [[ $banner == SSH-* ]] || { echo "something other than sshd answers there"; exit 1; }
        printf "SSH-2.0-gaudi-launch-probe\r\n" >&3' probe "$1" "$2" 2>&1); then
        return 0
    else
        rc=$?
    fi
    if [ "$rc" -eq 124 ]; then
        echo "no answer within 3 s"
    else
        out=${out##*$'\n'}
        echo "${out##*: }"
    fi
    return 1
}

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

# add_authorized_keys SOURCE_NAME FILE: append each public key of FILE to SSHD_AUTHORIZED_KEYS unless
# that key (its base64 blob) is already there. Never rewrites or removes a line.
add_authorized_keys() {
    local what=$1 src=$2 line blob one added=0 present=0
    if grep -q "PRIVATE KEY" "$src"; then
        die 2 "$what holds a PRIVATE key: give the PUBLIC key (the .pub file, 'ssh-ed25519 AAAA... comment')"
    fi
    one=$(mktemp)
    while IFS= read -r line || [ -n "$line" ]; do
        line=${line%$'\r'}
        case "$line" in '' | '#'*) continue ;; esac
        printf '%s\n' "$line" >"$one"
        if ! "$SSH_KEYGEN" -l -f "$one" >/dev/null 2>&1; then
            rm -f "$one"
            die 2 "$what is not an SSH public key: '${line:0:60}' (expected 'ssh-ed25519 AAAA... comment')"
        fi
        blob=$(awk '{for (i = 1; i < NF; i++) if ($i ~ /^(ssh-|ecdsa-|sk-)/) { print $(i + 1); exit }}' "$one")
        if [ -n "$blob" ] && awk -v b="$blob" '{for (i = 1; i <= NF; i++) if ($i == b) f = 1} END {exit !f}' \
            "$SSHD_AUTHORIZED_KEYS"; then
            present=$((present + 1))
            continue
        fi
        # keep the file's last line intact when it has no newline at its end
        if [ -s "$SSHD_AUTHORIZED_KEYS" ] && [ -n "$(tail -c 1 "$SSHD_AUTHORIZED_KEYS")" ]; then
            echo >>"$SSHD_AUTHORIZED_KEYS"
        fi
        printf '%s\n' "$line" >>"$SSHD_AUTHORIZED_KEYS"
        added=$((added + 1))
    done <"$src"
    rm -f "$one"
    if [ $((added + present)) -eq 0 ]; then
        die 2 "$what holds no public key"
    fi
    log "authorized keys from $what: $added added, $present already in $SSHD_AUTHORIZED_KEYS"
}

# setup_authorized_keys REQUIRED [EXTRA_PUBKEY_FILE]
setup_authorized_keys() {
    local required=$1 extra=${2:-} dir tmp given=0
    dir=$(dirname "$SSHD_AUTHORIZED_KEYS")
    if [ ! -d "$dir" ]; then
        mkdir -p "$dir" || die 2 "cannot create $dir (for SSHD_AUTHORIZED_KEYS)"
        chmod 700 "$dir"
    fi
    if [ ! -e "$SSHD_AUTHORIZED_KEYS" ]; then
        (umask 077 && : >"$SSHD_AUTHORIZED_KEYS") || die 2 "cannot create $SSHD_AUTHORIZED_KEYS"
    fi
    if [ -n "${AUTHORIZED_KEYS_FILE:-}" ]; then
        given=1
        [ -f "$AUTHORIZED_KEYS_FILE" ] ||
            die 2 "AUTHORIZED_KEYS_FILE=$AUTHORIZED_KEYS_FILE does not exist (mount the leader's public key there)"
        [ -r "$AUTHORIZED_KEYS_FILE" ] || die 2 "AUTHORIZED_KEYS_FILE=$AUTHORIZED_KEYS_FILE is not readable"
        add_authorized_keys "AUTHORIZED_KEYS_FILE ($AUTHORIZED_KEYS_FILE)" "$AUTHORIZED_KEYS_FILE"
    fi
    if [ -n "${AUTHORIZED_KEY+x}" ]; then
        given=1
        [ -n "$AUTHORIZED_KEY" ] ||
            die 2 "AUTHORIZED_KEY is set but empty (did the command that should print the leader's public key fail?)"
        tmp=$(mktemp)
        printf '%s\n' "$AUTHORIZED_KEY" >"$tmp"
        add_authorized_keys "AUTHORIZED_KEY" "$tmp"
        rm -f "$tmp"
    fi
    if [ -n "$extra" ]; then
        add_authorized_keys "the leader's own key ($extra)" "$extra"
    fi
    if [ "$given" -eq 0 ] && [ "$required" -eq 1 ]; then
        if grep -Eq '^[^#]*(ssh-|ecdsa-|sk-)' "$SSHD_AUTHORIZED_KEYS"; then
            log "no AUTHORIZED_KEY / AUTHORIZED_KEYS_FILE given: using the keys already in $SSHD_AUTHORIZED_KEYS"
        else
            die 2 "no authorized key: nobody could log in to this worker. Give the leader's public key with" \
                "-e AUTHORIZED_KEY=\"\$(cat leader_key.pub)\" or mount it and set AUTHORIZED_KEYS_FILE=/path/in/container" \
                "(sshd not started)"
        fi
    fi
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
        echo "# Written by $PROG at every start: change the environment, not this file."
        echo "Port $SSH_PORT"
        if [ -n "$SSHD_LISTEN_ADDRESS" ]; then echo "ListenAddress $SSHD_LISTEN_ADDRESS"; fi
        for key in "${HOST_KEYS[@]}"; do echo "HostKey $key"; done
        echo "PidFile none"
        echo "AuthorizedKeysFile $SSHD_AUTHORIZED_KEYS"
        echo "PubkeyAuthentication yes"
        echo "PasswordAuthentication no"
        echo "KbdInteractiveAuthentication no"
        echo "PermitRootLogin prohibit-password"
        echo "UsePAM no"
        echo "StrictModes $SSHD_STRICT_MODES"
        echo "UseDNS no"
        echo "PrintMotd no"
        echo "X11Forwarding no"
        echo "MaxStartups 100:30:200"
        echo "MaxSessions 100"
        echo "LogLevel $SSHD_LOG_LEVEL"
        echo "Subsystem sftp internal-sftp"
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

# The hostfile is parsed by gaudi-launch's own parser, so its errors (file:line) are the launcher's.
read_hosts() {
    local out err
    [ -e "$HOSTFILE" ] ||
        die 2 "no hostfile at HOSTFILE=$HOSTFILE: mount one (docker run -v \$PWD/hostfile:$HOSTFILE:ro ...) or set HOSTFILE"
    err=$(mktemp)
    # shellcheck disable=SC2016  # Python source, not shell
    out=$("$PYTHON" -c '
import sys
try:
    from gaudi_launch.errors import UserError
    from gaudi_launch.hostfile import read_hostfile
except ImportError as e:
    sys.exit(f"{sys.executable} cannot import gaudi_launch ({e}): set PYTHON to the interpreter gaudi-launch is installed for")
try:
    hosts = read_hostfile(sys.argv[1])
except UserError as e:
    sys.exit(str(e))
for h in hosts:
    print(h.name.rpartition("@")[2])
' "$HOSTFILE" 2>"$err") || {
        out=$(cat "$err")
        rm -f "$err"
        die 2 "bad hostfile: ${out:-$PYTHON failed}"
    }
    rm -f "$err"
    mapfile -t HOSTS <<<"$out"
}

start_background_sshd() {
    local waited=0 probe=${SSHD_LISTEN_ADDRESS:-127.0.0.1}
    "$SSHD" -D -e -f "$SSHD_CONFIG" </dev/null &
    SSHD_PID=$!
    until ssh_probe "$probe" "$SSH_PORT" >/dev/null; do
        kill -0 "$SSHD_PID" 2>/dev/null || die 2 "sshd exited at start (port $SSH_PORT in use? see its message above)"
        [ "$waited" -lt 50 ] || die 2 "sshd does not answer on $probe:$SSH_PORT after 10 s"
        sleep 0.2
        waited=$((waited + 1))
    done
    log "sshd listening on port $SSH_PORT (pid $SSHD_PID)"
}

# Wait until every host answers on SSH_PORT, bounded by LEADER_WAIT_SECONDS, probing in parallel.
wait_for_hosts() {
    local start=$SECONDS deadline=$((SECONDS + LEADER_WAIT_SECONDS)) dir i h r last_report=-100
    local -a pending=("${HOSTS[@]}") next
    local -A why=()
    dir=$(mktemp -d)
    PROBE_DIR=$dir
    log "waiting up to ${LEADER_WAIT_SECONDS} s for ${#HOSTS[@]} host(s) to answer on port $SSH_PORT: ${HOSTS[*]}"
    while :; do
        PROBE_PIDS=()
        for i in "${!pending[@]}"; do
            (if ssh_probe "${pending[$i]}" "$SSH_PORT" >"$dir/$i"; then echo ok >"$dir/$i"; fi) &
            PROBE_PIDS+=("$!")
        done
        wait "${PROBE_PIDS[@]}" || true
        PROBE_PIDS=()
        next=()
        for i in "${!pending[@]}"; do
            h=${pending[$i]}
            r=$(cat "$dir/$i" 2>/dev/null || true)
            if [ "$r" = ok ]; then
                log "  $h:$SSH_PORT answers (after $((SECONDS - start)) s)"
            else
                next+=("$h")
                why[$h]=${r:-no answer}
            fi
        done
        pending=("${next[@]}")
        [ "${#pending[@]}" -gt 0 ] || break
        if [ "$SECONDS" -ge "$deadline" ]; then
            rm -rf "$dir"
            for h in "${pending[@]}"; do
                log "error: $h:$SSH_PORT did not answer within $LEADER_WAIT_SECONDS s (${why[$h]})"
            done
            die 3 "unreachable worker(s): ${pending[*]}. Is the worker container running there" \
                "(entrypoint worker, --net=host, SSH_PORT=$SSH_PORT) and does the security group allow TCP $SSH_PORT" \
                "between the nodes? Raise LEADER_WAIT_SECONDS for slow starts."
        fi
        if [ $((SECONDS - last_report)) -ge 5 ]; then
            last_report=$SECONDS
            for h in "${pending[@]}"; do
                log "  waiting for $h:$SSH_PORT: ${why[$h]} ($((deadline - SECONDS)) s left)"
            done
        fi
        sleep 1
    done
    rm -rf "$dir"
}

# Record every host's key in KNOWN_HOSTS the way StrictHostKeyChecking=accept-new does: add keys of
# hosts not known yet, keep known ones, refuse a host whose key changed.
record_host_keys() {
    local h name scanned known line type blob ktype kblob added
    mkdir -p "$(dirname "$KNOWN_HOSTS")" || die 2 "cannot create the directory of KNOWN_HOSTS $KNOWN_HOSTS"
    [ -e "$KNOWN_HOSTS" ] || (umask 077 && : >"$KNOWN_HOSTS")
    for h in "${HOSTS[@]}"; do
        if [ "$SSH_PORT" = 22 ]; then name=$h; else name="[$h]:$SSH_PORT"; fi
        scanned=$("$SSH_KEYSCAN" -T 5 -p "$SSH_PORT" "$h" 2>/dev/null | grep -v '^#' || true)
        [ -n "$scanned" ] || die 3 "could not read the host key of $h:$SSH_PORT (ssh-keyscan got nothing): is sshd answering there?"
        known=$("$SSH_KEYGEN" -F "$name" -f "$KNOWN_HOSTS" 2>/dev/null | grep -v '^#' || true)
        # first: does any offered key contradict a recorded key of the same type? Then nothing is added.
        if [ -n "$known" ]; then
            while read -r _ type blob _; do
                while read -r _ ktype kblob _; do
                    if [ "$ktype" = "$type" ] && [ "$kblob" != "$blob" ]; then
                        die 3 "the $type host key of $h:$SSH_PORT CHANGED since it was recorded in $KNOWN_HOSTS." \
                            "If that worker's state volume was recreated on purpose, forget the old key with:" \
                            "ssh-keygen -R '$name' -f $KNOWN_HOSTS (otherwise someone may be impersonating it)"
                    fi
                done <<<"$known"
            done <<<"$scanned"
        fi
        added=0
        while IFS= read -r line; do
            read -r _ type blob _ <<<"$line"
            [ -n "$blob" ] || continue
            if [ -n "$known" ] && grep -qF -- "$blob" <<<"$known"; then continue; fi
            printf '%s\n' "$line" >>"$KNOWN_HOSTS"
            added=$((added + 1))
        done <<<"$scanned"
        if [ "$added" -gt 0 ]; then
            log "  recorded $added host key(s) of $name in $KNOWN_HOSTS"
        else
            log "  host key of $name already known"
        fi
    done
}

efa_present() {
    local d
    for d in "$EFA_SYSFS"/efa* "$EFA_SYSFS"/rdmap*; do
        if [ -e "$d" ]; then return 0; fi
    done
    if command -v "$FI_INFO" >/dev/null 2>&1 && timeout 15 "$FI_INFO" -p efa >/dev/null 2>&1; then
        return 0
    fi
    return 1
}

socket_ifname() {
    local name
    if [ -n "${HCCL_SOCKET_IFNAME:-}" ]; then
        echo "$HCCL_SOCKET_IFNAME"
        return 0
    fi
    name=$(ip -o -4 route show default 2>/dev/null |
        awk '{for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit }}' || true)
    if [ -z "$name" ]; then
        name=$(ip -o -4 addr show scope global 2>/dev/null | awk '{print $2; exit}' || true)
    fi
    echo "$name"
}

# The EFA variables for every rank, in the .deepspeed_env gaudi-launch (and DeepSpeed) read. Other
# lines of an existing file are kept; only these three names are replaced.
write_efa_env() {
    local ifname ld="" entry tmp
    local -a entries
    ifname=$(socket_ifname)
    IFS=: read -r -a entries <<<"$HCCL_OFI_WRAPPER:$EFA_LIBS:${LD_LIBRARY_PATH:-}"
    for entry in "${entries[@]}"; do
        [ -n "$entry" ] || continue
        case ":$ld:" in *":$entry:"*) continue ;; esac
        ld=${ld:+$ld:}$entry
    done
    mkdir -p "$(dirname "$DEEPSPEED_ENV_FILE")"
    tmp="$DEEPSPEED_ENV_FILE.tmp$$"
    {
        if [ -f "$DEEPSPEED_ENV_FILE" ]; then
            grep -Ev '^[[:space:]]*(export[[:space:]]+)?(HCCL_OVER_OFI|HCCL_SOCKET_IFNAME|LD_LIBRARY_PATH)[[:space:]]*=' \
                "$DEEPSPEED_ENV_FILE" || true
        fi
        echo "HCCL_OVER_OFI=1"
        if [ -n "$ifname" ]; then echo "HCCL_SOCKET_IFNAME=$ifname"; fi
        echo "LD_LIBRARY_PATH=$ld"
    } >"$tmp"
    mv -f "$tmp" "$DEEPSPEED_ENV_FILE"
    log "EFA devices found: wrote HCCL_OVER_OFI=1${ifname:+, HCCL_SOCKET_IFNAME=$ifname}, LD_LIBRARY_PATH=$ld" \
        "to $DEEPSPEED_ENV_FILE"
    if [ -z "$ifname" ]; then
        log "no default-route interface found: HCCL_SOCKET_IFNAME left to gaudi-launch (set it to choose)"
    fi
}

write_client_config() {
    local dir
    dir=$(dirname "$SSH_CLIENT_CONFIG")
    mkdir -p "$dir" || die 2 "cannot create $dir (for SSH_CLIENT_CONFIG)"
    {
        echo "# Written by $PROG: how the leader reaches the workers."
        echo "Host *"
        echo "    Port $SSH_PORT"
        echo "    IdentityFile $SSH_IDENTITY"
        echo "    IdentitiesOnly yes"
        echo "    UserKnownHostsFile $KNOWN_HOSTS"
        echo "    StrictHostKeyChecking accept-new"
        echo "    BatchMode yes"
        echo "    ConnectTimeout 10"
        echo "    LogLevel ERROR"
    } >"$SSH_CLIENT_CONFIG.tmp$$"
    mv -f "$SSH_CLIENT_CONFIG.tmp$$" "$SSH_CLIENT_CONFIG"
}

launcher_argv() {  # sets LAUNCHER: the gaudi-launch command line before the user's arguments
    command -v "$GAUDI_LAUNCH_CMD" >/dev/null 2>&1 ||
        die 2 "GAUDI_LAUNCH_CMD '$GAUDI_LAUNCH_CMD' not found (pip install gaudi-launch, or set GAUDI_LAUNCH_CMD)"
    LAUNCHER=("$GAUDI_LAUNCH_CMD" --hostfile "$HOSTFILE" --ssh-port "$SSH_PORT"
        --ssh-config "$SSH_CLIENT_CONFIG" --ssh-identity "$SSH_IDENTITY")
}

# ------------------------------------------------------------------ signals and cleanup

cleanup() {
    local pid
    if [ -n "$PROBE_DIR" ]; then rm -rf "$PROBE_DIR"; fi
    for pid in "${PROBE_PIDS[@]}" "$CHILD_PID"; do
        if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; fi
    done
    if [ -n "$SSHD_PID" ] && kill -0 "$SSHD_PID" 2>/dev/null; then
        kill -TERM "$SSHD_PID" 2>/dev/null || true
        wait "$SSHD_PID" 2>/dev/null || true
    fi
}

on_signal_before_launch() {
    log "received SIG$1 before the launch: stopping"
    trap - EXIT
    cleanup
    exit "$2"
}

FORWARDED=""
forward_signal() {
    FORWARDED=$1
    if [ -n "$CHILD_PID" ]; then kill -s "$1" "$CHILD_PID" 2>/dev/null || true; fi
}

# run_child ARGV...: run a command with signals forwarded to it; return its exit status.
run_child() {
    local rc
    # a background job of a non-interactive shell starts with SIGINT/SIGQUIT ignored: undo that
    (
        trap - INT QUIT
        exec "$@"
    ) &
    CHILD_PID=$!
    trap 'forward_signal TERM' TERM
    trap 'forward_signal INT' INT
    trap 'forward_signal HUP' HUP
    while :; do
        FORWARDED=""
        rc=0
        wait "$CHILD_PID" || rc=$?
        # wait returns early when a trapped signal arrives; wait again for the child's own status
        [ -n "$FORWARDED" ] || break
    done
    CHILD_PID=""
    return "$rc"
}

# ------------------------------------------------------------------ roles

role_worker() {
    prepare_sshd 1
    log "starting sshd in the foreground on port $SSH_PORT ($SSHD_CONFIG)"
    exec "$SSHD" -D -e -f "$SSHD_CONFIG"
}

role_leader() {
    local rc
    read_hosts
    check_path SSH_IDENTITY "$SSH_IDENTITY"
    check_path KNOWN_HOSTS "$KNOWN_HOSTS"
    launcher_argv
    trap cleanup EXIT
    trap 'on_signal_before_launch TERM 143' TERM
    trap 'on_signal_before_launch INT 130' INT
    trap 'on_signal_before_launch HUP 129' HUP
    ensure_leader_key
    prepare_sshd 0 "$LEADER_PUB"
    start_background_sshd
    wait_for_hosts
    record_host_keys
    if efa_present; then
        write_efa_env
    else
        log "no EFA device (${EFA_SYSFS}/efa*, $FI_INFO -p efa): no OFI variables written"
    fi
    write_client_config
    log "running: ${LAUNCHER[*]} $*"
    rc=0
    run_child "${LAUNCHER[@]}" "$@" || rc=$?
    log "gaudi-launch exited with status $rc"
    exit "$rc"
}

role_check() {
    read_hosts
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
