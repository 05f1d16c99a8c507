"""What the collective check costs (issues 25, 33): 2, 4, 8, 16 hosts, beside the launch without it.

On a namespace cluster this script builds (tests/cluster/netcluster.py, prefix "glq", subnet 10.226.0.0/24,
never the tests' clusters), per host count: a launch of `/bin/true` (one rank per host, --no_python), the
same launch's pre-flight with the collective check (`gaudi-launch check --collective`: on this CPU its
torch-free TCP stage is the verdict), the check with one host's link throttled both ways (tc tbf, 200 mbit),
which must name that host and only it slow, the check with one host hung (an iptables connbytes rule in its
namespace: its connections stop carrying data after 2 MB), which must name that host and only it failed
within its pairs' deadlines (the default 10 s each), and the healthy check with gloo's stage as well
(GAUDI_LAUNCH_COLLECTIVE_LIBRARY=1: what hccl and nccl always run, each pair's processes importing torch;
each pair's all-reduce 4 MB x 5 here, GAUDI_LAUNCH_COLLECTIVE_SIZE, not hccl_demo's 32 MB x 1000).
With two hosts nothing can tell which end of their one link is bad: the throttled and hung checks must
name neither (exit 3, "not pinned").
Every command runs "on" host 0 with the cluster's ssh wrapper first on PATH. Printed: seconds per run
(median of --repeats), and the check's table with the throttled host at the largest count.

    .venv/bin/python scripts/bench/bench_collective.py [--hosts 2,4,8,16] [--repeats 1]

A benchmark, not a test: exit 1 only when a run did not do what it should (launch failed, the healthy check
failed, or the throttled check did not name exactly the throttled host).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

PREFIX, OCTET = "glq", 226
RATE = "200mbit"


def run_on_0(cluster, argv: list[str], workdir: str, env=None) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    env = cluster.env(env)
    res = cluster.run_on(0, argv, env=env, cwd=workdir, capture_output=True, text=True, timeout=600)
    return time.monotonic() - t0, res


def throttle(cluster, i: int, on: bool) -> None:
    h = cluster.hosts[i]
    tbf = ["tbf", "rate", RATE, "burst", "64kb", "latency", "200ms"]
    for prefix, dev in (([], h.veth), (["ip", "netns", "exec", h.netns], "eth0")):
        args = ["add", "dev", dev, "root", *tbf] if on else ["del", "dev", dev, "root"]
        subprocess.run([*prefix, "tc", "qdisc", *args], check=on, capture_output=True)


HANG_RULE = ["-p", "tcp", "-m", "connbytes", "--connbytes", f"{2 << 20}:", "--connbytes-dir", "both"]
HANG_RULE += ["--connbytes-mode", "bytes", "-j", "DROP"]


def hang(cluster, i: int, on: bool) -> None:
    ns = ["ip", "netns", "exec", cluster.hosts[i].netns, "iptables"]
    for chain in ("INPUT", "OUTPUT"):
        subprocess.run([*ns, "-A" if on else "-D", chain, *HANG_RULE], check=on, capture_output=True)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="2,4,8,16")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    counts = sorted(int(x) for x in args.hosts.split(","))
    from tests.cluster.netcluster import NetCluster

    failures = 0
    rows = []
    last_table = ""
    with tempfile.TemporaryDirectory(prefix="bench-collective-") as workdir:
        cluster = NetCluster(counts[-1], os.path.join(workdir, "cluster"), prefix=PREFIX, subnet_octet=OCTET)
        with cluster:
            gl = [sys.executable, "-m", "gaudi_launch"]
            for n in counts:
                hf = cluster.hostfile(slots=1, hosts=list(range(n)))
                common = ["--hostfile", hf, "--ssh-config", cluster.ssh_config]
                times: dict[str, list[float]] = {
                    "launch": [],
                    "check": [],
                    "check+slow": [],
                    "check+hung": [],
                    "check+gloo": [],
                }
                slow_host = cluster.names[n - 1]
                for _ in range(args.repeats):
                    took, res = run_on_0(cluster, gl + common + ["--no_python", "/bin/true"], workdir)
                    times["launch"].append(took)
                    failures += res.returncode != 0
                    took, res = run_on_0(cluster, gl + ["check", *common, "--collective"], workdir)
                    times["check"].append(took)
                    if res.returncode != 0:
                        failures += 1
                        print(res.stdout[-2000:], res.stderr[-2000:], file=sys.stderr)
                    throttle(cluster, n - 1, True)
                    try:
                        took, res = run_on_0(cluster, gl + ["check", *common, "--collective", "--json"], workdir)
                    finally:
                        throttle(cluster, n - 1, False)
                    times["check+slow"].append(took)
                    failures += not named_alone(res, [slow_host] if n > 2 else [], n, "throttled")
                    hang(cluster, n - 1, True)
                    try:
                        took, res = run_on_0(cluster, gl + ["check", *common, "--collective", "--json"], workdir)
                    finally:
                        hang(cluster, n - 1, False)
                    times["check+hung"].append(took)
                    failures += not named_alone(res, [slow_host] if n > 2 else [], n, "hung")
                    gloo = dict(os.environ, GAUDI_LAUNCH_COLLECTIVE_LIBRARY="1", GAUDI_LAUNCH_COLLECTIVE_SIZE="4m,5")
                    took, res = run_on_0(cluster, gl + ["check", *common, "--collective", "--json"], workdir, gloo)
                    times["check+gloo"].append(took)
                    if res.returncode != 0 or json.loads(res.stdout or "{}").get("library") != "gloo":
                        failures += 1
                        print(res.stdout[-2000:], res.stderr[-2000:], file=sys.stderr)
                    if n == counts[-1]:
                        throttle(cluster, n - 1, True)
                        try:
                            _, shown = run_on_0(cluster, gl + ["check", *common, "--collective"], workdir)
                        finally:
                            throttle(cluster, n - 1, False)
                        last_table = shown.stdout
                rows.append((n, *(statistics.median(v) for v in times.values())))
    head = ("launch /bin/true", "check --collective", "same, 1 host slow", "same, 1 host hung", "same + gloo stage")
    print(f"{'hosts':>5}  " + "  ".join(f"{h:>18}" for h in head))
    for n, *secs in rows:
        print(f"{n:>5}  " + "  ".join(f"{s:>16.2f} s" for s in secs))
    print(f"\n{counts[-1]} hosts, {cluster.names[counts[-1] - 1]} throttled to {RATE} both ways:\n{last_table}")
    return 1 if failures else 0


def named_alone(res, expected: list[str], n: int, what: str) -> bool:
    """Whether the check said exit 3 and named exactly ``expected`` (slow or failed)."""
    try:
        data = json.loads(res.stdout)
        named = data["slow"] + data["failed"]
    except (ValueError, KeyError):
        named = None
    if res.returncode != 3 or named != expected:
        print(f"{n} hosts: {what} host, exit {res.returncode}, named {named}", file=sys.stderr)
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
