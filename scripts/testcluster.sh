#!/usr/bin/env bash
# A multi-host test cluster on this machine (one netns + sshd per host, over a bridge). Needs root.
#   scripts/testcluster.sh up [N] [DIR]    build N hosts (default 3) and leave them running
#   scripts/testcluster.sh down [DIR]      tear it down
#   scripts/testcluster.sh status [DIR]
# DIR defaults to /tmp/gaudi-launch-cluster. Options before the command: --prefix gl --octet 213.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$root/.venv/bin/python"
[ -x "$py" ] || py="$(command -v python3)"
exec "$py" "$root/tests/cluster/netcluster.py" "$@"
