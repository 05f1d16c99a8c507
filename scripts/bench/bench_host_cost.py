"""Per-host CPU the flat path pays beyond raw mpirun (issue 34): what grows with the hosts when every
"host" shares one machine's cores, measured as CPU time (user + sys of the process and the children it
waited for, resource.getrusage(RUSAGE_CHILDREN)), not wall time, which a loaded machine makes meaningless.

  probe      the pre-flight's command line on one host (remote/probe.command with the session agent, as
             the flat pre-flight sends it: probe.sh, probe_checks.py in the interpreter that stays on as
             the session's agent), run by `sh -c` with the session's input closed (the agent then exits);
             without ssh, sshd and the login shell, which raw mpirun pays too
  bootstrap  `python -u -m gaudi_launch.process.worker empty.py` as mpirun starts a rank (OpenMPI's rank
             variables, the job id, output to pipes), less `python -u empty.py` (raw mpirun's Python rank)
  rsh agent  remote/rshagent.py starting one daemon, answered by a stand-in for the launcher's socket
             (sshmux.serve_rsh's answer format); raw mpirun runs ssh there, which the session replaces

Each figure is the median of --repeats runs, milliseconds of CPU. With --before REV the same runs are
made with revision REV's package (git archive into a temporary directory, first on PYTHONPATH),
interleaved with this checkout's, and the table shows both. A benchmark, not a test: it prints figures
and never fails on them.

    .venv/bin/python scripts/bench/bench_host_cost.py [--repeats 10] [--before REV] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
from typing import Callable, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_COMMAND = (
    "import sys\n"
    "from gaudi_launch.remote.probe import command\n"
    "from gaudi_launch.remote.sshmux import SESSION_AGENT\n"
    "py, script, cwd, port = sys.argv[1:5]\n"
    "sys.stdout.write(command(py, script, cwd, '127.0.0.1', int(port), None, agent=SESSION_AGENT))\n"
)


def cpu_ms(argv: list[str], **kwargs) -> float:
    """Milliseconds of CPU (user + sys) that argv and the children it waited for used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run(argv, capture_output=True, **kwargs)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise RuntimeError(f"{argv[:4]}... exited {res.returncode}: {res.stderr.decode(errors='replace')[-500:]}")
    return 1000 * ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))


class Tree:
    """One revision's package: this checkout (rev None) or REV unpacked into a temporary directory."""

    def __init__(self, rev: Optional[str], scratch: str):
        self.rev = rev
        if rev is None:
            self.root = ROOT
        else:
            self.root = os.path.join(scratch, "rev-" + rev.replace("/", "_"))
            os.makedirs(self.root)
            archive = subprocess.run(
                ["git", "-C", ROOT, "archive", "--format=tar", rev, "gaudi_launch"],
                stdout=subprocess.PIPE,
                check=True,
            ).stdout
            with tempfile.TemporaryFile() as f:
                f.write(archive)
                f.seek(0)
                with tarfile.open(fileobj=f) as tar:
                    tar.extractall(self.root, filter="data")
        self.env = {**os.environ, "PYTHONPATH": self.root, "PYTHONDONTWRITEBYTECODE": ""}
        self.label = rev or "this checkout"

    def probe_command(self, script: str, cwd: str, port: int) -> str:
        return subprocess.run(
            [sys.executable, "-c", _COMMAND, sys.executable, script, cwd, str(port)],
            env=self.env,
            cwd=cwd,  # not this checkout's root: `python -c` puts the working directory first on sys.path
            stdout=subprocess.PIPE,
            check=True,
            text=True,
        ).stdout


class StandInLauncher:
    """Answers rshagent.py's requests as sshmux.serve_rsh does for a daemon that started: "0 0 0\\n"."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.path = path
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                conn.sendall(b"0 0 0\n")

    def close(self) -> None:
        self.sock.close()


def rank_env(base: dict[str, str], master_port: int) -> dict[str, str]:
    """What an mpirun-started rank of the flat path has (one rank per host, two hosts)."""
    return {
        **base,
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "GAUDI_LAUNCH_JOB_ID": "benchhostcost",
        "GAUDI_LAUNCH_JOB_DIR_SUFFIX": "0123456789abcdef",
        "GAUDI_LAUNCH_DEVICE": "cpu",
    }


def measure(trees: list[Tree], repeats: int, scratch: str) -> dict[str, dict[str, float]]:
    """{tree label: {row: median ms}}, the runs interleaved over trees and rows."""
    listener = socket.create_server(("127.0.0.1", 0))  # the master's sshd, for the probe's reachability check
    port = listener.getsockname()[1]
    script = os.path.join(scratch, "empty.py")
    with open(script, "w") as f:
        f.write("pass\n")
    launcher = StandInLauncher(os.path.join(scratch, "rsh"))
    jobs: list[tuple[str, str, Callable[[], float]]] = []
    for tree in trees:
        command = tree.probe_command(script, scratch, port)
        env = rank_env(tree.env, port + 1)
        agent = os.path.join(tree.root, "gaudi_launch", "remote", "rshagent.py")
        daemon = ["orted", "-mca", "ess", "env", "-mca", "orte_ess_jobid", "1"]
        jobs += [
            (
                tree.label,
                "probe",
                lambda c=command, e=tree.env: cpu_ms(["sh", "-c", c], env=e, stdin=subprocess.DEVNULL, cwd=scratch),
            ),
            (
                tree.label,
                "bootstrap",
                lambda e=env: cpu_ms(
                    [sys.executable, "-u", "-m", "gaudi_launch.process.worker", script], env=e, cwd=scratch
                ),
            ),
            (tree.label, "bare python rank", lambda e=env: cpu_ms([sys.executable, "-u", script], env=e, cwd=scratch)),
            (
                tree.label,
                "rsh agent",
                lambda a=agent, e=tree.env: cpu_ms(
                    [sys.executable, "-S", "-I", a, launcher.path, "0", "host1", *daemon], env=e, cwd=scratch
                ),
            ),
        ]
    samples: dict[tuple[str, str], list[float]] = {(label, row): [] for label, row, _ in jobs}
    try:
        for _ in range(repeats):
            for label, row, run in jobs:
                samples[label, row].append(run())
    finally:
        launcher.close()
        listener.close()
    out: dict[str, dict[str, float]] = {}
    for (label, row), values in samples.items():
        out.setdefault(label, {})[row] = statistics.median(values)
    for figures in out.values():
        figures["bootstrap beyond bare python"] = figures["bootstrap"] - figures["bare python rank"]
        figures["per host beyond raw mpirun"] = (
            figures["probe"] + figures["bootstrap beyond bare python"] + figures["rsh agent"]
        )
    return out


ROWS = [
    "probe",
    "bootstrap",
    "bare python rank",
    "bootstrap beyond bare python",
    "rsh agent",
    "per host beyond raw mpirun",
]


def table(figures: dict[str, dict[str, float]]) -> str:
    labels = list(figures)
    head = ["per host, ms of CPU (median)", *labels] + (["change"] if len(labels) == 2 else [])
    lines = [head]
    for row in ROWS:
        cells = [row, *(f"{figures[label][row]:.1f}" for label in labels)]
        if len(labels) == 2:
            cells.append(f"{figures[labels[1]][row] - figures[labels[0]][row]:+.1f}")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))) for line in lines
    )


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--before", metavar="REV", help="also measure git revision REV (before), beside this checkout")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args(argv)
    scratch = tempfile.mkdtemp(prefix="bench-host-cost-")
    try:
        trees = ([Tree(args.before, scratch)] if args.before else []) + [Tree(None, scratch)]
        figures = measure(trees, max(1, args.repeats), scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"load {load:.1f} on {os.cpu_count()} cores; median of {args.repeats}; CPU time, not wall time")
    print(table(figures))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load": load, "repeats": args.repeats, "figures": figures}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
