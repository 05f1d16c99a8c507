#!/usr/bin/env bash
# A stand-in for Habana's PyTorch base image (vault.habana.ai/gaudi-docker/<SYNAPSE>/<OS>/habanalabs/
# pytorch-installer-<TORCH>), made from Debian's own packages, so that docker/Dockerfile builds and its
# containers run where Habana's registry cannot be reached (this project's CI, tests/docker).
#
# It has what docker/Dockerfile and docker/entrypoint.sh take from Habana's image: python3 with pip that
# installs system-wide (Debian's EXTERNALLY-MANAGED marker removed, as Habana's images allow it) and
# OpenMPI's mpirun. For an OS of ubuntu24.04 or later it also has what Habana's images inherit from
# ubuntu:noble and a Dockerfile can trip on: user "ubuntu" with uid and gid 1000
# (https://bugs.launchpad.net/cloud-images/+bug/2005129). It leaves out everything Gaudi: the SynapseAI
# driver libraries, habana_frameworks, Habana's torch and DeepSpeed, hl-smi, the Ubuntu release itself (the
# OS in the tag is only a name: this is Debian bookworm whatever it says) and libfabric/EFA. So a job in it
# runs plain Python ranks, never a training step.
#
#   scripts/docker-standin-base.sh          build it (or bring it up to date) and print its tag
#
# The tag is the one docker/Dockerfile's FROM names with --build-arg HABANA_REGISTRY=localhost, for the
# Dockerfile's default SYNAPSE_VERSION/OS/TORCH_VERSION/BASE_TAG, or for those set in the environment:
#   localhost/1.23.0/ubuntu24.04/habanalabs/pytorch-installer-2.9.0:latest
# Then: docker build -f docker/Dockerfile --build-arg HABANA_REGISTRY=localhost --build-arg EFA=0 .
#
# Steps: debootstrap --variant=minbase (once: imported as $DEBIAN_IMAGE and reused, about 35 s), then a
# small docker build on it. Both use the host's network (--network host), so no NAT rule is needed.
# Package registries here sit behind a TLS proxy whose CA only this machine's bundle holds: its
# certificates go into the image's /usr/local/share/ca-certificates and update-ca-certificates runs after
# the ca-certificates package is installed (the package would rebuild the bundle without them).
# Needs root (debootstrap), docker, debootstrap, csplit. Settings (environment):
#   HABANA_REGISTRY (localhost) SYNAPSE_VERSION OS TORCH_VERSION BASE_TAG (the Dockerfile's defaults)
#   DEBIAN_SUITE (bookworm) DEBIAN_MIRROR (http://deb.debian.org/debian)
#   DEBIAN_IMAGE (gaudi-launch-standin/debian:$DEBIAN_SUITE) HOST_CA_BUNDLE (/etc/ssl/certs/ca-certificates.crt)
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "docker-standin-base: $*" >&2; }
die() {
    say "error: $*"
    exit 1
}

# The Dockerfile's own ARG defaults, so that the tag follows it.
dockerfile_default() {
    local v
    v=$(sed -n "s/^ARG $1=//p" docker/Dockerfile | head -n 1)
    [ -n "$v" ] || die "docker/Dockerfile has no 'ARG $1=' default"
    echo "$v"
}
HABANA_REGISTRY=${HABANA_REGISTRY:-localhost}
SYNAPSE_VERSION=${SYNAPSE_VERSION:-$(dockerfile_default SYNAPSE_VERSION)}
OS=${OS:-$(dockerfile_default OS)}
TORCH_VERSION=${TORCH_VERSION:-$(dockerfile_default TORCH_VERSION)}
BASE_TAG=${BASE_TAG:-$(dockerfile_default BASE_TAG)}
TAG="$HABANA_REGISTRY/$SYNAPSE_VERSION/$OS/habanalabs/pytorch-installer-$TORCH_VERSION:$BASE_TAG"
DEBIAN_SUITE=${DEBIAN_SUITE:-bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBIAN_IMAGE=${DEBIAN_IMAGE:-gaudi-launch-standin/debian:$DEBIAN_SUITE}
HOST_CA_BUNDLE=${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

command -v docker >/dev/null || die "docker not found (apt-get install docker.io, then start dockerd)"
docker info >/dev/null 2>&1 || die "the Docker engine does not answer (start it: dockerd >/tmp/dockerd.log 2>&1 &)"
[ -s "$HOST_CA_BUNDLE" ] || die "no CA bundle at HOST_CA_BUNDLE=$HOST_CA_BUNDLE"

work=$(mktemp -d "${TMPDIR:-/tmp}/gaudi-launch-standin.XXXXXX")
trap 'rm -rf "$work"' EXIT

if ! docker image inspect "$DEBIAN_IMAGE" >/dev/null 2>&1; then
    [ "$(id -u)" -eq 0 ] || die "debootstrap needs root (or docker pull a $DEBIAN_SUITE image and tag it $DEBIAN_IMAGE)"
    command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
    say "debootstrap --variant=minbase $DEBIAN_SUITE (once; kept as $DEBIAN_IMAGE)..."
    debootstrap --variant=minbase "$DEBIAN_SUITE" "$work/rootfs" "$DEBIAN_MIRROR" >"$work/debootstrap.log" 2>&1 ||
        die "debootstrap failed: $(tail -n 5 "$work/debootstrap.log")"
    # debootstrap's downloaded packages and apt lists are not part of the system (80 MB)
    tar -C "$work/rootfs" --exclude='./var/cache/apt/archives/*.deb' --exclude='./var/lib/apt/lists/*' -c . |
        docker import - "$DEBIAN_IMAGE" >/dev/null
    rm -rf "$work/rootfs"
fi

# Ubuntu 23.04 and later images hold user "ubuntu" (uid 1000); 22.04 and earlier do not.
noble_user=""
case "$OS" in
ubuntu2[3-9].* | ubuntu[3-9][0-9].*)
    noble_user="RUN useradd --create-home --uid 1000 --user-group --shell /bin/bash --comment Ubuntu ubuntu"
    ;;
esac

# One file per certificate: update-ca-certificates reads single certificates from /usr/local/share.
mkdir -p "$work/ctx/cas"
csplit -s -z -f "$work/ctx/cas/host-" -b '%03d.crt' "$HOST_CA_BUNDLE" '/-----BEGIN CERTIFICATE-----/' '{*}'
cat >"$work/ctx/Dockerfile" <<EOF
# Stand-in for Habana's PyTorch image, written by scripts/docker-standin-base.sh (see there).
FROM $DEBIAN_IMAGE
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
RUN apt-get update -qq \\
    && apt-get install -y -qq --no-install-recommends python3 python3-pip ca-certificates openmpi-bin >/dev/null \\
    && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \\
    && rm -rf /var/lib/apt/lists/*
COPY cas/ /usr/local/share/ca-certificates/host/
RUN update-ca-certificates >/dev/null
$noble_user
LABEL org.opencontainers.image.description="gaudi-launch stand-in for Habana's pytorch-installer image ($OS in name only): Debian $DEBIAN_SUITE, python3, pip, OpenMPI; no Gaudi stack"
EOF
say "building $TAG..."
docker build -q --network host -t "$TAG" "$work/ctx" >/dev/null
echo "$TAG"
