# The pre-flight's probe (gaudi_launch/remote/probe.py), run by each host's login shell. It arrives as
# one command line: `set -- ARGS` (each shlex-quoted) followed by this text, so no value is ever code.
# It prints key=value lines between markers (probe.parse reads them); every check runs on its own with
# its errors swallowed, so one failing check never hides the others. The shell's own expansions do the
# text work: no head, tr or sed to start, since the probe runs on every host of every job.
#
# $1 the workers' python   $2 working directory   $3 script ("" for none)
# $4 Python code: probe_checks.py, followed by the session agent when $5 is 1; empty: a one-host job's facts
#    only (no Python checks, no OpenMPI version, no scale-out ports, links or libfabric: nothing between hosts)
# $5 1: the interpreter stays on as the session's agent (stdin is the session's); 2: the Python checks are left to
#    the caller, which runs them in its own interpreter (the one-pass rank bootstrap, process/gate.py)
# $6 what the ranks have first on sys.path (the working directory, the job's PYTHONPATH), ':'-joined
# $7... the checks' argv: MASTER_ADDR MASTER_SSH_PORT (0: only resolve the master) [PORT_TO_CHECK]
py=$1 cwd=$2 script=$3 code=$4 agent=$5 search=$6
shift 6
echo '@@gaudi-launch-probe begin'
# each external tool gets a time limit when `timeout` exists
_t() { if command -v timeout >/dev/null 2>&1; then timeout 20 "$@"; else "$@"; fi; }
# _one TEXT: its first line, without carriage returns or trailing spaces, in $_v
_nl='
'
_cr=$(printf '\r')
_one() {
    _v=$1
    while :; do case $_v in *"$_cr"*) _v=${_v%%"$_cr"*}${_v#*"$_cr"};; *) break;; esac; done
    _v=${_v%%"$_nl"*}
    while [ "${_v% }" != "$_v" ]; do _v=${_v% }; done
}
# when the checks cannot run: python_ok=0, and what they would have said is not known
_unknown() {
    echo python_ok=0
    echo master_reachable=unknown
    if [ $# -gt 2 ]; then echo port_free=unknown; fi
}
_one "$( (hostname || uname -n || cat /proc/sys/kernel/hostname) 2>/dev/null)"; echo "hostname=$_v"
_one "$( (nproc || getconf _NPROCESSORS_ONLN) 2>/dev/null)"; echo "ncpus=$_v"
_one "$(command -v "$py" 2>/dev/null)"; echo "python_path=$_v"
# the cards, a line each: their count here, their generation, driver and bus ids for the scale-out facts below
_q=
if command -v hl-smi >/dev/null 2>&1; then
    _q=$(_t hl-smi -Q name,driver_version,bus_id -f csv,noheader 2>/dev/null </dev/null); _rc=$?
    if [ "$_rc" = 0 ]; then echo "devices=$(printf '%s\n' "$_q" | grep -c '[^[:space:]]')"
    else echo devices=0; echo "devices_error=hl-smi failed (exit $_rc)"; fi
else echo devices=none; fi
# mpirun on PATH, else where Habana's RHEL-family images (HabanaAI/Setup_and_Install dockerfiles/base: MPI_ROOT=
# /opt/habanalabs/openmpi, on PATH only through Docker's ENV, which an ssh session does not get) and AWS's put it
_m=$(command -v mpirun 2>/dev/null)
for _d in /opt/habanalabs/openmpi /opt/amazon/openmpi; do
    [ -z "$_m" ] && [ -x "$_d/bin/mpirun" ] && _m=$_d/bin/mpirun
done
if [ -n "$_m" ] && [ -n "$code" ]; then _one "$(_t "$_m" --version 2>&1 </dev/null)"; echo "openmpi=$_v"; fi
# hl-smi calls that need no other's answer run side by side: _side_start CALL ARG... runs each function CALL with
# its one ARG in the background, into a file of its own; _side_end waits and prints them in that order. Habana's
# Health Screen reads a host's cards so (IGNodes.py health_check: a process per card). One after another, an 8-card
# host made 30 hl-smi calls in a row, each opening the driver; now 4 (the list of the cards, then each card's three
# port reads beside the rest). Where mktemp is missing, one after another still.
_side_start() {
    _side_d=$(mktemp -d 2>/dev/null) || _side_d=
    _side_n=0
    while [ $# -ge 2 ]; do
        _side_n=$((_side_n + 1))
        if [ -n "$_side_d" ]; then "$1" "$2" >"$_side_d/$_side_n" & else "$1" "$2"; fi
        shift 2
    done
}
_side_end() {
    [ -n "$_side_d" ] || return 0
    wait
    _side_k=0
    while [ "$_side_k" -lt "$_side_n" ]; do _side_k=$((_side_k + 1)); cat "$_side_d/$_side_k" 2>/dev/null; done
    rm -rf "$_side_d"
}
_ports() { echo "@@hl-smi -n ports -i $1"; _t hl-smi -n ports -i "$1" 2>/dev/null </dev/null; }
# every port of a card, three reads: a port DOWN in any read is down, UP and DOWN is flapping (Intel Gaudi Health
# Screen, IGNodes.py check_link_state, reads each card's ports repeatedly)
_reads() {
    for _r in 1 2 3; do echo "@@hl-smi -n link -i $1"; _t hl-smi -n link -i "$1" 2>/dev/null </dev/null; done
}
_fw() { echo '@@hl-smi --fw-versions'; _t hl-smi --fw-versions 2>/dev/null </dev/null; }
_table() { echo '@@hl-smi'; _t hl-smi 2>/dev/null </dev/null; }
# Scale-out facts (plan/scaleout.py reads them): each tool's output verbatim under a @@<command> line.
# GAUDI_LAUNCH_SYSFS / GAUDI_LAUNCH_PROCFS: where /sys and /proc are (tests point them at a stand-in tree).
# hl-smi's port lists only when it answers, -n ports on card 0 (the external ports are the same on each card).
_scaleout() {
    _s=${GAUDI_LAUNCH_SYSFS:-/sys}
    echo '@@scaleout begin'
    echo '@@uname -r'; uname -r 2>/dev/null
    echo '@@ls /sys/class/infiniband'
    for _e in "$_s"/class/infiniband/*; do [ -e "$_e" ] && echo "${_e##*/}"; done
    if [ -n "$code" ] && command -v fi_info >/dev/null 2>&1; then
        echo '@@fi_info --version'; _t fi_info --version 2>/dev/null </dev/null
        _efa=0
        for _e in "$_s"/class/infiniband/efa* "$_s"/class/infiniband/rdmap*; do [ -e "$_e" ] && _efa=1; done
        if [ "$_efa" = 0 ]; then echo '@@fi_info -p efa'; _t fi_info -p efa 2>/dev/null </dev/null; fi
        # Gaudi Direct's kernel check (HabanaAI/HCL hl_ofi.cpp ofi_t::checkDMABUFSupport): the symbol's name
        echo '@@grep -c ib_umem_dmabuf_get kallsyms'
        grep -c ib_umem_dmabuf_get "${GAUDI_LAUNCH_PROCFS:-/proc}/kallsyms" 2>/dev/null
    fi
    if command -v hl-smi >/dev/null 2>&1; then
        echo '@@hl-smi -Q name,driver_version,bus_id -f csv,noheader'; printf '%s\n' "$_q"
        _buses=
        [ -n "$code" ] && while IFS= read -r _l; do
            case $_l in HL-*,*,*) ;; *) continue ;; esac
            _b=${_l##*,}; _b=${_b# }
            _buses="$_buses $_b"
        done <<EOF_Q
$_q
EOF_Q
        # side by side: card 0's port types, each card's port reads, the firmware and the summary table (the
        # last two between hosts only); the rest below meanwhile
        set --
        for _b in $_buses; do
            [ $# -eq 0 ] && set -- _ports "$_b"
            set -- "$@" _reads "$_b"
        done
        if [ -n "$code" ]; then set -- "$@" _fw "" _table ""; fi
        _side_start "$@"
        if [ -n "$code" ]; then  # (a one-host job: nothing between hosts)
            # the L3 Gaudi-NIC configuration HCL reads at every start when it exists (HabanaAI/HCL
            # hcl_device_config.cpp parseGaudinet: HCL_GAUDINET_CONFIG_FILE, else /etc/habanalabs/gaudinet.json,
            # falling back to /etc/gaudinet.json)
            _g=${HCL_GAUDINET_CONFIG_FILE:-/etc/habanalabs/gaudinet.json}
            [ -r "$_g" ] || _g=/etc/gaudinet.json
            if [ -r "$_g" ]; then echo "@@gaudinet.json $_g"; cat "$_g" 2>/dev/null; echo; fi
            # HCCL's OFI plugin (HabanaAI/HCL ofi_plugin.cpp) dlopens libhccl_ofi_wrapper.so: where it resolves from
            echo '@@find libhccl_ofi_wrapper.so'
            _ldc=$(command -v ldconfig 2>/dev/null || { [ -x /sbin/ldconfig ] && echo /sbin/ldconfig; })
            if [ -n "$_ldc" ]; then
                "$_ldc" -p 2>/dev/null | grep -F 'libhccl_ofi_wrapper.so ' | while IFS= read -r _l; do
                    echo "ldconfig ${_l##*=> }"
                done
            fi
            _ifs=$IFS; IFS=:
            for _d in ${LD_LIBRARY_PATH:-} ${HCCL_OFI_WRAPPER:-} /usr/lib/habanalabs /root/hccl_ofi_wrapper; do
                [ -n "$_d" ] && [ -e "$_d/libhccl_ofi_wrapper.so" ] && echo "dir $_d"
            done
            IFS=$_ifs
        fi
        # which card is which module (preflight.py: partial nodes, cards another process holds)
        _c=$(_t hl-smi -Q index,module_id,bus_id -f csv,noheader 2>/dev/null </dev/null)
        echo '@@hl-smi -Q index,module_id,bus_id -f csv,noheader'; printf '%s\n' "$_c"
        # each card's NUMA node and each node's CPUs, for the ranks' binding (inputs/cards.py)
        echo '@@numa'
        while IFS=, read -r _i _mod _b; do
            _b=${_b# }; [ -r "$_s/bus/pci/devices/$_b/numa_node" ] && echo "$_b $(cat "$_s/bus/pci/devices/$_b/numa_node")"
        done <<EOF_C
$_c
EOF_C
        for _n in "$_s"/devices/system/node/node[0-9]*; do
            [ -r "$_n/cpulist" ] && echo "${_n##*/} $(cat "$_n/cpulist")"
        done
        _side_end
    fi
    echo '@@scaleout end'
}
_scaleout
if [ "$agent" = 0 ] && [ -n "$code" ]; then
    # before the cd: python -c puts the working directory on sys.path, where a stray socket.py must not
    # matter. Printing nothing means it did not run.
    _p=$(_t "$py" -c "$code" "$search" "$@" </dev/null 2>/dev/null)
    if [ -n "$_p" ]; then printf '%s\n' "$_p"; else _unknown "$@"; fi
fi
if cd "$cwd" 2>/dev/null; then
    echo cwd_ok=1
    if [ -n "$script" ]; then
        if [ -f "$script" ] && [ -r "$script" ]; then echo script_ok=1; else echo script_ok=0; fi
    fi
else
    echo cwd_ok=0
    if [ -n "$script" ]; then echo script_ok=0; fi
fi
echo '@@ip-addr begin'
ip -o addr show 2>/dev/null
echo '@@ip-addr end'
if [ "$agent" != 1 ]; then
    echo '@@gaudi-launch-probe end'
    exit 0
fi
# The agent: the checks run last in the interpreter that stays on (one start, not two), leave the
# working directory off sys.path first, print the end marker and then read the session's requests.
# When it does not run at all, the shell ends the probe itself.
"$py" -u -c "$code" "$search" "$@" 2>/dev/null || { _unknown "$@"; echo '@@gaudi-launch-probe end'; }
