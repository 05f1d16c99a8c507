"""`gaudi-launch run plan.json`: run the job a dry run showed (`--dry-run --json > plan.json`).

A plan holds the options it was made from (``request``). The job is planned again from them, as
the dry run did, with what belongs to one job fresh (job id, an automatically picked port, the
heartbeat directory, the job file's digest), and runs only when the new plan is the saved one: every
field of the plan is compared (commands, ssh options, environment, hosts, ...) except the per-run
ones above, the notes and the pre-flight's findings; a field this version does not make counts as a
difference. The hosts, program, ssh options and interpreter are compared before the pre-flight runs
anything with them. Options that only the request shows (log dir, grace, timeouts, restarts) are
taken as the plan shows them. When the hostfile, an env file, the hosts or the plan itself changed, it says what
differs and starts nothing (exit 2): a reviewed plan never runs as something else.

Secrets are never written to a plan; a masked one is taken from this shell's environment by name and
must be the value the dry run saw: the plan holds an HMAC-SHA256 of each secret value under a key
private to this user ($XDG_STATE_HOME/gaudi-launch/plan-key, 0600 in a 0700 directory), so the plan
tells nobody who reads it anything about the value, not even by guessing.
"""

from __future__ import annotations

import json
import os
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import fields, replace

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.backend_options import OWNER
from gaudi_launch.inputs.envfile import MASK, parse_assignments
from gaudi_launch.inputs.spec import JOB_OWN_VARS, JobSpec, job_option_fields, option_types
from gaudi_launch.plan.launchplan import LaunchPlan
from gaudi_launch.plan.planner import BackendPlanning, build_plan
from gaudi_launch.wire import (
    HEARTBEAT_DIR,
    JOB_DIGEST_FLAG,
    JOB_DIR_SUFFIX,
    JobDirError,
    check_private_dir,
    write_private,
)

# Per run, not compared: the job id, the notes and the pre-flight's findings (the port too, unless
# the request fixed it). Every other field of either plan is.
PER_RUN = ("job_id", "notes", "preflight")
# The plan's format: 1 had no key (before it was written); 2 writes it. A plan of a later format is refused,
# one of an earlier format runs with the options it predates at their defaults (said once).
PLAN_FORMAT = 2
FORMAT_KEY = "plan_format"
BY_RANK = "set_by_rank"  # what this version's ranks set themselves (plan/contract.py): the version's, not the job's
MAX_DIFFERENCES = 12  # lines shown; the rest counted
DIGESTS = "secret_digests"  # {NAME: HMAC-SHA256 of the value}, for every value the plan masks
KEY_FILE = "plan-key"
MAX_PLAN_BYTES = 64 << 20  # a plan of thousands of hosts is a few MiB
# What a plan says before any host is asked: compared before the pre-flight (or srun's probe) runs
# anything with the request's interpreter and ssh options.
STATIC = ("backend", "world_size", "master_addr", "nodes", "program", "ssh_args")


def read_plan(path: str) -> dict:
    """The saved plan (a dict), or a UserError naming the file (and line) and what to do. Reads at
    most MAX_PLAN_BYTES: `gaudi-launch run /dev/zero` ends at once, a FIFO without writer does not
    block the open."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            os.set_blocking(fd, True)  # a pipe's writer may still be writing
            data = f.read(MAX_PLAN_BYTES + 1)
    except OSError as exc:
        raise UserError(
            f"cannot read the plan: {exc.strerror}",
            where=path,
            hint="make one with: gaudi-launch --dry-run --json [OPTIONS] SCRIPT > plan.json",
        ) from None
    if len(data) > MAX_PLAN_BYTES:
        raise UserError(
            f"not a plan: larger than {MAX_PLAN_BYTES >> 20} MiB", where=path, hint="the file --dry-run --json writes"
        )
    try:
        saved = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(f"not a plan: not UTF-8 text (byte {exc.start})", where=path) from None
    except json.JSONDecodeError as exc:
        raise UserError(
            f"not a plan: invalid JSON ({exc.msg})",
            where=f"{path}:{exc.lineno}",
            hint="the file --dry-run --json writes, unedited",
        ) from None
    except (RecursionError, ValueError) as exc:  # nested too deeply; an integer of thousands of digits
        raise UserError(f"not a plan: {type(exc).__name__}: {str(exc)[:100]}", where=path) from None
    if not isinstance(saved, dict) or not isinstance(saved.get("request"), dict):
        raise UserError(
            "not a plan gaudi-launch can run: it has no 'request' (the options it was made from)",
            where=path,
            hint="make it again with this version: gaudi-launch --dry-run --json ... > plan.json",
        )
    return saved


def check_format(saved: dict, path: str) -> None:
    """A plan this version can read: its format is this one's or earlier (absent: the first)."""
    made = saved.get(FORMAT_KEY, 1)
    if not isinstance(made, int) or isinstance(made, bool) or made < 1:
        raise UserError(f"{FORMAT_KEY}: a whole number, 1 or more, got {_brief(made)}", where=path)
    if made > PLAN_FORMAT:
        raise UserError(
            f"the plan is of plan format {made}, made by a newer gaudi-launch; this one reads up to format {PLAN_FORMAT}",
            where=path,
            hint="run it with the version that made it, or make the plan again with this one",
        )


def fill_request(request: dict) -> tuple[dict, list[str]]:
    """The request with every option it predates (a plan made before the option existed) at its default,
    and those options' flags, to say so. Unknown options are left for spec_from_request to refuse. Pure."""
    defaults = JobSpec(program=[]).as_request(str(request.get("cwd") or "/"))
    missing = [name for name in defaults if name not in request and name not in ("program", "cwd")]  # never new
    flags = sorted(_flag_of(name) for name in missing)
    return {**request, **{name: defaults[name] for name in missing}}, flags


def _flag_of(name: str) -> str:
    for f, option in job_option_fields():
        if f.name == name:
            return next((flag for flag in option.flags if flag.startswith("--")), name)
    return name


def enter_cwd(saved: dict, path: str) -> None:
    """Work where the dry run was made: relative paths (script, hostfile, env file) and the ranks'
    working directory mean what they meant then."""
    cwd = saved["request"].get("cwd")
    if not isinstance(cwd, str) or not os.path.isabs(cwd):
        raise UserError(
            "the plan does not say where it was made (request.cwd: an absolute directory)",
            where=path,
            hint="make it again with this version: gaudi-launch --dry-run --json ... > plan.json",
        )
    _check_text("cwd", cwd, path)
    try:
        os.chdir(cwd)
    except OSError as exc:
        raise UserError(
            f"cannot work in the plan's directory {cwd}: {exc.strerror}",
            where=path,
            hint="run the plan where that directory exists, or make the plan again",
        ) from None


def check_request(request: dict, path: str) -> None:
    """Each option of a saved request has the type its command-line option gives, and its strings
    could have come from a command line (no NUL, no lone surrogate): a plan is edited text. Pure."""
    hints = option_types()
    for name, value in request.items():
        if name == "cwd":
            continue
        want = _wanted(hints[name], value)
        if want:
            raise UserError(
                f"request.{name}: {want}, got {_brief(value)}",
                where=path,
                hint="the plan was edited: make it again with gaudi-launch --dry-run --json ... > plan.json",
            )
    for name, value in request.items():
        _check_text(name, value, path)
    if request.get("lost_hosts"):  # the restart loop's own, never an option
        raise UserError(f"request.lost_hosts: always [] in a plan, got {_brief(request['lost_hosts'])}", where=path)
    program = request.get("program")
    if not program:
        raise UserError(
            f"request.program: the script and its arguments (a list of text, the script first), got {_brief(program)}",
            where=path,
        )


# The request field of each command-line flag, to name the field in the plan an error is about.
_FIELD_OF_FLAG = {flag: f.name for f, option in job_option_fields() for flag in (*option.flags, option.via) if flag} | {
    "request.env": "env",
    "SCRIPT": "program",
}


def _wanted(hint, value) -> str:
    """What ``value`` should be for a field of type ``hint``; empty when it is that. Pure."""
    optional = typing.get_origin(hint) is typing.Union and type(None) in typing.get_args(hint)
    if optional:
        if value is None:
            return ""
        hint = next(h for h in typing.get_args(hint) if h is not type(None))
    tail = " or null" if optional else ""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is bool:
        return "" if isinstance(value, bool) else "true or false" + tail
    if hint is int:
        return "" if number and isinstance(value, int) else "a whole number" + tail
    if hint is float:
        return "" if number else "a number" + tail
    if hint is str:
        return "" if isinstance(value, str) else "text" + tail
    item = typing.get_args(hint)[-1] if typing.get_args(hint) else str
    if typing.get_origin(hint) is dict:
        ok = isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        return "" if ok else "NAME: text pairs" + tail
    if item is int:
        ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        return "" if ok else "a list of whole numbers, 0 or more" + tail
    ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    return "" if ok else "a list of text" + tail


def _check_text(name: str, value, path: str) -> None:
    texts = value if isinstance(value, list) else [*value, *value.values()] if isinstance(value, dict) else [value]
    for text in texts:
        if not isinstance(text, str):
            continue
        if "\0" in text:
            raise UserError(f"request.{name}: holds a NUL character, which no command line can", where=path)
        try:
            text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise UserError(f"request.{name}: holds a lone surrogate ({_brief(text)}), not text", where=path) from None


def _brief(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def spec_from_request(request: dict, environ: Mapping[str, str], path: str) -> JobSpec:
    """The JobSpec a saved plan was made from, masked secrets taken from ``environ``. Pure."""
    request = {k: v for k, v in request.items() if k != "cwd"}
    known = {f.name for f in fields(JobSpec) if f.name != "backend_options"} | set(OWNER)  # the request is flat
    unknown = sorted(set(request) - known)
    if unknown:
        raise UserError(
            f"the plan has options this gaudi-launch does not know: {', '.join(unknown)}",
            where=path,
            hint="run it with the version that made it, or make the plan again",
        )
    check_request(request, path)
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
    try:  # as strictly as the command line: names of variables, then the options' values
        parse_assignments([f"{k}={v}" for k, v in env.items()], "request.env")
        return JobSpec.build(**{**request, "env": env}).validate()
    except UserError as exc:
        where = exc.where or ""
        field = "request." + _FIELD_OF_FLAG[where] if where in _FIELD_OF_FLAG else where or "request"
        label = f"{field} ({where})" if where.startswith("-") else field
        raise UserError(f"{label}: {exc.message}", where=path, hint=exc.hint) from None


def secret_digests(values: Mapping[str, str], key: bytes) -> dict[str, str]:
    """A keyed digest of each secret value (name and value both bound). Pure."""
    import hashlib  # here and below: only a plan's JSON and a replay load OpenSSL, a text dry run does not
    import hmac

    return {
        name: hmac.new(
            key, name.encode() + b"\0" + value.encode("utf-8", "surrogateescape"), hashlib.sha256
        ).hexdigest()
        for name, value in sorted(values.items())
    }


def key_path(environ: Mapping[str, str]) -> str:
    state = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "gaudi-launch", KEY_FILE)


def plan_key(environ: Mapping[str, str]) -> bytes:
    """This user's key for plans' secret digests, made on first use: 32 random bytes in a 0600 file
    of a 0700 directory, never through a link, refused when anyone else could read or swap it."""
    path = key_path(environ)
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        check_private_dir(directory)
        try:
            return _read_key(path)
        except FileNotFoundError:
            pass
        tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}"
        write_private(tmp, os.urandom(32).hex().encode())  # what secrets.token_hex(32) reads
        try:
            os.link(tmp, path)  # all at once, and never over a key another launcher made meanwhile
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        return _read_key(path)
    except (OSError, JobDirError) as exc:
        raise UserError(
            f"cannot use the key for plans' secret digests: {getattr(exc, 'strerror', None) or exc}",
            where=path,
            hint="it must be a private file (0600) of yours in a private directory (0700); remove it to make a new one",
        ) from None


def _read_key(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise JobDirError(f"{path} is not a private file of this user")
        key = f.read(129).strip()
    if not re.fullmatch(rb"[0-9a-f]{64}", key):
        raise JobDirError(f"{path} does not hold a key (64 hex digits)")
    return key


def plan_json(plan: LaunchPlan, environ: Mapping[str, str]) -> dict:
    """The plan as --dry-run --json shows it: secrets masked, with their keyed digests."""
    data = {FORMAT_KEY: PLAN_FORMAT, **plan.to_dict()}
    values = plan.secret_values()
    if values:
        data[DIGESTS] = secret_digests(values, plan_key(environ))
    return data


def differences(saved: dict, fresh: dict, fixed_port: bool) -> list[str]:
    """What differs between a saved plan and the same request planned now (both as JSON dicts,
    secrets masked, with their digests). Empty when they are the same job. Pure."""
    skip = set(PER_RUN) | ({"master_port"} if not fixed_port else set()) | {DIGESTS, FORMAT_KEY, BY_RANK}
    a_run, b_run = _per_run(saved, fixed_port), _per_run(fresh, fixed_port)
    out = []
    for key in [k for k in saved if k not in skip] + [k for k in fresh if k not in skip and k not in saved]:
        a = _normal(_comparable(key, saved.get(key, _ABSENT)), a_run)
        b = _normal(_comparable(key, fresh.get(key, _ABSENT)), b_run)
        out += _differing(key, a, b)
    if len(out) > MAX_DIFFERENCES:
        out = [*out[:MAX_DIFFERENCES], f"... and {len(out) - MAX_DIFFERENCES} more"]
    out += _secret_differences(saved.get(DIGESTS), fresh.get(DIGESTS) or {})
    return out


def _differing(key: str, a, b) -> list[str]:
    """Each differing leaf, named by its path in the plan (request.grace, commands[2].argv[0]), not the
    whole field: two long values that differ at their end look alike in any prefix. Pure."""
    if isinstance(a, dict) and isinstance(b, dict):
        names = [*a, *(k for k in b if k not in a)]
        return [line for k in names for line in _differing(f"{key}.{k}", a.get(k, _ABSENT), b.get(k, _ABSENT))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [line for i, (x, y) in enumerate(zip(a, b)) for line in _differing(f"{key}[{i}]", x, y)]
    return [] if a == b else [f"{key}: the plan has {_short(a)}, now {_short(b)}"]


def _secret_differences(saved, fresh: dict) -> list[str]:
    """Names only: a digest says nothing to the reader, but there is no need to show it either."""
    import hmac

    if not isinstance(saved, dict):
        saved = {}
    out = []
    for name in sorted(set(saved) | set(fresh)):
        if name not in fresh:
            out.append(f"{name}: the plan holds a digest of a secret that this job does not have")
        elif name not in saved:
            out.append(f"{name}: the plan holds no digest of it, so its value here cannot be checked")
        elif not hmac.compare_digest(str(saved[name]), fresh[name]):
            out.append(
                f"{name}: its value here is not the one the plan was made with (or the plan was made by another "
                "user, or before $XDG_STATE_HOME/gaudi-launch/plan-key was made again)"
            )
    return out


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()


def _per_run(plan: dict, fixed_port: bool) -> list[tuple[re.Pattern, str]]:
    """The plan's own per-run values, each with the placeholder that stands for it when comparing."""
    out = []
    job = plan.get("job_id")
    if isinstance(job, str) and re.fullmatch(r"[0-9a-f]{8,64}", job):
        out.append((re.compile(rf"(?<![0-9a-f]){job}(?![0-9a-f])"), "<job id>"))
    port = plan.get("master_port")
    if not fixed_port and isinstance(port, int) and not isinstance(port, bool):
        out.append((re.compile(rf"(?<![0-9]){port}(?![0-9])"), "<port>"))
    env = plan.get("env")
    beat = env.get(HEARTBEAT_DIR) if isinstance(env, dict) else None
    if isinstance(beat, str) and beat:
        out.append((re.compile(re.escape(beat)), "<heartbeat dir>"))
    suffix = env.get(JOB_DIR_SUFFIX) if isinstance(env, dict) else None
    if isinstance(suffix, str) and re.fullmatch(r"[0-9a-f]{16}", suffix):  # drawn per run (plan/shared.py)
        out.append((re.compile(rf"(?<![0-9a-f]){suffix}(?![0-9a-f])"), "<job dir suffix>"))
    out.append((re.compile(rf"^{re.escape(JOB_DIGEST_FLAG)}[0-9a-f]+$"), JOB_DIGEST_FLAG + "<digest>"))
    return out


def _normal(value, per_run: list[tuple[re.Pattern, str]]):
    if isinstance(value, str):
        for pattern, placeholder in per_run:
            value = pattern.sub(placeholder, value)
        return value
    if isinstance(value, list):
        return [_normal(v, per_run) for v in value]
    if isinstance(value, dict):
        return {k: _normal(v, per_run) for k, v in value.items()}
    return value


def _comparable(key: str, value):
    """Both plans are JSON, secrets already masked; a job's own variables are fresh each run."""
    if key == "env" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in JOB_OWN_VARS}
    return value


def _short(value) -> str:
    if value is _ABSENT:
        return "(absent)"
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 200 else text[:197] + "..."


def check_before_hosts(saved: dict, spec: JobSpec, path: str, backends: Callable[[str], BackendPlanning]) -> None:
    """Before the pre-flight runs ssh (with the request's ssh options) and the interpreter on every
    host: the plan made now without asking any host must agree with the saved one on the hosts,
    the program, the ssh options, and run the interpreter that the saved commands show (``backends``: as
    build_plan takes them)."""
    static = build_plan(replace(spec, ssh_check=False, wait_hosts=None), backends=backends).to_dict()
    diff = [d for d in differences({k: saved.get(k) for k in STATIC}, {k: static[k] for k in STATIC}, False)]
    commands = saved.get("commands")
    if not isinstance(commands, list) or not all(
        isinstance(c, dict) and isinstance(c.get("argv"), list) and spec.python in c["argv"] for c in commands
    ):
        diff.append(f"python: the plan's commands do not run {spec.python} (request.python)")
    _refuse(diff, path)


def check_same(saved: dict, fresh: dict, path: str) -> None:
    _refuse(differences(saved, fresh, fixed_port=saved["request"].get("master_port") is not None), path)


def _refuse(diff: list[str], path: str) -> None:
    if diff:
        raise UserError(
            "the job planned now is not the one in the plan, so nothing was started:\n  " + "\n  ".join(diff),
            where=path,
            hint="the hostfile, an env file, the hosts, this shell's environment or the plan itself changed "
            "since the dry run: check them, or make the plan again",
        )
