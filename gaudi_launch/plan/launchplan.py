"""The launch plan: plain data saying exactly what will run where, and how it is shown.

A plan is built without side effects on the job (see planner.py), printed by ``--dry-run`` and
executed by a backend. Secrets are masked in everything rendered here.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Optional

from gaudi_launch.inputs.envfile import is_secret, mask_env, mask_text, straddling
from gaudi_launch.inputs.idranges import id_ranges
from gaudi_launch.plan.contract import ELASTIC, LAYOUT, VISIBILITY
from gaudi_launch.plan.gaudi import RECIPE_VAR
from gaudi_launch.scriptflags import BF16_OPS_VAR, FP32_OPS_VAR, INT64_VAR, LAZY_VAR

if TYPE_CHECKING:
    from gaudi_launch.inputs.spec import JobSpec


# Who sets a variable (docs/architecture.md, "The plan sets, the rank sets"): the plan sets every variable it
# can know from the request, the launcher's environment and the hosts' facts (--dry-run --json shows each); a
# rank sets at its start only these, each from its own place in the job or its host's state when it starts,
# and never one you set yourself. The plan lists them ("set_by_rank"); tests/integration/test_set_by_rank.py
# runs the bootstrap as each backend starts it and finds it sets no other name.
SET_BY_RANK: dict[str, str] = {
    **{name: "the rank's place in the job, from the launcher that started it" for name in LAYOUT},
    **{name: "torchrun's worker variables, made with the rank's layout" for name in ELASTIC},
    "MASTER_ADDR": "srun from a login node: the step's first node (known once srun has the nodes)",
    "MASTER_PORT": "srun from a login node: from the Slurm job id (known once srun has the job)",
    **{name: "its node's devices (the plan's per-node lists), by the rank's node" for name in VISIBILITY},
    "OMP_NUM_THREADS": "the cores the rank is bound to (its card's NUMA node), or its host's cores over its ranks",
    "TORCHELASTIC_ERROR_FILE": "a private file of the rank's own, for torch's @record",
    RECIPE_VAR: "the job's directory on the rank's host, and that filesystem's kind",
    LAZY_VAR: "where the rank's Python has the Gaudi bridge: from the script's flags",
    INT64_VAR: "where the rank's Python has the Gaudi bridge: from the script's flags",
    BF16_OPS_VAR: "where the rank's Python has the Gaudi bridge: op lists written in the job's directory there",
    FP32_OPS_VAR: "where the rank's Python has the Gaudi bridge: op lists written in the job's directory there",
    "PYTHONPATH": "DeepSpeed's runners put their own directory first: the launcher's working directory instead",
}


@dataclass
class NodePlan:
    host: str
    node_rank: int
    devices: list[int]
    ranks: list[int]


@dataclass
class Command:
    """One process the launcher starts. ``env`` is what it adds on top of the job env."""

    host: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    rank: Optional[int] = None  # None when one process (mpirun, deepspeed) starts many ranks


@dataclass
class LaunchPlan:
    backend: str
    world_size: int
    master_addr: str
    master_port: int
    nodes: list[NodePlan]
    env: dict[str, str]  # what every rank sees on top of the inherited environment
    commands: list[Command]
    program: list[str]  # the user's script (or module) and its arguments
    notes: list[str] = field(default_factory=list)
    job_id: str = ""
    # Multi-node details, filled from the options and the pre-flight's findings.
    exported: list[str] = field(default_factory=list)  # launcher env names remote ranks also get
    ssh_args: list[str] = field(default_factory=list)  # options for every ssh the backend runs
    ifname: Optional[str] = None  # interface carrying the master's subnet
    tcp_cidr: Optional[str] = None  # its network, for mpirun's tcp_if_include
    cores_per_host: Optional[int] = None  # fewest cores of any host, for CPU binding
    # What the pre-flight found (multinode.findings), when one ran: a dry run shows it even when
    # it failed, so the plan of a job whose hosts cannot be reached is still visible.
    preflight: Optional[dict] = None
    # Each host's scale-out path (plan/scaleout.py: path, name, why, env, page), when a pre-flight probed it.
    scaleout: Optional[dict] = None
    # Never shown (to_dict drops them): a random key that makes a job file's digest on argv say
    # nothing about short values, and the values of the launcher's secret-looking variables, to mask
    # (ranks on this host, and all of srun's, inherit them, exported or not).
    # os.urandom is what secrets.token_hex reads; secrets would load OpenSSL (hmac) into every plan's start-up
    job_key: str = field(default_factory=lambda: os.urandom(16).hex(), repr=False)
    exported_secrets: dict[str, str] = field(default_factory=dict, repr=False)
    # --spare-hosts held back from this attempt (host: devices), pre-flighted with the job's hosts; not
    # shown (the notes name them).
    spares: dict[str, int] = field(default_factory=dict, repr=False)
    # Hosts the collective check left out, "HOST (why)" each: both end-of-job summaries repeat them.
    # Not shown (the notes name them).
    left_out: list[str] = field(default_factory=list, repr=False)
    # The options the plan was made from (JobSpec.as_request): what `gaudi-launch run plan.json`
    # makes the plan again from (replay.py). Secrets masked in the JSON as everywhere.
    request: dict = field(default_factory=dict, repr=False)
    # What the planner detected on this host for the backend: mpirun's OpenMPI major version (4, 5), or
    # None when there is no OpenMPI mpirun here (the plan then shows OpenMPI 4's flags). Not shown when None.
    openmpi: Optional[int] = None
    # The JobSpec itself, for the backend (grace, log dir, interpreter, ssh settings): the plan is all a
    # backend reads. Never shown: its JSON form is ``request``.
    spec: Optional[JobSpec] = field(default=None, repr=False, compare=False)

    @property
    def job(self) -> JobSpec:
        """The JobSpec this plan was made from (the planner sets it)."""
        if self.spec is None:
            raise ValueError("this plan was not made by the planner: it carries no JobSpec")
        return self.spec

    def secret_values(self) -> dict[str, str]:
        return {**self.exported_secrets, **{k: v for k, v in self.env.items() if is_secret(k, v)}}

    def mask(self, text: str) -> str:
        return mask_text(text, self.secret_values())

    def secret_tail(self, data: bytes) -> int:
        """Bytes at the end of a cut line that may begin a secret: kept for the next piece (envfile.straddling)."""
        return straddling(data, self.secret_values())

    def to_dict(self) -> dict:
        """The JSON form (secrets masked): stable keys that tests and tools may rely on."""
        secrets = self.secret_values()
        data = asdict(replace(self, spec=None))  # the spec is shown as request
        del data["job_key"], data["exported_secrets"], data["spec"], data["spares"], data["left_out"]
        if self.openmpi is None:
            del data["openmpi"]
        data["env"] = mask_env(self.env)
        data["commands"] = [
            {"host": c.host, "rank": c.rank, "argv": [mask_text(a, secrets) for a in c.argv], "env": mask_env(c.env)}
            for c in self.commands
        ]
        data["program"] = [mask_text(a, secrets) for a in self.program]
        if self.scaleout is None:
            del data["scaleout"]  # no host was probed: no key
        if self.preflight is None:
            del data["preflight"]  # no pre-flight ran (one host, --no-ssh-check): no key
        data["request"] = {k: (mask_env(v) if k == "env" else _masked(v, secrets)) for k, v in self.request.items()}
        data["set_by_rank"] = dict(SET_BY_RANK)  # the only names a rank sets itself at its start, and why
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def render_text(self) -> str:
        """A readable dry run: who runs what, with which environment."""
        secrets = self.secret_values()
        out = [
            f"backend: {self.backend}    world size: {self.world_size}    "
            f"master: {self.master_addr}:{self.master_port}    job: {self.job_id}"
        ]
        out.append("nodes:")
        for n in self.nodes:
            out.append(f"  node {n.node_rank}  {n.host:<24} devices {_ids(n.devices):<16} ranks {_ids(n.ranks)}")
        if self.env:
            out.append("environment for every rank (in addition to the launcher's):")
            for k, v in sorted(mask_env(self.env).items()):
                out.append(f"  {k}={v}")
        out.append(
            "set by each rank at its start where the plan has not (why: --dry-run --json, set_by_rank): "
            + ", ".join(SET_BY_RANK)
        )
        out.append("commands:")
        for c in self.commands:
            who = f"rank {c.rank}" if c.rank is not None else "all ranks"
            extra = " ".join(f"{k}={v}" for k, v in mask_env(c.env).items())
            line = shlex.join(mask_text(a, secrets) for a in c.argv)  # mask before quoting
            out.append(f"  [{c.host}, {who}] {extra + ' ' if extra else ''}{line}")
        if any(c.rank is None for c in self.commands):
            out.append("what the ranks see (set by the backend and the rank bootstrap):")
            for n in self.nodes:
                out.append(
                    f"  {n.host}: RANK={_ids(n.ranks)} LOCAL_RANK={_ids(list(range(len(n.ranks))))} "
                    f"WORLD_SIZE={self.world_size} LOCAL_WORLD_SIZE={len(n.ranks)} NODE_RANK={n.node_rank} "
                    f"MASTER_ADDR={self.master_addr} MASTER_PORT={self.master_port}"
                )
            if self.exported:
                out.append("  and from this shell: " + ", ".join(self.exported))
        for note in self.notes:
            out.append(f"note: {note}")
        if self.preflight is not None:
            verdict = "OK" if self.preflight["ok"] else "FAILED: a real run would start nothing (exit 3)"
            out.append(f"pre-flight: {verdict}")
            out.extend("  " + line for line in self.preflight["table"].splitlines())
        return "\n".join(out) + "\n"


def _masked(value, secrets: dict[str, str]):
    """A request value with every secret value in its strings masked. Pure."""
    if isinstance(value, str):
        return mask_text(value, secrets)
    if isinstance(value, list):
        return [_masked(v, secrets) for v in value]
    return value


def _ids(ids: list[int]) -> str:
    """[0,1,2,3,6] -> '0-3,6': short and unambiguous."""
    return id_ranges(ids) or "-"


def layout(selected: list[tuple[str, list[int]]]) -> list[NodePlan]:
    """Global ranks are handed out node by node, devices in order. Pure."""
    nodes, rank = [], 0
    for node_rank, (host, devices) in enumerate(selected):
        ranks = list(range(rank, rank + len(devices)))
        rank += len(devices)
        nodes.append(NodePlan(host=host, node_rank=node_rank, devices=list(devices), ranks=ranks))
    return nodes
