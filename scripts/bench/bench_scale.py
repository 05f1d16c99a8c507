"""Launch cost against the number of hosts: gaudi-launch next to raw mpirun (and pdsh/DeepSpeed), 2..16 hosts.

Every configuration starts one rank per host running `/bin/true` (`--no_python`), so nothing is
measured but launching: ssh, the pre-flight, mpirun's daemons, the end-of-job sweep. The hosts are a
namespace cluster this script builds (tests/cluster/netcluster.py, prefix "glb", subnet 10.221.0.0/24,
one sshd per host; never the tests' clusters) and every launcher runs "on" its first host with the
cluster's ssh wrapper first on PATH, as a user on a login node that is also host 0 would.

    .venv/bin/python scripts/bench/bench_scale.py [--hosts 2,4,8,16] [--repeats 3] [--deepspeed] [--json out.json]

Rows of each round are interleaved (every host count and configuration once per round, the order of
the configurations rotated each round), so load on this shared machine hits them alike. Printed: the
median of the rounds per host count, its ratio to raw mpirun at the same host count, and per
configuration the least-squares slope in seconds per host. Then the per-host costs measured on
the cluster (handshake, a session over an open connection, the pre-flight's probe), the plan's
scale (dry run of 1,000 and 10,000 hosts x 8, the longest mpirun argument) and a model of launch
time at 128 and 1,024 hosts built from those costs, with its assumptions. A benchmark, not a test:
it passes or fails on nothing but a launch that did not exit 0 (exit status 1 then).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

from bench_launch import environment, environment_line, timed, venv_tool  # noqa: E402

BASELINE = "mpirun (raw)"
PREFIX, OCTET = "glb", 221


def gl_argv() -> list[str]:
    # `python -m gaudi_launch` from this checkout (the console script may point at another one)
    return [sys.executable, "-m", "gaudi_launch"]


def configs(deepspeed: bool) -> list[tuple[str, callable]]:
    """(name, build(cluster, hostfile, n, workdir) -> argv)."""

    def gl(*extra):
        return lambda c, hf, n, wd: gl_argv() + ["--hostfile", hf, "--ssh-config", c.ssh_config, *extra]

    def raw_mpirun_of(*program):
        return lambda c, hf, n, wd: (
            ["mpirun"]
            + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
            + ["-n", str(n), "--host", ",".join(f"{h.name}:1" for h in c.hosts[:n])]
            + [os.path.join(wd, p) for p in program]  # relative to the workdir; absolute paths stay
        )

    def raw_pdsh(c, hf, n, wd):
        return ["pdsh", "-R", "ssh", "-w", ",".join(h.name for h in c.hosts[:n]), "/bin/true"]

    out = [
        ("gaudi-launch --check-only", gl("--check-only")),
        ("gaudi-launch mpirun", gl("--backend", "mpirun", "--no_python", "/bin/true")),
        ("gaudi-launch mpirun --no-ssh-check", gl("--backend", "mpirun", "--no-ssh-check", "--no_python", "/bin/true")),
        # the same job without the shared connections: a handshake for every ssh, as before issue 18
        (
            "gaudi-launch mpirun, no sharing",
            lambda c, hf, n, wd: (
                ["env", "GAUDI_LAUNCH_SSH_SHARE=0"]
                + gl("--backend", "mpirun", "--no_python", "/bin/true")(c, hf, n, wd)
            ),
        ),
        # mpirun's daemons by its own ssh over the shared connections (a session, so a login shell, of
        # their own per host), not through the pre-flight's session: a user's OMPI_MCA_plm_rsh_agent is kept
        (
            "gaudi-launch mpirun, daemons by ssh",
            lambda c, hf, n, wd: (
                ["env", "OMPI_MCA_plm_rsh_agent=ssh"]
                + gl("--backend", "mpirun", "--no_python", "/bin/true")(c, hf, n, wd)
            ),
        ),
        # A Python rank (an empty script) on both sides: what a training job's launch pays. Ours starts
        # it through the rank bootstrap as every rank does; /bin/true above starts through it too
        # (--no_python), where raw mpirun starts no Python at all.
        (
            "gaudi-launch mpirun, a Python rank",
            lambda c, hf, n, wd: gl("--backend", "mpirun")(c, hf, n, wd) + [os.path.join(wd, "noop.py")],
        ),
        (BASELINE, raw_mpirun_of("/bin/true")),
        ("mpirun (raw), a Python rank", raw_mpirun_of(sys.executable, "noop.py")),
        ("pdsh (raw)", raw_pdsh),
    ]
    if deepspeed:

        def ds_raw(c, hf, n, wd):
            return [
                venv_tool("deepspeed") or "deepspeed",
                "--hostfile",
                hf,
                "--master_addr",
                c.hosts[0].name,
                "--launcher",
                "pdsh",
                os.path.join(wd, "noop.py"),
            ]

        out += [
            (
                "gaudi-launch deepspeed",
                lambda c, hf, n, wd: gl("--backend", "deepspeed")(c, hf, n, wd) + [os.path.join(wd, "noop.py")],
            ),
            ("deepspeed (raw, pdsh)", ds_raw),
        ]
    return out


def slope(points: Sequence[tuple[float, float]]) -> Optional[float]:
    """Least-squares slope of y over x (seconds per host). Pure."""
    if len(points) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else None


# ---------------------------------------------------------------------------------------------
# Launches


def measure(
    cluster,
    counts: list[int],
    rounds: int,
    warmup: int,
    deepspeed: bool,
    workdir: str,
    env: dict[str, str],
    timeout: float,
) -> dict[str, dict[int, dict]]:
    cfgs = configs(deepspeed)
    hostfiles = {n: cluster.hostfile(slots=1, hosts=range(n)) for n in counts}
    results: dict[str, dict[int, dict]] = {name: {n: {"seconds": []} for n in counts} for name, _ in cfgs}
    for r in range(warmup + rounds):
        order = cfgs[r % len(cfgs) :] + cfgs[: r % len(cfgs)]
        for n in counts:
            for name, build in order:
                argv = build(cluster, hostfiles[n], n, workdir)
                seconds, code, out = timed(argv, env, workdir, timeout, cluster)
                entry = results[name][n]
                entry["command"] = shlex.join(argv)
                if code != 0:
                    entry["error"] = f"exit {code}: {out.strip()[-600:]}"
                    print(f"  {name} x{n}: FAILED ({entry['error'][:200]})", file=sys.stderr, flush=True)
                elif r >= warmup:
                    entry["seconds"].append(seconds)
                print(
                    f"  round {r + 1 - warmup if r >= warmup else 'warm-up'}: {name} x{n}: {seconds:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
    for per in results.values():
        for entry in per.values():
            if entry["seconds"]:
                entry["median"] = statistics.median(entry["seconds"])
    return results


# ---------------------------------------------------------------------------------------------
# Per-host costs, for the model


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def per_host_costs(cluster, env: dict[str, str], workdir: str, samples: int = 5) -> dict[str, float]:
    """Median wall time (and this side's CPU) of: a full ssh session (handshake + remote shell), opening
    a ControlMaster (handshake only), a session over it (remote shell only), the pre-flight's probe over
    it, measured from host 0 to the others one at a time. The remote shell includes the login files."""
    from gaudi_launch.remote import probe

    ctl = tempfile.mkdtemp(prefix="glb-", dir="/tmp")
    ssh = ["ssh", "-F", cluster.ssh_config]
    mux = ["-o", f"ControlPath={ctl}/%C"]
    probe_line = probe.command(sys.executable, None, ROOT, cluster.hosts[0].name, 22, None)
    rows: dict[str, list[float]] = {"session": [], "handshake": [], "mux_session": [], "probe": [], "rsh_agent": []}
    cpu: dict[str, list[float]] = {k: [] for k in rows}
    targets = [h.name for h in cluster.hosts[1:]][:samples] or [cluster.hosts[0].name]

    def one(key: str, argv: list[str]) -> None:
        c0 = _children_cpu()
        t0 = time.perf_counter()
        done = cluster.run_on(0, argv, env=env, cwd=workdir, stdin=subprocess.DEVNULL, capture_output=True)
        rows[key].append(time.perf_counter() - t0)
        cpu[key].append(_children_cpu() - c0)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)}: exit {done.returncode}: {done.stderr.decode()[-300:]}")

    try:
        for host in targets:
            one("session", ssh + [host, "true"])
            one("handshake", ssh + mux + ["-o", "ControlMaster=yes", "-o", "ControlPersist=30", "-fN", host])
            one("mux_session", ssh + mux + ["-o", "ControlMaster=no", host, "true"])
            one("probe", ssh + mux + ["-o", "ControlMaster=no", host, probe_line])
            # what a daemon's start through the pre-flight's session costs this side: our rsh agent's
            # interpreter and imports (gaudi_launch/remote/rshagent.py; its request is one line over a socket)
            one("rsh_agent", [sys.executable, "-S", "-I", "-c", "import _socket, os, sys"])
    finally:
        for host in targets:
            cluster.run_on(0, ssh + mux + ["-O", "exit", host], env=env, capture_output=True)
        subprocess.run(["rm", "-rf", ctl])
    out = {k: statistics.median(v) for k, v in rows.items() if v}
    out.update({f"{k}_local_cpu": statistics.median(v) for k, v in cpu.items() if v})
    return out


# ---------------------------------------------------------------------------------------------
# Plans at scale (no cluster needed)


def plan_scale(workdir: str, env: dict[str, str], sizes=(1000, 10000), per_host: int = 8) -> dict[int, dict]:
    out = {}
    for n in sizes:
        hf = os.path.join(workdir, f"hostfile.{n}")
        with open(hf, "w") as f:
            f.writelines(f"node{i:05d}.cluster.example slots={per_host}\n" for i in range(n))
        argv = gl_argv() + [
            "--hostfile",
            hf,
            "--backend",
            "mpirun",
            "--no-ssh-check",
            "--dry-run",
            "--json",
            "--no_python",
            "/bin/true",
        ]
        times, plan = [], None
        for _ in range(3):
            t0 = time.perf_counter()
            done = subprocess.run(argv, env=env, cwd=workdir, capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            if done.returncode != 0:
                out[n] = {"error": done.stderr[-400:]}
                break
            plan = json.loads(done.stdout)
        if plan is not None:
            mpirun = plan["commands"][0]["argv"]
            out[n] = {
                "dry_run_s": statistics.median(times),
                "argv_args": len(mpirun),
                "longest_arg_bytes": max(len(a.encode()) for a in mpirun),
                "argv_bytes": sum(len(a.encode()) + 1 for a in mpirun),
            }
    return out


# ---------------------------------------------------------------------------------------------
# The model


def model(
    costs: dict[str, float],
    fit: dict[str, tuple[float, float]],
    sizes=(16, 128, 1024),
    pool: int = 512,
    radix: int = 64,
    launcher_cores: int = 8,
) -> tuple[list[str], dict[str, dict[int, float]]]:
    """Launch time against hosts on a real cluster (every host its own machine), from costs measured here.

    Assumptions, printed with the result:
    - remote work runs in parallel on the hosts (here it shares 2 cores: the measured slopes are
      mostly that, and do not carry over);
    - what grows with the host count is the launcher's own CPU per host (the ssh clients' crypto and
      process starts, `*_local_cpu`), spread over `launcher_cores`, plus rounds of a bounded pool;
    - raw mpirun (OpenMPI 4, rsh tree spawn, routed radix `radix`): the launcher starts up to
      `radix` daemons, each of them the next level; every level costs one full ssh session and a
      daemon start; the fixed part is mpirun's own start-up (intercept of the fit);
    - gaudi-launch: the pre-flight opens one ControlMaster per host in rounds of `pool` (handshake +
      probe), mpirun's daemons start through the pre-flight's session on each host (our rsh agent
      here, one line to the interpreter the session left running there: no handshake, no new
      session, no tree: one level), the end-of-job sweep is one more line to it (taken as 0.05 s),
      then the connections close; fixed part: our start-up.
    """
    hs, sess, mux, probe = costs["handshake"], costs["session"], costs["mux_session"], costs["probe"]
    c_hs = costs.get("handshake_local_cpu", 0.0)
    c_mux = costs.get("mux_session_local_cpu", 0.0)
    rsh, c_rsh = costs.get("rsh_agent", 0.0), costs.get("rsh_agent_local_cpu", 0.0)
    mpirun_fixed = max(0.0, fit[BASELINE][0]) if BASELINE in fit else 0.3
    ours_fixed = max(0.0, fit["gaudi-launch mpirun"][0] - fit[BASELINE][0]) if "gaudi-launch mpirun" in fit else 0.3
    daemon = max(0.0, mux)  # a session's shell; the daemon's own start is inside mpirun's fixed part
    lines = [
        f"measured per host here (median, from host 0): full ssh session {sess:.3f} s, handshake "
        f"(ControlMaster open) {hs:.3f} s, session over an open connection {mux:.3f} s, pre-flight probe "
        f"over it {probe:.3f} s, our rsh agent (a daemon's start through the session) {rsh:.3f} s; launcher-side "
        f"CPU per handshake {c_hs:.3f} s, per multiplexed session {c_mux:.3f} s, per rsh agent {c_rsh:.3f} s",
        f"fixed parts (intercepts of the fits here): raw mpirun {mpirun_fixed:.2f} s, gaudi-launch's own "
        f"start-up over that {ours_fixed:.2f} s",
        f"assumed: every host its own machine (remote work in parallel), a launcher with {launcher_cores} cores, "
        f"pre-flight pool {pool} (fanout.pool_size with an open-file limit of 4,160 or more), OpenMPI tree "
        f"spawn radix {radix}",
    ]
    out: dict[str, dict[int, float]] = {
        "mpirun (raw, tree spawn)": {},
        "gaudi-launch (ControlMaster)": {},
        "gaudi-launch (no ControlMaster)": {},
    }
    for n in sizes:
        levels = max(1, math.ceil(math.log(max(n, 2), radix)))
        direct = min(n, radix)
        out["mpirun (raw, tree spawn)"][n] = mpirun_fixed + levels * (sess + daemon) + direct * c_hs / launcher_cores
        rounds = math.ceil(n / pool)
        pre = rounds * (hs + probe) + n * (c_hs + c_mux) / launcher_cores
        job = rsh + n * c_rsh / launcher_cores  # daemons through the pre-flight's sessions
        sweep = 0.05
        out["gaudi-launch (ControlMaster)"][n] = mpirun_fixed + ours_fixed + pre + job + sweep
        # today's shape without sharing: a handshake for every one of them, and mpirun's tree
        pre0 = rounds * (sess + probe) + n * c_hs / launcher_cores
        sweep0 = sess + n * c_hs / launcher_cores
        out["gaudi-launch (no ControlMaster)"][n] = (
            mpirun_fixed + ours_fixed + pre0 + levels * (sess + daemon) + direct * c_hs / launcher_cores + sweep0
        )
    return lines, out


def _bullets(doc: str) -> list[str]:
    """The "- ..." items of a docstring, each joined onto one line. Pure."""
    items: list[str] = []
    for line in doc.splitlines():
        text = line.strip()
        if text.startswith("- "):
            items.append(text)
        elif items and text:
            items[-1] += " " + text
    return items


# ---------------------------------------------------------------------------------------------
# Output


def print_report(res: dict) -> None:
    counts = res["config"]["hosts"]
    launches = res["launches"]
    print(
        f"launch cost vs hosts: 1 rank per host running /bin/true, launcher on host 0, median of "
        f"{res['config']['repeats']} interleaved rounds"
    )
    print(environment_line(res) + f"; load at start {res.get('load_average_at_start')}")
    names = list(launches)
    w = max(len(n) for n in names)
    print(f"\n{'configuration':<{w}}  " + "  ".join(f"{n:>6} h" for n in counts) + "   s/host  ratio@max")
    for name in names:
        cells = []
        for n in counts:
            e = launches[name][str(n)]
            cells.append(f"{e['median']:7.2f}s" if "median" in e else "  failed")
        fit = res["fits"].get(name)
        top = launches[name][str(counts[-1])]
        base = launches.get(BASELINE, {}).get(str(counts[-1]), {})
        ratio = f"{top['median'] / base['median']:.2f}x" if "median" in top and base.get("median") else "-"
        print(f"{name:<{w}}  " + "  ".join(cells) + (f"  {fit[1]:7.3f}" if fit else "        -") + f"  {ratio:>8}")
    print("\nratio to raw mpirun at each host count:")
    for name in names:
        if name == BASELINE:
            continue
        cells = []
        for n in counts:
            e, b = launches[name][str(n)], launches.get(BASELINE, {}).get(str(n), {})
            cells.append(f"{e['median'] / b['median']:6.2f}x" if "median" in e and b.get("median") else "     -")
        print(f"  {name:<{w}}  " + "  ".join(cells))
    if res.get("costs"):
        print("\nper-host costs and model (launch time in s at N hosts):")
        for line in res["model"]["assumptions"]:
            print("  " + line)
        for name, by_n in res["model"]["predicted"].items():
            print(f"  {name:<32} " + "  ".join(f"{n:>5} h: {t:6.2f} s" for n, t in by_n.items()))
    if res.get("plans"):
        print("\nplans at scale (mpirun backend, 8 ranks per host, --dry-run --json, median of 3):")
        for n, p in res["plans"].items():
            if "error" in p:
                print(f"  {n} hosts: FAILED {p['error']}")
            else:
                print(
                    f"  {n:>6} hosts: dry run {p['dry_run_s']:.2f} s; mpirun argv {p['argv_args']} arguments, "
                    f"{p['argv_bytes']} bytes, longest {p['longest_arg_bytes']} bytes (Linux limit 131072)"
                )


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="2,4,8,16", help="host counts, comma-separated (default 2,4,8,16)")
    p.add_argument("--repeats", type=int, default=3, help="measured rounds (default 3)")
    p.add_argument("--warmup-rounds", type=int, default=1)
    p.add_argument("--deepspeed", action="store_true", help="also gaudi-launch --backend deepspeed and raw DeepSpeed")
    p.add_argument("--no-plans", action="store_true", help="skip the 1,000/10,000-host dry runs")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    counts = sorted({int(x) for x in args.hosts.split(",")})
    if not counts or counts[0] < 1 or counts[-1] > 100:
        p.error("--hosts: counts from 1 to 100")

    from tests.cluster.netcluster import NetCluster

    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", os.defpath)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("DS_ACCELERATOR", "cpu")
    res: dict = {
        "bench": "scale",
        **environment(),
        "config": {"hosts": counts, "repeats": args.repeats, "deepspeed": args.deepspeed},
    }
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as workdir:
        with open(os.path.join(workdir, "noop.py"), "w") as f:
            f.write("pass\n")
        if not args.no_plans:
            print("plans at scale ...", file=sys.stderr, flush=True)
            res["plans"] = plan_scale(workdir, env)
        cluster = NetCluster(counts[-1], os.path.join(workdir, "cluster"), prefix=PREFIX, subnet_octet=OCTET)
        cluster.up()
        try:
            cenv = cluster.env(env)
            launches = measure(
                cluster, counts, args.repeats, args.warmup_rounds, args.deepspeed, workdir, cenv, args.timeout
            )
            res["launches"] = {name: {str(n): e for n, e in per.items()} for name, per in launches.items()}
            fits = {}
            for name, per in launches.items():
                pts = [(n, e["median"]) for n, e in per.items() if "median" in e]
                s = slope(pts)
                if s is not None:
                    intercept = statistics.fmean(y for _, y in pts) - s * statistics.fmean(x for x, _ in pts)
                    fits[name] = (intercept, s)
            res["fits"] = fits
            if counts[-1] >= 2:
                res["costs"] = per_host_costs(cluster, cenv, workdir)
                lines, predicted = model(res["costs"], fits)
                res["model"] = {"assumptions": lines + _bullets(model.__doc__), "predicted": predicted}
        finally:
            cluster.down()
    print_report(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2, default=str)
        print(f"wrote {args.json}")
    failed = any("error" in e for per in res["launches"].values() for e in per.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
