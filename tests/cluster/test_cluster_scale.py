"""The namespace cluster at the size the launch bench needs (scripts/bench/bench_scale.py, 64 hosts):
it comes up, every host answers over ssh as itself, and it goes down leaving nothing."""

from __future__ import annotations

import subprocess
import time

from tests.cluster.conftest import require_cluster_support, running
from tests.cluster.netcluster import NetCluster

HOSTS = 64


def test_sixty_four_hosts_come_up_and_each_answers_as_itself(tmp_path):
    require_cluster_support()
    with running(NetCluster(HOSTS, str(tmp_path / "c"), prefix="glv", subnet_octet=228)) as c:
        assert len({h.addr for h in c.hosts}) == HOSTS and c.hosts[-1].addr == "10.228.0.73"
        # one ssh per host, all at once, from host 0 as a launcher would: each answers with its own name
        t0 = time.monotonic()
        procs = [
            c.popen_on(0, c.ssh_argv(h, "hostname"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for h in c.hosts
        ]
        answers = [p.communicate(timeout=120) for p in procs]
        fanout_s = time.monotonic() - t0
        wrong = [
            (h.name, p.returncode, out.strip(), err.strip()[-200:])
            for h, p, (out, err) in zip(c.hosts, procs, answers)
            if (p.returncode, out.strip()) != (0, h.name)
        ]
        assert not wrong, wrong
        mem = c.memory_kib()
        # an anchor and an sshd per host at least (the sessions above have ended)
        assert mem["hosts"] == HOSTS and mem["processes"] >= 2 * HOSTS and mem["pss"] > 0, mem
        print(
            f"{HOSTS} hosts: up {c.timings['up']:.2f} s, an ssh to each at once {fanout_s:.2f} s, "
            f"{mem['pss'] / 1024:.1f} MiB PSS ({mem['pss'] / HOSTS:.0f} KiB a host), {mem['rss'] / 1024:.0f} MiB RSS"
        )
