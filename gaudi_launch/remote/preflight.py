"""SSH pre-flight: before a multi-node job starts, check every host in parallel.

For each host of the hostfile: can we log in with a key (and which one was refused), does the
workers' Python exist, is the script there, how many Gaudi devices does ``hl-smi`` see, which
OpenMPI / DeepSpeed versions are installed, can the host reach the master, and (on the master)
is the master port free. Every failure comes with a reason and a fix, as one table.

``check_hosts`` does the I/O: each host's probe (probe.py) through the job's OpenSSH connection, or
through our own client (sshclient.py) when there is none; a failed login becomes a reason and a fix
(sshfailures.py). Judging a probe's result and the report are pure. Never imports torch.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from gaudi_launch.inputs import cards
from gaudi_launch.inputs.sshconfig import SshConfig, SshConfigError
from gaudi_launch.plan import scaleout
from gaudi_launch.plan.hostfacts import HostFacts
from gaudi_launch.remote import probe
from gaudi_launch.remote.fanout import per_host
from gaudi_launch.remote.sshclient import (
    CommandFailed,
    SshOptions,
    Target,
    keys_description,
    quiet_paramiko,
    run_command,
    target_of,
    unresolved,
)
from gaudi_launch.remote.sshfailures import classify_ssh_error
from gaudi_launch.remote.sshmux import SESSION_AGENT, read_until
from gaudi_launch.remote.sshresolve import resolve
from gaudi_launch.version import __version__

PROBE_TIMEOUT = 60.0  # seconds for the probe command itself, once logged in


# ---------------------------------------------------------------- data


@dataclass
class CheckReport:
    facts: dict[str, HostFacts]
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.facts.values())

    def failures(self) -> list[HostFacts]:
        return [f for f in self.facts.values() if not f.ok]

    def render_table(self) -> str:
        """host | OK/failed | reason (the fix on the next line), then the warnings."""
        rows: list[tuple[str, str, str, Optional[str]]] = []
        for f in self.facts.values():
            if f.ok:
                rows.append((f.host, "OK", _summary(f), None))
            else:
                rows.append((f.host, "failed", f.reason or "failed", f.fix))
        w_host = max([len("host")] + [len(r[0]) for r in rows])
        w_status = max([len("status")] + [len(r[1]) for r in rows])
        lines = [f"{'host':<{w_host}}  {'status':<{w_status}}  details"]
        pad = " " * (w_host + w_status + 4)
        for host, status, text, fix in rows:
            text_lines = (text or "").splitlines() or [""]
            lines.append(f"{host:<{w_host}}  {status:<{w_status}}  {text_lines[0]}".rstrip())
            lines += [pad + extra for extra in text_lines[1:]]
            if fix:
                fix_lines = fix.splitlines()
                lines.append(f"{pad}fix: {fix_lines[0]}")
                lines += [pad + "     " + extra for extra in fix_lines[1:]]
        for w in self.warnings:
            lines.append(f"warning: {w}")
        return "\n".join(lines)


def _summary(f: HostFacts) -> str:
    parts = []
    if f.hostname:
        parts.append(f.hostname)
    if f.ncpus is not None:
        parts.append(f"{f.ncpus} cpus")
    if f.devices is not None:
        parts.append(f"{f.devices} devices")
    parts.append(f"{f.elapsed_s:.2f} s")
    return ", ".join(parts)


def _master_run(connections, host: str, command: str, opts: SshOptions) -> tuple[Optional[str], str]:
    """Run the probe with OpenSSH as the host's master connection: (stdout, stderr), or (None, stderr)
    when ssh itself failed (exit 255 without the probe's end marker). A connect timeout is raised as
    one, so the host is not waited for twice. After the probe, the session's shell becomes the job's
    agent (sshmux.SESSION_AGENT: the sweep, mpirun's daemon) and this ssh is kept (connections.adopt)."""
    proc = subprocess.Popen(
        connections.master_argv(host, command),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )  # Ctrl-C is the launcher's to handle
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    marker = (probe.END + "\n").encode()
    data = read_until(proc.stdout.fileno(), marker, time.monotonic() + PROBE_TIMEOUT + 3 * opts.timeout)
    if marker in data:
        connections.adopt(host, proc)
        return data.decode("utf-8", "replace"), ""
    if proc.poll() is None:
        try:
            proc.wait(0.5)  # ended its output without the marker: let it exit
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            proc.stdin.close()
            proc.stdout.close()
            proc.stderr.close()
            raise subprocess.TimeoutExpired(proc.args, PROBE_TIMEOUT) from None
    err_bytes = proc.stderr.read()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        pipe.close()
    out = data.decode("utf-8", "replace")
    err = err_bytes.decode("utf-8", "replace")
    if proc.returncode == 255 and probe.END not in out:
        low = err.lower()
        if "banner exchange" in low:  # connected, but no SSH greeting came ("timed out during banner exchange")
            import paramiko

            raise paramiko.SSHException("Error reading SSH protocol banner")
        if "connection timed out" in low or "operation timed out" in low:
            raise socket.timeout("timed out")
        return None, err
    return out, err


def hop_timeout(ssh_said: str) -> Optional[Exception]:
    """The exception the flat path would have met for a tree hop's ssh that timed out (its last error line),
    so it is classified the same way (sshfailures.py); None for any other failure. Pure."""
    low = ssh_said.lower()
    if "banner exchange" in low:  # connected, but no SSH greeting came (see _master_run)
        import paramiko

        return paramiko.SSHException("Error reading SSH protocol banner")
    if "connection timed out" in low or "operation timed out" in low:
        return socket.timeout("timed out")
    return None


def _local_run(command: str) -> tuple[str, str, int]:
    done = subprocess.run(["sh", "-c", command], stdin=subprocess.DEVNULL, capture_output=True, timeout=PROBE_TIMEOUT)
    return (done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace"), done.returncode)


# ---------------------------------------------------------------- judging one host


def _judge(
    facts: HostFacts,
    found: probe.ProbeResult,
    *,
    python: str,
    script: Optional[str],
    cwd: str,
    master_addr: str,
    master_port: Optional[int],
    master_ssh_port: int,
    is_master: bool,
    needed: int,
    where: str,
    modules: Optional[list[int]] = None,
) -> None:
    """Fill facts from the parsed probe (probe.facts_of, as every backend's facts) and set ok / reason / fix
    (the first problem wins)."""
    port_free = facts.port_free  # the master's, when a listener here answered it
    read = probe.facts_of(facts.host, found, script=script, cwd=cwd)
    for name in dataclasses.fields(HostFacts):
        if name.name not in ("host", "ok", "reason", "fix", "elapsed_s", "port_free"):
            setattr(facts, name.name, getattr(read, name.name))
    facts.port_free = (port_free if port_free is not None else found.port_free) if is_master else None

    problems: list[tuple[str, str]] = []
    if not found.complete:
        problems.append(
            (
                "the probe did not finish (is the login shell a POSIX shell?)",
                f"try it by hand: ssh {facts.host} 'sh -c true'",
            )
        )
    if facts.python_ok is False:
        path = found.python_path
        how = f"found at {path} but does not run" if path else "not found or not executable"
        problems.append(
            (
                f"python {python} {how} on {where}",
                "install Python at the same path on every host, or give --python with a path that exists everywhere",
            )
        )
    launcher = launcher_problem(
        found.gaudi_launch_ok, found.gaudi_launch_error, found.python_path or python, cwd, where
    )
    if launcher:
        problems.append(launcher)
    if found.cwd_ok is False:
        problems.append(
            (
                f"working directory {cwd} does not exist on {where}",
                "run from a directory that exists on every host (a shared filesystem), or create it there",
            )
        )
    elif script is not None and facts.script_ok is False:
        problems.append(
            (
                f"script {script} not found on {where} (cwd {cwd})",
                "copy the script to the same path on every host, or put it on a shared filesystem",
            )
        )
    if facts.devices is not None and needed and facts.devices < needed:
        extra = f"; {found.devices_error}" if found.devices_error else ""
        problems.append(
            (
                f"hl-smi sees {facts.devices} Gaudi device(s), {needed} needed{extra}",
                "lower slots= for this host in the hostfile (or --num_devices / --include), "
                "or check the devices with hl-smi",
            )
        )
    if facts.master_reachable is False:
        why = found.master_error or "connection failed"
        problems.append(
            (
                f"cannot reach the master {master_addr}:{master_ssh_port} from here ({why})",
                "check routing and firewalls between the hosts, or give --master_addr an address every host can reach",
            )
        )
    if is_master and master_port is not None and facts.port_free is False:
        why = found.port_error or "in use"
        problems.append(
            (
                f"master port {master_port} is busy on {where} ({why})",
                f"choose another --master_port, or stop what holds it (ss -ltnp 'sport = :{master_port}')",
            )
        )
    problems += _card_problems(facts.cards, modules or [], where)
    problems += scaleout_problems(facts.fabric) if facts.fabric else []
    if problems:
        facts.ok = False
        facts.reason = "; ".join(p[0] for p in problems)
        facts.fix = "\n".join(p[1] for p in problems)
    else:
        facts.ok = True


def launcher_problem(
    ok: Optional[bool], error: Optional[str], python: str, cwd: str, where: str
) -> Optional[tuple[str, str]]:
    """(reason, fix) when the workers' ``python`` on ``where`` cannot find gaudi_launch's worker with ``cwd``
    first on sys.path (probe: gaudi_launch_ok, the error it met): every rank starts as `python -m
    gaudi_launch.process.worker`, so none of them would start there. None when it can, or when that was not
    found out (the python did not run: said on its own). Pure."""
    if ok is not False:
        return None
    why = error or "not found"
    return (
        f"python {python} cannot import gaudi_launch on {where} (with {cwd} first on sys.path, as the ranks "
        f"have it): {why}",
        f"install it in that Python there ({python} -m pip install gaudi-launch=={__version__}, the launcher's "
        "version), or give --python an interpreter that has it on every host",
    )


def scaleout_problems(f: scaleout.HostFabric) -> list[tuple[str, str]]:
    """The scale-out facts that stop a job on this host (plan/scaleout.py): enabled Gaudi scale-out ports down
    (HCCL takes the Gaudi NICs anyway), scale-up ports down or flapping, no OFI wrapper for a host-NIC path,
    a gaudinet.json HCL cannot read."""
    out: list[tuple[str, str]] = []
    ports = scaleout.port_finding(f)
    if ports and ports[2]:
        out.append(ports[:2])
    out += scaleout.link_findings(f)
    wrapper = scaleout.wrapper_finding(f, scaleout.decide(f))
    if wrapper:
        out.append(wrapper)
    gaudinet = scaleout.gaudinet_problem(f)
    if gaudinet:
        out.append(gaudinet)
    return out


def _card_problems(host: Optional[cards.HostCards], modules: list[int], where: str) -> list[tuple[str, str]]:
    """A partial node Habana does not support, and wanted cards that another process holds ("Device acquire
    failed", synStatus 26/20 otherwise), from hl-smi's answers in the probe (inputs/cards.py). Pure."""
    if host is None or not host.cards or not modules:
        return []
    out = []
    problem = cards.partial_node_problem(modules, len(host.cards))
    if problem:
        out.append(
            (
                f"{problem} on {where}",
                "take 2 or 4 cards of one of those groups with --include HOST:0,1, or the whole node",
            )
        )
    held = cards.held_cards(modules, host, {})
    if held:
        pids = " ".join(dict.fromkeys(h.split("process ", 1)[1].split()[0] for h in held))
        out.append(
            (
                "; ".join(held) + f" on {where}: its ranks would fail with 'Device acquire failed'",
                f"wait for it or stop it (kill {pids}), or choose other cards with --include",
            ),
        )
    return out


def _versions_warning(what: str, by_host: dict[str, Optional[str]]) -> Optional[str]:
    groups: dict[str, list[str]] = {}
    for host, v in by_host.items():
        groups.setdefault(v or "not installed", []).append(host)
    if len(groups) < 2:
        return None
    return f"{what} differs across hosts: " + "; ".join(f"{v} on {', '.join(hs)}" for v, hs in groups.items())


# ---------------------------------------------------------------- check_hosts


def check_hosts(
    hosts: list[str],
    *,
    python: str,
    script: Optional[str],
    cwd: str,
    master_host: str,
    master_addr: str,
    master_port: Optional[int],
    devices_needed: dict[str, int],
    modules_needed: Optional[dict[str, list[int]]] = None,
    ssh: SshOptions,
    local: Callable[[str], bool],
    progress: Optional[Callable[[str, str], None]] = None,
    connections=None,
    tree=None,
    pythonpath: Optional[str] = None,
) -> CheckReport:
    """Probe every host in parallel (threads): over SSH (paramiko, keys only, never a prompt), or
    with ``sh -c`` for hosts where ``local(host)`` is true. See the module docstring.

    With ``connections`` (sshmux.Connections) the probe runs through the job's own ssh, whose
    connection stays open for the rest of the job; when that ssh fails before the probe ran,
    paramiko connects again to tell why (a failure costs a second attempt, a success nothing).

    With ``tree`` (called with the port the hosts check the master on, it gives treeprobe.TreeResult: the
    probe run through mpirun's daemon tree before the per-host checks) a host's answer is
    judged as it came; a host the tree's hop could not reach for a timeout is reported so, without a
    second wait; any other host (another failure, or not answered) is probed the flat way, which tells why.

    ``pythonpath``: the PYTHONPATH the job gives its ranks (after ``cwd``, where each host's python looks for
    gaudi_launch's worker, as the ranks will)."""
    quiet_paramiko()
    reader = SshConfig(ssh.config)  # each config file read once for every host
    targets: dict[str, Target] = {}

    def target(host: str) -> Target:
        """How ssh reaches ``host`` (inputs/sshconfig.py): only when paramiko connects, or to name a
        remote master's port."""
        if host not in targets:
            try:
                targets[host] = target_of(host, ssh, resolve([host], ssh, reader)[host])
            except (SshConfigError, RuntimeError) as exc:
                targets[host] = unresolved(host, ssh, f"cannot read the ssh config: {exc}")
        return targets[host]

    master_local = bool(local(master_host))

    # What the workers TCP-connect to for "master reachable": the master's sshd, or, when the master
    # is this machine (no sshd needed), a listener of ours: on the master port itself when it is free.
    listener: Optional[socket.socket] = None
    master_port_free: Optional[bool] = None
    if master_local:
        listener, master_port_free = _local_listener(master_port)
        master_probe_port = listener.getsockname()[1] if listener else (master_port or 22)
    else:
        master_probe_port = target(master_host).port

    def one(host: str) -> HostFacts:
        t0 = time.monotonic()
        facts = HostFacts(host=host, ok=False)
        is_master = host == master_host
        check_port = master_port if (is_master and not master_local) else None
        if is_master and master_local:
            facts.port_free = master_port_free
        cmd = probe.command(python, script, cwd, master_addr, master_probe_port, check_port, pythonpath=pythonpath)
        t: Optional[Target] = None
        try:
            if local(host):
                where = f"{host} (this machine)"
                if through_tree is not None and host in through_tree.outputs:  # its own first rank's (one pass)
                    out, err = through_tree.outputs[host], ""
                else:
                    out, err, _ = _local_run(cmd)
            else:
                where = host
                try:
                    out = None
                    if through_tree is not None and host in through_tree.outputs:  # answered through mpirun's tree
                        out, err = through_tree.outputs[host], ""
                        t0 -= through_tree.elapsed_s  # (its time is the tree's)
                    elif through_tree is not None and host in through_tree.failed:
                        hung = hop_timeout(through_tree.failed[host][1])
                        if hung is not None:  # said once, not waited for again
                            raise hung
                    if out is None and connections is not None:  # the job's own ssh, left open as its connection
                        out, err = _master_run(
                            connections,
                            host,
                            probe.command(
                                python,
                                script,
                                cwd,
                                master_addr,
                                master_probe_port,
                                check_port,
                                agent=SESSION_AGENT,
                                pythonpath=pythonpath,
                            ),
                            ssh,
                        )
                    if out is None:  # no connection, or ssh failed before the probe: paramiko says why
                        t = target(host)
                        if t.config_error:
                            facts.reason = t.config_error
                            facts.fix = "fix the ssh config (--ssh-config)"
                            return facts
                        if t.proxy_jump and not t.proxy_command:
                            facts.reason = f"ProxyJump {t.proxy_jump} (ssh config) is not supported by the pre-flight"
                            facts.fix = f"use ProxyCommand ssh -W %h:%p {t.proxy_jump} in the ssh config instead"
                            return facts
                        missing = [k for k in t.key_files if not os.path.isfile(k)]
                        if missing:
                            facts.reason = f"identity file {missing[0]} does not exist"
                            facts.fix = "give an existing private key with --ssh-identity"
                            return facts
                        out, err, _ = run_command(t, ssh, cmd, PROBE_TIMEOUT)
                except CommandFailed as exc:
                    facts.reason = str(exc)
                    facts.fix = (
                        "check the host by hand: ssh to it and run hl-smi, mpirun --version and "
                        f"{python} -c 'import sys' (one of them may hang)"
                    )
                    return facts
                except Exception as exc:  # classified below: every failure becomes a reason + fix
                    t = t or target(host)
                    o = dataclasses.replace(ssh, port=t.port, known_hosts=t.known_hosts, strict=t.strict)
                    facts.reason, facts.fix = classify_ssh_error(
                        exc, f"{t.user}@{t.hostname}", o, keys_description(t) or None
                    )
                    if t.hostname != t.name:
                        facts.reason += f" ({t.name} = {t.hostname} in the ssh config)"
                    return facts
            assert out is not None  # (every way above gave output or returned)
            found = probe.parse(out)
            _judge(
                facts,
                found,
                python=python,
                script=script,
                cwd=cwd,
                master_addr=master_addr,
                master_port=master_port,
                master_ssh_port=master_probe_port,
                is_master=is_master,
                needed=int(devices_needed.get(host, 0) or 0),
                modules=(modules_needed or {}).get(host),
                where=where,
            )
            if not found.complete and err.strip():
                facts.reason = (facts.reason or "") + f" (stderr: {err.strip().splitlines()[-1][:200]})"
            return facts
        except subprocess.TimeoutExpired:
            facts.reason = f"the probe did not finish within {PROBE_TIMEOUT:g} s"
            facts.fix = (
                "check this machine by hand: run hl-smi, mpirun --version and "
                f"{python} -c 'import sys' (one of them may hang)"
            )
            return facts
        except Exception as exc:  # never let one host take the whole check down
            facts.reason = f"pre-flight failed: {type(exc).__name__}: {exc}"
            facts.fix = "rerun with GAUDI_LAUNCH_DEBUG=1 and report it"
            return facts
        finally:
            facts.elapsed_s = time.monotonic() - t0

    def done(host: str, f: HostFacts) -> None:
        if progress is not None:
            progress(host, "OK" if f.ok else f"failed: {f.reason}")

    through_tree = None
    try:
        if tree is not None:  # every remote host's answer at once, before the per-host checks judge them
            through_tree = tree(master_probe_port)
        facts_by_host = per_host(hosts, one, on_done=done, name="preflight")
    finally:
        if listener is not None:
            listener.close()

    ordered = {h: facts_by_host[h] for h in hosts}
    return CheckReport(facts=ordered, warnings=_warnings(ordered))


def _local_listener(port: Optional[int]) -> tuple[Optional[socket.socket], Optional[bool]]:
    """A listening socket on this machine: on ``port`` when it is free (then True), else on any port."""
    free: Optional[bool] = None
    if port is not None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
            s.listen(128)
            return s, True
        except OSError:
            s.close()
            free = False
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("", 0))
        s.listen(128)
    except OSError:
        s.close()
        return None, free
    return s, free


def _warnings(facts: dict[str, HostFacts]) -> list[str]:
    probed = {h: f for h, f in facts.items() if f.hostname is not None or f.python_ok is not None}
    out = []
    w = _versions_warning("OpenMPI version", {h: f.openmpi for h, f in probed.items()})
    if w:
        out.append(w)
    w = _versions_warning("DeepSpeed version", {h: f.deepspeed for h, f in probed.items() if f.python_ok})
    if w:
        out.append(w)
    no_smi = [h for h, f in probed.items() if f.devices is None]
    if no_smi:
        out.append(f"device count not checked (no hl-smi) on {', '.join(no_smi)}")
    out += _port_warnings(probed)
    return out


def _port_warnings(facts: dict[str, HostFacts]) -> list[str]:
    """Every Gaudi scale-out port of a host down: HCCL falls back to a host NIC, slower. Pure."""
    out = []
    for host, f in facts.items():
        found = scaleout.port_finding(f.fabric) if f.fabric else None
        if found and not found[2]:
            out.append(f"{host}: {found[0]}: HCCL falls back to a host NIC (fix: {found[1]})")
    return out
