"""Launch overhead: the same trivial job started by gaudi-launch and by the launchers it replaces.

The job (written to a temporary file): every rank initialises a gloo process group, runs one
all_reduce, checks the sum and exits. It is started, N ranks per host, by

  gaudi-launch (local backend), gaudi-launch --backend mpirun, raw `mpirun -n N python job.py`
  (the job maps OMPI_COMM_WORLD_* onto torchrun's names itself), `python -m torch.distributed.run`
  and DeepSpeed's `deepspeed` launcher,

on this host, and with --hosts 2 also across 2 hosts of a namespace cluster (tests/cluster/
netcluster.py, prefix "gb", subnet 10.230.0.0/24: never the tests' "gl"), every launcher running
"on" the first host with the cluster's ssh wrapper first on PATH. Configurations that cannot run
there are listed with the reason. Wall time is measured from spawning the launcher until it exits
(the job's own work is a few milliseconds; the rest is start-up, rendezvous and teardown).
Also: start-up of `gaudi-launch --help` and a one-host `gaudi-launch --dry-run` against `python -c pass`,
each against its budget (issue 26: --help <= 0.25 s, the dry run <= 0.3 s, on an idle machine; printed,
never asserted), and whether the launcher imported torch, transformers or DeepSpeed on the way (it must not).
`--start-up-only` measures just that part (seconds, not minutes).

    .venv/bin/python scripts/bench/bench_launch.py [--repeats 5] [--ranks 2] [--hosts 2] [--json out.json]

Repeats are interleaved (round-robin over the configurations) so machine noise hits every
configuration alike; reported are the median, min-max and the ratio of medians to raw mpirun.
It is a benchmark, not a test: it prints figures and never passes or fails on time (a launch whose
job did not complete correctly is reported as failed, and the exit status is then 1).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OK = "BENCH-LAUNCH-OK"
BASELINE = "mpirun (raw)"
PY_BASELINE = "python -c pass"
HELP = "gaudi-launch --help"
DRY_RUN = "gaudi-launch --dry-run --num_devices 2 x.py"
BUDGETS_S = {HELP: 0.25, DRY_RUN: 0.3}  # issue 26's, for the median on an idle machine
HEAVY = ("torch", "transformers", "deepspeed")  # the launcher imports none of them

# The job every launcher starts. It maps OpenMPI's variables itself (as a raw-mpirun user must)
# and ignores its arguments (DeepSpeed appends --local_rank=N).
JOB = f'''import datetime, os, socket
for src, dst in (("OMPI_COMM_WORLD_RANK", "RANK"), ("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"),
                 ("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK")):
    if os.environ.get(src) and not os.environ.get(dst):
        os.environ[dst] = os.environ[src]
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
t = torch.ones(1)
dist.all_reduce(t)
ok = t.item() == dist.get_world_size()
print("{OK}" if ok else "BENCH-LAUNCH-WRONG", dist.get_rank(), socket.gethostname(), flush=True)
dist.destroy_process_group()
raise SystemExit(0 if ok else 1)
'''


# ---------------------------------------------------------------------------------------------
# Environment of a result: device, versions, git revision (bench_mfu.py uses these too)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _dist_version(name: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def openmpi_version() -> Optional[str]:
    if shutil.which("mpirun") is None:
        return None
    try:
        out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.strip().splitlines()[0] if out.strip() else ""
    return first.rsplit(" ", 1)[-1] if "Open MPI" in first else (first or None)


def git_revision() -> dict[str, object]:
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)

    try:
        rev = git("rev-parse", "--short", "HEAD")
        if rev.returncode != 0:
            return {"git_revision": None}
        dirty = bool(git("status", "--porcelain", "--untracked-files=no").stdout.strip())
        return {"git_revision": rev.stdout.strip(), "git_dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"git_revision": None}


def environment(device: Optional[str] = None) -> dict[str, object]:
    """What a result was measured on: device, versions, git revision, date."""
    versions = {
        "python": platform.python_version(),
        "torch": _dist_version("torch"),
        "openmpi": openmpi_version(),
        "deepspeed": _dist_version("deepspeed"),
        "transformers": _dist_version("transformers"),
        "gaudi-launch": _dist_version("gaudi-launch"),
    }
    try:
        load = [round(x, 2) for x in os.getloadavg()]  # other work on the machine skews every figure
    except OSError:
        load = None
    return {
        "device": device or f"cpu: {cpu_model()}, {os.cpu_count()} cores",
        "host_cores": os.cpu_count(),
        "platform": platform.platform(),
        "versions": versions,
        **git_revision(),
        "load_average_at_start": load,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def environment_line(env: dict[str, object]) -> str:
    v = env["versions"]
    rev = env.get("git_revision") or "unknown"
    if env.get("git_dirty"):
        rev += " (uncommitted changes)"
    parts = [f"{k} {v[k]}" for k in ("torch", "openmpi", "deepspeed", "python") if v.get(k)]
    return f"{env['device']}; {', '.join(parts)}; git {rev}"


# ---------------------------------------------------------------------------------------------
# Configurations


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def venv_tool(name: str) -> Optional[str]:
    """A console script next to this interpreter (the venv's), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.access(here, os.X_OK) else shutil.which(name)


def gaudi_launch_argv() -> list[str]:
    tool = venv_tool("gaudi-launch")
    return [tool] if tool else [sys.executable, "-m", "gaudi_launch"]


@dataclass
class Ctx:
    """Where a configuration runs: ranks per host and, across hosts, the cluster."""

    ranks: int
    job: str
    workdir: str
    cluster: object = None  # NetCluster when several hosts
    hostfile: Optional[str] = None

    @property
    def hosts(self) -> int:
        return self.cluster.n if self.cluster is not None else 1

    @property
    def master(self) -> str:
        return self.cluster.hosts[0].name if self.cluster is not None else "127.0.0.1"


@dataclass
class Config:
    name: str
    build: Callable[[Ctx], list[str]]
    multi: bool = True  # can run across hosts
    why_not_multi: str = ""
    why_not_local: str = ""  # set when it cannot run on one host alone
    needs: list[str] = field(default_factory=list)  # executables that must exist
    env: dict[str, str] = field(default_factory=dict)


def _gl(ctx: Ctx, *extra: str) -> list[str]:
    argv = gaudi_launch_argv()
    if ctx.cluster is not None:
        argv += ["--hostfile", ctx.hostfile, "--ssh-config", ctx.cluster.ssh_config]
    else:
        argv += ["--num_devices", str(ctx.ranks)]
    return argv + list(extra) + [ctx.job]


def _mpirun(ctx: Ctx) -> list[str]:
    world = ctx.ranks * ctx.hosts
    argv = ["mpirun"] + (["--allow-run-as-root"] if os.geteuid() == 0 else []) + ["-n", str(world)]
    if ctx.cluster is not None:
        argv += ["--host", ",".join(f"{h.name}:{ctx.ranks}" for h in ctx.cluster.hosts)]
    elif ctx.ranks > (os.cpu_count() or 1):
        argv += ["--oversubscribe"]
    return argv + ["-x", f"MASTER_ADDR={ctx.master}", "-x", f"MASTER_PORT={free_port()}", sys.executable, ctx.job]


def _torchrun(ctx: Ctx) -> list[str]:
    if ctx.cluster is None:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(ctx.ranks),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            ctx.job,
        ]
    # torchrun starts only this host's ranks: one per host through pdsh, meeting at a c10d rendezvous.
    remote = shlex.join(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(ctx.hosts),
            "--nproc_per_node",
            str(ctx.ranks),
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            f"{ctx.master}:{free_port()}",
            "--rdzv_id",
            uuid.uuid4().hex[:12],
            ctx.job,
        ]
    )
    return [
        "pdsh",
        "-R",
        "ssh",
        "-w",
        ",".join(h.name for h in ctx.cluster.hosts),
        f"cd {shlex.quote(ctx.workdir)} && {remote}",
    ]


def _deepspeed(ctx: Ctx) -> list[str]:
    argv = [venv_tool("deepspeed") or "deepspeed"]
    if ctx.cluster is not None:
        argv += ["--hostfile", ctx.hostfile, "--master_addr", ctx.master, "--launcher", "pdsh"]
    else:
        argv += ["--num_gpus", str(ctx.ranks)]
    return argv + ["--master_port", str(free_port()), ctx.job]


CONFIGS = [
    Config(
        "gaudi-launch (local)",
        lambda c: _gl(c),
        multi=False,
        why_not_multi="the local backend runs on this host only (with a hostfile gaudi-launch picks mpirun)",
    ),
    Config("gaudi-launch --backend mpirun", lambda c: _gl(c, "--backend", "mpirun"), needs=["mpirun"]),
    Config(
        "gaudi-launch mpirun --no-ssh-check",
        lambda c: _gl(c, "--backend", "mpirun", "--no-ssh-check"),
        needs=["mpirun"],
        why_not_local="no SSH pre-flight on one host: same as the row above",
    ),
    Config(
        "gaudi-launch --backend deepspeed",
        lambda c: _gl(c, "--backend", "deepspeed"),
        needs=["pdsh"],
        why_not_local="DeepSpeed's runner then wants passwordless ssh to localhost",
    ),
    Config(BASELINE, _mpirun, needs=["mpirun"]),
    Config("torchrun", _torchrun),
    Config("deepspeed", _deepspeed, env={"DS_ACCELERATOR": "cpu"}),
]


def _label(name: str, hosts: int) -> str:
    return "torchrun (one per host, pdsh)" if name == "torchrun" and hosts > 1 else name


def _skip_reason(cfg: Config, hosts: int) -> Optional[str]:
    if hosts > 1 and not cfg.multi:
        return cfg.why_not_multi
    if hosts == 1 and cfg.why_not_local:
        return cfg.why_not_local
    needs = list(cfg.needs) + (["pdsh"] if hosts > 1 and cfg.name in ("torchrun", "deepspeed") else [])
    if cfg.name == "deepspeed" and not venv_tool("deepspeed"):
        needs.append("deepspeed")
    missing = [t for t in needs if not (venv_tool(t) if t == "deepspeed" else shutil.which(t))]
    return f"not installed: {', '.join(missing)}" if missing else None


# ---------------------------------------------------------------------------------------------
# Running


def timed(argv: list[str], env: dict[str, str], cwd: str, timeout: float, cluster=None):
    """(seconds, exit code, output) of one run; the whole process group is killed on timeout."""
    kw = dict(
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    t0 = time.perf_counter()
    proc = cluster.popen_on(0, argv, **kw) if cluster is not None else subprocess.Popen(argv, **kw)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        return time.perf_counter() - t0, None, out
    return time.perf_counter() - t0, proc.returncode, out


def launch_once(cfg: Config, ctx: Ctx, env: dict[str, str], timeout: float) -> dict[str, object]:
    argv = cfg.build(ctx)
    seconds, code, out = timed(argv, {**env, **cfg.env}, ctx.workdir, timeout, ctx.cluster)
    world = ctx.ranks * ctx.hosts
    oks = out.count(OK)  # not per line: ranks sharing one pipe (torchrun) can end up on one line
    if code == 0 and oks == world:
        return {"seconds": seconds, "argv": argv}
    why = f"timed out after {timeout:.0f} s" if code is None else f"exit {code}, {oks}/{world} ranks reported OK"
    return {"error": why, "output_tail": out[-3000:], "argv": argv}


def summarize(seconds: list[float]) -> dict[str, object]:
    return {"seconds": seconds, "median": statistics.median(seconds), "min": min(seconds), "max": max(seconds)}


def measure_scope(ctx: Ctx, args, env: dict[str, str], skip_all: Optional[str] = None) -> dict[str, dict]:
    """Every configuration in ctx (one host, or the cluster), `repeats` interleaved rounds."""
    results: dict[str, dict] = {}
    active = []
    for cfg in CONFIGS:
        reason = skip_all or _skip_reason(cfg, ctx.hosts)
        if reason:
            results[cfg.name] = {"label": _label(cfg.name, ctx.hosts), "skipped": reason}
        else:
            active.append(cfg)
            results[cfg.name] = {"label": _label(cfg.name, ctx.hosts), "runs": []}
    rounds = args.warmup_rounds + args.repeats
    for r in range(rounds):
        for cfg in active:
            entry = results[cfg.name]
            if "error" in entry:
                continue  # failed before: do not keep paying for it
            run = launch_once(cfg, ctx, env, args.timeout)
            if "error" in run:
                entry.update(error=run["error"], output_tail=run["output_tail"])
                print(
                    f"  {entry['label']}: FAILED ({run['error']}):\n{run['output_tail'][-1500:]}",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            entry["command"] = shlex.join(run["argv"]).replace(ctx.job, "job.py")
            if r >= args.warmup_rounds:
                entry["runs"].append(run["seconds"])
        print(
            f"  [{ctx.hosts} host(s)] round {r + 1}/{rounds} done"
            + (" (warm-up, not counted)" if r < args.warmup_rounds else ""),
            file=sys.stderr,
            flush=True,
        )
    base = results.get(BASELINE, {})
    base_med = statistics.median(base["runs"]) if base.get("runs") and "error" not in base else None
    for name, entry in results.items():
        runs = entry.pop("runs", None)
        if runs and "error" not in entry:
            entry.update(summarize(runs))
            entry["ratio"] = entry["median"] / base_med if base_med else None
    return results


def byte_compile_package() -> bool:
    """Byte-compile gaudi_launch as an install does (pip writes .pyc; PYTHONDONTWRITEBYTECODE, set on the
    development machines, would leave every start compiling our 100 modules: a tenth of a second)."""
    import compileall

    import gaudi_launch

    return bool(compileall.compile_dir(os.path.dirname(gaudi_launch.__file__), quiet=2))


def measure_start_up(args, env: dict[str, str], workdir: str) -> dict[str, dict]:
    gl = gaudi_launch_argv()
    compiled = byte_compile_package()
    cmds = [
        (PY_BASELINE, [sys.executable, "-c", "pass"]),
        (HELP, gl + ["--help"]),
        (DRY_RUN, gl + ["--dry-run", "--num_devices", "2", "x.py"]),
        ("python -c 'import torch' (reference)", [sys.executable, "-c", "import torch"]),
    ]
    runs: dict[str, list[float]] = {name: [] for name, _ in cmds}
    cpu: dict[str, list[float]] = {name: [] for name, _ in cmds}  # user+sys of the command: the figure an idle
    errors: dict[str, str] = {}  # machine's wall time comes near, where other work inflates the wall time
    for r in range(1 + args.cold_repeats):  # one warm-up round (page cache, .pyc), not counted
        for name, argv in cmds:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            seconds, code, out = timed(argv, env, workdir, 120)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if code != 0:
                errors[name] = f"exit {code}: {out[-500:]}"
            elif r > 0:
                runs[name].append(seconds)
                cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    base = statistics.median(runs[PY_BASELINE]) if runs[PY_BASELINE] else None
    table = {}
    for name, argv in cmds:
        if name in errors:
            table[name] = {"error": errors[name]}
            continue
        entry = summarize(runs[name])
        entry["command"] = shlex.join(argv)
        entry["ratio"] = entry["median"] / base if base else None
        entry["over_python_ms"] = 1000 * (entry["median"] - base) if base else None
        entry["cpu_median"] = statistics.median(cpu[name])
        if name in BUDGETS_S:
            entry["budget_s"] = BUDGETS_S[name]
            entry["within_budget"] = entry["median"] <= BUDGETS_S[name]
        if argv[: len(gl)] == gl:
            entry["heavy_imports"] = heavy_imports(argv, env, workdir)
            entry["byte_compiled"] = compiled
        table[name] = entry
    return table


def heavy_imports(argv: list[str], env: dict[str, str], workdir: str) -> Optional[list[str]]:
    """The heavy packages (HEAVY) the command imported (python -X importtime), or None when it did not run."""
    proc = subprocess.run(
        argv, env={**env, "PYTHONPROFILEIMPORTTIME": "1"}, cwd=workdir, capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        return None
    modules = [line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    return sorted({m.split(".")[0] for m in modules if m.split(".")[0] in HEAVY})


def start_cluster(args, workdir: str):
    """(cluster, None) or (None, why not)."""
    sys.path.insert(0, ROOT)
    try:
        from tests.cluster.netcluster import ClusterError, NetCluster, missing_requirements
    except ImportError as exc:
        return None, f"tests/cluster/netcluster.py not importable: {exc}"
    missing = missing_requirements()
    if missing:
        return None, "no namespace cluster here: missing " + ", ".join(missing)
    cluster = NetCluster(args.hosts, os.path.join(workdir, "cluster"), args.cluster_prefix, args.cluster_octet)
    try:
        cluster.up()
    except ClusterError as exc:
        return None, f"could not build the namespace cluster: {exc}"
    return cluster, None


# ---------------------------------------------------------------------------------------------
# Output


def print_tables(res: dict[str, object]) -> None:
    cfg = res["config"]
    print(
        f"launch overhead: trivial gloo job (init, one all_reduce, exit), {cfg['ranks']} rank(s) per host, "
        f"{cfg['repeats']} repeat(s) interleaved after {cfg['warmup_rounds']} warm-up round(s); "
        f"wall time from spawning the launcher to its exit"
    )
    print(environment_line(res))
    print(f"{'hosts':5} {'configuration':36} {'median s':>8} {'min-max s':>13} {'vs mpirun':>9}")
    for scope, table in res["results"].items():
        hosts = scope.split()[0]
        for name, e in table.items():
            label = e["label"]
            if "skipped" in e:
                print(f"{hosts:5} {label:36} {'skipped: ' + e['skipped']}")
            elif "error" in e:
                print(f"{hosts:5} {label:36} {'FAILED: ' + e['error']}")
            else:
                ratio = f"{e['ratio']:8.2f}x" if e.get("ratio") else f"{'-':>9}"
                print(f"{hosts:5} {label:36} {e['median']:8.2f} {e['min']:6.2f}-{e['max']:<6.2f} {ratio}")
    print()
    print_start_up(res)


def print_start_up(res: dict[str, object]) -> None:
    cfg = res["config"]
    print(f"start-up without a job: {cfg['cold_repeats']} repeat(s) interleaved after 1 warm-up round")
    print(f"{'command':42} {'median ms':>9} {'min-max ms':>13} {'+ms':>6} {'vs python':>9} {'cpu ms':>6}  budget")
    for name, e in res["start_up"].items():
        if "error" in e:
            print(f"{name:42} FAILED: {e['error']}")
            continue
        budget = ""
        if "budget_s" in e:
            budget = f"<= {1000 * e['budget_s']:.0f} ms: {'within' if e['within_budget'] else 'OVER'}"
        print(
            f"{name:42} {1000 * e['median']:9.1f} {1000 * e['min']:6.0f}-{1000 * e['max']:<6.0f} "
            f"{e['over_python_ms']:6.0f} {e['ratio']:8.2f}x {1000 * e['cpu_median']:6.0f}  {budget}"
        )
    for name, e in res["start_up"].items():
        if "heavy_imports" in e:
            heavy = e["heavy_imports"]
            said = "did not run" if heavy is None else ", ".join(heavy) or "none (no torch, transformers, deepspeed)"
            print(f"{name}: heavy imports: {said}; byte-compiled: {'yes' if e.get('byte_compiled') else 'NO'}")
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    print(f"load average at the start {res.get('load_average_at_start')}, now {load} (budgets are for an idle machine)")


def write_json(res: dict, path: Optional[str]) -> None:
    """The results as JSON (for `gaudi-launch report`), with --start-up-only too."""
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=2)
        print(f"wrote {path}")


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="measured launches per configuration (default 5)")
    p.add_argument("--warmup-rounds", type=int, default=1, help="rounds run first and not counted (default 1)")
    p.add_argument("--ranks", type=int, default=2, help="ranks per host (default 2)")
    p.add_argument(
        "--hosts",
        type=int,
        default=1,
        help="1: this host only; N >= 2: also across N hosts of a namespace cluster (needs root)",
    )
    p.add_argument("--cold-repeats", type=int, default=20, help="start-up measurements per command (default 20)")
    p.add_argument("--timeout", type=float, default=300, help="seconds before a launch counts as failed")
    p.add_argument("--cluster-prefix", default="gb")
    p.add_argument("--cluster-octet", type=int, default=230)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument(
        "--start-up-only", action="store_true", help="only the start-up table (--help, --dry-run): no launches"
    )
    args = p.parse_args(argv)
    if args.repeats < 1 or args.ranks < 1 or args.hosts < 1 or args.cold_repeats < 1 or args.warmup_rounds < 0:
        p.error("--repeats, --ranks, --hosts and --cold-repeats must be >= 1, --warmup-rounds >= 0")

    venv_bin = os.path.dirname(sys.executable)
    env = dict(os.environ)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", os.defpath)  # deepspeed/pdsh find this python
    res: dict[str, object] = {
        "bench": "launch",
        **environment(),
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "baseline": BASELINE,
        "results": {},
        "start_up": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as workdir:
        job = os.path.join(workdir, "job.py")
        with open(job, "w") as f:
            f.write(JOB)
        print(f"start-up: {args.cold_repeats} round(s)", file=sys.stderr, flush=True)
        res["start_up"] = measure_start_up(args, env, workdir)
        if args.start_up_only:
            print_start_up(res)
            write_json(res, args.json)
            return 1 if any("error" in e for e in res["start_up"].values()) else 0
        res["results"]["1 host"] = measure_scope(Ctx(args.ranks, job, workdir), args, env)
        if args.hosts > 1:
            cluster, why = start_cluster(args, workdir)
            scope = f"{args.hosts} hosts"
            try:
                if cluster is None:
                    res["results"][scope] = measure_scope(Ctx(args.ranks, job, workdir), args, env, skip_all=why)
                else:
                    ctx = Ctx(args.ranks, job, workdir, cluster, cluster.hostfile(slots=args.ranks))
                    res["results"][scope] = measure_scope(ctx, args, cluster.env(env), None)
            finally:
                if cluster is not None:
                    cluster.down()
    print_tables(res)
    write_json(res, args.json)
    failed = any("error" in e for table in res["results"].values() for e in table.values())
    failed = failed or any("error" in e for e in res["start_up"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
