"""mpirun's ssh for the tree pre-flight (its plm_rsh_agent, remote/treeprobe.py): one hop of OpenMPI's daemon tree.

OpenMPI 4 with tree spawn runs its rsh agent on the launcher for its children and on each daemon for theirs
(the agent travels down the tree with the other MCA parameters given on mpirun's command line). When a hop's ssh
fails, mpirun says only "ORTE was unable to reliably start one or more daemons", whichever host it was; this hop
is that ssh, and when it fails it adds one line naming the host and ssh's last words, which reaches mpirun's
error output through the parent daemons' (FAILED below). Everything else passes through untouched.

    python -m gaudi_launch.remote.treehop SSH_OPTION... HOST COMMAND_WORD...
    python -S -I .../gaudi_launch/remote/treehop.py SSH_OPTION... HOST COMMAND_WORD...  (``agent``)

Standard library only, and nothing of the package (it also runs as a file, without site); runs on every host of
the tree that has children (its Python: the workers').
"""

from __future__ import annotations

import os
import signal
import sys
import time

FAILED = "@@gaudi-launch-hop failed"
# After naming its host, a failed hop waits this long before it exits (and mpirun, told, stops the whole tree):
# hops that fail at about the same time (two hosts that hang, each timing out after ConnectTimeout) are then
# named in the same round, so two hanging hosts cost one timeout, not one each.
LINGER_S = 1.0


# ssh's options that take a value (ssh(1) SYNOPSIS)
_WITH_VALUE = set("BbcDEeFIiJLlmOoPpQRSWw")


def agent(python: str, launcher_only: bool, here: str = __file__) -> str:
    """mpirun's plm_rsh_agent for this hop (OpenMPI splits it at spaces). Where every hop runs on the launcher (the
    tree one level deep: no more remote hosts than the radix), this file itself, by path, with -S -I: no site and
    no package to find, which is two thirds of the hop's start-up (14 of 24 ms of CPU here, once per host). Deeper,
    the daemons run it on their own hosts, where only the module's name is sure to be found. Pure."""
    path = os.path.abspath(here)
    if launcher_only and not any(c.isspace() for c in path):
        return f"{python} -S -I {path}"
    return f"{python} -m gaudi_launch.remote.treehop"


def split(argv: list[str]) -> tuple[list[str], str, list[str]]:
    """(ssh options, host, command words) from our argv (without argv[0]): ssh's own command line, as mpirun
    gives its agent (plm_rsh_args, then the host, then the daemon's command), read as ssh reads it. Pure."""
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        flags = argv[i][1:]
        for j, ch in enumerate(flags):
            if ch in _WITH_VALUE:
                i += 1 if j + 1 < len(flags) else 2  # -oX=Y, or -o X=Y
                break
        else:
            i += 1
    if i < len(argv) and argv[i] == "--":
        i += 1
    if i >= len(argv) - 1:
        raise ValueError("usage: treehop SSH_OPTION... HOST COMMAND...")
    return argv[:i], argv[i], argv[i + 1 :]


def failure_line(host: str, rc: int, stderr_tail: str) -> str:
    """The line that names a failed hop. Pure."""
    last = [line.strip() for line in stderr_tail.splitlines() if line.strip()]
    return f"{FAILED} {host} {rc} {last[-1] if last else ''}".rstrip() + "\n"


def parse_failures(text: str) -> dict[str, tuple[int, str]]:
    """{host: (ssh's exit status, its last error line)} from mpirun's error output. Pure."""
    out: dict[str, tuple[int, str]] = {}
    for line in text.splitlines():
        at = line.find(FAILED)
        if at < 0:
            continue
        parts = line[at + len(FAILED) :].strip().split(" ", 2)
        if len(parts) >= 2 and parts[1].lstrip("-").isdigit():
            out.setdefault(parts[0], (int(parts[1]), parts[2] if len(parts) > 2 else ""))
    return out


def main(argv: list[str]) -> int:
    try:
        options, host, words = split(argv)
    except ValueError as exc:
        sys.stderr.write(f"gaudi-launch tree hop: {exc}\n")
        return 255
    # -x: no X11; agent forwarding stays off (ForwardAgent=no is among the launcher's options). fork and exec,
    # not subprocess: its import is a third of this hop's start-up, paid once per child of every daemon.
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.dup2(write_end, 2)
        os.close(write_end)
        try:
            os.execvp("ssh", ["ssh", "-x", *options, host, *words])
        except OSError as exc:
            os.write(2, f"gaudi-launch tree hop: cannot run ssh: {exc}\n".encode())
        os._exit(255)
    os.close(write_end)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    tail = b""
    while True:
        try:
            chunk = os.read(read_end, 65536)
        except InterruptedError:
            continue
        if not chunk:
            break
        os.write(2, chunk)
        tail = (tail + chunk)[-4096:]
    rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if rc != 0:
        os.write(2, failure_line(host, rc, tail.decode("utf-8", "replace")).encode())
        time.sleep(LINGER_S)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
