"""Job-scoped teardown on every host: signal exactly the processes of one job, nothing else.

Every rank (and everything it starts) inherits GAUDI_LAUNCH_JOB_ID, so on each host we signal the
processes whose environment carries this job's id: never a pattern match on command lines, which
kills other users' jobs (DeepSpeed #6807). Runs over plain ssh, in parallel, with the job's options.
"""
from __future__ import annotations

import shlex
import subprocess
import threading
from typing import Callable, Dict, List, Sequence

# Run by the remote interpreter; argv: JOB_ID SIGNAL. Prints how many processes it signalled.
KILL_CODE = r"""
import os, sys
needle = b"\0GAUDI_LAUNCH_JOB_ID=" + sys.argv[1].encode() + b"\0"
sig, me, hit = int(sys.argv[2]), os.getpid(), 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == me:
        continue
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            env = b"\0" + f.read()
    except OSError:
        continue
    if needle in env or env.endswith(needle[:-1]):
        try:
            os.kill(int(pid), sig)
            hit += 1
        except OSError:
            pass
print(hit)
"""


def kill_argv(python: str, job_id: str, sig: int) -> List[str]:
    return [python, "-c", KILL_CODE, job_id, str(int(sig))]


def remote_argv(host: str, ssh_args: Sequence[str], python: str, job_id: str, sig: int) -> List[str]:
    """ssh's argv; the one remote command line is built with shlex.quote from a list."""
    return ["ssh", *ssh_args, host, shlex.join(kill_argv(python, job_id, sig))]


def signal_job(hosts: Sequence[str], job_id: str, sig: int, *, ssh_args: Sequence[str], python: str,
               is_local: Callable[[str], bool], timeout: float = 15.0) -> Dict[str, int]:
    """Signal the job's processes on every host at once; {host: processes signalled, -1 if unknown}."""
    if not job_id:
        raise ValueError("a job id is required: without one every process would match")
    result: Dict[str, int] = {}

    def one(host: str) -> None:
        argv = kill_argv(python, job_id, sig) if is_local(host) else remote_argv(host, ssh_args, python, job_id, sig)
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
            result[host] = int(out.stdout.strip() or -1) if out.returncode == 0 else -1
        except (OSError, subprocess.SubprocessError, ValueError):
            result[host] = -1

    threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in dict.fromkeys(hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return result
