"""What every backend's plan shares, whatever started the ranks: the job's variables (env files, then -x),
the names exported to other hosts and the secrets to mask, the fabric's variables, and each node's device
subset. The planner puts them together (planner.assemble); each backend adds only its own half."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Optional

from gaudi_launch.inputs.backend_options import capabilities
from gaudi_launch.inputs.envfile import load_env_files, secrets_in
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan import fabric
from gaudi_launch.plan.contract import node_device_env
from gaudi_launch.plan.hostfacts import HostFacts
from gaudi_launch.plan.launchplan import LaunchPlan, NodePlan
from gaudi_launch.plan.multinode import apply_scaleout, scaleout_paths
from gaudi_launch.wire import JOB_DIR_SUFFIX

# The note naming the env files read: a dry run shows it with the others, a real run prints it (backends/job.py).
ENV_FILES_NOTE = "environment files read: "


def job_env(spec: JobSpec, environ: Mapping[str, str], notes: list[str]) -> dict[str, str]:
    """The job's variables: the env files' (.deepspeed_env, --env-file), then -x's; a note names the files read."""
    env, sources = load_env_files(explicit=spec.env_file, environ=environ)
    env.update(spec.env)
    if sources:
        notes.append(ENV_FILES_NOTE + ", ".join(sources))
    return env


def new_plan(
    backend: str,
    nodes: list[NodePlan],
    master_addr: str,
    master_port: int,
    spec: JobSpec,
    environ: Mapping[str, str],
    notes: list[str],
    spares: Optional[dict[str, int]] = None,
) -> LaunchPlan:
    """A plan's first draft, once its nodes and master are known (every backend's, before planner.assemble):
    the job's variables, a fresh job id, and the random suffix of its ranks' job directories (wire.JOB_DIR_SUFFIX:
    a job variable, so it reaches every rank as the job's values do and is never on argv)."""
    return LaunchPlan(
        backend=backend,
        world_size=sum(len(n.ranks) for n in nodes),
        master_addr=master_addr,
        master_port=master_port,
        nodes=nodes,
        env={**job_env(spec, environ, notes), JOB_DIR_SUFFIX: os.urandom(8).hex()},
        commands=[],
        program=list(spec.program),
        notes=notes,
        job_id=os.urandom(4).hex(),  # as secrets.token_hex, without loading OpenSSL (hmac)
        spares=spares if spares is not None else {},
    )


def export_settings(plan: LaunchPlan, spec: JobSpec, environ: Mapping[str, str]) -> None:
    """The launcher's variables the ranks on other hosts get (--export prefixes; srun takes them all),
    and every secret-looking one, masked in all output whether exported or inherited."""
    plan.exported_secrets = secrets_in(environ)
    if capabilities(plan.backend).multi_host:
        plan.exported = [n for n in fabric.exported_names(environ, spec.export_prefixes) if n not in plan.env]


def fabric_settings(
    plan: LaunchPlan, spec: JobSpec, environ: Mapping[str, str], *, facts: Optional[Mapping[str, HostFacts]] = None
) -> None:
    """The fabric's variables: each host's scale-out path from its facts when every host of a multi-host plan
    has them (the pre-flight's, or Slurm's probe through srun), else EFA as --efa/--no-efa say or as this
    host's devices show."""
    multi_host = capabilities(plan.backend).multi_host
    facts = facts or {}
    known = all(n.host in facts and not facts[n.host].one_host for n in plan.nodes)
    paths = scaleout_paths(facts, spec.efa) if facts and known and multi_host else {}
    efa = False  # with the hosts' facts, the recipe, where a host needs it, is set by apply_scaleout
    if paths:  # decided per host from what each host's probe found (plan/scaleout.py)
        apply_scaleout(plan, paths, environ, spec.hccl_ofi_wrapper)
    else:  # no per-host facts: HCCL_OVER_OFI only for first-generation Gaudi (plan/fabric.py), from this machine's
        here = next((f.fabric for f in facts.values() if f.one_host and f.fabric is not None), None)  # its probe
        if here is not None:  # (its RDMA devices in sysfs and hl-smi's card name, as efa_present/local_generation)
            efa_here = here.efa if spec.efa is None else False
            gen = here.generation if spec.efa or efa_here else None
        else:
            efa_here = fabric.efa_present() if spec.efa is None else False
            gen = fabric.local_generation() if spec.efa or efa_here else None
        efa, note = fabric.ofi_recipe_without_facts(spec.efa, efa_here, gen)
        if note and (efa or multi_host):
            plan.notes.append(note)
    plan.env.update(
        fabric.fabric_env({**environ, **plan.env}, efa=efa, ifname=plan.ifname, wrapper_dir=spec.hccl_ofi_wrapper)
    )


def device_settings(plan: LaunchPlan, parents: Sequence[Mapping[str, str]]) -> None:
    """Each node's device subset in job variables, when one command starts every node (not the local
    backend's way), mapped onto the visibility its ranks inherit (``parents``, one per node): a selected index is
    the same device whatever the backend."""
    subset = any(n.devices != list(range(len(n.devices))) for n in plan.nodes)
    caps = capabilities(plan.backend)
    # DeepSpeed's launch.py sets CUDA_VISIBLE_DEVICES to slot numbers even for whole hosts.
    rewritten = caps.rewrites_visibility and any(p.get("CUDA_VISIBLE_DEVICES", "").strip() for p in parents)
    if caps.one_command and (subset or rewritten):
        plan.env.update(node_device_env([n.devices for n in plan.nodes], list(parents)))
