"""The benchmarks in scripts/bench/ run end to end, each in a tiny version (seconds, not minutes):
every configuration gets its row in the printed table and its figures in the JSON. Nothing here
asserts on speed: only that figures exist, are positive, and have their keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import run_whole

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "scripts", "bench")

LAUNCH_ROWS = [
    "gaudi-launch (local)",
    "gaudi-launch --backend mpirun",
    "gaudi-launch mpirun --no-ssh-check",
    "gaudi-launch --backend deepspeed",
    "mpirun (raw)",
    "torchrun",
    "deepspeed",
]
# Rows that cannot run on one host alone; the rest must be measured unless their tool is missing.
LAUNCH_LOCAL_SKIPS = {"gaudi-launch mpirun --no-ssh-check", "gaudi-launch --backend deepspeed"}
START_UP_ROWS = [
    "python -c pass",
    "gaudi-launch --help",
    "gaudi-launch --dry-run --num_devices 2 x.py",
    "python -c 'import torch' (reference)",
]
TRAIN_ROWS = [
    "gaudi-launch Trainer, fast_ddp",
    "gaudi-launch Trainer, DDP",
    "transformers Trainer, DDP",
    "plain loop, DDP (no trainer)",
]


def run_bench(script, *args, timeout=240):
    res = run_whole([sys.executable, os.path.join(BENCH, script), *args], cwd=ROOT, timeout=timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def table_rows(stdout, names):
    """The names with a table line starting with them (after the hosts column, if any)."""
    lines = [line.split(None, 1)[1] if line[:1].isdigit() else line for line in stdout.splitlines() if line.strip()]
    return [n for n in names if any(line.startswith(n + " ") for line in lines)]


def assert_environment(data):
    assert data["device"]
    assert set(data["versions"]) >= {"torch", "openmpi", "deepspeed", "python"}
    assert data["versions"]["torch"] and data["versions"]["python"]
    assert "git_revision" in data


def positive(x):
    return isinstance(x, (int, float)) and x > 0


def report(path, out):
    """gaudi-launch report draws each benchmark's JSON (when matplotlib is there)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    res = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "report", str(path), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    paths = res.stdout.split()
    pngs, html = paths[:-1], paths[-1]
    assert pngs and all(p.endswith(".png") and os.path.getsize(p) > 1000 for p in pngs)
    assert html.endswith("report.html") and open(html).read().count("data:image/png;base64,") == len(pngs)


def test_bench_launch_tiny(tmp_path):
    # All local launchers including DeepSpeed's (its runner alone takes ~10 s here: worth covering,
    # since its command line is the one most likely to change under us).
    out = tmp_path / "launch.json"
    stdout = run_bench(
        "bench_launch.py",
        "--repeats",
        "1",
        "--warmup-rounds",
        "0",
        "--ranks",
        "2",
        "--cold-repeats",
        "1",
        "--json",
        str(out),
    )
    assert table_rows(stdout, LAUNCH_ROWS) == LAUNCH_ROWS, stdout
    assert table_rows(stdout, START_UP_ROWS) == START_UP_ROWS, stdout
    data = json.loads(out.read_text())
    assert data["bench"] == "launch"
    assert_environment(data)
    table = data["results"]["1 host"]
    assert list(table) == LAUNCH_ROWS
    for name, entry in table.items():
        if "skipped" in entry:
            assert name in LAUNCH_LOCAL_SKIPS or entry["skipped"].startswith("not installed"), (name, entry)
            continue
        assert "error" not in entry, (name, entry)
        assert len(entry["seconds"]) == 1 and positive(entry["median"]), (name, entry)
        assert entry["min"] <= entry["median"] <= entry["max"]
        assert positive(entry["ratio"]), (name, entry)
    assert table["mpirun (raw)"].get("ratio") == pytest.approx(1.0) or "skipped" in table["mpirun (raw)"]
    for name in START_UP_ROWS:
        entry = data["start_up"][name]
        assert positive(entry["median"]) and positive(entry["ratio"]), (name, entry)
    report(out, tmp_path / "plots")


def test_bench_mfu_tiny(tmp_path):
    out = tmp_path / "mfu.json"
    stdout = run_bench(
        "bench_mfu.py",
        "--device",
        "cpu",
        "--model",
        "tiny",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--batch",
        "4",
        "--block",
        "32",
        "--repeats",
        "1",
        "--sizes",
        "64,128",
        "--trials",
        "1",
        "--min-time",
        "0.01",
        "--json",
        str(out),
    )
    assert table_rows(stdout, ["fp32", "bf16", "bf16 autocast"]) == ["fp32", "bf16", "bf16 autocast"], stdout
    assert "MFU" in stdout
    data = json.loads(out.read_text())
    assert data["bench"] == "mfu"
    assert_environment(data)
    for prec in ("fp32", "bf16"):
        peak, train = data["peak"][prec], data["training"][prec]
        assert positive(peak["flops"]) and peak["size"] in (64, 128)
        assert set(peak["per_size"]) == {"64", "128"}
        for key in ("tokens_per_s", "samples_per_s", "step_ms", "params", "flops", "mfu"):
            assert positive(train[key]), (prec, key, train)
        assert train["flops"] == pytest.approx(6 * train["params"] * train["tokens_per_s"])
        assert train["mfu"] == pytest.approx(train["flops"] / peak["flops"])
    report(out, tmp_path / "plots")


def test_bench_train_tiny(tmp_path):
    out = tmp_path / "train.json"
    stdout = run_bench("bench_train.py", "--steps", "6", "--warmup", "2", "--json", str(out))
    assert table_rows(stdout, TRAIN_ROWS) == TRAIN_ROWS, stdout
    data = json.loads(out.read_text())
    assert list(data["results"]) == TRAIN_ROWS
    for name, entry in data["results"].items():
        assert entry["samples_per_s"] and all(positive(x) for x in entry["samples_per_s"]), (name, entry)
        assert positive(entry["median"]) and positive(entry["step_ms"]) and positive(entry["ratio"])
    report(out, tmp_path / "plots")


def test_bench_seed_prints_the_guides_table_and_writes_json(tmp_path):
    path = tmp_path / "seed.json"
    out = run_bench(
        "bench_seed.py",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--batch-scale",
        "0.125",
        "--workloads",
        "mlm,t5",
        "--json",
        str(path),
        timeout=600,
    )
    assert "Gaudi2 1580.2, A100 981.6 (BERT-Large, 8 devices)" in out  # the guide's figures beside ours
    data = json.loads(path.read_text())
    assert_environment(data["environment"])
    assert [(r["workload"], r["batch_per_device"]) for r in data["rows"]] == [("mlm", 4), ("mlm", 8), ("t5", 1)]
    assert all(
        positive(r["ours_samples_per_s"])
        and positive(r["transformers_samples_per_s"])
        and positive(r["ratio"])
        and r["devices"] == 2
        for r in data["rows"]
    )
    # the plain loop (no trainer) and its ratio to transformers' Trainer
    assert all(
        positive(r["plain_loop_samples_per_s"])
        and r["plain_ratio"] == pytest.approx(r["plain_loop_samples_per_s"] / r["transformers_samples_per_s"])
        for r in data["rows"]
    )
    # BERT's rows: our runtime with the masked-LM head on every position too, as transformers runs it
    for r in data["rows"]:
        if r["workload"] == "mlm":
            assert positive(r["ours_every_position_samples_per_s"])
            assert r["every_position_ratio"] == pytest.approx(
                r["ours_every_position_samples_per_s"] / r["transformers_samples_per_s"]
            )
            assert set(r["runs"]) == {"ours", "transformers", "plain loop", "ours, head on every position"}
        else:
            assert "ours_every_position_samples_per_s" not in r and "ours, head on every position" not in r["runs"]
    report(path, tmp_path / "plots")


def test_bench_seed_torch_compile_adds_our_compiled_column(tmp_path):
    path = tmp_path / "seed.json"
    out = run_bench(
        "bench_seed.py",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--batch-scale",
        "0.25",
        "--workloads",
        "clm",
        "--torch_compile",
        "--json",
        str(path),
        timeout=600,
    )
    assert "compiled" in out.splitlines()[2]  # the table's header
    (row,) = json.loads(path.read_text())["rows"]
    assert positive(row["ours_compiled_samples_per_s"])
    assert row["compiled_ratio"] == pytest.approx(
        row["ours_compiled_samples_per_s"] / row["transformers_samples_per_s"]
    )
    assert set(row["runs"]) == {"ours", "transformers", "plain loop", "ours, compiled"}  # every run, not only medians


SCALE_ROWS = ["gaudi-launch, tree", "gaudi-launch, flat", "gaudi-launch, tree, three passes", "mpirun (raw)"]


def test_bench_scale_tiny(tmp_path):
    """bench_scale.py on 2 and 3 hosts of its namespace cluster, one round: the tree, the flat path and raw
    mpirun, a slope each, the memory, one level of the tree, the per-host costs, the model to 4,096 hosts
    with its crossover, and the targets (needs what the cluster tests need)."""
    from tests.cluster.conftest import require_cluster_support

    require_cluster_support()
    out = run_bench(
        "bench_scale.py",
        "--hosts",
        "2,3",
        "--repeats",
        "1",
        "--warmup-rounds",
        "0",
        "--no-plans",
        "--markdown",
        "--cpu-by-process",
        "3",
        "--json",
        str(tmp_path / "scale.json"),
        timeout=600,
    )
    assert table_rows(out, SCALE_ROWS) == SCALE_ROWS
    assert (  # docs/performance.md's table
        "| hosts | gaudi-launch, tree | gaudi-launch, flat | gaudi-launch, tree, three passes | mpirun (raw) |" in out
    )
    # the report again from the saved result, without a cluster
    again = run_bench("bench_scale.py", "--from-json", str(tmp_path / "scale.json"), "--markdown")
    assert again.splitlines()[2:] == out.splitlines()[2 : len(again.splitlines())]
    data = json.loads((tmp_path / "scale.json").read_text())
    assert_environment(data)
    assert list(data["launches"]) == SCALE_ROWS  # the core rows only, without --all-rows
    assert data["config"]["repeats"] == data["config"]["repeats_asked"] == 1
    for name in SCALE_ROWS:
        assert all(positive(data["launches"][name][n]["median"]) for n in ("2", "3")), name
        assert name in data["fits"]
    # every launch ran a Python laid out as a wheel install (no editable finder at each start), byte-compiled
    assert data["python"]["editable_finder"] is False and data["python"]["byte_compiled"] is True
    assert data["python"]["interpreter"] != sys.executable
    assert data["launches"]["gaudi-launch, tree"]["3"]["command"].startswith(
        data["python"]["interpreter"] + " -m gaudi_launch"
    )
    assert "laid out as a wheel install" in out
    assert "--fan-out tree" in data["launches"]["gaudi-launch, tree"]["3"]["command"]
    assert "--fan-out flat" in data["launches"]["gaudi-launch, flat"]["3"]["command"]
    three = data["launches"]["gaudi-launch, tree, three passes"]["3"]["command"]
    assert "GAUDI_LAUNCH_TREE_PASSES=3" in three and "--fan-out tree" in three
    assert "--fan-out" not in data["launches"]["mpirun (raw)"]["3"]["command"]
    mem = data["memory"]
    assert mem["hosts"] == 3 and positive(mem["idle_pss_kib"]) and 0 < mem["lowest_available_kib"] <= mem["total_kib"]
    assert positive(data["costs"]["handshake"]) and positive(data["costs"]["mux_session"])
    assert positive(data["costs"]["rsh_agent"]) and positive(data["costs"]["tree_hop"])
    # one level of OpenMPI's tree: raw mpirun over a chain of 2 and 3 hosts (routed_radix 1)
    assert set(data["tree_level"]["chain_seconds"]) == {"2", "3"}
    assert data["costs"]["tree_level"] == data["tree_level"]["per_level"]
    # the launchers' own start-up, measured with host 0 alone
    costs = data["costs"]
    assert positive(costs["mpirun_fixed"]) and positive(costs["gaudi_launch_one_host"])
    assert costs["ours_fixed"] == pytest.approx(max(0.0, costs["gaudi_launch_one_host"] - costs["mpirun_fixed"]))
    assert "fixed parts (measured on host 0 alone)" in out
    predicted = data["model"]["predicted"]
    assert set(predicted) == {
        "mpirun (raw, tree spawn)",
        "gaudi-launch, flat",
        "gaudi-launch, tree",
        "gaudi-launch, tree, three passes",
    }
    # the one-pass gate's connections, measured: 512 hosts x 2 (first rank, last rank) on loopback, in the model
    assert data["gate"]["connections"] == 1024 and positive(data["gate"]["per_connection_cpu"])
    gate = costs["gate_connection_local_cpu"]
    assert gate == data["gate"]["per_connection_cpu"]
    assert f"per connection at the one-pass gate {gate * 1000:.2f} ms (one thread)" in out
    # the tree's one pass down the tree costs less than the three passes, but for the gate's thread, which
    # grows with the hosts (two connections a host)
    assert all(
        predicted["gaudi-launch, tree"][n] - int(n) * 2 * gate < predicted["gaudi-launch, tree, three passes"][n]
        for n in predicted["gaudi-launch, tree"]
    )
    assert all(set(by_n) == {"16", "64", "128", "1024", "4096"} for by_n in predicted.values())
    # the model's shape: raw mpirun's tree costs the same from 128 to 4,096 hosts (depth 2 at radix 64)
    # and the flat path grows with every host
    raw, flat = predicted["mpirun (raw, tree spawn)"], predicted["gaudi-launch, flat"]
    assert raw["128"] == pytest.approx(raw["4096"]) and flat["4096"] > flat["1024"] > flat["128"]
    crossover = data["model"]["crossover"]
    assert crossover is None or 2 <= crossover <= 8192
    assert "the tree is never slower than flat from" in out or "the tree stays slower than flat" in out
    assert [t["target"] for t in data["targets"]] == [
        "3 hosts: slope per host <= raw mpirun's",
        "1,024 hosts in the model: <= 2x raw mpirun",
    ]
    assert all(isinstance(t["met"], bool) for t in data["targets"])
    assert "1,024 hosts in the model: <= 2x raw mpirun" in out
    # where each launch's CPU goes, by process (accounting): the same ssh clients and daemons on both sides, our
    # Python beside them (3 rank bootstraps, a hop beside each of the 2 ssh, the launcher), none in raw mpirun's
    cpu = data["cpu_by_process"]
    assert cpu["hosts"] == 3 and list(cpu["rows"]) == ["gaudi-launch, tree", "mpirun (raw)"]
    ours, raw = (cpu["rows"][r]["per_launch"] for r in cpu["rows"])
    assert ours["ssh"]["processes"] == raw["ssh"]["processes"] == 2 and positive(raw["ssh"]["cpu"])
    assert ours["orted"]["processes"] == raw["orted"]["processes"] == 2
    assert ours["Python: rank bootstraps"]["processes"] == 3 and positive(ours["Python: rank bootstraps"]["cpu"])
    assert ours["Python: tree hops"]["processes"] == 2 and ours["Python: the launcher"]["processes"] == 1
    assert all(raw[role]["processes"] == 0 for role in raw if role.startswith("Python"))
    assert "| Python: rank bootstraps | " in out


def test_bench_launch_start_up_only_writes_its_json(tmp_path):
    out = tmp_path / "start-up.json"
    stdout = run_bench("bench_launch.py", "--start-up-only", "--cold-repeats", "1", "--json", str(out))
    assert table_rows(stdout, START_UP_ROWS) == START_UP_ROWS, stdout
    data = json.loads(out.read_text())
    assert data["results"] == {} and all(positive(data["start_up"][name]["median"]) for name in START_UP_ROWS)


HOST_COST_ROWS = ["probe", "bootstrap", "bare python rank", "bootstrap beyond bare python", "rsh agent"]


def test_bench_host_cost_measures_this_checkout_beside_a_revision(tmp_path):
    out = tmp_path / "host-cost.json"
    stdout = run_bench("bench_host_cost.py", "--repeats", "1", "--before", "HEAD", "--json", str(out))
    assert "per host beyond raw mpirun" in stdout and "this checkout" in stdout and "HEAD" in stdout, stdout
    figures = json.loads(out.read_text())["figures"]
    assert set(figures) == {"HEAD", "this checkout"}
    for by_row in figures.values():
        assert all(positive(by_row[row]) for row in ("probe", "bootstrap", "bare python rank", "rsh agent")), by_row
        assert by_row["per host beyond raw mpirun"] == pytest.approx(
            by_row["probe"] + by_row["bootstrap beyond bare python"] + by_row["rsh agent"]
        )
    assert table_rows(stdout, HOST_COST_ROWS) == HOST_COST_ROWS, stdout
