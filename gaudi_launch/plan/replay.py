"""`gaudi-launch run plan.json`: run the job a dry run showed (`--dry-run --json > plan.json`).

A plan holds the options it was made from (``request``). The job is planned again from them, as
the dry run did, with what belongs to one job fresh (job id, an automatically picked port, the
heartbeat directory), and runs only when the new plan is the saved one: same backend, hosts,
devices, ranks, program, rendezvous address, environment and fabric settings. When the hostfile,
an env file or the hosts changed, it says what differs and starts nothing (exit 2): a reviewed plan
never runs as something else. Secrets are never written to a plan; a masked one is taken from this
shell's environment by name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import fields

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.envfile import MASK
from gaudi_launch.inputs.spec import JOB_OWN_VARS, JobSpec

# What makes two plans the same job; the rest (job id, port, job key, notes, findings) is per run.
SAME_JOB = (
    "backend",
    "world_size",
    "master_addr",
    "nodes",
    "program",
    "env",
    "exported",
    "ifname",
    "tcp_cidr",
    "cores_per_host",
)


def read_plan(path: str) -> dict:
    """The saved plan (a dict), or a UserError naming the file (and line) and what to do."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise UserError(
            f"cannot read the plan: {exc.strerror}",
            where=path,
            hint="make one with: gaudi-launch --dry-run --json [OPTIONS] SCRIPT > plan.json",
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(
            f"not a plan: invalid JSON ({exc.msg})",
            where=f"{path}:{exc.lineno}",
            hint="the file --dry-run --json writes, unedited",
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("request"), dict):
        raise UserError(
            "not a plan gaudi-launch can run: it has no 'request' (the options it was made from)",
            where=path,
            hint="make it again with this version: gaudi-launch --dry-run --json ... > plan.json",
        )
    return data


def enter_cwd(saved: dict, path: str) -> None:
    """Work where the dry run was made: relative paths (script, hostfile, env file) and the ranks'
    working directory mean what they meant then."""
    cwd = saved["request"].get("cwd")
    if not isinstance(cwd, str):
        raise UserError(
            "the plan does not say where it was made (request.cwd)",
            where=path,
            hint="make it again with this version: gaudi-launch --dry-run --json ... > plan.json",
        )
    try:
        os.chdir(cwd)
    except OSError as exc:
        raise UserError(
            f"cannot work in the plan's directory {cwd}: {exc.strerror}",
            where=path,
            hint="run the plan where that directory exists, or make the plan again",
        ) from None


def spec_from_request(request: dict, environ: Mapping[str, str], path: str) -> JobSpec:
    """The JobSpec a saved plan was made from, masked secrets taken from ``environ``. Pure."""
    request = {k: v for k, v in request.items() if k != "cwd"}
    known = {f.name for f in fields(JobSpec)}
    unknown = sorted(set(request) - known)
    if unknown:
        raise UserError(
            f"the plan has options this gaudi-launch does not know: {', '.join(unknown)}",
            where=path,
            hint="run it with the version that made it, or make the plan again",
        )
    env = dict(request.get("env") or {})
    for name, value in env.items():
        if value == MASK:  # secret by its name or by its value (a URL's password): from this shell
            if not environ.get(name):
                raise UserError(
                    f"{name} is masked in the plan (plans never hold secrets) and not set here",
                    where=path,
                    hint=f"export {name} in this shell, then run the plan again",
                )
            env[name] = environ[name]
    masked = [k for k in ("program", "launcher_args", "slurm_args") if MASK in json.dumps(request.get(k))]
    if masked:
        raise UserError(
            f"a secret was masked in the plan's {masked[0].replace('_', ' ')} ({MASK}); a plan cannot carry it",
            where=path,
            hint="pass secrets in environment variables (-x NAME), not on the command line",
        )
    return JobSpec(**{**request, "env": env})


def differences(saved: dict, fresh: dict, fixed_port: bool) -> list[str]:
    """What differs between a saved plan and the same request planned now (both as JSON dicts,
    secrets masked). Empty when they are the same job. Pure."""
    keys = SAME_JOB + (("master_port",) if fixed_port else ())
    out = []
    for key in keys:
        a, b = _comparable(key, saved.get(key)), _comparable(key, fresh.get(key))
        if a != b:
            out.append(f"{key}: the plan has {_short(a)}, now {_short(b)}")
    return out


def _comparable(key: str, value):
    """Both plans are JSON, secrets already masked; a job's own variables are fresh each run."""
    if key == "env" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in JOB_OWN_VARS}
    return value


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 200 else text[:197] + "..."


def check_same(saved: dict, fresh: dict, path: str) -> None:
    diff = differences(saved, fresh, fixed_port=saved["request"].get("master_port") is not None)
    if diff:
        raise UserError(
            "the job planned now is not the one in the plan, so nothing was started:\n  " + "\n  ".join(diff),
            where=path,
            hint="the hostfile, an env file, the hosts or this shell's environment changed since the dry "
            "run: check them, or make the plan again",
        )
