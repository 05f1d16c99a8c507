"""``--config job.yaml``: gaudi_launch.inputs.config.load_config and its use by the command line."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.config import load_config, normalize_key
from tests.helpers import job_env
from tests.unit.cli_helpers import plan_of, run_cli, user_error

pytestmark = pytest.mark.usefixtures("isolated")  # tests/unit/conftest.py


def job(tmp_path: Path, text: str, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def load_error(path: str) -> UserError:
    with pytest.raises(UserError) as info:
        load_config(path)
    return info.value


# ----------------------------------------------------------------------------- load_config


def test_load_config_names_values_and_lines(tmp_path):
    path = job(
        tmp_path,
        "# a job\nnum-devices: 2\n\n--master_port: 29600\nenv: {A: '1'}\nscript: train.py\nscript_args: [--lr, 1e-4]\n",
    )
    assert load_config(path) == [
        ("num_devices", 2, f"{path}:2"),
        ("master_port", 29600, f"{path}:4"),
        ("env", {"A": "1"}, f"{path}:5"),
        ("script", "train.py", f"{path}:6"),
        ("script_args", ["--lr", "1e-4"], f"{path}:7"),
    ]


@pytest.mark.parametrize(
    "key, name",
    [
        ("num_gpus", "num_devices"),
        ("nproc_per_node", "num_devices"),
        ("num-devices", "num_devices"),
        ("hostfile_path", "hostfile"),
        ("training_script", "script"),
        ("script", "script"),
        ("args", "script_args"),
        ("training_script_args", "script_args"),
        ("script-args", "script_args"),
        ("--use-mpi", "use_mpi"),
        ("append-local-rank", "append_local_rank"),
        ("env_file", "env_file"),
    ],
)
def test_normalize_key(key, name):
    assert normalize_key(key) == name


def test_load_config_empty_and_comment_only(tmp_path):
    assert load_config(job(tmp_path, "")) == []
    assert load_config(job(tmp_path, "# nothing\n\n", "c.yaml")) == []


def test_load_config_values_are_plain_python(tmp_path):
    path = job(
        tmp_path, "use_mpi: true\ngrace: 2.5\nhostfile: null\nenv: [A=1, B=2]\ninclude: &x worker-0\nexclude: *x\n"
    )
    assert [(n, v) for n, v, _ in load_config(path)] == [
        ("use_mpi", True),
        ("grace", 2.5),
        ("hostfile", None),
        ("env", ["A=1", "B=2"]),
        ("include", "worker-0"),
        ("exclude", "worker-0"),
    ]


def test_load_config_duplicate_across_spellings(tmp_path):
    path = job(tmp_path, "num_devices: 2\nhostfile: h\nnum-devices: 3\n")
    err = load_error(path)
    assert err.where == f"{path}:3"
    assert "given twice" in err.message
    assert f"{path}:1" in err.message


def test_load_config_duplicate_via_alias(tmp_path):
    path = job(tmp_path, "nproc_per_node: 2\nnum_gpus: 3\n")
    assert load_error(path).where == f"{path}:2"


@pytest.mark.parametrize("text, line", [("- a\n- b\n", 1), ("just a string\n", 1), ("\n\n42\n", 3)])
def test_load_config_not_a_mapping(tmp_path, text, line):
    path = job(tmp_path, text)
    err = load_error(path)
    assert err.where == f"{path}:{line}"
    assert "mapping" in err.message
    assert err.hint


@pytest.mark.parametrize(
    "text, line",
    [
        ("num_devices: 2\nenv: [A=1\n", 3),
        ("num_devices: 2\n  bad: indent\n", 2),
        ("a: 1\n---\nb: 2\n", 2),
        ('a: "unterminated\n', 2),
    ],
)
def test_load_config_invalid_yaml_names_line(tmp_path, text, line):
    path = job(tmp_path, text)
    err = load_error(path)
    assert err.where == f"{path}:{line}"
    assert "not valid YAML" in err.message


def test_load_config_complex_key(tmp_path):
    path = job(tmp_path, "num_devices: 1\n? [a, b]\n: 1\n")
    err = load_error(path)
    assert err.where == f"{path}:2"


def test_load_config_missing_file(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    err = load_error(missing)
    assert err.where == missing
    assert "does not exist" in err.message


def test_load_config_not_utf8(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"num_devices: \xff\xfe\n")
    err = load_error(str(path))
    assert err.where == str(path)


def test_load_config_directory(tmp_path):
    err = load_error(str(tmp_path))
    assert err.where == str(tmp_path)


# ----------------------------------------------------------------------------- through the CLI


def test_config_dash_and_underscore_spellings(capsys, tmp_path):
    port = free_port()
    path = job(
        tmp_path,
        f'num_devices: 2\nmaster-port: {port}\nenv: {{A: "1", B: 2, C: null}}\n'
        "use-mpi: false\nscript: train.py\nscript_args: [--lr, '1e-4', 3, 'a b']\n",
    )
    plan = plan_of(capsys, "--config", path)
    assert plan["backend"] == "local"
    assert plan["world_size"] == 2
    assert plan["master_port"] == port
    assert job_env(plan["env"]) == {"A": "1", "B": "2", "C": ""}
    assert plan["program"] == ["train.py", "--lr", "1e-4", "3", "a b"]
    for cmd in plan["commands"]:
        assert cmd["argv"][-5:] == ["train.py", "--lr", "1e-4", "3", "a b"]
        assert cmd["env"]["MASTER_PORT"] == str(port)


def test_config_env_as_list(capsys, tmp_path):
    path = job(tmp_path, 'env: ["A=1", "B=x=y"]\nnum-devices: 1\nscript: t.py\n')
    plan = plan_of(capsys, "--config", path)
    assert job_env(plan["env"]) == {"A": "1", "B": "x=y"}


def test_config_aliases_and_flags(capsys, tmp_path):
    hf = tmp_path / "hf"
    hf.write_text("worker-0 slots=4\nworker-1 slots=4\n")
    path = job(
        tmp_path,
        f"hostfile_path: {hf}\nnproc_per_node: 2\nuse_deepspeed: true\n"
        "training_script: t.py\ntraining_script_args: [--bf16]\n",
    )
    plan = plan_of(capsys, "--config", path)
    assert plan["backend"] == "deepspeed"
    assert plan["world_size"] == 4
    assert [n["devices"] for n in plan["nodes"]] == [[0, 1], [0, 1]]
    assert plan["program"] == ["t.py", "--bf16"]


def test_config_module_and_append_local_rank(capsys, tmp_path):
    path = job(tmp_path, "module: true\nappend-local-rank: true\nnum_devices: 2\nscript: pkg.train\n")
    plan = plan_of(capsys, "--config", path)
    assert [c["argv"][-3:] for c in plan["commands"]] == [
        ["-m", "pkg.train", "--local_rank=0"],
        ["-m", "pkg.train", "--local_rank=1"],
    ]


def test_config_dry_run_key(capsys, tmp_path):
    path = job(tmp_path, "dry_run: true\nnum_devices: 1\nscript: t.py\n")
    rc, out, err = run_cli(capsys, "--config", path)
    assert rc == 0, err
    assert out.startswith("backend: local")


def test_command_line_wins_over_config(capsys, tmp_path):
    yaml_port, cli_port = free_port(), free_port()
    path = job(
        tmp_path, f"num_devices: 2\nmaster_port: {yaml_port}\nenv: {{A: yaml}}\nbackend: mpirun\nscript: train.py\n"
    )
    plan = plan_of(
        capsys, "--config", path, "--num_devices", "3", "--master_port", cli_port, "-x", "A=cli", "--backend", "local"
    )
    assert plan["world_size"] == 3
    assert plan["master_port"] == cli_port
    assert plan["env"]["A"] == "cli"
    assert plan["backend"] == "local"
    assert plan["program"] == ["train.py"]


def test_command_line_script_wins(capsys, tmp_path):
    path = job(tmp_path, "num_devices: 1\nscript: train.py\n")
    plan = plan_of(capsys, "--config", path, "other.py", "--x")
    assert plan["program"] == ["other.py", "--x"]


def test_command_line_script_drops_config_script_args(capsys, tmp_path):
    path = job(tmp_path, "num_devices: 1\nscript: train.py\nscript_args: [--lr, '1']\n")
    plan = plan_of(capsys, "--config", path, "other.py")
    assert plan["program"] == ["other.py"]


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("num_devices: 2\nnum_widgets: 3\n", 2, ["unknown option 'num_widgets'"]),
        ("num_devices: two\n", 1, ["num_devices"]),
        ("script: t.py\nscript_args: --lr 1\n", 2, ["script_args"]),
        ("version: true\n", 1, ["unknown option 'version'"]),
        ("config: other.yaml\n", 1, ["unknown option 'config'"]),
        ("help: true\n", 1, ["unknown option 'help'"]),
        ("num_devices: 2\nnum-devices: 3\n", 2, ["given twice"]),
        ("- num_devices\n", 1, ["mapping"]),
        ("num_devices: 2\nenv: {A: 1\n", 3, ["not valid YAML"]),
        ("use_mpi: maybe\n", 1, ["use_mpi"]),
    ],
)
def test_config_errors_name_file_and_line(capsys, tmp_path, text, line, words):
    path = job(tmp_path, text)
    err = user_error(capsys, "--dry-run", "--config", path)
    assert f"{path}:{line}: " in err
    for w in words:
        assert w in err


def test_config_missing_file(capsys, tmp_path):
    missing = str(tmp_path / "missing.yaml")
    err = user_error(capsys, "--dry-run", "--config", missing, "train.py")
    assert missing in err
    assert "does not exist" in err


def test_config_value_errors_come_from_planning(capsys, tmp_path):
    path = job(tmp_path, "backend: bogus\nscript: t.py\n")
    err = user_error(capsys, "--dry-run", "--config", path)
    assert "--backend" in err and "bogus" in err


@pytest.mark.parametrize(
    "text", ["num_devices: !foo 3\n", "num_devices: !!int two\n", "script: !!python/name:os.system\n"]
)
def test_config_bad_tag_is_user_error(capsys, tmp_path, text):
    path = job(tmp_path, text)
    err = user_error(capsys, "--dry-run", "--config", path, "train.py")
    assert f"{path}:1: " in err


@pytest.mark.parametrize("value", ["2.5", "true"])
def test_config_non_integer_for_int_option_is_error(capsys, tmp_path, value):
    path = job(tmp_path, f"num_devices: {value}\nscript: t.py\n")
    err = user_error(capsys, "--dry-run", "--config", path)
    assert f"{path}:1: " in err


def test_config_list_for_int_option_is_error(capsys, tmp_path):
    path = job(tmp_path, "script: t.py\nmaster_port: [1, 2]\n")
    err = user_error(capsys, "--dry-run", "--config", path)
    assert f"{path}:2: " in err
    assert "master_port" in err


def test_config_mapping_for_string_option_is_error(capsys, tmp_path):
    path = job(tmp_path, "script: t.py\nhostfile: {a: 1}\n")
    err = user_error(capsys, "--dry-run", "--config", path)
    assert f"{path}:2: " in err


def test_config_json_key(capsys, tmp_path):
    path = job(tmp_path, "dry_run: true\njson: true\nnum_devices: 1\nscript: t.py\n")
    rc, out, err = run_cli(capsys, "--config", path)
    assert rc == 0, err
    assert json.loads(out)["world_size"] == 1
