"""``gaudi-launch report SOURCE [--out DIR]``: PNG plots of a training run or of a benchmark result.

SOURCE is a run's output directory (its ``metrics.jsonl``, as the Trainer writes it), a
``metrics.jsonl`` file, or a benchmark JSON from ``scripts/bench/`` (bench_train.py, bench_launch.py,
bench_mfu.py; recognised by content). A run gives loss, throughput, memory (and learning-rate)
curves over the optimizer steps; a benchmark gives bar charts with each configuration's ratio
against its peer (transformers' Trainer, raw mpirun, ``python -c pass``, the measured matmul peak).

Plots go to --out (default: RUN_DIR/plots, or a ``plots`` directory beside a JSON file), drawn with
matplotlib's Agg canvas (no display needed); the paths written are printed. matplotlib is optional
(``pip install 'gaudi-launch[report]'``) and imported only here, never by the launcher itself.
Exit status: 0, or 2 for bad input (no such file, no metrics, unknown JSON) or missing matplotlib.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import stat
import sys
from typing import Any, BinaryIO, Callable, Optional

from gaudi_launch import safewrite
from gaudi_launch.exitcodes import ExitCode
from gaudi_launch.inputs.readfile import read_bounded
from gaudi_launch.reports.collective import is_report as is_collective_report
from gaudi_launch.reports.collective import pair_matrix

INSTALL_HINT = "pip install 'gaudi-launch[report]'"


class ReportError(Exception):
    """Bad input: the message is for the user, the exit status is 2."""


class MissingMatplotlib(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Reading


def _number(value: Any) -> Optional[float]:
    """A plottable float: numbers as they are, the strings the metrics writer uses for NaN/inf too."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)  # "nan", "inf", "-inf"
        except ValueError:
            return None
    return None


MAX_INPUT_BYTES = 1 << 30  # a long run's metrics.jsonl; /dev/zero must not eat memory


def _read_input(path: str) -> str:
    """A report input's text: a regular file (a FIFO would hang, a device never end) under MAX_INPUT_BYTES."""
    try:
        data = read_bounded(path, MAX_INPUT_BYTES)
    except OSError as exc:
        raise ReportError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > MAX_INPUT_BYTES:
        raise ReportError(f"{path}: larger than {MAX_INPUT_BYTES >> 30} GiB, not a run's metrics or a result")
    return data.decode("utf-8", errors="replace")


def read_metrics(path: str) -> tuple[list[dict[str, Any]], int]:
    """(rows, unreadable line count) of a metrics.jsonl. Rows are JSON objects with a "step"."""
    rows, bad = [], 0
    for line in _read_input(path).split("\n"):
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            bad += 1  # e.g. the half-written last line of a killed job
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


def hf_trainer_state(directory: str) -> Optional[str]:
    """transformers' trainer_state.json in a run directory (or its newest checkpoint), if any."""
    direct = os.path.join(directory, "trainer_state.json")
    if os.path.isfile(direct):
        return direct
    found = []
    for name in os.listdir(directory):
        m = re.match(r"^checkpoint-(\d+)$", name)
        if m and os.path.isfile(os.path.join(directory, name, "trainer_state.json")):
            found.append((int(m.group(1)), os.path.join(directory, name, "trainer_state.json")))
    return max(found)[1] if found else None


def read_trainer_state(path: str) -> list[dict[str, Any]]:
    """transformers Trainer's log_history as this report's rows: training logs by step, evaluations
    as eval rows where they happened, the final summary as a summary row."""
    try:
        history = json.loads(_read_input(path)).get("log_history", [])
    except (ValueError, AttributeError, RecursionError) as exc:
        raise ReportError(f"{path}: not a trainer_state.json ({exc})")
    keyed = []
    for entry in history:
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
            continue
        if "eval_loss" in entry:
            loss = _number(entry["eval_loss"])
            row = {**entry, "step": -1}  # an evaluation, placed after the training step it followed
            if loss is not None:
                row["perplexity"] = math.exp(min(loss, 50.0))
            keyed.append(((entry["step"], 1), row))
        elif "train_runtime" in entry or "train_loss" in entry:
            keyed.append(((entry["step"], 2), {**entry, "global_step": entry["step"]}))
        else:
            keyed.append(((entry["step"], 0), dict(entry)))
    return [row for _, row in sorted(keyed, key=lambda item: item[0])]


def _segments(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs one metrics.jsonl holds, in file order (the writer appends: a re-run or a resumed
    run continues the same file). A run is [evals before training], training rows, a summary row
    (train_loss/global_step), [closing eval]; a training row whose step does not grow, or training
    after a summary, starts the next run. Eval rows (step -1) get an x position: 0 before training,
    the last training step during it, the summary's step for the first eval after the summary;
    further evals after a summary open the next run. A restart mark (``{"step": N, "restart": K}``,
    the Trainer's after --max-restarts resumed it from checkpoint N) is kept apart, not a training row."""

    def new_run(evals=()):
        return {"train": {}, "evals": list(evals), "summaries": [], "first": None, "restarts": []}

    runs = [new_run()]
    last_step: Optional[int] = None
    summary_step: Optional[int] = None  # set while after a summary row
    closing_taken = False
    pending: list[dict[str, Any]] = []  # evals opening the next run
    for row in rows:
        step, cur = row["step"], runs[-1]
        if "restart" in row and "loss" not in row:
            cur["restarts"].append(step)
        elif step < 0:
            if summary_step is not None and not closing_taken:
                cur["evals"].append((summary_step, row))
                closing_taken = True
            elif summary_step is not None:
                pending.append(row)
            else:
                cur["evals"].append((last_step if cur["train"] else None, row))
        elif "train_loss" in row or "global_step" in row:
            cur["summaries"].append(row)
            summary_step, closing_taken = step, False
        else:
            if summary_step is not None or (cur["train"] and last_step is not None and step <= last_step):
                runs.append(new_run((None, e) for e in pending))
                cur = runs[-1]
            pending, summary_step = [], None
            if cur["first"] is None:
                cur["first"] = step
            cur["train"][step] = row
            last_step = step
    runs[-1]["evals"] += [(summary_step, e) for e in pending]
    return [r for r in runs if r["train"] or r["evals"] or r["summaries"]]


def split_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What to plot: the last run in the file; when it is a resumed one (its first step is later
    than the file's first run's), merged with the runs it continues (a later line wins for the same
    step). Returns train rows by step, summary rows, eval (x, row) pairs and how many runs were left
    out."""
    runs = _segments(rows) or [{"train": {}, "evals": [], "summaries": [], "first": None, "restarts": []}]
    start = next((r["first"] for r in runs if r["first"] is not None), None)
    chosen = len(runs) - 1
    while chosen > 0 and runs[chosen]["first"] is not None and start is not None and runs[chosen]["first"] > start:
        chosen -= 1  # a resume continues the run before it
    train: dict[int, dict[str, Any]] = {}
    evals: list[tuple[int, dict[str, Any]]] = []
    summaries: list[dict[str, Any]] = []
    restarts: list[int] = []
    for i, run in enumerate(runs[chosen:]):
        restarts += run["restarts"]
        if run["first"] is not None:
            # A resumed run replaces what came after its restart point.
            train = {k: v for k, v in train.items() if k < run["first"]}
            evals = [(x, e) for x, e in evals if x < run["first"]]
        train.update(run["train"])
        opening = 0 if i == 0 or run["first"] is None else run["first"]  # where evals before training go
        evals += [(opening if x is None else x, e) for x, e in run["evals"]]
        summaries = run["summaries"] or summaries
    return {
        "train": [train[s] for s in sorted(train)],
        "summaries": summaries,
        "evals": evals,
        "runs": len(runs),
        "left_out": chosen,
        "restarts": restarts,
    }


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in rows:
        y = _number(row.get(key))
        if y is not None:
            xs.append(row["step"])
            ys.append(y)
    return xs, ys


def bench_kind(data: Any) -> Optional[str]:
    """ "launch", "mfu", "train", "seed", "collective" or None, from a benchmark JSON's content."""
    if not isinstance(data, dict):
        return None
    if is_collective_report(data):
        return "collective"  # check --collective --json, or the collective-check.json it leaves
    if data.get("bench") in ("launch", "mfu", "train", "seed"):
        return data["bench"]
    results = data.get("results")
    if (
        isinstance(results, dict)
        and results
        and all(isinstance(v, dict) and "samples_per_s" in v and "median" in v for v in results.values())
    ):
        return "train"  # bench_train.py: {"config": ..., "results": {name: {samples_per_s, median, ratio}}}
    return None


# ---------------------------------------------------------------------------------------------
# Drawing


def _mpl():
    """matplotlib's Figure and Agg canvas (no pyplot, no global backend switch); MissingMatplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingMatplotlib(str(exc)) from exc
    return Figure, FigureCanvasAgg


def _figure(width: float = 7.5, height: float = 4.2):
    Figure, Canvas = _mpl()
    fig = Figure(figsize=(width, height), dpi=110)
    Canvas(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.grid(True, alpha=0.3)
    return fig, ax


def write_whole(path: str, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` through a new temporary file beside it, renamed over it: a link someone planted
    at ``path`` (a run directory others can write to) is replaced, never written through (safewrite.py)."""
    safewrite.write_whole(path, write)  # the mode open() would have given: a report is to share


def read_own(path: str) -> bytes:
    """A file this run wrote, read back only if it still is our plain file (not a link put in its place)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ReportError(f"cannot read back {path}, just written: {exc.strerror} (replaced by someone?)")
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            raise ReportError(f"{path} was replaced after it was written (not a plain file of this user)")
        return f.read()


def _save(fig, path: str, written: list[str]) -> None:
    fig.tight_layout()
    # bbox "tight": long labels stay in the picture
    write_whole(path, lambda f: fig.savefig(f, format="png", bbox_inches="tight", pad_inches=0.12))
    written.append(path)


def _headroom(ax, values: list[float]) -> None:
    """y from 0 to a little above the largest finite value (room for the legend)."""
    finite = [v for v in values if math.isfinite(v)]
    top = max(finite) if finite else 0.0
    ax.set_ylim(0, top * 1.25 if top > 0 else 1.0)


def _fmt(value: float) -> str:
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _memory_label(key: str, rows: list[dict[str, Any]]) -> str:
    """On CPU the Trainer's memory figures are the process's resident set (RSS), not a device's."""
    cpu = any(r.get("device") == "cpu" for r in rows)
    if cpu:
        return "RSS (process, peak)" if key.startswith("max_") else "RSS (process)"
    return key.replace(" (GB)", "")


def write_html(paths: list[str], out: str, title: str) -> str:
    """One HTML file with every plot inline (base64), to mail or attach as it is."""
    import base64
    import html

    parts = [
        f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>",
        f"<h1 style='font-family:sans-serif'>{html.escape(title)}</h1>",
    ]
    for path in paths:
        data = base64.b64encode(read_own(path)).decode("ascii")
        parts.append(f"<p><img alt='{html.escape(os.path.basename(path))}' src='data:image/png;base64,{data}'></p>")
    target = os.path.join(out, "report.html")
    write_whole(target, lambda f: f.write(("\n".join(parts) + "\n").encode("utf-8")))
    return target


def _mark_restarts(ax, steps: list[int]) -> None:
    """A dotted line where --max-restarts resumed the run (from the checkpoint of that step)."""
    for i, step in enumerate(sorted(set(steps))):
        ax.axvline(step, linestyle=":", color="0.4", label="restart (resumed here)" if i == 0 else None)


def plot_run(rows: list[dict[str, Any]], out: str, title: str) -> list[str]:
    parts = split_rows(rows)
    train, evals, summaries = parts["train"], parts["evals"], parts["summaries"]
    if parts["left_out"]:
        print(
            f"gaudi-launch report: the metrics file holds {parts['runs']} runs (the step count restarts, as "
            f"when a job runs again into the same --output_dir); plotting the last one, leaving out "
            f"{parts['left_out']}",
            file=sys.stderr,
        )
    written: list[str] = []

    xs, ys = series(train, "loss")
    ev = [(x, _number(r.get("eval_loss"))) for x, r in evals if _number(r.get("eval_loss")) is not None]
    if xs or ev:
        fig, ax = _figure()
        if xs:
            ax.plot(xs, ys, marker="." if len(xs) < 40 else None, label="training loss")
        if ev:
            ax.plot([x for x, _ in ev], [y for _, y in ev], "s", color="C3", label="eval loss")
            for x, r in evals:
                ppl = _number(r.get("perplexity"))
                if ppl is not None and _number(r.get("eval_loss")) is not None:
                    # right of a point, except in the right half, where the label would leave the frame
                    right_half = x > (max(xs + [e[0] for e in ev]) + min(xs + [e[0] for e in ev])) / 2
                    ax.annotate(
                        f"ppl {_fmt(ppl)}",
                        (x, _number(r["eval_loss"])),
                        textcoords="offset points",
                        xytext=(-6 if right_half else 6, 6),
                        ha="right" if right_half else "left",
                        fontsize=8,
                        color="C3",
                    )
        _mark_restarts(ax, parts["restarts"])
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("loss")
        ax.set_title(f"{title}: loss")
        ax.legend()
        _save(fig, os.path.join(out, "loss.png"), written)

    xs, ys = series(train, "train_samples_per_second")
    if xs:
        fig, ax = _figure()
        ax.plot(xs, ys, marker="." if len(xs) < 40 else None, label="samples/s (since warm-up)")
        final = [v for v in (_number(s.get("train_samples_per_second")) for s in summaries) if v is not None]
        if final:
            avg = final[-1]
            ax.axhline(avg, linestyle="--", color="C2", label=f"whole run: {_fmt(avg)} samples/s")
            ys = ys + [avg]
        _headroom(ax, ys)
        _mark_restarts(ax, parts["restarts"])
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("samples/s")
        tokens = series(train, "train_tokens_per_second")[1]
        ax.set_title(
            f"{title}: throughput in samples/s"
            + (f" (= {_fmt(tokens[-1])} tokens/s at the last step)" if tokens else ""),
            fontsize=10,
        )
        ax.legend()
        _save(fig, os.path.join(out, "throughput.png"), written)

    mem_keys = [k for k in ("memory_allocated (GB)", "max_memory_allocated (GB)") if series(train, k)[0]]
    if mem_keys:
        fig, ax = _figure()
        for key in mem_keys:
            x, y = series(train, key)
            ax.plot(x, y, marker="." if len(x) < 40 else None, label=_memory_label(key, train))
        total = series(train, "total_memory_available (GB)")[1]
        _headroom(ax, [v for key in mem_keys for v in series(train, key)[1]])
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("GB")
        ax.set_title(f"{title}: memory" + (f" (of {_fmt(total[-1])} GB available)" if total else ""))
        ax.legend()
        _save(fig, os.path.join(out, "memory.png"), written)

    xs, ys = series(train, "learning_rate")
    if xs:
        fig, ax = _figure(7.5, 3.2)
        ax.plot(xs, ys, marker="." if len(xs) < 40 else None)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("learning rate")
        ax.set_title(f"{title}: learning rate")
        _save(fig, os.path.join(out, "learning_rate.png"), written)
    return written


def _hbars(
    names: list[str],
    values: list[Optional[float]],
    lows: list[Optional[float]],
    highs: list[Optional[float]],
    notes: list[str],
    xlabel: str,
    title: str,
    path: str,
    written: list[str],
    colors: Optional[list[str]] = None,
) -> None:
    """Horizontal bars (top to bottom in the given order) with min-max whiskers and a note each."""
    width = 8.5
    fig, ax = _figure(width, 0.9 + 0.42 * len(names))
    ys = list(range(len(names)))[::-1]
    ends = [h if h is not None else v for v, h in zip(values, highs) if v is not None]
    top = max(ends or [1.0])
    # Room on the right for each note: ~0.058 in per character at 8 pt, on axes ~60% of the width.
    per_char = 0.058 / (0.6 * width)
    right = max(
        [
            end / max(0.1, 1 - per_char * len(note) - 0.02)
            for end, note in zip([h if h is not None else v for v, h in zip(values, highs)], notes)
            if end is not None
        ]
        or [top * 1.35]
    )
    for y, v, lo, hi, note, i in zip(ys, values, lows, highs, notes, range(len(names))):
        if v is None:
            ax.text(0, y, "  " + note, va="center", fontsize=8, color="0.4")
            continue
        color = colors[i] if colors else "C0"
        ax.barh(y, v, color=color, height=0.6)
        if lo is not None and hi is not None:
            ax.errorbar(v, y, xerr=[[v - lo], [hi - v]], fmt="none", ecolor="0.25", capsize=3, lw=1)
        ax.text((hi if hi is not None else v) + top * 0.01, y, note, va="center", fontsize=8)
    ax.set_yticks(ys)
    ax.set_yticklabels(names, fontsize=8)
    ax.set_xlim(0, max(right, top * 1.1))
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    ax.grid(False, axis="y")
    _save(fig, path, written)


def _ratio(r: Optional[float], peer: str) -> str:
    return f"{r:.2f}x {peer}" if isinstance(r, (int, float)) and r else ""


def plot_train_bench(data: dict[str, Any], out: str, stem: str) -> list[str]:
    results: dict[str, dict[str, Any]] = data["results"]
    cfg = data.get("config", {})
    peer = "transformers Trainer, DDP"
    names, vals, lows, highs, notes = [], [], [], [], []
    for name, r in results.items():
        sps = [x for x in (_number(v) for v in r.get("samples_per_s", [])) if x is not None]
        names.append(name)
        vals.append(_number(r.get("median")))
        lows.append(min(sps) if sps else None)
        highs.append(max(sps) if sps else None)
        note = f"{_fmt(r['median'])} samples/s"
        if name != peer and r.get("ratio"):
            note += f" ({_ratio(r['ratio'], 'vs transformers')})"
        notes.append(note)
    title = "training throughput (median, min-max)"
    if cfg:
        title += (
            f": tiny GPT-2, {cfg.get('ranks')} ranks, batch {cfg.get('batch')}x{cfg.get('block')}, "
            f"{cfg.get('steps')} steps ({cfg.get('warmup')} warm-up), {cfg.get('repeats')} repeat(s)"
        )
    written: list[str] = []
    colors = ["C1" if n == peer else "C0" for n in names]
    _hbars(
        names,
        vals,
        lows,
        highs,
        notes,
        "samples/s (higher is better)",
        title,
        os.path.join(out, f"{stem}.png"),
        written,
        colors,
    )
    return written


def plot_seed_bench(data: dict[str, Any], out: str, stem: str) -> list[str]:
    """bench_seed.py: per workload and batch size, our runtime beside transformers' Trainer."""
    names, vals, notes, colors = [], [], [], []
    for row in data.get("rows", []):
        label = f"{row['workload']} b={row['batch_per_device']}"
        for side, key, ratio, color in (
            ("ours", "ours_samples_per_s", "ratio", "C0"),
            ("ours, compiled", "ours_compiled_samples_per_s", "compiled_ratio", "C2"),
            ("ours, head on every position", "ours_every_position_samples_per_s", "every_position_ratio", "C3"),
            ("transformers", "transformers_samples_per_s", None, "C1"),
        ):
            if side != "ours" and ratio and key not in row:
                continue  # a column this run did not measure (--torch_compile off; not BERT)
            value = _number(row.get(key))
            names.append(f"{label}: {side}")
            vals.append(value)
            note = f"{_fmt(value)} samples/s" if value is not None else "not measured"
            if ratio and row.get(ratio):
                note += f" ({_ratio(row[ratio], 'vs transformers')})"
            notes.append(note)
            colors.append(color)
    if not names:
        raise ReportError("the seed benchmark JSON has no rows to plot")
    env = data.get("environment", {})
    title = f"seed workloads, {data.get('config', {}).get('ranks', '?')} ranks on {env.get('device', '?')} (median)"
    written: list[str] = []
    _hbars(
        names,
        vals,
        [None] * len(vals),
        [None] * len(vals),
        notes,
        "samples/s (higher is better)",
        title,
        os.path.join(out, f"{stem}.png"),
        written,
        colors,
    )
    return written


def plot_launch_bench(data: dict[str, Any], out: str, stem: str) -> list[str]:
    baseline = data.get("baseline", "mpirun (raw)")
    names: list[str] = []
    vals: list[Optional[float]] = []
    lows: list[Optional[float]] = []
    highs: list[Optional[float]] = []
    notes: list[str] = []
    colors: list[str] = []
    scopes = data.get("results", {})
    for scope, table in scopes.items():
        for name, e in table.items():
            names.append(f"{e.get('label', name)} [{scope}]" if len(scopes) > 1 else e.get("label", name))
            colors.append("C1" if name == baseline else "C0")
            if "median" not in e:
                vals.append(None)
                lows.append(None)
                highs.append(None)
                notes.append(
                    ("skipped: " + e["skipped"]) if "skipped" in e else ("failed: " + str(e.get("error", "no result")))
                )
                continue
            vals.append(e["median"])
            lows.append(e.get("min"))
            highs.append(e.get("max"))
            note = f"{e['median']:.2f} s"
            if name != baseline and e.get("ratio"):
                note += f" ({_ratio(e['ratio'], 'vs raw mpirun')})"
            notes.append(note)
    cfg = data.get("config", {})
    title = (
        f"launch overhead: trivial gloo job, {cfg.get('ranks', '?')} rank(s) per host, "
        f"median and min-max of {cfg.get('repeats', '?')}"
    )
    written: list[str] = []
    if names:
        _hbars(
            names,
            vals,
            lows,
            highs,
            notes,
            "wall time, s (lower is better)",
            title,
            os.path.join(out, f"{stem}.png"),
            written,
            colors,
        )
    start = data.get("start_up") or {}
    if start:
        names, vals, lows, highs, notes, colors = [], [], [], [], [], []
        for name, e in start.items():
            names.append(name)
            colors.append("C1" if name.startswith("python -c pass") else "C0")
            if "median" not in e:
                vals.append(None)
                lows.append(None)
                highs.append(None)
                notes.append("failed: " + str(e.get("error", "no result"))[:60])
                continue
            vals.append(1000 * e["median"])
            lows.append(1000 * e["min"])
            highs.append(1000 * e["max"])
            note = f"{1000 * e['median']:.0f} ms"
            if not name.startswith("python -c pass") and e.get("ratio"):
                note += f" ({_ratio(e['ratio'], 'vs python -c pass')})"
            notes.append(note)
        _hbars(
            names,
            vals,
            lows,
            highs,
            notes,
            "wall time, ms (lower is better)",
            f"start-up without a job: median and min-max of {cfg.get('cold_repeats', '?')}",
            os.path.join(out, f"{stem}-start-up.png"),
            written,
            colors,
        )
    return written


def plot_mfu_bench(data: dict[str, Any], out: str, stem: str) -> list[str]:
    peak, train = data.get("peak", {}), data.get("training", {})
    precisions = [p for p in ("fp32", "bf16") if p in peak and p in train]
    if not precisions:
        raise ReportError("the MFU benchmark JSON has no 'peak'/'training' entries to plot")
    top = max(max(peak[p]["flops"], train[p]["flops"]) for p in precisions)
    scale, unit = (1e12, "TFLOP/s") if top >= 1e12 else (1e9, "GFLOP/s")
    fig, ax = _figure(7.5, 4.2)
    width = 0.38
    for i, p in enumerate(precisions):
        pk, ach = peak[p]["flops"] / scale, train[p]["flops"] / scale
        ax.bar(i - width / 2, pk, width, color="C1", label="measured matmul peak" if i == 0 else None)
        ax.bar(i + width / 2, ach, width, color="C0", label="Trainer: 6 x params x tokens/s" if i == 0 else None)
        ax.text(i - width / 2, pk, f"{_fmt(pk)}\n(n={peak[p].get('size')})", ha="center", va="bottom", fontsize=8)
        ax.text(
            i + width / 2,
            ach,
            f"{_fmt(ach)}\n{100 * train[p]['mfu']:.0f}% of peak",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xticks(range(len(precisions)))
    ax.set_xticklabels(["fp32" if p == "fp32" else "bf16 (autocast)" for p in precisions])
    ax.set_ylabel(unit)
    ax.set_ylim(0, top / scale * 1.3)
    cfg = data.get("config", {})
    ax.set_title(f"MFU-style efficiency, {cfg.get('model', '?')} GPT-2 on {data.get('device', '?')}"[:95], fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(False, axis="x")
    written: list[str] = []
    _save(fig, os.path.join(out, f"{stem}.png"), written)
    return written


def plot_collective_matrix(data: dict[str, Any], out: str, stem: str) -> list[str]:
    """The collective check's pairs as a hosts x hosts matrix, bandwidth as colour (the pairs' all-reduce
    bus bandwidth when the library stage ran, else the TCP links'); a failed pair is a red x, a slow one
    has its figure in red, a pair the rounds did not meet is blank. The named hosts are in the title."""
    hosts, gbs, state = pair_matrix(data)
    if not hosts:
        raise ReportError("the collective check's report lists no hosts")
    n = len(hosts)
    side = min(12.0, 2.5 + 0.45 * n)
    fig, ax = _figure(side + 1.2, side)
    ax.grid(False)
    values = [
        [v if v is not None and state[i][j] != "failed" else math.nan for j, v in enumerate(row)]
        for i, row in enumerate(gbs)
    ]
    image = ax.imshow(values, cmap="viridis", vmin=0)
    fig.colorbar(image, ax=ax, label="GB/s")
    ax.set_xticks(range(n), hosts, rotation=90, fontsize=8)
    ax.set_yticks(range(n), hosts, fontsize=8)
    for i in range(n):
        for j in range(n):
            if state[i][j] == "failed":
                ax.text(j, i, "x", ha="center", va="center", color="red", fontsize=12, fontweight="bold")
            elif state[i][j] and n <= 16 and (figure := gbs[i][j]) is not None:
                colour = "red" if state[i][j] == "slow" else "black"
                ax.text(j, i, _fmt(figure), ha="center", va="center", color=colour, fontsize=7)
    named = [f"{h} {what}" for what in ("failed", "slow") for h in data.get(what, []) if isinstance(h, str)]
    stage = (
        "all-reduce bus bandwidth"
        if any(p.get("stage") == "library" for p in data.get("pairs", []) if isinstance(p, dict))
        else "TCP link"
    )
    ax.set_title(
        f"collective check: pairs of hosts ({stage})" + (f"\n{', '.join(named)}" if named else ""), fontsize=10
    )
    written: list[str] = []
    _save(fig, os.path.join(out, f"{stem}-pairs.png"), written)
    return written


# ---------------------------------------------------------------------------------------------


def _default_out(source: str) -> str:
    if os.path.isdir(source):
        return os.path.join(source, "plots")
    return os.path.join(os.path.dirname(source), "plots")


def _load(source: str) -> tuple[str, Any]:
    """("run", rows) or (bench kind, data); ReportError for anything unusable."""
    if not os.path.exists(source):
        raise ReportError(f"{source}: no such file or directory")
    path = os.path.join(source, "metrics.jsonl") if os.path.isdir(source) else source
    if os.path.isdir(source) and not os.path.exists(path):
        state = hf_trainer_state(source)
        if state is None:
            raise ReportError(
                f"{source}: no metrics.jsonl here (the Trainer writes it into its --output_dir), nor "
                "transformers' trainer_state.json"
            )
        path = state
    if os.path.basename(path) == "trainer_state.json":
        rows = read_trainer_state(path)
        if not rows:
            raise ReportError(f"{path}: its log_history holds nothing to plot")
        return "run", rows
    if path.endswith(".jsonl"):
        rows, bad = read_metrics(path)
        if not rows:
            raise ReportError(
                f"{path}: no metrics in it ("
                + (f"none of its {bad} line(s) is" if bad else "empty, no line")
                + " a JSON object with a 'step')"
            )
        if bad:
            print(f"gaudi-launch report: skipped {bad} unreadable line(s) in {path}", file=sys.stderr)
        return "run", rows
    try:
        data = json.loads(_read_input(path))
    except ValueError as exc:
        raise ReportError(f"{path}: not JSON ({exc})")
    except RecursionError:
        raise ReportError(f"{path}: not a benchmark result (nested too deep)") from None
    kind = bench_kind(data)
    if kind is None:
        raise ReportError(
            f"{path}: not a benchmark result this knows (from scripts/bench/bench_train.py, "
            "bench_launch.py, bench_mfu.py or bench_seed.py) nor a collective check's report "
            "(collective-check.json); for a run, give its directory or metrics.jsonl"
        )
    return kind, data


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gaudi-launch report",
        description="PNG plots of a run's metrics.jsonl (loss, throughput, memory over steps) or of a "
        "benchmark JSON from scripts/bench/ (bars with ratios against the peer).",
    )
    parser.add_argument(
        "source", metavar="RUN_DIR", help="a run's output directory or its metrics.jsonl, or a benchmark JSON file"
    )
    parser.add_argument(
        "--out", default=None, help="directory for the PNGs (default: RUN_DIR/plots, or plots/ beside a JSON file)"
    )
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as exc:  # --help (0) or a usage error (2): argparse has printed why
        return int(exc.code or 0)
    return report(args.source, args.out)


def report(source: str, out_dir: Optional[str] = None) -> int:
    """`gaudi-launch report RUN_DIR [--out DIR]` (parsed in cli.py): the PNGs and their HTML page."""
    try:
        kind, data = _load(source)
        out = out_dir or _default_out(source)
        if not out_dir and os.path.islink(out):
            raise ReportError(
                f"{out} is a symbolic link: the plots are not written through it (whoever can write to "
                f"{os.path.dirname(out)} may have put it there); give the directory for them with --out DIR"
            )
        _mpl()  # before creating anything: a missing matplotlib leaves no empty directory behind
        os.makedirs(out, exist_ok=True)
        if kind == "run":
            title = os.path.basename(os.path.normpath(os.path.abspath(source)))
            if title == "metrics.jsonl":
                title = os.path.basename(os.path.dirname(os.path.abspath(source)))
            written = plot_run(data, out, title)
            if not written:
                raise ReportError(f"{source}: nothing to plot (no loss, throughput or memory values)")
        else:
            stem = os.path.splitext(os.path.basename(source))[0]
            written = {
                "train": plot_train_bench,
                "launch": plot_launch_bench,
                "mfu": plot_mfu_bench,
                "seed": plot_seed_bench,
                "collective": plot_collective_matrix,
            }[kind](data, out, stem)
        written.append(write_html(written, out, f"gaudi-launch report: {os.path.basename(os.path.abspath(source))}"))
    except MissingMatplotlib as exc:
        print(
            f"gaudi-launch report: error: matplotlib is not installed ({exc})\n  hint: {INSTALL_HINT}", file=sys.stderr
        )
        return ExitCode.USAGE
    except ReportError as exc:
        print(f"gaudi-launch report: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
