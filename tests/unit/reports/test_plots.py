"""gaudi-launch report: PNG plots of a run's metrics.jsonl and of benchmark JSONs, and its errors."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from gaudi_launch import cli
from gaudi_launch.reports import plots as report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def needs_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        msg = "matplotlib is not installed (pip install '.[dev]')"
        if os.environ.get("CI") == "true":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


def write_metrics(run_dir, rows) -> str:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def train_row(step, loss):
    return {
        "step": step,
        "loss": loss,
        "learning_rate": 1e-3 * (1 - step / 100),
        "train_samples_per_second": 500.0 + step,
        "train_tokens_per_second": 32000.0 + 64 * step,
        "train_steps_per_second": 30.0,
        "train_runtime": step / 30,
        "measured_steps": step - 3,
        "memory_allocated (GB)": 0.38,
        "max_memory_allocated (GB)": 0.39,
        "total_memory_available (GB)": 23.54,
    }


RUN = (
    [{"step": -1, "eval_loss": 6.9, "perplexity": 1000.0}]
    + [train_row(s, 6.3 - s / 100) for s in range(10, 90, 10)]
    + [
        {
            "step": 81,
            "train_samples_per_second": 538.0,
            "train_tokens_per_second": 34455.0,
            "train_steps_per_second": 33.6,
            "train_runtime": 2.4,
            "measured_steps": 78,
            "train_loss": 6.1,
            "global_step": 81,
        },
        {"step": -1, "eval_loss": 5.9, "perplexity": 368.0},
    ]
)

TRAIN_BENCH = {
    "config": {"steps": 40, "warmup": 5, "batch": 8, "block": 64, "ranks": 2, "repeats": 3},
    "results": {
        "gaudi-launch Trainer, fast_ddp": {
            "samples_per_s": [540.0, 520.0, 560.0],
            "median": 540.0,
            "step_ms": 29.6,
            "ratio": 1.3,
        },
        "gaudi-launch Trainer, DDP": {
            "samples_per_s": [500.0, 490.0, 510.0],
            "median": 500.0,
            "step_ms": 32.0,
            "ratio": 1.2,
        },
        "transformers Trainer, DDP": {
            "samples_per_s": [415.0, 400.0, 420.0],
            "median": 415.0,
            "step_ms": 38.5,
            "ratio": 1.0,
        },
    },
}


def launch_entry(med, ratio):
    return {
        "label": "x",
        "seconds": [med * 0.9, med, med * 1.1],
        "median": med,
        "min": med * 0.9,
        "max": med * 1.1,
        "ratio": ratio,
    }


LAUNCH_BENCH = {
    "bench": "launch",
    "device": "cpu: test, 2 cores",
    "versions": {"torch": "2.13.0"},
    "git_revision": "abc1234",
    "config": {"ranks": 2, "repeats": 3, "cold_repeats": 5},
    "baseline": "mpirun (raw)",
    "results": {
        "1 host": {
            "gaudi-launch (local)": {**launch_entry(2.7, 0.9), "label": "gaudi-launch (local)"},
            "mpirun (raw)": {**launch_entry(3.0, 1.0), "label": "mpirun (raw)"},
            "torchrun": {"label": "torchrun", "error": "exit 1, 0/2 ranks reported OK"},
        },
        "2 hosts": {
            "gaudi-launch (local)": {"label": "gaudi-launch (local)", "skipped": "this host only"},
            "mpirun (raw)": {**launch_entry(4.8, 1.0), "label": "mpirun (raw)"},
        },
    },
    "start_up": {
        "python -c pass": {**launch_entry(0.02, 1.0), "over_python_ms": 0.0},
        "gaudi-launch --help": {**launch_entry(0.1, 5.0), "over_python_ms": 80.0},
    },
}

MFU_BENCH = {
    "bench": "mfu",
    "device": "cpu: test",
    "config": {"model": "small"},
    "peak": {
        "fp32": {"flops": 9.0e10, "size": 1024, "per_size": {"1024": 9.0e10}},
        "bf16": {"flops": 2.5e11, "size": 512, "per_size": {"512": 2.5e11}},
    },
    "training": {
        "fp32": {"flops": 4.5e10, "mfu": 0.5, "tokens_per_s": 7500.0},
        "bf16": {"flops": 5.0e10, "mfu": 0.2, "tokens_per_s": 8300.0},
    },
}


def assert_png(path, min_bytes=5000):
    assert os.path.isfile(path), path
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert len(data) > min_bytes, f"{path}: only {len(data)} bytes"


def test_run_dir_gives_loss_throughput_memory_plots_in_run_dir_plots(tmp_path, capsys):
    needs_matplotlib()
    run = tmp_path / "run"
    write_metrics(run, RUN)
    assert report.main([str(run)]) == 0
    printed = capsys.readouterr().out.split()
    for name in ("loss.png", "throughput.png", "memory.png", "learning_rate.png"):
        path = str(run / "plots" / name)
        assert_png(path)
        assert path in printed


def test_metrics_file_and_out_dir_through_the_cli(tmp_path, capsys):
    needs_matplotlib()
    path = write_metrics(tmp_path / "run", RUN)
    out = tmp_path / "figs" / "nested"
    assert cli.main(["report", path, "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["learning_rate.png", "loss.png", "memory.png", "report.html", "throughput.png"]
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 4  # one file, plots inline
    assert str(out / "loss.png") in capsys.readouterr().out


def test_nan_loss_and_a_half_written_last_line_still_plot(tmp_path, capsys):
    needs_matplotlib()
    path = write_metrics(
        tmp_path / "run", [train_row(10, 6.0), {**train_row(20, 0), "loss": "nan"}, train_row(30, 5.0)]
    )
    with open(path, "a") as f:
        f.write('{"step": 40, "loss": 4.')  # a killed job's last line
    assert report.main([path, "--out", str(tmp_path / "o")]) == 0
    assert "skipped 1 unreadable line" in capsys.readouterr().err
    assert_png(str(tmp_path / "o" / "loss.png"))


def test_only_the_last_of_several_runs_in_one_file_is_plotted():
    rows = RUN + [{**r, "loss": r["loss"] - 1} if "loss" in r else r for r in RUN]
    parts = report.split_rows(rows)
    assert parts["runs"] == 2 and parts["left_out"] == 1
    assert [r["loss"] for r in parts["train"]] == [pytest.approx(5.3 - s / 100) for s in range(10, 90, 10)]
    assert [(x, e["eval_loss"]) for x, e in parts["evals"]] == [(0, 6.9), (81, 5.9)]


def test_a_resumed_run_continues_the_curve():
    rows = (
        [train_row(s, 6.0 - s / 100) for s in (10, 20, 30)]  # crashed after step 30, checkpoint at 20
        + [train_row(s, 7.0 - s / 100) for s in (30, 40)]
        + [{"step": 40, "train_loss": 6.5, "global_step": 40, "train_samples_per_second": 500.0}]
    )
    parts = report.split_rows(rows)
    assert parts["left_out"] == 0
    assert [(r["step"], r["loss"]) for r in parts["train"]] == [(10, 5.9), (20, 5.8), (30, 6.7), (40, 6.6)]
    assert parts["summaries"][-1]["train_loss"] == 6.5


def test_restart_marks_are_not_training_rows_and_are_drawn(tmp_path, capsys):
    # --max-restarts: crashed after step 30, the Trainer resumed from checkpoint-20 and marked it
    rows = (
        [train_row(s, 6.0 - s / 100) for s in (10, 20, 30)]
        + [{"step": 20, "restart": 1}]
        + [train_row(s, 6.0 - s / 100) for s in (30, 40)]
    )
    parts = report.split_rows(rows)
    assert [(r["step"], r["loss"]) for r in parts["train"]] == [(10, 5.9), (20, 5.8), (30, 5.7), (40, 5.6)]
    assert parts["restarts"] == [20] and parts["left_out"] == 0
    needs_matplotlib()
    written = report.plot_run(rows, str(tmp_path), "run")
    assert os.path.join(str(tmp_path), "loss.png") in written


@pytest.mark.parametrize(
    "name,data,files",
    [
        ("bench_train.json", TRAIN_BENCH, ["bench_train.png"]),
        ("launch.json", LAUNCH_BENCH, ["launch.png", "launch-start-up.png"]),
        ("mfu.json", MFU_BENCH, ["mfu.png"]),
    ],
)
def test_bench_json_is_recognised_by_content_and_drawn_as_bars(tmp_path, capsys, name, data, files):
    needs_matplotlib()
    src = tmp_path / name
    src.write_text(json.dumps(data))
    assert report.main([str(src)]) == 0  # default: plots/ beside the file
    printed = capsys.readouterr().out.split()
    for f in files:
        assert_png(str(tmp_path / "plots" / f))
        assert str(tmp_path / "plots" / f) in printed


def test_bench_kind_detection():
    assert report.bench_kind(TRAIN_BENCH) == "train"
    assert report.bench_kind(LAUNCH_BENCH) == "launch"
    assert report.bench_kind(MFU_BENCH) == "mfu"
    assert report.bench_kind({"results": {"a": {"x": 1}}}) is None
    assert report.bench_kind([1, 2]) is None


@pytest.mark.parametrize(
    "case,message",
    [
        ("missing", "no such file or directory"),
        ("no-metrics", "no metrics.jsonl here"),
        ("empty", "no metrics in it"),
        ("garbage", "no metrics in it"),
        ("unknown-json", "not a benchmark result this knows"),
        ("bad-json", "not JSON"),
    ],
)
def test_bad_input_is_a_clear_message_and_exit_2(tmp_path, capsys, case, message):
    src = tmp_path / "run"
    if case == "no-metrics":
        src.mkdir()
    elif case == "empty":
        write_metrics(src, [])
    elif case == "garbage":
        src.mkdir()
        (src / "metrics.jsonl").write_text("not json\n[1, 2]\n\n")
    elif case == "unknown-json":
        src = tmp_path / "x.json"
        src.write_text('{"hello": 1}')
    elif case == "bad-json":
        src = tmp_path / "x.json"
        src.write_text('{"hello": ')
    assert report.main([str(src), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gaudi-launch report: error: ")
    assert message in err
    assert not (tmp_path / "out").exists()


def test_missing_matplotlib_says_how_to_install_and_exits_2(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    write_metrics(run, RUN)
    for mod in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, mod, None)  # `import` then raises ImportError
    assert report.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert "matplotlib is not installed" in err
    assert "pip install 'gaudi-launch[report]'" in err
    assert not (run / "plots").exists()


def test_usage_errors_exit_2_through_the_cli(capsys):
    assert cli.main(["report"]) == 2
    assert "RUN_DIR" in capsys.readouterr().err
    assert cli.main(["report", "--help"]) == 0
    assert "metrics.jsonl" in capsys.readouterr().out


def test_the_launcher_imports_neither_matplotlib_nor_torch():
    code = (
        "import sys\nfrom gaudi_launch import cli\n"
        "rc = cli.main(['--help'])\n"
        "bad = [m for m in ('matplotlib', 'torch', 'gaudi_launch.reports.plots') if m in sys.modules]\n"
        "print('LOADED', bad)\nsys.exit(rc)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "LOADED []" in res.stdout


# transformers' Trainer writes trainer_state.json; its log_history is what a run of it looked like.
HF_STATE = {
    "log_history": [
        {"epoch": 0.5, "learning_rate": 4e-05, "loss": 6.9, "step": 10},
        {"epoch": 1.0, "eval_loss": 6.2, "eval_runtime": 1.0, "step": 20},
        {"epoch": 1.0, "learning_rate": 3e-05, "loss": 6.1, "step": 20},
        {
            "epoch": 1.0,
            "step": 20,
            "total_flos": 1.0,
            "train_loss": 6.5,
            "train_runtime": 9.0,
            "train_samples_per_second": 35.5,
            "train_steps_per_second": 2.2,
        },
    ]
}


def test_transformers_trainer_state_is_plotted_too(tmp_path, capsys):
    needs_matplotlib()
    ckpt = tmp_path / "run" / "checkpoint-20"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps(HF_STATE))
    rows = report.read_trainer_state(str(ckpt / "trainer_state.json"))
    parts = report.split_rows(rows)
    assert [r["step"] for r in parts["train"]] == [10, 20]
    assert parts["evals"][0][0] == 20 and parts["evals"][0][1]["perplexity"] == pytest.approx(math.exp(6.2))
    assert parts["summaries"][-1]["train_samples_per_second"] == 35.5
    assert report.main([str(tmp_path / "run")]) == 0  # the newest checkpoint's state, found by itself
    assert_png(str(tmp_path / "run" / "plots" / "loss.png"))


def test_cpu_memory_is_named_as_the_process_rss():
    cpu = [{"step": 1, "device": "cpu", "memory_allocated (GB)": 0.4}]
    assert report._memory_label("memory_allocated (GB)", cpu) == "RSS (process)"
    assert report._memory_label("max_memory_allocated (GB)", cpu) == "RSS (process, peak)"
    assert report._memory_label("memory_allocated (GB)", [{"step": 1, "device": "hpu"}]) == "memory_allocated"
