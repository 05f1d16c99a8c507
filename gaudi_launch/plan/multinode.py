"""What a multi-node plan adds: SSH options, the pre-flight's findings, the interface pick, EFA/HCCL env.

Decisions are pure functions of the spec, the launcher's environment and the pre-flight's facts; the
pre-flight itself runs in remote/hostchecks.py, handed to the planner by the composition root.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Mapping
from typing import Optional

from gaudi_launch.errors import UserError
from gaudi_launch.exitcodes import ExitCode
from gaudi_launch.inputs.backend_options import capabilities
from gaudi_launch.inputs.hostnames import is_local_host
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.inputs.sshconfig import SshConfig, SshConfigError, host_key_policy
from gaudi_launch.plan import fabric, scaleout
from gaudi_launch.plan.hostfacts import HostFacts
from gaudi_launch.plan.launchplan import LaunchPlan


class PreflightFailed(UserError):
    exit_code = ExitCode.PREFLIGHT

    def __init__(self, report):
        super().__init__(
            "pre-flight failed: nothing was started\n" + report.render_table().rstrip(),
            hint="fix the hosts marked failed, or skip the SSH checks with --no-ssh-check",
        )
        self.report = report


def findings(report) -> dict:
    """The pre-flight's report as plain data for the plan (JSON and the dry run's text). Pure."""
    return {
        "ok": report.ok,
        "hosts": [{"host": f.host, "ok": f.ok, "reason": f.reason, "fix": f.fix} for f in report.facts.values()],
        "warnings": list(report.warnings),
        "table": report.render_table(),
    }


def ssh_args(spec: JobSpec, configured_host_keys: Optional[str] = None) -> list[str]:
    """Options for every `ssh` a backend runs (mpirun's plm_rsh_args, pdsh, teardown). Pure but for
    the working directory that relative paths are resolved against.

    An -o option beats ssh_config, so StrictHostKeyChecking is given only where the user's
    config does not decide (``configured_host_keys``: its value for the job's hosts, if any):
    --strict-host-keys means yes for every ssh; otherwise the default is accept-new. Agent
    forwarding is always off: a user's ForwardAgent yes would hand the agent to every host.
    """
    args = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(spec.ssh_timeout))}", "-o", "ForwardAgent=no"]
    if spec.strict_host_keys:
        args += ["-o", "StrictHostKeyChecking=yes"]
    elif not configured_host_keys:
        args += ["-o", "StrictHostKeyChecking=accept-new"]
    if spec.ssh_port:
        args += ["-p", str(spec.ssh_port)]
    # Absolute paths: DeepSpeed's runner, and so pdsh's ssh, runs in the job directory, where a
    # relative path names nothing (resolved against the launcher's working directory, as typed).
    if spec.ssh_identity:
        args += ["-i", os.path.abspath(os.path.expanduser(spec.ssh_identity)), "-o", "IdentitiesOnly=yes"]
    if spec.ssh_config:
        args += ["-F", os.path.abspath(os.path.expanduser(spec.ssh_config))]
    return args


def configured_host_keys(hosts: list[str], config_path: Optional[str]) -> Optional[str]:
    """StrictHostKeyChecking as the ssh config files that ssh reads set it for any of ``hosts`` (the one
    reader, inputs/sshconfig.py: Include followed, user config then system config); "unknown" when only
    ssh can evaluate it (then no -o overrides it)."""
    try:
        return host_key_policy(SshConfig(config_path), hosts)
    except SshConfigError:
        return "unknown"  # ssh itself will refuse the file; the pre-flight says why


def master_host(plan: LaunchPlan) -> str:
    """The selected host that is the master (the first one unless --master_addr names another)."""
    for node in plan.nodes:
        if node.host.rsplit("@", 1)[-1] == plan.master_addr:
            return node.host
    return plan.nodes[0].host


def pick_remote_port() -> int:
    # The pre-flight then checks on the master that nothing listens there.
    return random.randint(20000, 40000)


def resolve_ip(addr: str) -> Optional[str]:
    try:
        return str(socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)[0][4][0])
    except (socket.gaierror, IndexError, UnicodeError):
        return None


def visible_modules(plan: LaunchPlan, host: str) -> Optional[str]:
    """HABANA_VISIBLE_MODULES as the ranks on ``host`` inherit it: the job's, else this shell's (here, or
    exported there). Pure but for the environment read."""
    inherited = os.environ if is_local_host(host) or "HABANA_VISIBLE_MODULES" in plan.exported else {}
    return plan.env.get("HABANA_VISIBLE_MODULES") or inherited.get("HABANA_VISIBLE_MODULES")


def apply_facts(plan: LaunchPlan, facts: Mapping[str, HostFacts], environ: Mapping[str, str]) -> None:
    """Interface, its network and the CPU budget from each host's facts (whoever read them: the pre-flight, the
    probe through srun). The master's address as this machine resolves it, else as the master host does (a
    login node may not know the compute nodes' names)."""
    cpus = [f.ncpus for f in facts.values() if f.ncpus]
    plan.cores_per_host = min(cpus) if cpus else None
    interfaces = {h: fabric.parse_ip_addr(f.ip_addr) for h, f in facts.items() if f.ip_addr}
    master_ip = resolve_ip(plan.master_addr) or _master_sees(plan, facts)
    user_pick = {**environ, **plan.env}.get("HCCL_SOCKET_IFNAME")
    if user_pick:
        plan.ifname = user_pick
        plan.notes.append(f"interface {user_pick}: HCCL_SOCKET_IFNAME as you set it")
    elif interfaces and not master_ip:
        plan.notes.append(
            f"interface: {plan.master_addr} does not resolve here nor on {master_host(plan)}: left to defaults"
        )
    elif interfaces and master_ip:
        plan.ifname, how = fabric.choose_interface(master_ip, interfaces)
        plan.notes.append(
            f"interface {plan.ifname}: "
            + (
                f"carries the master's subnet ({master_ip}) on every host"
                if how == "subnet"
                else "no host has an address on the master's subnet: first common interface (fallback)"
            )
        )
    if plan.ifname and master_ip:
        mine = interfaces.get(master_host(plan), [])
        plan.tcp_cidr = fabric.subnet_cidr(master_ip, mine, plan.ifname)


def _master_sees(plan: LaunchPlan, facts: Mapping[str, HostFacts]) -> Optional[str]:
    """The master's address as the master host's probe resolved it, unless a loopback one (a host's own name
    in its /etc/hosts as 127.0.1.1). Pure."""
    found = facts.get(master_host(plan))
    ip = found.master_ip if found is not None else None
    return ip if ip and not ip.startswith(("127.", "::1")) else None


def host_settings(plan: LaunchPlan, spec: JobSpec, *, facts_of_every_host: bool) -> None:
    """What reaching hosts over ssh adds to a plan: the ssh options, and notes saying what is left to defaults
    without every host's facts (the pre-flight's, or this machine's when it is every host; the planner plans
    from them as from any backend's). Nothing for a backend that reaches no host over ssh."""
    if not capabilities(plan.backend).ssh_preflight:
        return
    plan.ssh_args = ssh_args(spec, configured_host_keys([n.host for n in plan.nodes], spec.ssh_config))
    if not facts_of_every_host:
        plan.notes.append("no pre-flight (--no-ssh-check): interface and CPU binding are left to defaults")
        if "StrictHostKeyChecking=accept-new" in plan.ssh_args:
            plan.notes.append(
                "host keys: ssh accepts and remembers the key of a host it has not seen "
                "(accept-new); --strict-host-keys, or StrictHostKeyChecking yes in your ssh "
                "config, refuses it"
            )


def scaleout_paths(facts: Mapping[str, HostFacts], efa: Optional[bool]) -> dict[str, scaleout.ScaleOutPath]:
    """Each probed host's scale-out path (--efa / --no-efa override its EFA devices). Pure."""
    return {h: scaleout.decide(f.fabric, efa) for h, f in facts.items() if f.fabric is not None}


def apply_scaleout(
    plan: LaunchPlan, paths: Mapping[str, scaleout.ScaleOutPath], environ: Mapping[str, str], wrapper: Optional[str]
) -> None:
    """The variables the hosts' paths need (none that you set yourself), the paths in the plan, and notes."""
    env, ofi, efa_libs, warnings = scaleout.combine(paths)
    plan.scaleout = {h: p.as_dict() for h, p in paths.items()}
    base = {**environ, **plan.env}
    if ofi:
        env.update(fabric.efa_env(base, wrapper))
    elif efa_libs:
        env.update(fabric.efa_libs_env(base, wrapper))
    dirs = scaleout.lib_dirs(paths)  # where each host's probe found the OFI wrapper HCCL dlopens
    if dirs:
        env["LD_LIBRARY_PATH"] = fabric.with_lib_dirs(
            env.get("LD_LIBRARY_PATH") or base.get("LD_LIBRARY_PATH", ""), dirs
        )
    plan.env.update({k: v for k, v in env.items() if k == "LD_LIBRARY_PATH" or not base.get(k)})
    if base.get("HCCL_OVER_OFI") and not ofi:
        plan.notes.append(
            f"scale-out: HCCL_OVER_OFI={base['HCCL_OVER_OFI']} as you set it forces the host NIC through host memory "
            f"(P2) on every host, slower than the path below on Gaudi 2 and 3 ({scaleout.SCALE_OUT_PAGE})"
        )
    for host, p in paths.items():
        plan.notes.append(f"scale-out {host}: {p.shown}: {p.why}")
    plan.notes += [f"scale-out: {w}" for w in warnings]
