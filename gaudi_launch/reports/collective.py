"""The collective check's verdict: from the ranks' marker lines (runtime/collective_check.py) to a per-host
table of bandwidth, latency and status. Pure: no I/O, no torch.

Each point-to-point record is one directed link src -> dst, timed at dst while every rank did the same on
its ring. A host's bandwidth is its best link, its latency its best latency: a healthy host next to a slow
one still has a fast partner on the other ring, so only the slow host itself is named. With two hosts
there is one partner only: both show the same figures, and only --min-bandwidth can call them slow.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from typing import Optional

from gaudi_launch.wire import COLLECTIVE_MARKER

MARKER = COLLECTIVE_MARKER  # what a check rank prints before its findings (runtime/link_check.py)
STEPS = ("start", "allreduce", "ring+1", "ring+2", "done")  # the library stage (runtime/collective_check.py)
TCP_STEPS = ("start", "ring+1", "ring+2", "done")  # the torch-free stage (runtime/link_check.py)
TCP = "tcp"  # the first stage's name, in its records ("stage") and as the report's library
# Under a quarter of the median is slow. Half (the first guess) named a healthy host in a CI run on
# the namespace cluster: the launcher's own host, sharing 2 cores with DeepSpeed's runner, measured 0.37x
# the median; a link really throttled (tc tbf) measures about 0.01x. --min-bandwidth sets a floor besides.
SLOW_FRACTION = 0.25
# What a rank says when a peer, not itself, stopped the step (gloo, HCCL and NCCL wordings).
_PEER_WORDS = ("timed out", "timeout", "connection reset", "connection closed", "broken pipe", "connection refused")


@dataclass
class HostResult:
    host: str
    rank: int
    status: str  # "ok" | "slow" | "failed" | "not measured"
    bandwidth_gbs: Optional[float] = None
    latency_us: Optional[float] = None
    partners: list[str] = field(default_factory=list)
    reason: str = ""


@dataclass
class CollectiveReport:
    hosts: list[HostResult]
    median_gbs: Optional[float]
    threshold_gbs: Optional[float]
    min_bandwidth: Optional[float]
    allreduce_gbs: Optional[float]  # bus bandwidth, as nccl-tests define it: bytes * 2(n-1)/n / time
    allreduce_ms: Optional[float]
    message_bytes: int
    library: str  # gloo, hccl or nccl: what the ranks used; "tcp": the torch-free stage alone (a CPU)
    elapsed_s: float = 0.0
    backend: str = ""  # what started the ranks: local, mpirun, deepspeed or slurm
    job_output: list[str] = field(default_factory=list)  # the check job's last lines when a rank said nothing

    @property
    def bad(self) -> list[HostResult]:
        return [h for h in self.hosts if h.status in ("slow", "failed")]

    @property
    def ok(self) -> bool:
        return not self.bad and all(h.status == "ok" for h in self.hosts)

    def to_json(self) -> dict:
        data = asdict(self)
        data["ok"] = self.ok
        data["slow"] = [h.host for h in self.hosts if h.status == "slow"]
        data["failed"] = [h.host for h in self.hosts if h.status == "failed"]
        return data

    def render_table(self) -> str:
        rows = [("host", "status", "bandwidth", "latency", "partners")]
        for h in self.hosts:
            rows.append(
                (
                    h.host,
                    h.status,
                    "-" if h.bandwidth_gbs is None else f"{h.bandwidth_gbs:.3g} GB/s",
                    "-" if h.latency_us is None else f"{h.latency_us:.0f} us",
                    ", ".join(h.partners) or "-",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        for h in self.hosts:
            if h.reason:
                lines.append(f"{h.host}: {h.reason}")
        if self.median_gbs is not None:
            rule = f"under {SLOW_FRACTION:g} x the median"
            if self.min_bandwidth is not None:
                rule += f" or under --min-bandwidth {self.min_bandwidth:g}"
            lines.append(f"median {self.median_gbs:.3g} GB/s; slow: {rule} ({self.threshold_gbs:.3g} GB/s)")
        if self.allreduce_gbs is not None:
            lines.append(
                f"all-reduce of {self.message_bytes / 2**20:g} MiB on {len(self.hosts)} hosts ({self.library}"
                f"{', started by ' + self.backend if self.backend else ''}): "
                f"{self.allreduce_ms:.3g} ms, {self.allreduce_gbs:.3g} GB/s bus bandwidth"
            )
        if self.library == TCP:
            lines.append(
                f"links measured over TCP between the check's ranks on {len(self.hosts)} hosts"
                f"{' (started by ' + self.backend + ')' if self.backend else ''}: on a CPU these are gloo's "
                "connections; the ranks imported no torch (GAUDI_LAUNCH_COLLECTIVE_LIBRARY=1 adds gloo's all-reduce)"
            )
        lines.append(f"collective check took {self.elapsed_s:.1f} s")
        if self.job_output:
            lines.append("the check job's last output (a host that said nothing):")
            lines.extend("  " + line for line in self.job_output)
        return "\n".join(lines)

    def verdict(self) -> str:
        """What is wrong and what to do (empty when every host passed)."""
        if self.ok:
            return ""
        slow = [h.host for h in self.hosts if h.status == "slow"]
        failed = [h.host for h in self.hosts if h.status == "failed"]
        parts = []
        if slow:
            parts.append(f"slow: {', '.join(slow)}")
        if failed:
            parts.append(f"failed: {', '.join(failed)}")
        if not parts:
            parts.append("not every host was measured")
        bad = slow + failed
        # under Slurm the spares are the allocation's nodes past --num_nodes (--spare-hosts needs a hostfile)
        spare = "--num_nodes below the allocation's node count" if self.backend == "slurm" else "--spare-hosts N"
        return (
            f"collective check failed ({'; '.join(parts)})\n"
            "  hint: check that host's link and card (ip -s link, tc qdisc show, hl-smi / the switch port), or "
            f"leave it out: --exclude {','.join(bad) or 'HOST'}, or let a spare take its place: "
            f"--collective-check {spare}" + ("" if self.backend == "slurm" else " --max-restarts M")
        )


def parse(lines) -> list[dict]:
    """The marker records in the job's output lines (any prefix before the marker)."""
    out = []
    for line in lines:
        at = line.find(MARKER)
        if at < 0:
            continue
        try:
            record = json.loads(line[at + len(MARKER) :])
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("rank"), int):
            out.append(record)
    return out


def stage_records(records: list[dict]) -> list[dict]:
    """The records to judge: the library stage's when it ran (on hccl or nccl it is the verdict), else the
    TCP stage's (on a CPU, gloo's transport; or the stage where a rank went missing)."""
    library = [r for r in records if r.get("stage") != TCP]
    return library or records


def _progress(records: list[dict], steps: tuple) -> tuple[int, Optional[dict]]:
    """(steps done in order, the error record if the rank reported one)."""
    done = {r["step"] for r in records if "error" not in r}
    error = next((r for r in records if "error" in r), None)
    count = 0
    for step in steps:
        if step in done:
            count += 1
        elif step.startswith("ring+") and "done" in done:
            count += 1  # two hosts have no shifted ring
        else:
            break
    return count, error


def _peer_error(error: Optional[dict]) -> bool:
    return error is not None and any(w in str(error.get("error", "")).lower() for w in _PEER_WORDS)


def judge(
    records: list[dict],
    rank_hosts: dict[int, str],
    *,
    min_bandwidth: Optional[float] = None,
    elapsed_s: float = 0.0,
) -> CollectiveReport:
    """The per-host verdict of one collective check (one rank per host in ``rank_hosts``)."""
    records = stage_records(records)
    steps = TCP_STEPS if records and all(r.get("stage") == TCP for r in records) else STEPS
    by_rank: dict[int, list[dict]] = {r: [] for r in rank_hosts}
    for rec in records:
        if rec["rank"] in by_rank:
            by_rank[rec["rank"]].append(rec)
    # ---- who failed: a rank that did not finish by its own fault (silent, or its own error); when every
    # unfinished rank only blames a peer, those that got least far
    state = {r: _progress(recs, steps) for r, recs in by_rank.items()}
    unfinished = {r: s for r, s in state.items() if s[0] < len(steps)}
    culprits = {r for r, (_, err) in unfinished.items() if not _peer_error(err)}
    if unfinished and not culprits:
        least = min(s[0] for s in unfinished.values())
        culprits = {r for r, s in unfinished.items() if s[0] == least}
    # ---- links: (src, dst) -> (GB/s, latency s)
    links: dict[tuple[int, int], tuple[float, float]] = {}
    size = 0
    for r, recs in by_rank.items():
        for rec in recs:
            if str(rec.get("step", "")).startswith("ring+") and "error" not in rec and rec.get("seconds"):
                size = int(rec.get("bytes", size))
                links[(int(rec["src"]), r)] = (rec["bytes"] / rec["seconds"] / 1e9, float(rec.get("latency_s", 0)))
    hosts: list[HostResult] = []
    for r in sorted(rank_hosts):
        mine = [(v, src if dst == r else dst) for (src, dst), v in links.items() if r in (src, dst)]
        res = HostResult(host=rank_hosts[r], rank=r, status="ok")
        res.partners = sorted({rank_hosts.get(p, str(p)) for _, p in mine})
        if mine and r not in culprits:
            res.bandwidth_gbs = max(v[0] for v, _ in mine)
            res.latency_us = min(v[1] for v, _ in mine) * 1e6
        if r in culprits:
            res.status = "failed"
            _, err = state[r]
            step = steps[min(state[r][0], len(steps) - 1)]
            res.reason = (
                f"failed at {err['step']}: {err['error']}"
                if err
                else f"did not answer at step {step} (no result within the step's time limit)"
            )
        elif r in unfinished:
            res.status = "not measured"
            err = state[r][1]
            res.reason = f"stopped at {err['step'] if err else 'a step'}: waited on a host that failed"
        elif not mine and len(rank_hosts) > 1:
            res.status = "not measured"
        hosts.append(res)
    measured = [h.bandwidth_gbs for h in hosts if h.bandwidth_gbs is not None]
    median = statistics.median(measured) if measured else None
    threshold = None
    if median is not None:
        threshold = SLOW_FRACTION * median
        if min_bandwidth is not None:
            threshold = max(threshold, min_bandwidth)
        for h in hosts:
            if h.status == "ok" and h.bandwidth_gbs is not None and h.bandwidth_gbs < threshold:
                h.status = "slow"
                h.reason = f"{h.bandwidth_gbs:.3g} GB/s with its best partner, under {threshold:.3g} GB/s"
    # ---- the all-reduce: median over ranks, bus bandwidth
    ar = [rec for recs in by_rank.values() for rec in recs if rec.get("step") == "allreduce" and "error" not in rec]
    ar_ms = ar_gbs = None
    n = len(rank_hosts)
    if ar:
        secs = statistics.median(rec["seconds"] for rec in ar)
        size = size or int(ar[0]["bytes"])
        ar_ms = secs * 1e3
        ar_gbs = ar[0]["bytes"] * (2 * (n - 1) / n if n > 1 else 1) / secs / 1e9
    library = next((rec["backend"] for recs in by_rank.values() for rec in recs if rec.get("backend")), "?")
    return CollectiveReport(
        hosts=hosts,
        median_gbs=median,
        threshold_gbs=threshold,
        min_bandwidth=min_bandwidth,
        allreduce_gbs=ar_gbs,
        allreduce_ms=ar_ms,
        message_bytes=size,
        library=library,
        elapsed_s=elapsed_s,
    )
