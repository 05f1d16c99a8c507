"""The collective check's verdict: from the agents' marker lines (runtime/link_check.py) to a per-host and a
per-pair table of bandwidth, latency and status. Pure: no I/O, no torch.

The coordinator prints one record per pair of hosts and round ("step": "pair"), per stage ("tcp": the
torch-free links; "library": the pair's all-reduce on every card, hccl on Gaudi), and one for the confirm of
the hosts left. Who is named follows pairrounds.py: a host whose pairs failed (or were slow) while
its partners passed with others. A host's bandwidth is its best pair's: a healthy host paired once with a
slow one has a fast partner in another round. The library stage's figures, when it ran, are the ones shown
(nccl-tests' bus bandwidth of the pair's all-reduce); the TCP stage's named hosts count in both.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Optional

from gaudi_launch import pairrounds
from gaudi_launch.inputs.backend_options import BACKENDS
from gaudi_launch.pairrounds import SLOW_FRACTION, Pair
from gaudi_launch.plan.scaleout import generation_of
from gaudi_launch.wire import COLLECTIVE_MARKER

MARKER = COLLECTIVE_MARKER  # what a check agent prints before its findings (runtime/link_check.py)
TCP = "tcp"  # the first stage's name, in its records ("stage") and as the report's library
LIBRARY = "library"
# What an agent says when another process, not itself, stopped it.
_PEER_WORDS = ("timed out", "timeout", "connection reset", "connection closed", "broken pipe", "connection refused")
REFUSED_SHOWN = 10  # refused connections the table lists: a flood of them must not bury the verdict
# Scale-out line rate per card and direction, GB/s, by Gaudi generation. Gaudi 3: three scale-out ports at
# 200 Gb/s, "75 GB/s in each direction" (Habana's page "Intel Gaudi Network Configuration"). No Habana page
# read here gives Gaudi 2's: the rule is left out there (the median rule still holds).
LINE_RATE_GBS = {3: 75.0}
# A pair whose all-reduce bus bandwidth is under half its cards' line rate names its host slow (with the
# same partner rule as the median's): a host that lost most of its scale-out ports or fell back to a host
# NIC path. Half, not closer: what a healthy pair of Gaudi 3 servers reaches was not measured here.
LINE_FRACTION = 0.5


@dataclass
class HostResult:
    host: str
    rank: int
    status: str  # "ok" | "slow" | "failed" | "unpinned" | "not measured"
    bandwidth_gbs: Optional[float] = None
    latency_us: Optional[float] = None
    partners: list[str] = field(default_factory=list)
    reason: str = ""


@dataclass
class PairResult:
    stage: str  # "tcp" or "library"
    round: int
    hosts: list[str]
    ok: bool
    slow: bool
    gbs: Optional[float]  # tcp: one direction's link rate; library: all-reduce bus bandwidth (nccl-tests)
    latency_us: Optional[float]
    ranks: Optional[int] = None  # the library job's processes (cards of both hosts)
    reason: str = ""


@dataclass
class CollectiveReport:
    hosts: list[HostResult]
    median_gbs: Optional[float]
    threshold_gbs: Optional[float]
    min_bandwidth: Optional[float]
    allreduce_gbs: Optional[float]  # the confirm's bus bandwidth, as nccl-tests define it: S/t * 2(n-1)/n
    allreduce_ms: Optional[float]
    message_bytes: int
    library: str  # "tcp": the torch-free stage alone (a CPU); else hccl, nccl or gloo
    elapsed_s: float = 0.0
    backend: str = ""  # what started the agents: local, mpirun, deepspeed or slurm
    job_output: list[str] = field(default_factory=list)  # the check job's last lines when a host said nothing
    pairs: list[PairResult] = field(default_factory=list)
    path_faults: list[str] = field(default_factory=list)  # "a-b": a bad pair of two good hosts
    refused: list[str] = field(default_factory=list)  # connections the rendezvous refused: "ADDR (why)"
    confirm: str = ""  # the confirm's failure, when it failed
    line_floor_gbs: Optional[float] = None  # LINE_FRACTION x the cards' scale-out line rate, when it applied

    @property
    def scheduler(self) -> bool:
        """The agents were placed by a scheduler (Slurm): spares are its nodes, not a hostfile's."""
        caps = BACKENDS.get(self.backend)
        return caps is not None and caps.scheduler

    @property
    def bad(self) -> list[HostResult]:
        return [h for h in self.hosts if h.status in ("slow", "failed")]

    @property
    def ok(self) -> bool:
        return all(h.status == "ok" for h in self.hosts) and not self.path_faults and not self.confirm

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
        status = {h.host: h.status for h in self.hosts}
        for p in self.pairs:
            # failed pairs, and slow ones of a host not cleared (a good host's one slow pair is no finding)
            if not p.ok or (p.slow and any(status.get(h) != "ok" for h in p.hosts)):
                what = "slow" if p.ok else "failed"
                why = f"{p.gbs:.3g} GB/s" if p.ok and p.gbs is not None else p.reason
                lines.append(f"  pair {p.hosts[0]} - {p.hosts[1]} ({p.stage}, round {p.round + 1}): {what}: {why}")
        for f in self.path_faults:
            lines.append(
                f"pair {f} failed while both hosts passed with others: the path between them (a switch port, a cable)"
            )
        for r in self.refused[:REFUSED_SHOWN]:
            lines.append(f"the rendezvous refused a connection from {r}")
        if len(self.refused) > REFUSED_SHOWN:
            lines.append(f"... and {len(self.refused) - REFUSED_SHOWN} more refused connections (--json lists them)")
        if self.median_gbs is not None:
            rule = f"a pair under {SLOW_FRACTION:g} x the median host (its best pair)"
            if self.min_bandwidth is not None:
                rule += f" or under --min-bandwidth {self.min_bandwidth:g}"
            if self.line_floor_gbs is not None:
                rule += f" or under {LINE_FRACTION:g} x the cards' scale-out line rate ({self.line_floor_gbs:.3g} GB/s)"
            lines.append(f"median {self.median_gbs:.3g} GB/s; slow: {rule} ({self.threshold_gbs:.3g} GB/s), twice")
        rounds = {(p.stage, p.round) for p in self.pairs}
        if self.pairs:
            stages = sorted({p.stage for p in self.pairs}, key=[TCP, LIBRARY].index)
            lines.append(
                f"{len(self.pairs)} pairs in {len(rounds)} rounds ({', '.join(stages)}) on {len(self.hosts)} hosts"
                f"{' (started by ' + self.backend + ')' if self.backend else ''}"
            )
        if self.allreduce_gbs is not None:
            lines.append(
                f"confirm: all-reduce of {self.message_bytes / 2**20:g} MiB on the hosts left ({self.library}): "
                f"{self.allreduce_ms:.3g} ms, {self.allreduce_gbs:.3g} GB/s bus bandwidth"
            )
        if self.confirm:
            lines.append(f"confirm failed: {self.confirm}")
        if self.library == TCP:
            lines.append(
                "links measured over TCP between the hosts' agents: on a CPU these are gloo's connections; "
                "the agents imported no torch (GAUDI_LAUNCH_COLLECTIVE_LIBRARY=1 adds gloo's all-reduce per pair)"
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
        unpinned = [h.host for h in self.hosts if h.status == "unpinned"]
        parts = []
        if slow:
            parts.append(f"slow: {', '.join(slow)}")
        if failed:
            parts.append(f"failed: {', '.join(failed)}")
        if unpinned:
            parts.append(
                f"not pinned: {', '.join(unpinned)} (their pairs failed with hosts that failed elsewhere too: "
                "a fault common to them, such as the interface, a firewall or the environment, or too few hosts "
                "to tell)"
            )
        if self.path_faults:
            parts.append(f"path between {', '.join(self.path_faults)}")
        if self.confirm:
            parts.append("the confirm of the hosts left failed")
        if not parts:
            parts.append("not every host was measured")
        bad = slow + failed
        # under Slurm the spares are the allocation's nodes past --num_nodes (--spare-hosts needs a hostfile)
        spare = "--num_nodes below the allocation's node count" if self.scheduler else "--spare-hosts N"
        return (
            f"collective check failed ({'; '.join(parts)})\n"
            "  hint: check that host's link and card (ip -s link, tc qdisc show, hl-smi / the switch port), or "
            f"leave it out: --exclude {','.join(bad) or 'HOST'}, or let a spare take its place: "
            f"--collective-check {spare}" + ("" if self.scheduler else " --max-restarts M")
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


def _pairs(records: list[dict], stage: str) -> list[Pair]:
    """The coordinator's pair records of one stage, each (round, a, b) once (a line a relay repeated too)."""
    out, seen = [], set()
    for r in records:
        key = (r.get("round"), r.get("a"), r.get("b"))
        if r.get("step") == "pair" and r.get("stage") == stage and key not in seen:
            seen.add(key)
            try:
                out.append(
                    Pair(
                        round=int(r["round"]),
                        a=int(r["a"]),
                        b=int(r["b"]),
                        ok=bool(r["ok"]),
                        gbs=r.get("gbs"),
                        latency_s=r.get("latency_s"),
                        reason=str(r.get("reason", "")),
                    )
                )
            except (KeyError, TypeError, ValueError):
                continue
    return out


def judge(
    records: list[dict],
    rank_hosts: dict[int, str],
    *,
    min_bandwidth: Optional[float] = None,
    elapsed_s: float = 0.0,
    scaleout: Optional[dict] = None,
) -> CollectiveReport:
    """The per-host and per-pair verdict of one collective check (one agent per host in ``rank_hosts``).
    ``scaleout``: host -> the scale-out path the job's pre-flight found ("P0": Gaudi NICs); the line-rate
    rule holds only on the Gaudi NICs of a known generation."""
    ranks = sorted(rank_hosts)
    name = lambda r: rank_hosts.get(r, str(r))  # noqa: E731
    tcp, lib = _pairs(records, TCP), _pairs(records, LIBRARY)
    v_tcp = pairrounds.verdict(ranks, tcp, min_bandwidth)
    lib_ranks = [r for r in ranks if r not in v_tcp.named]
    floor = line_floor(records, rank_hosts, scaleout or {}) if lib else None
    lib_floor = max(min_bandwidth or 0.0, floor) if floor is not None else min_bandwidth
    v_lib = pairrounds.verdict(lib_ranks, lib, lib_floor) if lib else None
    shown, v_shown = (lib, v_lib) if lib and v_lib is not None else (tcp, v_tcp)
    hosts: list[HostResult] = []
    for r in ranks:
        res = HostResult(host=name(r), rank=r, status="ok")
        mine = [p for p in shown if r in (p.a, p.b)]
        res.partners = sorted({name(p.b if p.a == r else p.a) for p in mine})
        fine = [p for p in mine if p.ok and p.gbs is not None]
        if fine:
            res.bandwidth_gbs = max(p.gbs for p in fine if p.gbs is not None)
            lat = [p.latency_s for p in fine if p.latency_s is not None]
            res.latency_us = min(lat) * 1e6 if lat else None
        for v, stage in ((v_tcp, TCP), (v_lib, LIBRARY)):
            if v is None or res.status != "ok":
                continue
            if r in v.failed:
                res.status = "failed"
                res.reason = f"failed ({stage}) with partners that passed with others: " + _why(v.failed[r], r, name)
            elif r in v.slow:
                res.status = "slow"
                best = max(p.gbs for p in v.slow[r])
                res.reason = (
                    f"{best:.3g} GB/s with its best partner, under {v.threshold_gbs:.3g} GB/s ({stage}; its partners "
                    "were fast with others)"
                )
            elif r in v.unpinned:
                res.status = "unpinned"
                bad = [p for p in (tcp if stage == TCP else lib) if r in (p.a, p.b) and p.bad]
                res.reason = f"its pairs failed ({stage}) and none of its partners passed elsewhere: " + _why(
                    bad, r, name
                )
        hosts.append(res)
    _not_started(records, hosts, rank_hosts, have_pairs=bool(tcp or lib))
    report = CollectiveReport(
        hosts=hosts,
        median_gbs=v_shown.median_gbs,
        threshold_gbs=v_shown.threshold_gbs,
        min_bandwidth=min_bandwidth,
        allreduce_gbs=None,
        allreduce_ms=None,
        message_bytes=0,
        library=TCP if not lib else _library_name(records),
        elapsed_s=elapsed_s,
    )
    extra = {(r.get("stage"), r.get("round"), r.get("a"), r.get("b")): r.get("ranks") for r in records}
    for stage, pairs in ((TCP, tcp), (LIBRARY, lib)):
        for p in pairs:
            report.pairs.append(
                PairResult(
                    stage=stage,
                    round=p.round,
                    hosts=[name(p.a), name(p.b)],
                    ok=p.ok,
                    slow=p.slow,
                    gbs=p.gbs,
                    latency_us=None if p.latency_s is None else p.latency_s * 1e6,
                    ranks=extra.get((stage, p.round, p.a, p.b)),
                    reason=p.reason,
                )
            )
    for v in (v_tcp, v_lib):
        if v is not None:
            report.path_faults += [f"{name(p.a)}-{name(p.b)}" for p in v.path_faults]
    report.line_floor_gbs = floor
    report.refused = [f"{r.get('from')} ({r.get('why')})" for r in records if r.get("step") == "refused"]
    confirm = next((r for r in records if r.get("step") == "confirm"), None)
    if confirm is not None:
        if confirm.get("ok") and confirm.get("seconds"):
            report.allreduce_gbs = confirm.get("gbs")
            report.allreduce_ms = confirm["seconds"] * 1e3
            report.message_bytes = int(confirm.get("bytes") or 0)
        elif not confirm.get("ok"):
            report.confirm = str(confirm.get("reason") or "no result")
    return report


def line_floor(records: list[dict], rank_hosts: dict, scaleout: dict) -> Optional[float]:
    """LINE_FRACTION x the line rate, when every host's cards are of one generation with a known rate and
    every host scales out over its Gaudi NICs (P0); else None. Pure."""
    devices = {r["rank"]: r.get("device") for r in records if r.get("step") == "start" and "device" in r}
    gens = {generation_of(devices.get(r)) for r in rank_hosts}
    paths = {
        scaleout.get(h, {}).get("path") if isinstance(scaleout.get(h), dict) else scaleout.get(h)
        for h in rank_hosts.values()
    }
    if len(gens) != 1 or paths != {"P0"}:
        return None
    gen = gens.pop()
    rate = None if gen is None else LINE_RATE_GBS.get(gen)
    return None if rate is None else LINE_FRACTION * rate


def _why(pairs: list[Pair], r: int, name) -> str:
    return "; ".join(
        f"with {name(p.b if p.a == r else p.a)}: " + (p.reason if not p.ok else f"{p.gbs:.3g} GB/s") for p in pairs
    )[:600]


def _library_name(records: list[dict]) -> str:
    return next((str(r["backend"]) for r in records if r.get("step") == "pair" and r.get("backend")), "library")


def _not_started(records: list[dict], hosts: list[HostResult], rank_hosts: dict, have_pairs: bool) -> None:
    """Hosts the rounds never measured: missing at the rendezvous, or silent (the check job's deadline)."""
    missing = next((r.get("missing") for r in records if r.get("step") == "rendezvous"), None)
    spoke = {r["rank"] for r in records}
    errors = {r["rank"]: r for r in records if "error" in r and r.get("step") != "pair"}
    # an agent that failed by itself (not waiting on another): its host is the one to name
    own = {r: e for r, e in errors.items() if not any(w in str(e.get("error", "")).lower() for w in _PEER_WORDS)}
    for h in hosts:
        if h.status != "ok" or (have_pairs and h.partners):
            continue
        if missing is not None and h.rank in missing:
            h.status, h.reason = "failed", "did not join the rendezvous in time (its agent never came, or was refused)"
        elif h.rank in own and not have_pairs:
            err = own[h.rank]
            h.status, h.reason = "failed", f"failed at {err.get('step')}: {err.get('error')}"
        elif h.rank not in spoke and not own:
            h.status, h.reason = "failed", "did not answer (no output within the check's deadline)"
        elif not have_pairs and len(rank_hosts) > 1:
            stopped = errors.get(h.rank)
            h.status = "not measured"
            h.reason = (
                f"stopped at {stopped.get('step')}: {stopped.get('error')}" if stopped else "stopped with the check job"
            )
    # nobody could reach the rendezvous: rank 0's host is the one they all waited on
    others = [h for h in hosts if h.rank != 0]
    if (
        not have_pairs
        and missing is None
        and not own
        and others
        and all("rendezvous" in str(errors.get(h.rank, {}).get("error", "")) for h in others)
    ):
        first = next((h for h in hosts if h.rank == 0), None)
        if first is not None:
            first.status = "failed"
            first.reason = "every other host timed out reaching the rendezvous on this host (rank 0)"
            for h in others:
                h.status, h.reason = "not measured", "waited on the rendezvous host"


def is_report(data) -> bool:
    """Whether a JSON document is a collective check's report (--json, collective-check.json)."""
    return isinstance(data, dict) and isinstance(data.get("hosts"), list) and isinstance(data.get("pairs"), list)


def pair_matrix(data: dict) -> tuple[list[str], list[list[Optional[float]]], list[list[str]]]:
    """(hosts, GB/s per pair, state per pair: "" unmeasured, "ok", "slow" or "failed") from a report's JSON,
    symmetric, hosts in the report's order. The library stage's pairs when it ran (the job's path), else the
    TCP stage's; a pair met in several rounds shows its worst. Pure."""
    hosts = [str(h.get("host")) for h in data.get("hosts", []) if isinstance(h, dict)]
    at = {h: i for i, h in enumerate(hosts)}
    pairs = [p for p in data.get("pairs", []) if isinstance(p, dict) and isinstance(p.get("hosts"), list)]
    if any(p.get("stage") == LIBRARY for p in pairs):
        pairs = [p for p in pairs if p.get("stage") == LIBRARY]
    n = len(hosts)
    gbs: list[list[Optional[float]]] = [[None] * n for _ in range(n)]
    state = [[""] * n for _ in range(n)]
    rank = {"": 0, "ok": 1, "slow": 2, "failed": 3}
    for p in pairs:
        if len(p["hosts"]) != 2 or p["hosts"][0] not in at or p["hosts"][1] not in at:
            continue
        i, j = at[p["hosts"][0]], at[p["hosts"][1]]
        s = "failed" if not p.get("ok") else ("slow" if p.get("slow") else "ok")
        value = p.get("gbs") if isinstance(p.get("gbs"), (int, float)) else None
        if rank[s] > rank[state[i][j]] or (s == state[i][j] and value is not None and (gbs[i][j] or 1e30) > value):
            for a, b in ((i, j), (j, i)):
                state[a][b], gbs[a][b] = s, value
    return hosts, gbs, state
