#!/usr/bin/env bash
# Install the system tools the multi-host test clusters need (sshd, ssh, OpenMPI, pdsh, ip, nsenter;
# Slurm and munge for the Slurm cluster; Docker's engine and debootstrap for the image tests).
# Idempotent: does nothing when everything is already present.
set -euo pipefail

# acct: the kernel's process accounting (accton, dump-acct), for bench_scale.py --cpu-by-process
PKGS=(openssh-server openssh-client openmpi-bin pdsh iproute2 util-linux acct)

missing=()
have() { command -v "$1" >/dev/null 2>&1 || [ -x "$1" ]; }
[ -x /usr/sbin/sshd ] || missing+=("/usr/sbin/sshd")
for tool in ssh ssh-keygen mpirun pdsh ip nsenter unshare accton dump-acct; do
    have "$tool" || missing+=("$tool")
done

# The Slurm test cluster (tests/slurm): Debian's Slurm 22.05 and munge. Their daemons do not start
# on install (policy-rc.d); the tests start their own, with their own configuration and key.
SLURM_PKGS=(slurm-wlm munge)
for tool in srun salloc sbatch scontrol squeue scancel sinfo munged mungekey; do
    have "$tool" || missing+=("$tool")
done
[ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] || missing+=("slurmctld/slurmd")

# The Docker image tests (tests/docker): Debian's engine (no systemd here: the tests start dockerd
# themselves) and debootstrap, which makes the stand-in base image (scripts/docker-standin-base.sh).
DOCKER_PKGS=(docker.io debootstrap)
for tool in docker dockerd debootstrap; do
    have "$tool" || missing+=("$tool")
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-system-deps: all present (sshd, ssh, mpirun, pdsh, ip, nsenter, unshare, accton, slurm, munge, docker, debootstrap)"
    exit 0
fi

echo "install-system-deps: missing: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
    echo "install-system-deps: not root; install as root with:" >&2
    echo "  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${PKGS[*]}" >&2
    echo "  apt-get install -y ${SLURM_PKGS[*]}" >&2
    echo "  apt-get install -y --no-install-recommends ${DOCKER_PKGS[*]}" >&2
    exit 1
fi

apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${SLURM_PKGS[@]}" >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${DOCKER_PKGS[@]}" >/dev/null
mkdir -p /run/sshd
echo "install-system-deps: installed ${PKGS[*]} ${SLURM_PKGS[*]} ${DOCKER_PKGS[*]}"
