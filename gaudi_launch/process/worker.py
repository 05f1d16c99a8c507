"""Rank bootstrap: ``python -m gaudi_launch.process.worker [-m] SCRIPT [ARGS...]``.

Runs on every rank, whatever started it (our local backend, mpirun, the DeepSpeed launcher):
normalises the environment to torchrun's contract, then runs the user's script in this process as
``__main__`` with sys.argv as given. (Started from a job file, by the deepspeed backend, it forks
first: the child is the rank, this process relays its output and reports its end, see relay.py.)
An uncaught exception is written as a structured error record (rank, host, time, traceback) as one
marker line on stderr, which the supervisor takes out of the output stream for its failure summary;
it works through any backend (pipes, mpirun, pdsh).
On a Gaudi host it also puts the bridge's import-time settings (lazy mode, per-job autocast op
lists) in the environment from the script's flags, before the script can import torch, and for a
multi-rank job registers the "hccl" process-group backend, so a script written for torchrun or
optimum-habana runs unchanged. Elsewhere this module imports no torch; the process group itself is
the script's (``init_process_group``) or the runtime's (``gaudi_launch.runtime.device``), with the
device's backend (hccl, nccl, gloo) and --ddp_timeout.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import re
import runpy
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, MutableMapping
from typing import Optional

from gaudi_launch.inputs.ports import describe_holder, port_is_free
from gaudi_launch.inputs.slurm import rank_layout, wait_alone_in_group
from gaudi_launch.plan.contract import elastic_env, node_layout, node_of_rank, node_visibility, read_error_file
from gaudi_launch.process import gate, placement, relay
from gaudi_launch.process.heartbeats import install_stack_dump
from gaudi_launch.remote.jobdir import clean_stale, read_job
from gaudi_launch.remote.teardown import sweep_here
from gaudi_launch.wire import (
    CPU_BIND,
    DEVICE,
    GATE,
    GRACE,
    HEARTBEAT_DIR,
    HOST_CARDS,
    JOB_DIGEST_FLAG,
    JOB_FILE_FLAG,
    JOB_ID,
    NO_PYTHON_FLAG,
    RANKS_FROM,
    STARTED,
    TORN_DOWN,
    JobDirError,
    check_private_dir,
    path_for,
    rank_dir,
    record_line,
)

# Where other launchers put the rank layout, in order of preference for each torchrun name.
_SOURCES = {
    "RANK": ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"),
    "WORLD_SIZE": ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
    "LOCAL_RANK": ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"),
    "LOCAL_WORLD_SIZE": ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"),
    # Not OMPI_COMM_WORLD_NODE_RANK: despite its name it is a rank within the node.
    "NODE_RANK": ("NODE_RANK", "GROUP_RANK", "CROSS_RANK"),
}


def normalize_env(env: Mapping[str, str], cpu_count: Optional[int] = None) -> dict[str, str]:
    """The torchrun names (plus DeepSpeed's aliases) filled in from whichever launcher ran us. Pure."""
    if env.get(RANKS_FROM) == "slurm":
        # srun started us (the slurm backend): its task variables are the layout, whatever
        # RANK/LOCAL_RANK/... came along in srun's environment.
        layout = rank_layout(env)
        merged = {**env, **layout, RANKS_FROM: ""}
        combined = {**layout, **normalize_env(merged, cpu_count)}
        return {k: v for k, v in combined.items() if env.get(k) != v}
    out: dict[str, str] = {}
    for name, sources in _SOURCES.items():
        for src in sources:
            if env.get(src, "") != "":
                out[name] = env[src]
                break
    node = None if "NODE_RANK" in out else node_of_rank({**env, **out})
    if node is not None:  # uneven nodes under mpirun: the sizes say which node the rank is on
        out["NODE_RANK"] = node
    out.update(node_layout({**env, **out}))  # uneven nodes under DeepSpeed: its LOCAL_RANK is off
    if "NODE_RANK" not in out and "RANK" in out and "LOCAL_WORLD_SIZE" in out:
        # Homogeneous nodes (mpirun ppr:K:node): node rank follows from the global rank.
        out["NODE_RANK"] = str(int(out["RANK"]) // max(1, int(out["LOCAL_WORLD_SIZE"])))
    if "NODE_RANK" in out:
        out.setdefault("GROUP_RANK", out["NODE_RANK"])
        out.setdefault("CROSS_RANK", out["NODE_RANK"])
    if "LOCAL_WORLD_SIZE" in out:
        out.setdefault("LOCAL_SIZE", out["LOCAL_WORLD_SIZE"])
    if "CROSS_SIZE" not in env and "WORLD_SIZE" in out and "LOCAL_WORLD_SIZE" in out:
        out["CROSS_SIZE"] = str(int(out["WORLD_SIZE"]) // max(1, int(out["LOCAL_WORLD_SIZE"])))
    # A backend that starts every node alike (mpirun, deepspeed) passes each node's device subset,
    # already mapped onto the visibility the ranks inherit: set exactly that.
    out.update(node_visibility(env, out.get("NODE_RANK")))
    out.update(elastic_env({**env, **out}, env))
    if cpu_count and not env.get("OMP_NUM_THREADS"):
        # Ranks sharing a host share its cores: without this each one starts a thread per core and
        # they slow each other down several times over (torchrun sets it too).
        local = int(out.get("LOCAL_WORLD_SIZE", "1") or 1)
        out["OMP_NUM_THREADS"] = str(max(1, cpu_count // max(1, local)))
    out.setdefault("MASTER_ADDR", env.get("MASTER_ADDR", "127.0.0.1"))
    out.setdefault("MASTER_PORT", env.get("MASTER_PORT", "29500"))
    return {k: v for k, v in out.items() if env.get(k) != v}


# Read by the dynamic loader or the interpreter at start-up: changing them needs a fresh process.
_STARTUP_VARS = ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PYTHONHOME")


def take_local_rank(argv: list[str]) -> tuple[Optional[str], list[str]]:
    """DeepSpeed's launch.py puts ``--local_rank=N`` before our own arguments (--append-local-rank):
    take it off, to go after the script as DeepSpeed gives it. Pure."""
    if len(argv) > 1 and argv[1].startswith(JOB_FILE_FLAG) and re.fullmatch(r"--local_rank=\d+", argv[0]):
        return argv[0], argv[1:]
    return None, argv


def job_argv(path: str, digest: str) -> list[str]:
    """What a backend puts on argv for the job file: its path and digest, no value."""
    return [JOB_FILE_FLAG + path, JOB_DIGEST_FLAG + digest]


def read_job_argv(argv: list[str]) -> dict:
    """The job file named by argv[0:2] (``job_argv``), checked: ours, private, the right digest."""
    if len(argv) < 2 or not argv[1].startswith(JOB_DIGEST_FLAG):
        raise JobDirError(f"{JOB_FILE_FLAG}PATH must be followed by {JOB_DIGEST_FLAG}DIGEST")
    return read_job(argv[0][len(JOB_FILE_FLAG) :], argv[1][len(JOB_DIGEST_FLAG) :])


def uses_hpu(environ: Mapping[str, str]) -> bool:
    """The Gaudi stack is installed (found, not imported) and --device did not say otherwise."""
    return environ.get(DEVICE, "hpu") == "hpu" and importlib.util.find_spec("habana_frameworks") is not None


def _may_bind(environ: Mapping[str, str]) -> bool:
    """The rank may bind itself to its card's cores (cardside.bind_cpus): binding is on and the plan carried the
    hosts' cards, or this host has hl-smi to read its own. Pure but for the PATH lookup."""
    return environ.get(CPU_BIND) != "none" and bool(environ.get(HOST_CARDS) or shutil.which("hl-smi"))


def _check_master_port(environ: Mapping[str, str]) -> None:
    """Under Slurm the master port follows from the job id, which every user of the cluster sees (squeue):
    another user on the first node may take it first. Rank 0 then fails at once naming who holds it,
    rather than in torch's rendezvous ("address already in use", naming nobody) or, worse, with every rank
    talking to someone else's listener."""
    port = environ.get("MASTER_PORT", "")
    if environ.get("RANK") != "0" or not port.isdigit() or not 1 <= int(port) <= 65535:
        return
    if not port_is_free(int(port)):
        print(
            f"gaudi-launch worker: error: the master port {port} is already taken on this node by "
            f"{describe_holder(int(port))}; give the job another --master_port",
            file=sys.stderr,
        )
        sys.exit(2)


def _clean_dead_jobs() -> None:
    """One rank per host and job removes what SIGKILLed jobs left in the temporary directory."""
    try:
        clean_stale()
    except OSError:
        pass  # housekeeping only: never a reason for the rank to fail


def error_record(
    environ: Mapping[str, str], exc: Optional[BaseException] = None, exit_code: Optional[int] = None
) -> dict:
    record = {
        "rank": int(environ["RANK"]) if environ.get("RANK", "").isdigit() else None,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "exit_code": exit_code,
    }
    if exc is not None:
        record.update(exc_type=type(exc).__name__, message=str(exc), traceback=format_user_traceback(exc))
    elastic = read_error_file(environ.get("TORCHELASTIC_ERROR_FILE"))
    if elastic:  # torch's @record wrote it: report what torchrun would, its traceback verbatim
        record["error_file"] = environ["TORCHELASTIC_ERROR_FILE"]
        if elastic["traceback"]:
            record["traceback"] = elastic["traceback"]
        if "exc_type" not in record:
            kind, _, message = elastic["message"].partition(": ")
            record.update(exc_type=kind, message=message)
    return record


def format_user_traceback(exc: BaseException) -> str:
    """The traceback as `python script.py` would print it: without our and runpy's frames."""
    tb = exc.__traceback__
    while tb is not None and (
        tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>")
        or tb.tb_frame.f_code.co_filename.endswith("runpy.py")
    ):
        tb = tb.tb_next
    import traceback  # here: only a failed rank formats one (every rank's start-up, issue 34)

    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def emit_error_record(record: dict) -> None:
    try:
        sys.stderr.write(record_line(record))
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr is gone: the exit code still tells


def _term_whole_group(signum, _frame) -> None:
    # We lead our own process group: take the rank's children (data loader workers, helpers) with
    # us, whoever sent the SIGTERM (our supervisor, mpirun's orted, DeepSpeed's launch.py).
    # Ignored until the group has it: a second SIGTERM (the parent-death signal comes again as a
    # killed launcher's threads exit one by one) would otherwise end us before our children.
    signal.signal(signum, signal.SIG_IGN)
    if _RELAYED:  # tell the relay (relay.py) this rank is torn down, not failing on its own
        try:
            os.write(2, (TORN_DOWN + "\n").encode())
        except OSError:
            pass
    if _ERROR_DIR:
        shutil.rmtree(_ERROR_DIR, ignore_errors=True)
    os.killpg(0, signum)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _close_process_group() -> None:
    """A script that leaves its process group open makes gloo abort at exit ("terminate called
    without an active exception"): close it for the script, only if torch is already in use."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            # First free the script's DDP models left in reference cycles: a reducer that holds the
            # last reference to the group frees it holding the GIL, while gloo's worker thread may
            # need the GIL to free its last work, and both wait for ever.
            gc.collect()
            dist.destroy_process_group()
    except Exception:
        pass


def _end_group() -> None:
    """The rank is done: whatever it started in its group (our group) ends with it."""
    if os.getpgrp() == os.getpid():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            os.killpg(0, signal.SIGTERM)
        except OSError:
            pass


def run(argv: list[str], environ: MutableMapping[str, str] = os.environ) -> int:
    try:
        return _run(argv, environ)
    finally:
        _close_process_group()
        if _ERROR_DIR:
            shutil.rmtree(_ERROR_DIR, ignore_errors=True)
        _end_group()
        if _GATE is not None:  # one-pass tree: the last rank of this host sweeps it (process/gate.py)
            _GATE.at_exit(environ.get(JOB_ID, ""))


_ERROR_DIR: Optional[str] = None
_GATE = None  # process/gate.Gate: the one-pass tree's connection to the launcher
_RELAYED = False  # our output goes through a relay (relay.py): ranks started from a job file
_RELAYED_FLAG = "--gaudi-launch-relayed"


def _error_file(environ: Mapping[str, str]) -> dict[str, str]:
    """A private TORCHELASTIC_ERROR_FILE per rank, as torchrun gives, for torch's @record."""
    global _ERROR_DIR
    if not environ.get(JOB_ID):
        return {}
    try:
        _ERROR_DIR = tempfile.mkdtemp(prefix=f"gaudi-launch-{environ[JOB_ID]}-rank{environ.get('RANK', '')}-")
    except OSError:
        return {}
    return {"TORCHELASTIC_ERROR_FILE": os.path.join(_ERROR_DIR, "error.json")}


def _grace(environ: Mapping[str, str]) -> float:
    try:
        grace = float(environ.get(GRACE, "10"))
    except ValueError:
        return 10.0
    return grace if 0 <= grace < 3600 else 10.0


def watch_launcher(grace: float, job: str = "", relayed: bool = False) -> bool:
    """End this rank's group when whatever reads its output is gone (the launcher, or the ssh session
    and pdsh that carried it, were killed): SIGTERM, then SIGKILL after ``grace`` seconds. With the
    ``job`` id, the same for everything on this host that carries it (what left the group: a rank's
    setsid + double-fork daemon), and the job's directory here (DeepSpeed's job file) is removed:
    with the launcher gone, no one else would.

    Nothing signals a remote rank when the launcher is SIGKILLed, but its stdout/stderr pipe (or
    socket) then loses its reader, which poll() reports as POLLERR/POLLHUP without polling for
    anything. A terminal or a file has no such reader: no watch then. True when watching.

    The watch is a forked process, not a thread: a rank hung in a C++ collective can hold the GIL
    for good, and then neither its SIGTERM handler nor any thread of it runs again. Forked here,
    before the script runs, the process has no other threads to worry about.

    The rank's end shows as a pipe's HUP: this process holds its write end. So does, though, whatever the
    rank fork()s without exec (a helper, a pool worker, a daemon that keeps its descriptors; an exec closes
    it) for as long as that lives: the watch may learn of the rank's end only from /proc (``_ended``).
    """
    fds = []
    for fd in (1, 2):
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
                fds.append(os.dup(fd))  # the script may close or redirect its own stdout
        except OSError:
            pass
    if not fds:
        return False
    rank_gone, rank_alive = os.pipe()  # not inherited by exec'd children: HUP when the rank ends
    group = os.getpgrp()
    start = _start_time(os.getpid())
    rank = (os.getpid(), start) if start is not None else None
    middle = os.fork()
    if middle == 0:
        # Forked twice, the watch is no descendant of the rank: whatever kills the rank's process tree
        # when the launcher is gone (ds_runner SIGKILLs all its descendants) leaves the watch to clean up.
        try:
            if os.fork() == 0:
                os.close(rank_alive)
                _watch(fds, rank_gone, grace, group, job, relayed, rank)
        finally:
            os._exit(0)
    os.waitpid(middle, 0)
    os.close(rank_gone)
    for fd in fds:
        os.close(fd)
    return True


def _watch(
    fds: list[int],
    rank_gone: int,
    grace: float,
    group: int,
    job: str = "",
    relayed: bool = False,
    rank: Optional[tuple[int, str]] = None,
) -> None:
    """The watcher process: deaf to the stop signals the rank's group gets, so that its SIGKILL follows
    its SIGTERM. Without a job id it stays in that group, so that whatever ends the group ends it too;
    with one it leads a group of its own, so that a group SIGKILL (mpirun's orted ending the ranks
    of a launcher that is gone) leaves it to sweep the job id after (whatever outlives it is swept by
    the launcher's own final sweep, which ends this watch too: it carries the job id). ``rank``: the
    rank's pid and start time (``_start_time``), to ask /proc whether it ended (None: /proc unreadable)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    if job:
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
    poller = select.poll()
    for fd in fds:
        poller.register(fd, 0)  # POLLERR and POLLHUP are reported whatever is asked for
    poller.register(rank_gone, select.POLLIN)
    while True:
        events = dict(poller.poll())
        lost = any(ev & (select.POLLERR | select.POLLHUP) for fd, ev in events.items() if fd in fds)
        # A relay (relay.py) reads a relayed rank's output: it ends right after the rank, and (reading the
        # launcher's pipe) at once when the launcher is gone. Its end with the rank_gone pipe still open
        # (held by a process the rank forked) is the rank's end when /proc says the rank ended, else the
        # launcher's.
        if events.get(rank_gone) or (lost and relayed and rank is not None and _ended(*rank)):
            # The rank ended: on its own, by the job's teardown, or by the parent-death signal of a
            # launcher that is gone (its pipe closed before that signal is sent): only then go on.
            # A relay is no such reader: it ends with the rank, and is watched while it runs.
            events = {} if relayed or not job else dict(poller.poll(0))
            if not any(ev & (select.POLLERR | select.POLLHUP) for fd, ev in events.items() if fd in fds):
                return
            break
        if lost:
            break
    for fd in fds:
        os.close(fd)  # nothing reads them any more; nor may they hold a pipe open for anyone
    _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + grace
    if job:
        sweep_here(job, signal.SIGTERM)  # spares this process; the other ranks' watches ignore it
    waiter = select.poll()
    waiter.register(rank_gone, select.POLLIN)
    if not waiter.poll(grace * 1000):
        _signal_group(group, signal.SIGKILL)
    if job:
        while time.monotonic() < deadline and sweep_here(job, 0).hit > 0:
            time.sleep(0.2)
        sweep_here(job, signal.SIGKILL)
        _remove_job_dir(job)


def _start_time(pid: int) -> Optional[str]:
    """When process ``pid`` started, in clock ticks since boot (/proc/PID/stat): with the pid, names one
    process for good. None when /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _ended(pid: int, start: str) -> bool:
    """Process ``pid`` that started at ``start`` (``_start_time``) has ended: a zombie, reaped, or its pid
    now another process's."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        return False  # cannot tell: as if it ran (the watch then takes the relay's end for the launcher's)
    return fields[0] in ("Z", "X", "x") or fields[19:20] != [start]


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except OSError:
        pass  # the group has ended already


def _remove_job_dir(job: str) -> None:
    """This host's directories of the job (DeepSpeed's job file's, the ranks' own), if ours and private (never
    through a link)."""
    for path in dict.fromkeys((path_for(job), rank_dir(job, os.environ))):
        try:
            check_private_dir(path)
        except (OSError, JobDirError):
            continue
        shutil.rmtree(path, ignore_errors=True)


def route_source(master_addr: str) -> str:
    """The address this machine reaches ``master_addr`` from (a UDP socket's connect picks the route and sends
    nothing); '' when there is no route or the name does not resolve."""
    if not master_addr:
        return ""
    try:
        family, _, _, _, addr = socket.getaddrinfo(master_addr, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            return str(s.getsockname()[0])
    except (OSError, IndexError):
        return ""


def run_program(argv: list[str], environ: Mapping[str, str]) -> int:
    """A --no_python rank: the executable runs as our child, in our process group. Its exit status is
    the rank's; killed by a signal, the rank ends by the same signal once its group is ended."""
    try:
        child = subprocess.Popen(argv, env=dict(environ))
    except OSError as exc:
        print(f"gaudi-launch worker: could not start {argv[0]}: {exc.strerror}", file=sys.stderr)
        emit_error_record(error_record(environ, exit_code=127))
        return 127
    while True:
        try:
            code = child.wait()
            break
        except KeyboardInterrupt:  # Ctrl-C reached the whole group: the child decides what it means
            continue
    if code < 0:
        _end_group()
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    if code:
        emit_error_record(error_record(environ, exit_code=code))
    return code


def cwd_on_path(env: Mapping[str, str], environ: Mapping[str, str], job_dir: str, cwd: str) -> dict[str, str]:
    """DeepSpeed's multi-node runners put their working directory first on the ranks' PYTHONPATH;
    ours is the job directory, so put the launcher's directory there instead, as `deepspeed` would. Pure."""
    if job_dir not in environ.get("PYTHONPATH", "").split(os.pathsep):
        return dict(env)
    rest = env.get("PYTHONPATH")
    if rest is None:
        rest = os.pathsep.join(p for p in environ["PYTHONPATH"].split(os.pathsep) if p != job_dir)
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (cwd, rest) if p)}


def _whole_lines() -> None:
    # One write per line: ranks sharing a pipe (pdsh, mpirun, our supervisor) must not interleave
    # inside a line, as they do when print() writes its pieces separately (python -u).
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # io.TextIOWrapper's; a replaced stream may lack it
        try:
            if reconfigure is not None:
                reconfigure(line_buffering=True, write_through=False)
        except ValueError:
            pass


def _run(argv: list[str], environ: MutableMapping[str, str]) -> int:
    global _RELAYED
    if argv[:1] == [_RELAYED_FLAG]:  # re-executed below, with the relay already in place
        _RELAYED, argv = True, argv[1:]
    local_rank, argv = take_local_rank(argv)
    if argv and argv[0].startswith(JOB_FILE_FLAG):
        try:
            job = read_job_argv(argv)
            os.chdir(job["cwd"])  # the launcher's; never pasted into a remote shell line
        except (OSError, ValueError, KeyError) as exc:
            print(
                f"gaudi-launch worker on {socket.gethostname()}: cannot start from the job file: {exc}", file=sys.stderr
            )
            return 2
        job_dir = os.path.dirname(argv[0][len(JOB_FILE_FLAG) :])
        program = list(job["argv"])
        if local_rank and program:  # script --local_rank=N args..., as DeepSpeed runs it
            fixed = node_layout({**environ, **job["env"]}).get("LOCAL_RANK")
            program.insert(1, f"--local_rank={fixed}" if fixed else local_rank)
        env, argv = job["env"], (["-m"] if job["module"] else []) + program
        env = cwd_on_path(env, environ, job_dir, job["cwd"])
        relay.start(environ.get("RANK", ""))  # from here on we are the rank, our output relayed
        _RELAYED = True
        if any(env.get(k, environ.get(k)) != environ.get(k) for k in _STARTUP_VARS):
            os.execve(
                sys.executable,
                [sys.executable, "-u", "-m", "gaudi_launch.process.worker", _RELAYED_FLAG, *argv],
                {**environ, **env},
            )
        environ.update(env)
    _whole_lines()
    no_python = argv[:1] == [NO_PYTHON_FLAG]
    if not argv or argv in (["-m"], [NO_PYTHON_FLAG]):
        print("usage: python -m gaudi_launch.process.worker [-m] SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    threads_set = bool(environ.get("OMP_NUM_THREADS"))  # the user's, before normalize_env sets one
    environ.update(normalize_env(environ, os.cpu_count()))
    try:
        os.setpgid(0, 0)  # lead a group of our own (mpirun/deepspeed start ranks inside theirs)
    except OSError:
        pass  # already a session leader (our local backend): nothing to do
    if environ.get(JOB_ID):  # to the launcher: this rank started (its start-up deadline), where
        # (process/placement.py), and the group it leads: the job-end sweep on this host ties to the job what
        # the rank leaves in it, another user's process included (a `sudo -u` orphan; remote/teardown.py)
        where = placement.machine(socket.gethostname(), route_source(environ.get("MASTER_ADDR", "")))
        sys.stderr.write(f"{STARTED}{environ.get('RANK', '')} {where} {os.getpgrp()}\n")
        sys.stderr.flush()
    if environ.get(GATE):  # --fan-out tree in one pass: the host's checks, then the launcher's go
        global _GATE
        _GATE = gate.wait_for_go(environ)
    if environ.get(JOB_ID) and environ.get("LOCAL_RANK") == "0":
        _clean_dead_jobs()
    environ.update(_error_file(environ))
    if environ.get(HEARTBEAT_DIR):  # --hang-timeout: the launcher may ask for this rank's stacks
        install_stack_dump(environ)
    if environ.get(RANKS_FROM) == "slurm":
        wait_alone_in_group()  # the first task of a node leads the group srun put them all in
        _check_master_port(environ)
    if os.getpgrp() == os.getpid():
        signal.signal(signal.SIGTERM, _term_whole_group)
        if environ.get(JOB_ID):
            watch_launcher(_grace(environ), environ[JOB_ID], relayed=_RELAYED)
    as_module = argv[0] in ("-m", NO_PYTHON_FLAG)
    target, args = (argv[1], argv[2:]) if as_module else (argv[0], argv[1:])
    hpu = uses_hpu(environ)
    if hpu or (environ.get(JOB_ID) and _may_bind(environ)):
        # (here, not at the top: a host without cards never loads the card and flag parsing, issue 34)
        from gaudi_launch.process import cardside

        if environ.get(JOB_ID):
            cardside.bind_cpus(environ, threads_set)
        if hpu:
            environ.update(cardside.hpu_env(args, environ))
            cardside.recipe_cache(environ)
            if int(environ.get("WORLD_SIZE", "1") or 1) > 1 and not no_python:
                cardside.register_hccl()
    if no_python:
        return run_program([target, *args], environ)
    try:
        if as_module:
            sys.argv = [target, *args]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *args]
            sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python script.py` does
            runpy.run_path(os.path.abspath(target), run_name="__main__")  # __file__ absolute, as python does
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            if code:
                emit_error_record(error_record(environ, exit_code=code))
            return code or 0
        print(code, file=sys.stderr)
        emit_error_record(error_record(environ, exit_code=1))
        return 1
    except BaseException as exc:
        sys.stderr.write(format_user_traceback(exc))
        emit_error_record(error_record(environ, exc, exit_code=1))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
