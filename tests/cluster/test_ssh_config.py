"""One SSH model on real hosts: a port that only an Include'd ssh_config file gives reaches the pre-flight
and an mpirun launch alike (inputs/sshconfig.py read by the launcher, OpenSSH's own reading by its ssh).

Host gl-n1 answers only on port 2222 for this test (a second sshd there, its port-22 sshd stopped), and
only a file that the --ssh-config file Includes says so. The launcher runs on gl-n0, a login node outside
the hostfile (root@gl-n1, gl-n2): gl-n1 is the master, so the pre-flight's master check (every host
TCP-connects to the master's ssh port, which the launcher names from its reading of the config) and the
job's ssh all need that port. The included file also says User nobody for gl-n1, which the hostfile's
root@gl-n1 overrides for every ssh of the job: the pre-flight's, and mpirun's own (GAUDI_LAUNCH_SSH_SHARE=0:
no shared connection, the pre-flight through paramiko) through the user@host lines of its hostfile.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from gaudi_launch.wire import SSH_SHARE
from tests.cluster.netcluster import SSHD
from tests.cluster.test_multinode import ROOT, SMOKE

PORT = 2222


def wait_listening(addr: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((addr, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.parametrize("share", ["1", "0"])
def test_included_port_reaches_preflight_and_mpirun(cluster, tmp_path, share):
    host = cluster.hosts[1]
    conf = tmp_path / "sshd_config"
    kept = [line for line in open(host.sshd_config).read().splitlines() if not line.startswith(("Port ", "PidFile "))]
    conf.write_text("\n".join(kept + [f"Port {PORT}", f"PidFile {tmp_path}/sshd.pid"]) + "\n")
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "10-gl-n1.conf").write_text(
        f"Host {host.name}\n    Port {PORT}\n    User nobody\n    UserKnownHostsFile {tmp_path}/known_hosts\n"
    )
    config = tmp_path / "config"
    config.write_text(f"Include {tmp_path}/conf.d/*.conf\nInclude {cluster.ssh_config}\n")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"root@{host.name} slots=2\n{cluster.hosts[2].name} slots=2\n")
    env = dict(os.environ, PATH=os.environ["PATH"].replace(cluster.bin_dir + os.pathsep, ""))  # no ssh wrapper
    env[SSH_SHARE] = share

    second = cluster.popen_on(
        1, [SSHD, "-D", "-e", "-f", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    cluster.stop_sshd(1)
    try:
        wait_listening(host.addr, PORT)
        argv = [sys.executable, "-m", "gaudi_launch", "--hostfile", str(hostfile), "--ssh-config", str(config)]
        argv += ["--backend", "mpirun", "--grace", "5", SMOKE]
        res = cluster.run_on(0, argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        cluster.start_sshd(1)
        second.terminate()
        second.wait(10)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ok = [line for line in res.stdout.splitlines() if "all_reduce sum = 10, expected 10: OK" in line]
    assert len(ok) == 4 and sum(f" on {host.name} " in line for line in ok) == 2, res.stdout[-3000:]
    # the job's ssh went to port 2222 (nothing else listened on gl-n1) and remembered the key there
    assert f"[{host.addr}]:{PORT} " in (tmp_path / "known_hosts").read_text()
