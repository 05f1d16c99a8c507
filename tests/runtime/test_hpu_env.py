"""The Gaudi bridge's import-time settings: read from the script's flags and set by the worker before
the script's first line (``import torch`` loads the bridge since SynapseAI 1.18)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from gaudi_launch.process.worker import uses_hpu
from gaudi_launch.runtime.args import GaudiConfig, TrainingArguments
from gaudi_launch.runtime.hpu_env import (
    BF16_OPS_VAR,
    FP32_OPS_VAR,
    INT64_VAR,
    LAZY_VAR,
    hpu_env_for_script,
    prepare_hpu_env,
    script_hpu_flags,
)
from tests.standin.fixture import STAND_IN_DIR

ROOT = Path(__file__).resolve().parents[2]
OPS = {"use_torch_autocast": True, "autocast_bf16_ops": ["addmm", "bmm"], "autocast_fp32_ops": ["softmax"]}


@pytest.fixture
def config_dir(tmp_path):
    path = tmp_path / "gcfg"
    path.mkdir()
    (path / "gaudi_config.json").write_text(json.dumps(OPS))
    return str(path)


@pytest.mark.parametrize(
    "argv, lazy",
    [
        ([], None),  # no flag: the Gaudi software's own default (eager in current releases)
        (["--do_train", "--use_lazy_mode"], "1"),
        (["--use_lazy_mode", "false"], "0"),
        (["--no_use_lazy_mode"], "0"),
        (["--torch_compile", "--output_dir", "x"], "0"),
        (["-h"], None),  # the script's own help: not ours to print
        (["--bf16", "not-a-bool"], None),  # unreadable: defaults, the script reports its own errors
    ],
)
def test_lazy_mode_follows_the_scripts_flags(argv, lazy, capsys):
    expected = {LAZY_VAR: lazy} if lazy else {}
    if "--torch_compile" in argv:
        expected[INT64_VAR] = "1"  # as optimum-habana's compiled runs (test_stand_in_fast_ddp_graphs.py)
    assert hpu_env_for_script(argv, {}, None) == expected
    assert capsys.readouterr() == ("", "")


def test_the_users_own_lazy_mode_wins():
    assert hpu_env_for_script(["--torch_compile"], {LAZY_VAR: "1"}, None) == {INT64_VAR: "1"}


def test_op_lists_from_the_scripts_gaudi_config_go_to_the_job_dir(config_dir, tmp_path):
    job_dir = tmp_path / "job"
    env = hpu_env_for_script(["--bf16", "--gaudi_config_name", config_dir, "--learning_rate", "1e-3"], {}, str(job_dir))
    assert LAZY_VAR not in env
    assert Path(env[BF16_OPS_VAR]).parent == job_dir and Path(env[FP32_OPS_VAR]).parent == job_dir
    assert Path(env[BF16_OPS_VAR]).read_text() == "addmm\nbmm\n"
    assert Path(env[FP32_OPS_VAR]).read_text() == "softmax\n"


def test_op_lists_as_optimum_habana_writes_them(config_dir):
    # use_torch_autocast turns autocast on without --bf16; DeepSpeed and cpu_amp get no lists.
    assert set(hpu_env_for_script(["--gaudi_config_name", config_dir], {}, None)) == {BF16_OPS_VAR, FP32_OPS_VAR}
    assert hpu_env_for_script(["--gaudi_config_name", config_dir, "--deepspeed", "ds.json"], {}, None) == {}
    assert (
        hpu_env_for_script(
            ["--bf16", "--gaudi_config_name", config_dir, "--half_precision_backend", "cpu_amp"], {}, None
        )
        == {}
    )
    assert hpu_env_for_script(["--bf16", "--gaudi_config_name", "/nonexistent"], {}, None) == {}
    # A shipped name resolves without the Hub; Habana/gpt2 lists no ops.
    assert hpu_env_for_script(["--bf16", "--gaudi_config_name", "Habana/gpt2"], {}, None) == {}
    # Lists the user already set stand.
    assert hpu_env_for_script(["--bf16", "--gaudi_config_name", config_dir], {BF16_OPS_VAR: "/mine"}, None).keys() == {
        FP32_OPS_VAR
    }


def test_script_flags_are_read_like_the_scripts_own_parser():
    flags = script_hpu_flags(["--bf16=true", "--gaudi_config_name=Habana/gpt2", "--other", "1"])
    assert (flags.bf16, flags.gaudi_config_name, flags.use_lazy_mode, flags.torch_compile) == (
        True,
        "Habana/gpt2",
        None,
        False,
    )
    assert script_hpu_flags(["--gaudi_config_name"]) is None  # missing value


def test_prepare_hpu_env_keeps_settings_already_in_place(hpu_stand_in, config_dir):
    args, cfg = TrainingArguments(bf16=True, use_lazy_mode=True), GaudiConfig.from_pretrained(config_dir)
    first = prepare_hpu_env(args, cfg)
    assert set(first) == {LAZY_VAR, BF16_OPS_VAR, FP32_OPS_VAR}
    import habana_frameworks.torch.core  # noqa: F401  the bridge is loaded now, as after `import torch`

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prepare_hpu_env(args, cfg) == {}  # the runtime's second call: nothing to redo
    os.environ.pop(LAZY_VAR)
    with pytest.warns(
        UserWarning, match="already imported: PT_ENABLE_INT64_SUPPORT, PT_HPU_LAZY_MODE cannot take effect now"
    ):
        assert prepare_hpu_env(TrainingArguments(bf16=True, torch_compile=True), cfg) == {}
    assert LAZY_VAR not in os.environ and INT64_VAR not in os.environ  # left as the bridge found them


def test_uses_hpu_only_where_the_stack_is_found(monkeypatch):
    assert not uses_hpu({})  # this machine has no Gaudi stack
    monkeypatch.syspath_prepend(STAND_IN_DIR)
    assert uses_hpu({}) and uses_hpu({"GAUDI_LAUNCH_DEVICE": "hpu"})
    assert not uses_hpu({"GAUDI_LAUNCH_DEVICE": "cpu"})


SCRIPT = textwrap.dedent("""
    import json, os, sys
    import habana_frameworks.torch.core  # what `import torch` does on SynapseAI >= 1.18
    from habana_frameworks import _calls
    seen = [d for n, d in _calls if n == "core.import"][0]
    print(json.dumps({"seen": seen, "argv": sys.argv[1:]}))
""")


def test_stand_in_worker_sets_the_bridge_env_before_the_scripts_first_import(tmp_path, config_dir):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    job = f"t{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PT_HPU_")}
    env.update(PYTHONPATH=os.pathsep.join([STAND_IN_DIR, str(ROOT)]), GAUDI_LAUNCH_JOB_ID=job, TMPDIR=str(tmp_path))
    argv = ["--bf16", "--gaudi_config_name", config_dir, "--use_lazy_mode", "false"]
    out = subprocess.run(
        [sys.executable, "-m", "gaudi_launch.process.worker", str(script), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["seen"]["PT_HPU_LAZY_MODE"] == "0"
    assert got["seen"]["op_lists"] == {BF16_OPS_VAR: "addmm\nbmm\n", FP32_OPS_VAR: "softmax\n"}
    assert all(
        os.path.dirname(got["seen"][var]) == str(tmp_path / f"gaudi-launch-{job}")
        for var in (BF16_OPS_VAR, FP32_OPS_VAR)
    )
    assert got["argv"] == argv  # the script's argv untouched
    # The rank's op lists go when it ends; what stays is the job's (here empty) compiled-graph cache, shared by
    # the job's ranks on this host until the launcher's teardown (or the next start here) removes the directory.
    left = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / f"gaudi-launch-{job}").rglob("*"))
    assert left == [f"gaudi-launch-{job}/recipe-cache"]


PLAIN_TORCH_SCRIPT = textwrap.dedent("""
    import json
    import torch, torch.distributed as dist
    dist.init_process_group("hccl")  # no habana import: a script written for torchrun
    t = torch.tensor([dist.get_rank() + 1.0]).to("hpu")  # hccl serves hpu tensors only
    dist.all_reduce(t)
    from habana_frameworks import _calls
    print(json.dumps({"sum": t.item(), "calls": [n for n, _ in _calls]}))
""")


def test_stand_in_worker_registers_hccl_for_a_plain_torch_script(tmp_path):
    import socket

    script = tmp_path / "plain.py"
    script.write_text(PLAIN_TORCH_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("PT_HPU_")}
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            PYTHONPATH=os.pathsep.join([STAND_IN_DIR, str(ROOT)]),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "gaudi_launch.process.worker", str(script)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for proc, (out, err) in zip(procs, outs):
        assert proc.returncode == 0, err
        got = json.loads(out.strip().splitlines()[-1])
        assert got["sum"] == 3.0
        # Registered by the worker before the script ran, then used by its init_process_group.
        calls = [c for c in got["calls"] if c in ("bridge.load", "hccl.import", "hccl.create")]
        assert calls == ["bridge.load", "hccl.import", "hccl.create"]


def test_worker_imports_no_torch_off_gaudi(tmp_path):
    script = tmp_path / "light.py"
    script.write_text("import sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(ROOT), WORLD_SIZE="2", RANK="0")
    out = subprocess.run(
        [sys.executable, "-m", "gaudi_launch.process.worker", str(script), "--bf16"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_stand_in_worker_that_cannot_get_its_job_directory_stops_before_the_script(tmp_path, config_dir):
    # Issue 36 item 4: a rank without its job directory would run without the user's bf16 op lists and
    # recipe cache; it stops (exit 2) saying what is in the way, never running the script without them.
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PT_HPU_")}
    env.update(PYTHONPATH=os.pathsep.join([STAND_IN_DIR, str(ROOT)]), GAUDI_LAUNCH_JOB_ID="j1", TMPDIR=str(tmp_path))
    (tmp_path / "gaudi-launch-j1").write_text("a file where the job's directory should be")
    out = subprocess.run(
        [sys.executable, "-m", "gaudi_launch.process.worker", str(script), "--bf16", "--gaudi_config_name", config_dir],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "ran" not in out.stdout
    assert "exists and is not a directory" in out.stderr and "will not run without its autocast op lists" in out.stderr
    assert "Traceback" not in out.stderr
