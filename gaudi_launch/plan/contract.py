"""What a rank sees beyond RANK/WORLD_SIZE: torchrun's elastic variables and device visibility.

Shared by the planner (the local backend sets each rank's environment itself) and the rank
bootstrap (gaudi_launch.process.worker, for ranks that mpirun or DeepSpeed start). Pure, stdlib only:
the worker imports this before the user's script.
"""

from __future__ import annotations

import json
from collections import ChainMap
from collections.abc import Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Optional, cast

from gaudi_launch.wire import (
    JOB_ID,
    MAX_RESTARTS_VAR,
    NO_PYTHON_FLAG,
    NODE_DEVICES,
    NODE_SIZES,
    RESTART_COUNT,
    node_var,
)

if TYPE_CHECKING:  # types only: the rank bootstrap imports this module, and nothing heavier
    from gaudi_launch.inputs.spec import JobSpec
    from gaudi_launch.plan.launchplan import LaunchPlan, NodePlan

VISIBILITY = ("HABANA_VISIBLE_MODULES", "CUDA_VISIBLE_DEVICES")
# torchrun's layout of a rank and the worker set made with it (elastic_env): what only the rank knows under a
# launcher that starts many ranks with one command (mpirun's, srun's, DeepSpeed's own variables).
LAYOUT = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "LOCAL_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "CROSS_RANK",
    "CROSS_SIZE",
)
ELASTIC = (
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)


def visible_subset(parent: Optional[str], slots: Sequence[int]) -> str:
    """Slots index what the rank would otherwise see: '4,5,6,7' and [1, 3] -> '5,7'.

    Without a restriction (or past its end) a slot is the device of that number. Pure.
    """
    ids = [d.strip() for d in (parent or "").split(",") if d.strip()]
    return ",".join(ids[s] if s < len(ids) else str(s) for s in slots)


def node_device_env(node_slots: Sequence[Sequence[int]], parents: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """The variables that carry each node's device subset to ranks a single command starts.

    ``parents[i]`` is the environment node i's ranks would inherit (the launcher's own on this
    host, the exported part of it elsewhere): the worker sets exactly these ids, whatever the
    backend in between did to the visibility variables (DeepSpeed's launch.py rewrites them).
    """
    env = {NODE_DEVICES: ";".join(",".join(map(str, s)) for s in node_slots)}
    for name in VISIBILITY:
        if any(p.get(name, "").strip() for p in parents):
            env[node_var(name)] = ";".join(visible_subset(p.get(name), s) for s, p in zip(node_slots, parents))
    return env


def _node_part(value: str, node_rank: Optional[str]) -> Optional[str]:
    """'0,1;1,3' and node 1 -> '1,3' (None when nothing applies)."""
    parts = value.split(";") if value else []
    if node_rank is None or not node_rank.isdigit() or int(node_rank) >= len(parts):
        return None
    return parts[int(node_rank)] or None


def node_visibility(env: Mapping[str, str], node_rank: Optional[str]) -> dict[str, str]:
    """HABANA_VISIBLE_MODULES and CUDA_VISIBLE_DEVICES for this node's selected devices."""
    slots = _node_part(env.get(NODE_DEVICES, ""), node_rank)
    if slots is None:
        return {}
    return {name: _node_part(env.get(node_var(name), ""), node_rank) or slots for name in VISIBILITY}


# Ranks per node, '1,2', when nodes differ: DeepSpeed's launch.py gives LOCAL_RANK as
# RANK % (ranks on the node), which is not the rank's place on its node then.


def node_sizes_env(sizes: list[int]) -> dict[str, str]:
    """What the deepspeed backend passes for uneven nodes (nothing for even ones). Pure."""
    return {NODE_SIZES: ",".join(map(str, sizes))} if len(set(sizes)) > 1 else {}


def node_of_rank(env: Mapping[str, str]) -> Optional[str]:
    """The node of RANK from NODE_SIZES (ranks numbered node by node, as every backend plans them); None
    without them. Pure."""
    sizes = [int(x) for x in env.get(NODE_SIZES, "").split(",") if x.strip().isdigit()]
    if not sizes or not env.get("RANK", "").isdigit():
        return None
    rank = int(env["RANK"])
    for node, size in enumerate(sizes):
        if rank < size:
            return str(node)
        rank -= size
    return None


def node_layout(env: Mapping[str, str]) -> dict[str, str]:
    """LOCAL_RANK and LOCAL_WORLD_SIZE from RANK, the node rank and NODE_SIZES; {} without them. Pure."""
    node = next((env[k] for k in ("NODE_RANK", "GROUP_RANK", "CROSS_RANK") if env.get(k, "").isdigit()), None)
    sizes = [int(x) for x in env.get(NODE_SIZES, "").split(",") if x.strip().isdigit()]
    if node is None or int(node) >= len(sizes) or not env.get("RANK", "").isdigit():
        return {}
    local = int(env["RANK"]) - sum(sizes[: int(node)])
    if not 0 <= local < sizes[int(node)]:
        return {}
    return {"LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(sizes[int(node)])}


def elastic_env(layout: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """torchrun's other worker variables (one role), from the rank's layout.

    ``layout`` has RANK, WORLD_SIZE and CROSS_SIZE (nodes); TORCHELASTIC_RUN_ID is the job id, so
    torch.distributed.is_torchelastic_launched() is true as under torchrun. Not
    TORCHELASTIC_USE_AGENT_STORE: there is no agent store, init_process_group makes its own.
    """
    if not environ.get(JOB_ID) or "RANK" not in layout or "WORLD_SIZE" not in layout:
        return {}
    env = {
        "ROLE_RANK": layout["RANK"],
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": layout["WORLD_SIZE"],
        "TORCHELASTIC_RUN_ID": environ[JOB_ID],
        # --max-restarts: the launcher's count of this attempt (restarts.py), under torchrun's names
        "TORCHELASTIC_RESTART_COUNT": environ.get(RESTART_COUNT) or "0",
        "TORCHELASTIC_MAX_RESTARTS": environ.get(MAX_RESTARTS_VAR) or "0",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
    if layout.get("CROSS_SIZE"):
        env["GROUP_WORLD_SIZE"] = layout["CROSS_SIZE"]
    return env


def read_error_file(path: Optional[str]) -> Optional[dict]:
    """The message and traceback torch's @record wrote (torchrun's error file), if it did."""
    try:
        with open(path or "", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, str):
        return {"message": message, "traceback": None}
    if not isinstance(message, dict):
        return None
    extra = message.get("extraInfo")
    if not isinstance(extra, dict):
        extra = {}
    return {"message": str(message.get("message", "")), "traceback": extra.get("py_callstack")}


def node_visibility_env(node: NodePlan, inherited: Optional[Mapping[str, str]] = None) -> dict:
    """HABANA_VISIBLE_MODULES/CUDA_VISIBLE_DEVICES for a node's ranks when the user picked devices
    (--include host:1,3): only those, LOCAL_RANK indexes them. Empty for whole nodes. Pure."""
    if node.devices == list(range(len(node.devices))):
        return {}
    return {name: visible_subset((inherited or {}).get(name), node.devices) for name in VISIBILITY}


def rank_contract(
    plan: LaunchPlan,
    node: NodePlan,
    local_rank: int,
    inherited: Optional[Mapping[str, str]] = None,
    node_env: Optional[Mapping[str, str]] = None,
) -> dict:
    """torchrun's worker environment (with DeepSpeed's aliases) for one rank. Pure.

    ``inherited`` is what the rank would see otherwise (the launcher's environment and the job's):
    device ids then index the devices that restricts it to. ``node_env``: node_visibility_env,
    computed once per node by a caller that plans many ranks (per rank it is linear in the node's
    devices, and planning became quadratic in ranks).
    """
    layout: dict[str, object] = {
        "RANK": node.ranks[local_rank],
        "LOCAL_RANK": local_rank,
        "WORLD_SIZE": plan.world_size,
        "LOCAL_WORLD_SIZE": len(node.ranks),
        "LOCAL_SIZE": len(node.ranks),
        "NODE_RANK": node.node_rank,
        "GROUP_RANK": node.node_rank,
        "CROSS_RANK": node.node_rank,
        "CROSS_SIZE": len(plan.nodes),
        "MASTER_ADDR": plan.master_addr,
        "MASTER_PORT": plan.master_port,
        JOB_ID: plan.job_id,
    }
    layout.update(node_visibility_env(node, inherited) if node_env is None else node_env)
    contract = {k: str(v) for k, v in layout.items()}
    # A ChainMap, not a merged copy of the whole environment for every rank (only read: the cast is
    # for ChainMap's stub, which asks for mutable maps).
    environ = ChainMap(contract, cast(MutableMapping[str, str], inherited or {}))
    return {**contract, **elastic_env(contract, environ)}


def worker_argv(spec: JobSpec, python: Optional[str] = None) -> list[str]:
    """How one rank starts the user's program: through our bootstrap, which a --no_python executable
    goes through too (it then runs as the bootstrap's child, inside the rank's process group, so the
    group's teardown and the launcher watch cover it as they cover a Python rank)."""
    head = [python or spec.python, "-u", "-m", "gaudi_launch.process.worker"]
    return head + (["-m"] if spec.module else [NO_PYTHON_FLAG] if spec.no_python else []) + list(spec.program)
