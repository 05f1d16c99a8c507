#!/usr/bin/env bash
# Install the system tools the multi-host test cluster needs (sshd, ssh, OpenMPI, pdsh, ip, nsenter).
# Idempotent: does nothing when everything is already present.
set -euo pipefail

PKGS=(openssh-server openssh-client openmpi-bin pdsh iproute2 util-linux)

missing=()
have() { command -v "$1" >/dev/null 2>&1 || [ -x "$1" ]; }
[ -x /usr/sbin/sshd ] || missing+=("/usr/sbin/sshd")
for tool in ssh ssh-keygen mpirun pdsh ip nsenter unshare; do
    have "$tool" || missing+=("$tool")
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-system-deps: all present (sshd, ssh, mpirun, pdsh, ip, nsenter, unshare)"
    exit 0
fi

echo "install-system-deps: missing: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
    echo "install-system-deps: not root; install as root with:" >&2
    echo "  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${PKGS[*]}" >&2
    exit 1
fi

apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
mkdir -p /run/sshd
echo "install-system-deps: installed ${PKGS[*]}"
