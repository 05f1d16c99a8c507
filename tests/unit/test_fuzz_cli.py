"""Property tests: whatever the hostfile, env file or options, gaudi-launch --dry-run answers with a
plan (exit 0) or one clear user error naming where the problem is (exit 2), never a traceback."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tempfile

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gaudi_launch.cli import main
from gaudi_launch.inputs.envfile import mask_env, parse_env_text
from tests.helpers import job_env

SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
ERROR_RE = re.compile(r"gaudi-launch: error: (.*?): ")


pytestmark = pytest.mark.usefixtures("isolated")  # tests/unit/conftest.py


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["--no-ssh-check", *argv])  # names only: nothing may be looked up
    event(f"exit {rc}")
    return rc, out.getvalue(), err.getvalue()


def check_plan(out: str) -> dict:
    plan = json.loads(out)
    assert plan["world_size"] == sum(len(n["devices"]) for n in plan["nodes"])
    ranks = [r for n in plan["nodes"] for r in n["ranks"]]
    assert ranks == list(range(plan["world_size"]))
    assert [n["node_rank"] for n in plan["nodes"]] == list(range(len(plan["nodes"])))
    assert 1 <= plan["master_port"] <= 65535
    assert plan["commands"]
    return plan


def assert_clean_error(rc, out, err):
    assert rc == 2, (rc, out, err)
    assert out == ""
    assert "Traceback" not in err
    assert "internal error" not in err
    assert err.strip()


@contextlib.contextmanager
def temp_file(data, suffix: str):
    """A file holding data (text or bytes) for one CLI run; hypothesis reruns forbid tmp_path."""
    fd, path = tempfile.mkstemp(suffix=suffix)
    with os.fdopen(fd, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
    try:
        yield path
    finally:
        os.unlink(path)


# ----------------------------------------------------------------------------- hostfiles

HOST_TOKENS = [
    "host-1",
    "host-2",
    "worker-0",
    "localhost",
    "127.0.0.1",
    "10.0.0.7",
    "999.1.1.1",
    "fe80::1",
    "[fe80::1]",
    "[host]",
    "a@b",
    "deploy@worker-0",
    "@x",
    "a@b@c",
    "host:22",
    "slots=2",
    "slots=4",
    "slots=0",
    "slots=-1",
    "slots=x",
    "Slots=2",
    "slots=",
    "gpus=2",
    "foo=bar",
    "=",
    "#",
    "# comment",
    "4",
    "",
    " ",
    "\t",
    "a,b",
    "-bad",
    "ü",
]
host_line = st.lists(st.sampled_from(HOST_TOKENS), min_size=0, max_size=4).map(" ".join)
HOSTS = ["worker-0", "worker-1", "deploy@worker-2", "10.0.0.7", "[fe80::1]", "localhost", "Worker-0"]
plausible_hostfile = st.tuples(
    st.lists(st.sampled_from(HOSTS), min_size=1, max_size=4, unique=True),
    st.lists(st.sampled_from(["1", "2", "4", "2"]), min_size=4, max_size=4),
    st.sampled_from(["", "  # trailing comment", "\r", " extra", ""]),
).map(
    lambda t: (
        "# hosts\n"
        + "\n".join(f"{h} slots={n}{t[2] if i == 1 else ''}" for i, (h, n) in enumerate(zip(t[0], t[1])))
        + "\n"
    )
)
hostfile_text = st.one_of(
    plausible_hostfile,
    st.lists(st.one_of(host_line, st.text(max_size=20)), max_size=6).map("\n".join),
    st.lists(host_line, max_size=6).map("\n".join),
    st.text(max_size=60),
)


@SETTINGS
@given(text=st.one_of(hostfile_text, st.binary(max_size=40)))
def test_fuzz_hostfile(text):
    with temp_file(text, ".hostfile") as path:
        rc, out, err = run(["--hostfile", path, "--dry-run", "--json", "--backend", "mpirun", "train.py"])
    if rc == 0:
        plan = check_plan(out)
        assert plan["backend"] == "mpirun"
        assert err == ""
        return
    assert_clean_error(rc, out, err)
    where = ERROR_RE.match(err)
    assert where, err
    where = where.group(1)
    if where.startswith("--"):
        return  # e.g. --hostfile: uneven nodes for mpirun
    assert where.startswith(path), err
    rest = where[len(path) :]
    if rest == "":  # a whole-file problem: no hosts at all, or not UTF-8
        assert "lists no hosts" in err or "UTF-8" in err, err
        return
    line = re.fullmatch(r":(\d+)", rest)
    assert line, err
    if isinstance(text, str):  # read with universal newlines: \r, \n and \r\n end lines
        assert 1 <= int(line.group(1)) <= text.count("\n") + text.count("\r") + 1


# ----------------------------------------------------------------------------- env files

ENV_TOKENS = [
    "A=1",
    "HF_TOKEN=hf_abcdefgh",
    "export B=2",
    "export",
    "C='x y'",
    'D="a\\nb"',
    "E='open",
    'F="open',
    "G=x # c",
    "H='a'b",
    "1X=2",
    "=v",
    "I",
    "# c",
    "",
    "  ",
    "J=$(id)",
    "K=a=b",
    "L=\x00",
    "M.N=1",
    "O = 3",
    "P='q' # ok",
]
env_line = st.one_of(st.sampled_from(ENV_TOKENS), st.text(max_size=15))
env_text = st.one_of(st.lists(env_line, max_size=6).map("\n".join), st.text(max_size=60))


@SETTINGS
@given(text=st.one_of(env_text, st.binary(max_size=40)))
def test_fuzz_env_file(text):
    with temp_file(text, ".env") as path:
        rc, out, err = run(["--env-file", path, "--num_devices", "1", "--dry-run", "--json", "train.py"])
    if rc == 0:
        plan = check_plan(out)
        assert err == ""
        if isinstance(text, str):
            assert job_env(plan["env"]) == mask_env(parse_env_text(text, path))
        return
    assert_clean_error(rc, out, err)
    where = ERROR_RE.match(err)
    assert where, err
    where = where.group(1)
    assert where.startswith(path), err
    line = re.fullmatch(r":(\d+)", where[len(path) :])
    assert line, err
    if isinstance(text, str):
        assert 1 <= int(line.group(1)) <= text.count("\n") + 1


# ----------------------------------------------------------------------------- options

small_int = st.integers(min_value=-2, max_value=8).map(str)
VALUES = {
    "--num_devices": st.one_of(small_int, st.sampled_from(["", "x", "2.5"])),
    "--world_size": st.one_of(small_int, st.sampled_from(["", "x"])),
    "--num_nodes": st.one_of(small_int, st.sampled_from(["x"])),
    "--include": st.one_of(
        st.sampled_from(
            [
                "localhost",
                "localhost:0",
                "localhost:1,3",
                "localhost:9",
                "nohost",
                "",
                "@",
                "localhost:a",
                "localhost:-1",
                "[fe80::1]:0",
                "localhost:0,0",
                "localhost@localhost",
            ]
        ),
        st.text(max_size=10),
    ),
    "--exclude": st.one_of(
        st.sampled_from(["localhost", "localhost:0", "localhost:0,1,2,3", "nohost", ""]), st.text(max_size=10)
    ),
    "--master_port": st.one_of(
        st.integers(min_value=-1, max_value=70000).map(str), st.sampled_from(["x", "0", "65535", "65536"])
    ),
    "--master_addr": st.sampled_from(["localhost", "127.0.0.1", "10.0.0.1", "worker-0"]),
    "-x": st.one_of(
        st.sampled_from(["A=1", "HF_TOKEN=hf_secretvalue", "1A=2", "noeq", "=v", "B=", "C=a=b", "D=\x00"]),
        st.text(max_size=10),
    ),
    "--backend": st.sampled_from(["auto", "local", "mpirun", "deepspeed", "bogus", ""]),
    "--grace": st.sampled_from(["-1", "0", "2.5", "nan", "inf", "x", "1e3"]),
    "--python": st.sampled_from(["python3", "/usr/bin/python3", ""]),
    "--env-file": st.sampled_from(["/nonexistent/gaudi-launch-test.env", ""]),
}
FLAGS = [
    "--use_mpi",
    "--use-mpi",
    "--use_deepspeed",
    "--module",
    "-m",
    "--no_python",
    "--append-local-rank",
    "--no_local_rank",
    "--json",
    "--dry_run",
]


@st.composite
def option_argv(draw):
    argv = []
    for _ in range(draw(st.integers(min_value=0, max_value=6))):
        if draw(st.booleans()):
            name = draw(st.sampled_from(sorted(VALUES)))
            argv.append(name)
            if draw(st.integers(min_value=0, max_value=9)):  # now and then the value is missing
                argv.append(draw(VALUES[name]))
        else:
            argv.append(draw(st.sampled_from(FLAGS)))
    tail = draw(
        st.sampled_from([[], ["train.py"], ["train.py", "--num_devices", "9", "--help"], ["pkg.mod", "-x", "A"]])
    )
    return argv + tail


KNOWN = tuple(VALUES) + tuple(FLAGS) + ("--hostfile", "--num_devices", "--dry-run")


@SETTINGS
@given(argv=option_argv(), with_hostfile=st.booleans())
def test_fuzz_options(argv, with_hostfile):
    head, hostfile = ["--dry-run"], None  # --dry-run first: no option can swallow it as its value
    with contextlib.ExitStack() as stack:
        if with_hostfile:
            hostfile = stack.enter_context(temp_file("localhost slots=4\n", ".hostfile"))
            head += ["--hostfile", hostfile]
        rc, out, err = run(head + argv)
    if rc == 0:
        if "--json" in argv[: argv.index("train.py") if "train.py" in argv else len(argv)] and out.startswith("{"):
            check_plan(out)
            assert "hf_secretvalue" not in out
        else:
            assert out  # the text plan
        return
    assert_clean_error(rc, out, err)
    match = ERROR_RE.match(err)
    if match and "hint: see gaudi-launch --help" not in err:  # our UserError: WHERE names an option, the script, a file
        where = match.group(1)
        assert (
            where.startswith("-")
            or where == "SCRIPT"
            or (hostfile and where.startswith(hostfile))
            or where.startswith("/nonexistent/")
        ), err
    else:  # the parser's usage error names the option or the offending token, and points to --help
        assert err.startswith("gaudi-launch: error: ") and "hint: see gaudi-launch --help" in err, err
        assert any(k in err for k in KNOWN) or "No such option" in err, err


# ----------------------------------------------------------------------------- job files (issue 36 items 6, 7)

HUGE = str(9 * 10**400)  # past a float's range: float() raises OverflowError
job_key = st.sampled_from(["num_devices", "grace", "ssh_timeout", "hang_timeout", "min_bandwidth", "env", "exclude"])
yaml_scalar = st.one_of(
    st.sampled_from(["1", "2.5", "null", "true", HUGE, "-" + HUGE, "1e999", ".nan", "x", '"A=1"', "A=1"]),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
)
yaml_value = st.one_of(
    yaml_scalar,
    st.lists(yaml_scalar, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
    st.dictionaries(st.sampled_from(["A", "B", "HF_TOKEN"]), yaml_scalar, max_size=2).map(
        lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"
    ),
    st.integers(min_value=1, max_value=3000).map(lambda n: "[" * n + "1" + "]" * n),  # deep: RecursionError
    st.integers(min_value=1, max_value=3000).map(lambda n: "{a: " * n + "1" + "}" * n),
)


@st.composite
def job_file(draw):
    lines = [f"{draw(job_key)}: {draw(yaml_value)}" for _ in range(draw(st.integers(1, 3)))]
    if draw(st.booleans()):  # anchors and aliases, a bomb's shape
        lines.insert(0, "include: &a0 [x, x]")
        lines.insert(1, "exclude: &a1 [*a0, *a0]")
        lines.append(f"{draw(job_key)}: {draw(st.sampled_from(['*a0', '*a1', '[*a1, *a1]']))}")
    return "\n".join(lines) + "\n"


@SETTINGS
@given(text=job_file())
def test_fuzz_job_file(text):
    with temp_file(text, ".yaml") as path:
        rc, out, err = run(["--config", path, "--dry-run", "--json", "train.py"])
    if rc == 0:
        check_plan(out)
        return
    assert_clean_error(rc, out, err)
    assert err.startswith(f"gaudi-launch: error: {path}"), err  # the job file (and line) at fault
