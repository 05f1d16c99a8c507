"""The pre-flight's probe through OpenMPI's daemon tree (``--fan-out tree``, plan/fanoutmode.py): one mpirun runs
the probe (probe.py, the same command line the flat path runs over ssh) as one rank per host, its daemons started
the way mpirun starts them, each starting its children (radix 64, or GAUDI_LAUNCH_TREE_RADIX). The launcher opens
no connection per host; the hosts' answers come back through mpirun's tagged output, one rank per host in the
order of the hosts given (OpenMPI's sequential mapper).

OpenMPI 4 starts no rank before every daemon is up, so one host that cannot be reached stops the round. Each hop's
ssh is our tree hop (treehop.py), which names the host it failed to reach; the round is run again without the
hosts named (at most MAX_ROUNDS rounds), so a host that hangs costs ssh's ConnectTimeout once, at any depth. What
the tree could not tell (a host not named when a round failed for another reason) is left to the flat path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

from gaudi_launch.inputs.hostnames import bare_host
from gaudi_launch.plan import fanoutmode
from gaudi_launch.remote import probe, treehop
from gaudi_launch.remote.openmpi import OmpiDemux, local_mpirun
from gaudi_launch.remote.preflight import PROBE_TIMEOUT

MAX_ROUNDS = 3
HOSTFILE = "tree-hosts"
# Picks each rank's probe: the master's also checks the master port (the rank given in $1).
_PICK = 'if [ "${OMPI_COMM_WORLD_RANK:-}" = "$1" ]; then eval "$2"; else eval "$3"; fi'


@dataclass
class TreeResult:
    outputs: dict[str, str] = field(default_factory=dict)  # host -> the probe's whole output (its end marker seen)
    failed: dict[str, tuple[int, str]] = field(default_factory=dict)  # host -> (ssh's status, its last line)
    rounds: int = 0
    elapsed_s: float = 0.0
    error: str = ""  # the last failed round's mpirun error output (tail), for a host neither answered nor named


def argv(
    hosts: Sequence[str],
    *,
    hostfile: str,
    mpirun: str,
    prefix: Optional[str],
    hop_python: Optional[str],
    ssh_args: Sequence[str],
    radix: Optional[int],
    tcp_cidr: Optional[str],
    root: bool,
    rank_argv: Sequence[str],
) -> list[str]:
    """mpirun's command line for one round over ``hosts`` (listed in ``hostfile``, one slot each), each rank
    running ``rank_argv``; ``hop_python``: the Python that runs our hop (treehop.py) as mpirun's ssh. Pure."""
    out = [mpirun, *(["--prefix", prefix] if prefix else [])]
    if root:
        out.append("--allow-run-as-root")
    # the sequential mapper: rank i on the hostfile's line i, whatever mpirun's own node order (its own host
    # first, were it listed): each answer is read as its host's (OpenMPI's rmaps seq component)
    out += ["-n", str(len(hosts)), "--hostfile", hostfile, "--mca", "rmaps", "seq", "--bind-to", "none"]
    out += ["--tag-output"]
    if hop_python:
        out += ["--mca", "plm_rsh_agent", treehop.agent(hop_python, fanoutmode.depth(len(hosts), radix) <= 1)]
    if ssh_args:
        out += ["--mca", "plm_rsh_args", " ".join(ssh_args)]
    if radix:
        out += ["--mca", "routed", "radix", "--mca", "routed_radix", str(radix)]
    if tcp_cidr:
        out += ["--mca", "oob_tcp_if_include", tcp_cidr]
    return out + list(rank_argv)


def probe_argv(master_rank: int, master_command: str, command: str) -> list[str]:
    """Each rank's probe: the master's (rank ``master_rank``, -1 for none) also checks the master port. Pure."""
    return ["sh", "-c", _PICK, "sh", str(master_rank), master_command, command]


def by_rank(text: str, hosts: Sequence[str]) -> dict[str, str]:
    """Each host's output from mpirun's tagged output (rank i is hosts[i]). Pure."""
    demux = OmpiDemux(4)
    lines: dict[int, list[str]] = {}
    for line in [*text.split("\n"), None]:
        if line == "":
            continue
        for rank, piece in demux(line):
            if rank is not None:
                lines.setdefault(rank, []).append(piece)
    return {hosts[r]: "\n".join(ls) + "\n" for r, ls in lines.items() if 0 <= r < len(hosts)}


def run_round(
    hosts: Sequence[str],
    rank_argv: Sequence[str],
    *,
    tmp: str,
    name: str,
    hop_python: Optional[str],
    ssh_args: Sequence[str],
    radix: Optional[int],
    tcp_cidr: Optional[str],
    timeout: float,
) -> tuple[int, dict[str, str], str]:
    """One mpirun over ``hosts`` (one rank each, running ``rank_argv``): its status, each host's output
    (by_rank) and its error output. The hostfile goes in ``tmp`` (private)."""
    mpirun, prefix = local_mpirun()
    hostfile = os.path.join(tmp, name)
    with open(hostfile, "w", encoding="utf-8") as f:  # user@host: only the hostfile takes it apart
        f.writelines(f"{h} slots=1\n" for h in hosts)
    cmd = argv(
        hosts,
        hostfile=hostfile,
        mpirun=mpirun,
        prefix=prefix,
        hop_python=hop_python,
        ssh_args=ssh_args,
        radix=radix,
        tcp_cidr=tcp_cidr,
        root=os.geteuid() == 0,
        rank_argv=rank_argv,
    )
    rc, out, err = _run(cmd, timeout)
    return rc, by_rank(out, hosts), err


def split_output(text: str, hosts: Sequence[str]) -> dict[str, str]:
    """Each host's probe output from mpirun's tagged output (rank i is hosts[i]); only complete ones. Pure."""
    return {h: body for h, body in by_rank(text, hosts).items() if probe.END in body}


def round_timeout(hosts: int, radix: Optional[int], ssh_timeout: float) -> float:
    """A round's backstop: the probe's own limit, and each level's ssh once. Pure."""
    return PROBE_TIMEOUT + ssh_timeout * (fanoutmode.depth(hosts, radix) + 1) + 10.0


def run_tree(
    hosts: Sequence[str],
    *,
    python: str,
    ssh_args: Sequence[str],
    ssh_timeout: float,
    radix: Optional[int],
    tcp_cidr: Optional[str],
    master_host: Optional[str],
    master_command: str,
    command: str,
) -> TreeResult:
    """The probe on ``hosts`` through mpirun's tree, in rounds (module docstring)."""
    result = TreeResult()
    t0 = time.monotonic()
    left = list(dict.fromkeys(hosts))
    with tempfile.TemporaryDirectory(prefix="gaudi-launch-tree-") as tmp:  # 0700
        while left and result.rounds < MAX_ROUNDS:
            result.rounds += 1
            master_rank = left.index(master_host) if master_host in left else -1
            rc, outputs, err = run_round(
                left,
                probe_argv(master_rank, master_command, command),
                tmp=tmp,
                name=f"{HOSTFILE}-{result.rounds}",
                hop_python=python,
                ssh_args=ssh_args,
                radix=radix,
                tcp_cidr=tcp_cidr,
                timeout=round_timeout(len(left), radix, ssh_timeout),
            )
            answered = {h: body for h, body in outputs.items() if probe.END in body}
            result.outputs.update(answered)
            named = {h: v for h, v in treehop.parse_failures(err).items() if h in left and h not in answered}
            # the hop names a host as ssh was given it (user@host as the hostfile has it, or the bare name)
            for entry in left:
                if entry not in named and bare_host(entry) in named and entry not in answered:
                    named[entry] = named.pop(bare_host(entry))
            result.failed.update(named)
            left = [h for h in left if h not in answered and h not in named]
            if rc == 0 or not named:
                if left:
                    result.error = _tail(err)
                break
    result.elapsed_s = time.monotonic() - t0
    return result


def _tail(text: str, lines: int = 3) -> str:
    """What mpirun's error output says first, before OpenMPI's boxed explanation (which names no host). Pure."""
    kept = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith(treehop.FAILED)]
    box = next((k for k, line in enumerate(kept) if line.startswith("-----")), len(kept))
    before = list(dict.fromkeys(kept[:box]))  # (each hop of a level says the same)
    return "\n".join(before[-lines:] if before else kept[box + 1 : box + 1 + lines])


def _run(cmd: list[str], timeout: float) -> tuple[int, str, str]:
    """mpirun, its output and error output; stopped (TERM, then KILL) at ``timeout``."""
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        out, err = proc.communicate()
        err += f"\nmpirun did not finish within {timeout:g} s\n".encode()
    except BaseException:
        _stop(proc)
        proc.communicate()
        raise
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _stop(proc: subprocess.Popen) -> None:
    """mpirun tears its daemons down on SIGTERM; what is left of its session gets SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
