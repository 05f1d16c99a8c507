"""Issue 12 items 1-4 on real hosts, for every backend: no value of the job's environment on any
process's argv on any host, a SIGKILLed launcher takes only its own job with it, and no shell
ever sees the working directory or the launcher's variables (DeepSpeed's pdsh line).

The namespace hosts share one PID namespace, so one scan of /proc/*/cmdline sees the processes of
every host (launcher, mpirun/orted, deepspeed runner, pdsh, ssh, sshd sessions, launch.py, ranks).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid

import pytest

from tests.cluster.test_multinode import ROOT, launch_argv, rank_lines
from tests.helpers import alive, all_gone, read_pids, wait_for

BACKENDS = ["local", "mpirun", "deepspeed"]
GRACE = 5  # launch_argv passes --grace 5

# Records its env values of interest and its pid (and a child's), then sleeps until torn down.
PROBE = """\
import json, os, socket, subprocess, sys, time
d = sys.argv[1]
names = sys.argv[2:]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)"])
rank = os.environ["RANK"]
with open(os.path.join(d, rank + ".json"), "w") as f:
    json.dump({"rank": rank, "host": socket.gethostname(), "cwd": os.getcwd(),
               "env": {n: os.environ.get(n) for n in names}}, f)
with open(os.path.join(d, rank + ".tmp"), "w") as f:
    f.write(f"{os.getpid()}\\n{child.pid}\\n")
os.replace(os.path.join(d, rank + ".tmp"), os.path.join(d, rank + ".pid"))
print(json.dumps({"rank": rank, "host": socket.gethostname(), "cwd": os.getcwd()}), flush=True)
time.sleep(900)
"""


def hosts_for(backend):
    return (0,) if backend == "local" else (0, 1)


def start(cluster, backend, tmp_path, extra=(), env=None, cwd=None, names=()):
    """The probe job on the backend's hosts, launched on gl-n0; returns (Popen, pid dir, world size)."""
    hosts = hosts_for(backend)
    pid_dir = tmp_path / f"pids-{uuid.uuid4().hex[:6]}"
    pid_dir.mkdir()
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    hostfile = cluster.hostfile(slots=2, hosts=list(hosts))
    argv = launch_argv(cluster, backend, hostfile, *extra, str(probe), str(pid_dir), *names)
    job = cluster.popen_on(
        0, argv, env=env or cluster.env(), cwd=cwd or ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return job, str(pid_dir), 2 * len(hosts)


def wait_started(job, pid_dir, world):
    ok = wait_for(
        lambda: len([n for n in os.listdir(pid_dir) if n.endswith(".pid")]) == world or job.poll() is not None,
        timeout=150,
    )
    assert ok and job.poll() is None, job.communicate(timeout=30)


def all_argv() -> dict:
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out[int(pid)] = f.read()
        except OSError:
            pass
    return out


@pytest.mark.parametrize(
    "backend,launcher", [("local", None), ("mpirun", None), ("deepspeed", "pdsh"), ("deepspeed", "openmpi")]
)
def test_no_value_of_the_jobs_environment_on_any_argv_on_any_host(cluster, backend, launcher, tmp_path):
    tag = uuid.uuid4().hex[:10]
    secrets = {
        "FROM_FILE_TOKEN": f"envfile-{tag}",  # .deepspeed_env
        "FROM_X_PASSWORD": f"dash-x-{tag}",  # -x NAME, the value from the launcher's env
        "MYSEC_API_KEY": f"prefix-{tag}",  # --export-prefix MYSEC_
        "HCCL_PRIVATE_NOTE": f"hccl-{tag}",  # exported by default (HCCL_)
    }
    launcher_only = {"MLFLOW_TRACKING_TOKEN": f"mlflow-{tag}", "PYTHONX_SECRET": f"python-{tag}"}
    (tmp_path / ".deepspeed_env").write_text(f"FROM_FILE_TOKEN={secrets['FROM_FILE_TOKEN']}\n")
    env = cluster.env(
        {
            **os.environ,
            "FROM_X_PASSWORD": secrets["FROM_X_PASSWORD"],
            "MYSEC_API_KEY": secrets["MYSEC_API_KEY"],
            "HCCL_PRIVATE_NOTE": secrets["HCCL_PRIVATE_NOTE"],
            **launcher_only,
        }
    )
    job, pid_dir, world = start(
        cluster,
        backend,
        tmp_path,
        env=env,
        cwd=str(tmp_path),
        names=list(secrets),
        extra=["-x", "FROM_X_PASSWORD", "--export-prefix", "MYSEC_", *(["--launcher", launcher] if launcher else [])],
    )
    try:
        wait_started(job, pid_dir, world)
        leaks = {
            pid: argv
            for pid, argv in all_argv().items()
            if any(v.encode() in argv for v in [*secrets.values(), *launcher_only.values()]) or tag.encode() in argv
        }
        assert not leaks, {p: a.replace(b"\0", b" ")[:300] for p, a in leaks.items()}
        seen = [json.load(open(os.path.join(pid_dir, f"{r}.json"))) for r in range(world)]
        for rank in seen:  # the values did arrive, byte-exact, on every host
            assert rank["env"] == secrets, rank
        assert {r["host"] for r in seen} == {f"gl-n{i}" for i in hosts_for(backend)}
        pids = read_pids(pid_dir)
    finally:
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=90)
    assert all_gone(pids, timeout=30)
    assert tag not in out + err  # nor in DeepSpeed's or pdsh's output, summaries included
    assert job.returncode == 128 + signal.SIGTERM, err[-3000:]


@pytest.mark.parametrize(
    "backend,launcher", [("local", None), ("mpirun", None), ("deepspeed", "pdsh"), ("deepspeed", "openmpi")]
)
def test_sigkill_of_a_launcher_ends_its_job_only(cluster, backend, launcher, tmp_path):
    extra = ["--launcher", launcher] if launcher else []
    other, other_dir, world = start(cluster, backend, tmp_path, extra=extra)
    victim = None
    try:
        wait_started(other, other_dir, world)
        victim, victim_dir, _ = start(cluster, backend, tmp_path, extra=extra)
        wait_started(victim, victim_dir, world)
        victims = read_pids(victim_dir)
        victim.kill()
        victim.communicate(timeout=30)
        # Within --grace + 10 s every process of the killed job is gone, on every host ...
        assert all_gone(victims, timeout=GRACE + 10), [p for p in victims if alive(p)]
        # ... and nothing of the other job was touched (DeepSpeed's pkill-by-pattern would).
        survivors = read_pids(other_dir)
        assert all(alive(p) for p in survivors), "killing one launcher touched another job"
        assert other.poll() is None
    finally:
        if victim is not None:
            victim.kill()
        other.send_signal(signal.SIGTERM)
        other.communicate(timeout=90)
    assert all_gone(read_pids(other_dir), timeout=30)


def test_shell_syntax_in_the_working_directory_or_launcher_env_runs_nothing(cluster, tmp_path):
    # DeepSpeed writes `cd <cwd>;` unquoted and re-exports PYTHON*/MLFLOW*/UCX* in "..." on pdsh's line.
    cwd = tmp_path / "a;echo INJECTED-CWD;b $(echo INJECTED-SUB)"
    cwd.mkdir()
    env = cluster.env({**os.environ, "MLFLOW_NOTE": "$(echo INJECTED-MLFLOW >&2)", "UCX_NOTE": "`echo INJECTED-UCX`"})
    probe = cwd / "probe.py"
    probe.write_text(
        "import json, os, socket\n"
        "print(json.dumps({'rank': os.environ['RANK'], 'host': socket.gethostname(),"
        " 'cwd': os.getcwd(), 'path0': os.environ.get('PYTHONPATH', '').split(':')[0]}))\n"
    )
    hostfile = cluster.hostfile(slots=2, hosts=[0, 1])
    res = cluster.run_on(
        0,
        launch_argv(cluster, "deepspeed", hostfile, "probe.py"),
        env=env,
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "INJECTED" not in res.stdout.replace(str(cwd), "") + res.stderr.replace(str(cwd), "")
    seen = rank_lines(res.stdout)
    assert sorted(int(r["rank"]) for r in seen) == [0, 1, 2, 3]
    assert {r["cwd"] for r in seen} == {str(cwd)}  # the ranks still run where the launcher was
    assert {r["path0"] for r in seen} == {str(cwd)}  # and find its modules first, as with `deepspeed`


# A --no_python rank: an executable (not Python) that starts a child of its own and waits.
NO_PYTHON_RANK = """\
#!/bin/sh
sleep 900 &
printf '%s\\n%s\\n' "$$" "$!" > "$1/$RANK.tmp" && mv "$1/$RANK.tmp" "$1/$RANK.pid"
wait
"""


@pytest.mark.parametrize("backend", ["local", "mpirun"])
def test_sigkill_of_a_launcher_ends_its_no_python_ranks_too(cluster, backend, tmp_path):
    # Such a rank runs under our bootstrap like a Python one (its group, the launcher watch): before,
    # mpirun started the executable itself, and it outlived a SIGKILLed launcher on host 0.
    rank = tmp_path / "rank.sh"
    rank.write_text(NO_PYTHON_RANK)
    rank.chmod(0o755)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    hosts = hosts_for(backend)
    argv = launch_argv(cluster, backend, cluster.hostfile(slots=2, hosts=list(hosts)), "--no_python", str(rank))
    job = cluster.popen_on(
        0, [*argv, str(pid_dir)], env=cluster.env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        wait_started(job, str(pid_dir), 2 * len(hosts))
        pids = read_pids(pid_dir)
        assert len(pids) == 4 * len(hosts) and all(alive(p) for p in pids)
        job.kill()
        job.communicate(timeout=30)
        assert all_gone(pids, timeout=GRACE + 10), [p for p in pids if alive(p)]
    finally:
        job.kill()
