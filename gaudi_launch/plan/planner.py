"""JobSpec -> LaunchPlan. Reads the hostfile and env files and picks a port; starts nothing."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Callable, Optional, Protocol

from gaudi_launch.errors import UserError
from gaudi_launch.inputs import cards
from gaudi_launch.inputs.backend_options import (
    AUTO,
    AUTO_HOSTS,
    AUTO_IN_ALLOCATION,
    AUTO_ONE_HOST,
    BACKENDS,
    capabilities,
    check_backend,
)
from gaudi_launch.inputs.devices import DeviceCount, detect_local_devices
from gaudi_launch.inputs.hostfile import Host, read_hostfile
from gaudi_launch.inputs.hostnames import bare_host, is_local_host
from gaudi_launch.inputs.hostselect import select
from gaudi_launch.inputs.ports import check_port, pick_free_port
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan import gaudi, slurm
from gaudi_launch.plan.contract import node_visibility_env
from gaudi_launch.plan.hostfacts import HostFacts
from gaudi_launch.plan.launchplan import Command, LaunchPlan, layout
from gaudi_launch.plan.multinode import PreflightFailed, apply_facts, findings, host_settings, pick_remote_port
from gaudi_launch.plan.restarthosts import hosts_for_attempt
from gaudi_launch.plan.shared import device_settings, export_settings, fabric_settings, new_plan
from gaudi_launch.wire import HOST_CARDS, JOB_DIR_SUFFIX
from gaudi_launch.wire import path_for as jobdir_path


class BackendPlanning(Protocol):
    """A backend's planning half, as the planner uses it (backends/__init__.py's Backend has it): handed in
    by the composition root, so that planning imports no backend."""

    def detect(self, plan: LaunchPlan, environ: Mapping[str, str]) -> Optional[Mapping[str, HostFacts]]: ...

    def commands(self, plan: LaunchPlan, environ: Mapping[str, str]) -> list[Command]: ...


def resolve_hosts(
    spec: JobSpec, detect: Callable[[], DeviceCount] = detect_local_devices
) -> tuple[list[tuple[str, list[int]]], list[Host], list[str], dict[str, int]]:
    """The selected (host, device ids), the hostfile's hosts, notes for the dry run, and the spare
    hosts held back (host: devices it would run), which the pre-flight checks too."""
    notes: list[str] = []
    if spec.hostfile is not None:
        hosts = read_hostfile(spec.hostfile)
        num_devices = spec.num_devices
    else:
        found = detect()
        slots = spec.num_devices or found.count
        if not spec.num_devices:
            notes.append(f"no hostfile: this host only, {found.count} {found.kind} device(s) ({found.source})")
        hosts = [Host(name="localhost", slots=slots, line=0)]
        num_devices = None  # already applied as the slot count
    selected = select(
        hosts,
        include=spec.include or None,
        exclude=spec.exclude or None,
        num_nodes=spec.num_nodes,
        num_devices=num_devices,
    )
    spares: dict[str, int] = {}
    if spec.spare_hosts or spec.lost_hosts:
        chosen, note = hosts_for_attempt(selected, spec.lost_hosts, spec.spare_hosts, spec.min_nodes)
        if note:
            notes.append(note)
        running = {h for h, _ in chosen}
        spares = {h: len(d) for h, d in selected if h not in running and h not in spec.lost_hosts}
        selected = chosen
    return selected, hosts, notes, spares


def choose_backend(spec: JobSpec, selected, hosts: list[Host]) -> str:
    all_local = all(is_local_host(h) for h, _ in selected)
    if spec.backend == AUTO:
        return AUTO_ONE_HOST if len(selected) == 1 and all_local else AUTO_HOSTS
    if not capabilities(spec.backend).multi_host and not all_local:
        remote = next(h for h, _ in selected if not is_local_host(h))
        line = next((x.line for x in hosts if x.name == remote), 0)
        where = f"{spec.hostfile}:{line}" if spec.hostfile and line else "--backend"
        several = " or ".join(f"--backend {n}" for n, c in BACKENDS.items() if c.ssh_preflight)
        raise UserError(
            f"the {spec.backend} backend runs on this host only, but '{remote}' is another host",
            where=where,
            hint=f"use {several} for several hosts",
        )
    return spec.backend


def build_plan(
    spec: JobSpec,
    detect: Callable[[], DeviceCount] = detect_local_devices,
    environ: Optional[Mapping[str, str]] = None,
    preflight: Optional[Callable] = None,
    require_program: bool = True,
    keep_failed_preflight: bool = False,
    *,
    backends: Callable[[str], BackendPlanning],
) -> LaunchPlan:
    """``preflight(plan, spec) -> CheckReport`` runs for multi-host backends unless --no-ssh-check;
    ``backends(name)`` is the backend's planning half (``gaudi_launch.backends.get_backend``).

    A failed pre-flight raises PreflightFailed, unless ``keep_failed_preflight`` (a dry run): the
    plan is then completed with what the hosts that answered told, and carries the findings.
    """
    environ = os.environ if environ is None else environ
    spec.validate(require_program)
    if slurm.wanted(spec, environ):  # the allocation (or srun's) is the hostfile: no ssh, no pre-flight
        name = AUTO_IN_ALLOCATION if spec.backend == AUTO else spec.backend
        check_backend(spec.backend_options, name, auto=spec.backend == AUTO)
        plan = slurm.draft(spec, environ)
        # srun --export=ALL: every rank inherits the launcher's whole environment
        return assemble(plan, spec, environ, backends(name), parents=[dict(environ)] * len(plan.nodes))
    selected, hosts, notes, spares = resolve_hosts(spec, detect)
    backend = choose_backend(spec, selected, hosts)
    check_backend(spec.backend_options, backend, auto=spec.backend == AUTO)  # (--backend NAME: validate's)
    caps = capabilities(backend)
    if spec.master_addr:
        master_addr = spec.master_addr
    elif not caps.multi_host:
        master_addr = "127.0.0.1"
    else:
        master_addr = bare_host(selected[0][0])
    master_local = is_local_host(master_addr)
    if spec.master_port is not None:
        if master_local:
            check_port(spec.master_port)
        master_port = spec.master_port
    elif master_local:
        master_port = pick_free_port()
    else:
        master_port = pick_remote_port()
    plan = new_plan(backend, layout(selected), master_addr, master_port, spec, environ, notes, spares)
    report = None
    if caps.ssh_preflight and spec.ssh_check and preflight is not None:
        report = preflight(plan, spec)
        if not report.ok and not keep_failed_preflight:
            raise PreflightFailed(report)
        plan.preflight = findings(report)
        plan.notes.extend(report.warnings)
    return assemble(plan, spec, environ, backends(backend), facts=report.facts if report is not None else None)


def assemble(
    plan: LaunchPlan,
    spec: JobSpec,
    environ: Mapping[str, str],
    backend: BackendPlanning,
    *,
    facts: Optional[Mapping[str, HostFacts]] = None,
    parents: Optional[list[dict]] = None,
) -> LaunchPlan:
    """The parts every backend's plan shares, once its hosts are known (plan/shared.py): the exported names
    and secrets, the backend's one look while planning, the hosts' facts, the fabric, each node's device subset,
    the Gaudi settings, then the backend's commands and the request it was made from.

    ``facts``: each host's HostFacts (plan/hostfacts.py) from the SSH pre-flight; without them, those the
    backend's look returned (local: the probe run here; slurm: the probe through srun). Whichever collected
    them, the plan is made from them alone. ``parents``: what the ranks on each node inherit (default:
    inherited_env)."""
    export_settings(plan, spec, environ)
    plan.spec = spec
    found = backend.detect(plan, environ)
    facts = dict(facts if facts is not None else found or {})
    every_host = bool(facts) and all(n.host in facts for n in plan.nodes)
    host_settings(plan, spec, facts_of_every_host=every_host)
    if every_host and capabilities(plan.backend).multi_host:  # job-wide choices need every host's facts
        apply_facts(plan, facts, environ)
    fabric_settings(plan, spec, environ, facts=facts)
    device_settings(
        plan, parents if parents is not None else [inherited_env(plan, n.host, environ) for n in plan.nodes]
    )
    gaudi_settings(plan, spec, environ, facts)
    plan.commands = backend.commands(plan, environ)
    plan.request = spec.as_request(os.getcwd())
    return plan


def inherited_env(plan: LaunchPlan, host: str, environ: Mapping[str, str]) -> dict:
    """What a rank on ``host`` inherits: the job's variables, and the launcher's own here or, on
    another host, the part of it that is exported there. Pure."""
    if is_local_host(host):
        return {**environ, **plan.env}
    return {**{k: environ[k] for k in plan.exported if k in environ}, **plan.env}


def gaudi_settings(
    plan: LaunchPlan, spec: JobSpec, environ: Mapping[str, str], facts: Optional[Mapping[str, HostFacts]] = None
) -> LaunchPlan:
    """--cpu-bind into the ranks' environment, a partial node refused where nothing else judged it (the
    pre-flight judges its hosts'), and what the ranks will do about binding, the recipe cache and lazy mode in
    the plan's notes (plan/gaudi.py), from each host's cards in its facts; those cards, by hostname, in the ranks'
    environment (HOST_CARDS), so that a rank binds without running hl-smi again."""
    plan.env.update(gaudi.cpu_bind_env(spec.cpu_bind))
    facts = facts or {}
    local = [n for n in plan.nodes if is_local_host(n.host)]
    lines: list[str] = []
    for node in plan.nodes:
        found = facts[node.host].cards if node.host in facts else None
        if found is None or not found.cards:
            continue
        modules = _node_modules(plan, node, environ)
        problem = cards.partial_node_problem(modules, len(found.cards))
        if problem and plan.preflight is None:  # (a pre-flight judged its hosts' cards itself)
            raise UserError(
                f"{node.host}: {problem}",
                where="--include" if spec.include else "--exclude" if spec.exclude else "--num_devices",
                hint="take 2 or 4 cards from one of those groups (e.g. --include host:0,1), or the whole node",
            )
        lines += gaudi.binding_lines(node.host, modules, found)
    carried = None
    if spec.cpu_bind != "none":  # each rank binds from its host's cards as found here, not from hl-smi again
        carried = gaudi.carry_cards(
            [(facts[n.host].hostname, facts[n.host].cards) for n in plan.nodes if n.host in facts]
        )
    if carried is not None and len(carried) <= gaudi.CARRY_LIMIT:
        plan.env[HOST_CARDS] = carried
    job_env = {**environ, **plan.env}
    tmp_dir = jobdir_path(plan.job_id, suffix=plan.env.get(JOB_DIR_SUFFIX, ""))  # the ranks' (worker._job_dir_path)
    version = gaudi.stack_version()
    if not any(f.cards and f.cards.cards for f in facts.values()) and version is None and len(local) == len(plan.nodes):
        return plan  # this machine alone, and no Gaudi here: nothing of this applies
    plan.notes.extend(
        gaudi.plan_notes(
            cpu_bind=spec.cpu_bind,
            local_binding=lines,
            recipe=gaudi.recipe_cache_setting(job_env, tmp_dir, _network_fs(os.path.dirname(tmp_dir)), version),
            mode=gaudi.execution_mode(job_env, spec.program[1:], version),
        )
    )
    if HOST_CARDS in plan.env:
        plan.notes.append(
            f"CPU binding: the cards the probe read on each host go to its ranks ({HOST_CARDS}): a rank runs "
            "hl-smi for its binding only on a host without them"
        )
    elif carried is not None:
        plan.notes.append(
            f"CPU binding: the hosts' cards ({len(carried)} bytes) are too many to carry to the ranks (over "
            f"{gaudi.CARRY_LIMIT}): each rank runs hl-smi for its binding"
        )
    return plan


def _node_modules(plan: LaunchPlan, node, environ: Mapping[str, str]) -> list[int]:
    """The module id of each local rank's card on ``node``: its slots through the HABANA_VISIBLE_MODULES its
    ranks inherit ("Gaudi-to-process Assignment"). Pure."""
    parent = inherited_env(plan, node.host, environ)
    visible = node_visibility_env(node, parent).get("HABANA_VISIBLE_MODULES") or parent.get("HABANA_VISIBLE_MODULES")
    return cards.rank_modules(len(node.ranks), visible)


def _network_fs(path: str) -> bool:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            return gaudi.fs_type(os.path.realpath(path), f.read()) in gaudi.NETWORK_FS
    except OSError:
        return False
