"""Job-scoped teardown on every host: signal exactly the processes of one job, nothing else.

Every rank (and everything it starts) inherits GAUDI_LAUNCH_JOB_ID, so on each host we signal the
processes whose environment carries this job's id: never a pattern match on command lines, which
kills other users' jobs (DeepSpeed #6807). Runs over plain ssh, in parallel, with the job's options.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import subprocess
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from types import MappingProxyType
from typing import Callable, NamedTuple, Optional

from gaudi_launch.remote.fanout import per_host

# Run by the remote interpreter; argv: JOB_ID SIGNAL [SINCE [IDS]]. IDS: the session/group ids of the job's
# own processes there, comma-separated (its ranks: each leads a group, the local backend's a session): what a
# rank that has exited left in them is still the job's (a `sudo -u` orphan). Under srun, one argv serves every
# node: IDS is then one such list per node, '/'-separated, and the node's task takes its own ($SLURM_PROCID; under
# mpirun's tree, --fan-out tree, $OMPI_COMM_WORLD_RANK).
# Prints how many processes it signalled, then one line "pid<TAB>name<TAB>uid<TAB>why" per process it could
# not inspect or signal that may be the job's: one of ours whose environment is closed to us (not dumpable:
# setuid, prctl) and that started after SINCE (epoch seconds); one of another user (its environment is
# closed to us, or open but without the job id: run as root, a `sudo -u` that reset the environment) that
# started after SINCE and is tied to the job: the child, or in the process group or session, of a process of
# the job or of such a closed one of ours (a rank's `sudo -E -u`), and not what started it (slurmstepd,
# sshd); or a match it was not allowed to signal. Signal 0 only counts.
KILL_CODE = r"""
import os, sys
needle = b"\0GAUDI_LAUNCH_JOB_ID=" + sys.argv[1].encode() + b"\0"
sig, me, uid, hit, unseen = int(sys.argv[2]), os.getpid(), os.getuid(), 0, []
since = float(sys.argv[3]) if len(sys.argv) > 3 else None
tied, groups, others = set(), set(), []
# one host's own processes only (a rank's own sweep, process/gate.py): not those of another UTS namespace (another
# container's, or another host's where hosts share one kernel)
def uts(pid):
    try:
        return os.readlink("/proc/%s/ns/uts" % pid)
    except OSError:
        return None
own_uts = uts("self") if os.environ.get("GAUDI_LAUNCH_SWEEP_OWN_UTS") else None
if len(sys.argv) > 4:
    ids = sys.argv[4].split("/")
    task = (os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("SLURM_PROCID", "0")) if len(ids) > 1 else "0"
    ids = ids[int(task)] if task.isdigit() and int(task) < len(ids) else ""
    groups.update(g for g in ids.split(",") if g.isdigit() and g not in ("0", "1"))
def facts(pid):
    with open("/proc/%s/stat" % pid) as f:
        stat = f.read()
    name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
    with open("/proc/stat") as f:
        btime = next(int(l.split()[1]) for l in f if l.startswith("btime "))
    with open("/proc/%s/status" % pid) as f:
        ruid = next(int(l.split()[1]) for l in f if l.startswith("Uid:"))
    # name, real uid, start (epoch s), state, parent, process group, session
    return (name, ruid, btime + int(rest[19]) / os.sysconf("SC_CLK_TCK")) + tuple(rest[:4])
def tie(pid, f):
    tied.add(pid)
    groups.update(g for g in f[5:7] if g != "0")
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == me or (own_uts is not None and uts(pid) not in (None, own_uts)):
        continue
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            env = b"\0" + f.read()
    except PermissionError:
        try:
            f = facts(pid)
        except (OSError, StopIteration, ValueError, IndexError):
            continue
        if since is not None and f[2] >= since and f[3] != "Z":  # a zombie is gone
            if f[1] == uid:
                unseen.append("%s\t%s\t%d\tits environment cannot be read" % (pid, f[0], f[1]))
                tie(pid, f)
            else:
                others.append((pid, f, "its environment cannot be read"))
        continue
    except OSError:
        continue
    if not (needle in env or env.endswith(needle[:-1])):
        try:  # root reads every environment: another user's process without the job id may still be tied
            if since is not None and os.stat("/proc/" + pid).st_uid != uid:
                f = facts(pid)
                if f[1] != uid and f[2] >= since and f[3] != "Z":
                    others.append((pid, f, "its environment has no job id"))
        except (OSError, StopIteration, ValueError, IndexError):
            pass
        continue
    try:
        tie(pid, facts(pid))  # before the signal ends it
    except (OSError, StopIteration, ValueError, IndexError):
        tied.add(pid)
    try:
        os.kill(int(pid), sig)
        hit += 1
    except PermissionError:
        try:
            name, ruid = facts(pid)[:2]
        except (OSError, StopIteration, ValueError, IndexError):
            name, ruid = "?", -1
        unseen.append("%s\t%s\t%d\tnot allowed to signal it" % (pid, name, ruid))
    except OSError:
        pass
def ancestors(pids):
    seen = set()
    for pid in pids:
        for _ in range(64):
            try:
                with open("/proc/%s/stat" % pid) as f:
                    pid = f.read().rsplit(")", 1)[1].split()[1]
            except (OSError, IndexError):
                break
            if pid in ("0", "1") or pid in seen:
                break
            seen.add(pid)
    return seen
above = ancestors(list(tied)) if others else set()  # what started the job (slurmstepd, sshd): not its
grew = True
while grew:  # a child of a tied process is tied too
    grew = False
    for pid, f, closed in others:
        if pid not in tied and pid not in above and (f[4] in tied or f[5] in groups or f[6] in groups):
            why = "another user's process in the job's session; " + closed
            unseen.append("%s\t%s\t%d\t%s" % (pid, f[0], f[1], why))
            tie(pid, f)
            grew = True
print(hit)
for line in unseen:
    print(line)
"""


# The sweep's other way in: a remote interpreter the pre-flight left running in its ssh session
# (sshmux.Connections.agent_run), so the end of a job costs no new session (no login shell, no
# interpreter start) per host. Each stdin line is KILL_CODE's argv as JSON; its output follows,
# then AGENT_DONE. It exits at end of input (the launcher closed the session, or died).
AGENT_DONE = "@@gaudi-launch-sweep-done"
AGENT_CODE = (
    "import contextlib, io, json, sys\n"
    f"code = compile({KILL_CODE!r}, 'sweep', 'exec')\n"
    "for line in sys.stdin:\n"
    "    buf = io.StringIO()\n"
    "    sys.argv = ['sweep'] + [str(a) for a in json.loads(line)]\n"
    "    try:\n"
    "        with contextlib.redirect_stdout(buf):\n"
    "            exec(code, {'__name__': '__main__'})\n"
    "    except BaseException:\n"
    "        buf = io.StringIO('-1\\n')\n"
    f"    sys.stdout.write(buf.getvalue() + {AGENT_DONE!r} + '\\n')\n"
    "    sys.stdout.flush()\n"
)


class Sweep(NamedTuple):
    """One host's answer: processes signalled (-1 when unknown) and those it could not inspect or
    signal that may be the job's, as "pid N (name, uid U): why"."""

    hit: int
    unseen: list[str]


def parse_sweep(text: str) -> Sweep:
    """KILL_CODE's output. Pure."""
    lines = text.strip().splitlines()
    hit = int(lines[0]) if lines and lines[0].strip().lstrip("-").isdigit() else -1
    unseen = []
    for line in lines[1:]:
        parts = line.split("\t")
        if len(parts) == 4:
            unseen.append(f"pid {parts[0]} ({parts[1]}, uid {parts[2]}): {parts[3]}")
    return Sweep(hit, unseen)


def describe_unseen(host: str, unseen: list[str]) -> str:
    """The warning for processes the teardown could not inspect or signal. Pure."""
    return (
        f"gaudi-launch: on {host}, {len(unseen)} process(es) that may belong to this job could not be "
        f"inspected or signalled and may still run: " + "; ".join(unseen)
    )


def sweep_here(job_id: str, sig: int) -> Sweep:
    """KILL_CODE run in this process (which it spares): the sweep of a rank's launcher watch, on its
    own host, once the launcher is gone (worker._watch)."""
    if not job_id:
        raise ValueError("a job id is required: without one every process would match")
    out, argv = io.StringIO(), sys.argv
    sys.argv = ["sweep", *kill_args(job_id, sig)]
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(KILL_CODE, "sweep", "exec"), {"__name__": "__main__"})
    except Exception:
        return Sweep(-1, [])
    finally:
        sys.argv = argv
    return parse_sweep(out.getvalue())


def kill_argv(
    python: str,
    job_id: str,
    sig: int,
    since: Optional[float] = None,
    groups: Collection[int] = (),
    per_task: Sequence[Collection[int]] = (),
) -> list[str]:
    # -S: no site module (KILL_CODE needs os and sys only): a third of the interpreter's start-up,
    # on every host at the end of every job
    return [python, "-S", "-c", KILL_CODE, *kill_args(job_id, sig, since, groups, per_task)]


def kill_args(
    job_id: str,
    sig: int,
    since: Optional[float] = None,
    groups: Collection[int] = (),
    per_task: Sequence[Collection[int]] = (),
) -> list[str]:
    """KILL_CODE's own arguments. ``groups`` (session/group ids of the job's processes), or ``per_task``: such
    ids for each srun task (node) of one argv, in task order; both need ``since``. Pure."""
    out = [job_id, str(int(sig))] + ([repr(float(since))] if since is not None else [])
    if since is not None and any(per_task):
        out.append("/".join(",".join(str(int(i)) for i in sorted(ids)) for ids in per_task))
    elif since is not None and groups:
        out.append(",".join(str(int(g)) for g in sorted(groups)))
    return out


def remote_argv(
    host: str,
    ssh_args: Sequence[str],
    python: str,
    job_id: str,
    sig: int,
    since: Optional[float] = None,
    limit: Optional[float] = None,
    groups: Collection[int] = (),
) -> list[str]:
    """ssh's argv; the one remote command line is built with shlex.quote from a list. ``limit``: seconds the
    sweep may run on the host: coreutils' timeout then kills it with its whole process group (a broken
    ``--python`` that hangs, and whatever it started), which ending ssh here would not (no terminal: no
    SIGHUP there)."""
    bound = ["timeout", "-k", "1", f"{max(1.0, limit):g}"] if limit is not None else []
    return ["ssh", *ssh_args, host, shlex.join([*bound, *kill_argv(python, job_id, sig, since, groups)])]


Via = Callable[[str, list[str], float], Optional[str]]


def sweep_job(
    hosts: Sequence[str],
    job_id: str,
    sig: int,
    *,
    ssh_args: Sequence[str],
    python: str,
    is_local: Callable[[str], bool],
    timeout: float = 15.0,
    since: Optional[float] = None,
    via: Optional[Via] = None,
    groups: Mapping[str, Collection[int]] = MappingProxyType({}),
) -> dict[str, Sweep]:
    """Signal the job's processes on every host at once (this host with our own interpreter).
    ``via(host, args, timeout)``: KILL_CODE's output from a remote agent (AGENT_CODE), or None to
    use a new ssh session instead. ``groups``: {host: session/group ids of the job's processes there}."""
    if not job_id:
        raise ValueError("a job id is required: without one every process would match")

    def one(host: str) -> Sweep:
        ids = groups.get(host, ())
        if via is not None and not is_local(host):
            out = via(host, kill_args(job_id, sig, since, ids), timeout)
            if out is not None:
                return parse_sweep(out)
        argv = (
            kill_argv(sys.executable, job_id, sig, since, ids)
            if is_local(host)
            else remote_argv(host, ssh_args, python, job_id, sig, since, limit=timeout - 2, groups=ids)
        )
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
            return parse_sweep(done.stdout) if done.returncode == 0 else Sweep(-1, [])
        except (OSError, subprocess.SubprocessError, ValueError):
            return Sweep(-1, [])

    return per_host(hosts, one, timeout=timeout + 5, default=lambda _: Sweep(-1, []), name="sweep")


def signal_job(
    hosts: Sequence[str],
    job_id: str,
    sig: int,
    *,
    ssh_args: Sequence[str],
    python: str,
    is_local: Callable[[str], bool],
    timeout: float = 15.0,
    via: Optional[Via] = None,
) -> dict[str, int]:
    """Signal the job's processes on every host at once; {host: processes signalled, -1 if unknown}."""
    swept = sweep_job(hosts, job_id, sig, ssh_args=ssh_args, python=python, is_local=is_local, timeout=timeout, via=via)
    return {host: s.hit for host, s in swept.items()}


def job_sweeper(
    hosts: Sequence[str],
    job_id: str,
    *,
    ssh_args: Sequence[str],
    python: str,
    is_local: Callable[[str], bool],
    lost: Callable[[], Collection[str]] = frozenset,
    via: Optional[Via] = None,
    groups: Collection[int] = (),
) -> Callable[..., dict[str, Sweep]]:
    """The sweep a Supervisor runs at teardown and at the end of every job, for every backend, as
    ``sweep(sig, ranks_groups)``. Processes of ours that are closed to inspection are reported when they
    started at most a minute before now (clock skew between hosts): older ones cannot be this job's.
    ``groups``: a collection the caller fills as the job runs (Hooks.sessions): the sessions of the
    processes it started on this host; ``ranks_groups()``: {host: the process groups the ranks there lead}
    (from their wire.STARTED lines). What is left in either is the job's even once those processes have
    exited (a `sudo -u` orphan)."""
    since = time.time() - 60

    Groups = Callable[[], Mapping[str, Collection[int]]]

    def sweep(sig: int, ranks_groups: Optional[Groups] = None) -> dict[str, Sweep]:
        alive = [h for h in hosts if h not in lost()]
        led = ranks_groups() if ranks_groups is not None else {}
        ids = {h: set(led.get(h, ())) | (set(groups) if is_local(h) else set()) for h in alive}
        return sweep_job(
            alive,
            job_id,
            sig,
            ssh_args=ssh_args,
            python=python,
            is_local=is_local,
            since=since,
            via=via,
            groups=ids,
        )

    return sweep
