"""Property tests: whatever a saved plan holds, `gaudi-launch run plan.json` answers with the job (exit
0), a failed pre-flight (3) or one clear user error (2) that names the request field at fault, never an
internal error; and it reads a bounded amount of whatever file it is given."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import time
import typing

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gaudi_launch.cli import main
from gaudi_launch.inputs.spec import JobSpec, option_types

# FUZZ_EXAMPLES=3000 for a deeper search by hand (CI runs the default).
SETTINGS = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
FIELDS = [k for k in JobSpec(program=[]).as_request("/") if k != "cwd"]  # a plan's request keys

pytestmark = pytest.mark.usefixtures("isolated")  # tests/unit/conftest.py


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    with contextlib.suppress(Exception):  # outside a hypothesis test there are no events
        event(f"exit {rc}")
    return rc, out.getvalue(), err.getvalue()


_BASE: dict = {}


def base_plan() -> dict:
    """A real dry run's plan (this host, 2 ranks), made once per working directory."""
    cwd = os.getcwd()
    if cwd not in _BASE:
        with open("train.py", "w") as f:
            f.write("")
        rc, out, err = run(["--dry-run", "--json", "--num_devices", "2", "-x", "FOO=bar", "train.py", "--lr", "1"])
        assert rc == 0, err
        _BASE[cwd] = json.loads(out)
    return json.loads(json.dumps(_BASE[cwd]))


def run_plan(plan) -> tuple[int, str, str]:
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "wb") as f:
        f.write(plan if isinstance(plan, bytes) else json.dumps(plan).encode("utf-8", "surrogatepass"))
    try:
        return run(["run", "--dry-run", "--json", path])
    finally:
        os.unlink(path)


def assert_clean(rc, out, err):
    assert rc in (0, 2, 3), (rc, err)
    assert "Traceback" not in err and "internal error" not in err, err
    if rc == 2:
        assert out == "" and err.startswith("gaudi-launch: error: "), err


def fits(hint, value) -> bool:
    """Whether a JSON value has the type a JobSpec field declares (bool is no number). Pure."""
    if typing.get_origin(hint) is typing.Union:
        return any(fits(h, value) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if typing.get_origin(hint) is list:
        return isinstance(value, list) and all(fits(typing.get_args(hint)[0], v) for v in value)
    if typing.get_origin(hint) is dict:
        return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    raise AssertionError(hint)


HINTS = option_types()
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, 1, 2, -1, 65535, 65536, 10**6, 2**63, 9 * 10**400]),  # 10**400: past a float
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "\0", "a\0b", "\ud800", "-x", "--help", "***", "train.py", "localhost", "all", "pdsh"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)


@SETTINGS
@given(changes=st.dictionaries(st.sampled_from(FIELDS + ["cwd", "turbo"]), json_values, min_size=1, max_size=3))
def test_fuzz_request(changes):
    plan = base_plan()
    plan["request"].update(changes)
    rc, out, err = run_plan(plan)
    assert_clean(rc, out, err)
    wrong = sorted(k for k, v in changes.items() if k in HINTS and not fits(HINTS[k], v))
    if "cwd" in changes and not (isinstance(changes["cwd"], str) and os.path.isabs(changes["cwd"])):
        wrong.append("cwd")
    if "turbo" in changes:  # an option this version does not know
        wrong.append("turbo")
    if wrong:  # a value the command line could never give, or no option at all: refused, naming it
        assert rc == 2, (changes, err)
        assert any(f"request.{k}" in err for k in wrong) or "does not know: turbo" in err, (changes, err)


def of_type(hint):
    """Values of a field's own type, with contents a command line could give or nearly (odd numbers, text)."""
    if typing.get_origin(hint) is typing.Union:
        return st.one_of(*[of_type(h) for h in typing.get_args(hint)])
    if hint is type(None):
        return st.none()
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.one_of(st.integers(-3, 70000), st.sampled_from([10**30, -(10**30), 2**63, 65536]))
    if hint is float:
        return st.one_of(st.floats(allow_nan=True), st.integers(-5, 10**6), st.just(9 * 10**400))
    if hint is str:
        return st.one_of(
            st.text(max_size=10),
            st.sampled_from(["localhost", "localhost:0", "all", "rank,host", "pdsh", "mpirun", "local", "-", ""]),
        )
    if typing.get_origin(hint) is list:
        return st.lists(of_type(typing.get_args(hint)[0]), max_size=3)
    return st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3)


@SETTINGS
@given(data=st.data())
def test_fuzz_request_typed(data):
    names = data.draw(st.lists(st.sampled_from(sorted(HINTS)), min_size=1, max_size=3, unique=True))
    plan = base_plan()
    plan["request"].update({n: data.draw(of_type(HINTS[n]), label=n) for n in names})
    assert_clean(*run_plan(plan))


@SETTINGS
@given(
    top=st.dictionaries(
        st.sampled_from(["request", "commands", "nodes", "env", "job_id", "master_port", "secret_digests", "x"]),
        json_values,
        min_size=1,
        max_size=2,
    )
)
def test_fuzz_plan_fields(top):
    plan = base_plan()
    plan.update(top)
    assert_clean(*run_plan(plan))


@SETTINGS
@given(
    data=st.one_of(
        st.binary(max_size=60),
        st.text(max_size=60).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.integers(min_value=1, max_value=5000).map(lambda n: b"[" * n + b"]" * n),
        st.integers(min_value=1, max_value=5000).map(lambda n: b'{"request": ' * n + b"1" + b"}" * n),
        st.sampled_from([b"1e999999", b"9" * 5000, b"NaN", b"\xef\xbb\xbf{}", b'{"request": {}}', b"\xff\xfe"]),
    )
)
def test_fuzz_plan_file(data):
    rc, out, err = run_plan(data)
    assert_clean(rc, out, err)
    assert rc == 2


def test_a_request_of_the_wrong_type_names_its_field():
    plan = base_plan()
    for field, value, said in [
        ("python", 3, "request.python: text, got 3"),
        ("num_devices", "2", "request.num_devices: a whole number or null, got '2'"),
        ("grace", True, "request.grace: a number, got True"),
        ("env", {"A": 1}, "request.env: NAME: text pairs, got {'A': 1}"),
        ("program", [], "request.program: the script"),
        ("hostfile", "h\0", "request.hostfile: holds a NUL character"),
        ("cwd", "/tmp\0x", "request.cwd: holds a NUL character"),
        ("num_devices", 0, "request.num_devices (--num_devices): must be at least 1, got 0"),
    ]:
        changed = base_plan()
        changed["request"][field] = value
        rc, out, err = run_plan(changed)
        assert rc == 2 and said in err, (field, err)
    assert run_plan(plan)[0] == 0


def test_reading_a_device_or_a_huge_file_is_bounded(tmp_path):
    start = time.monotonic()
    rc, out, err = run(["run", "/dev/zero"])
    assert rc == 2 and "/dev/zero: not a plan: larger than" in err, err
    assert time.monotonic() - start < 10
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (65 << 20))
    rc, out, err = run(["run", str(big)])
    assert rc == 2 and "not a plan: larger than" in err, err


@pytest.mark.parametrize("field", ["grace", "ssh_timeout", "hang_timeout", "start_timeout", "restart_backoff"])
def test_a_number_too_large_for_a_float_names_its_field(field):
    """Issue 36 item 7: the review's overflow in 5 places (math.isfinite of 10**400 raised OverflowError)."""
    plan = base_plan()
    plan["request"][field] = 9 * 10**400
    rc, out, err = run_plan(plan)
    assert_clean(rc, out, err)
    assert rc == 2 and f"request.{field}" in err, err
