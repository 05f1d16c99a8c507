"""The collective check's schedule and verdict: hosts paired in rounds, a fault pinned to its host. Pure.

Habana's Intel Gaudi Health Screen tests a cluster as pairs of nodes, each pair its own hccl_demo all_reduce
job on all 8 cards of both (HabanaAI/Setup_and_Install r1.22.0, utils/intel_gaudi_health_screen/:
template/bare-metal/run_hccl_demo.sh, 32m x 1000; hccl_demo_helper.py find_groups pairs a node not yet
passed with one that has; IGNodes.py determine_node_health marks n1 infected only when its partner n2 is
healthy; config.yaml level-2: a timeout and 5 rounds). The rule below is that one. A pair is small
and has a deadline of its own, so a hang (the bridge's HCCL ``WorkHCCL::wait`` ignores its timeout) costs
one pair's deadline and says which two hosts it was between. Rounds of pairs then tell which of the two:

* The schedule is the round-robin "circle" method: n/2 disjoint pairs a round (one host sits out when n is
  odd), every pair of hosts at most once over n-1 rounds.
* A pair is *bad* when it failed (an error, or no result by its deadline) or was slow (its bandwidth under
  SLOW_FRACTION x the median of the hosts' best pairs, or under a floor given).
* A host is *good* once one of its pairs was not bad: a healthy pair proves both ends.
* A host is *named* when it is not good and one of its bad pairs was with a good host: its partner passed
  with someone else, so the fault is this host's. Failed if such a pair failed; slow if two such pairs
  were slow (from three hosts on: one slow exchange on a busy machine is not enough).
* Rounds go on while a host with a bad pair is neither good nor named, up to max_rounds.

One bad host X: round 1 pairs X with A (bad) and the others pass; round 2 pairs X with B, who passed in
round 1, so X is named and A, passing in round 2, is good. Two rounds, whatever n (>= 3).
Two bad hosts X, Y: each is named as soon as it has met a good host; paired together their pair says
nothing, and the next round pairs each with a good host. With n = 4 and both bad, rounds 2-3 do it.
When nothing can be told apart (two hosts only; or every pair of a host failed with hosts that failed
everywhere else, as when most of the cluster is broken) the host is "unpinned", never named: the
report then says that the fault may be common to all (the interface, a firewall, the environment).
A failed pair of two good hosts is a fault of the path between them (a switch port, a cable): kept as such.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Optional

# Under a quarter of the median is slow. Half named a healthy host in a CI run on the namespace cluster
# (the launcher's own host shared 2 cores with DeepSpeed's runner: 0.37x); a link throttled with tc's tbf
# measures about 0.01x.
SLOW_FRACTION = 0.25
MARGIN_S = 3.0  # the coordinator's wait for a round's results past the pairs' deadline


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """The n-1 rounds (n rounds when n is odd) of disjoint pairs that meet every pair of 0..n-1 once.
    The circle method: 0 stays, the others rotate by one each round; an odd n adds a bye."""
    ids: list[Optional[int]] = list(range(n)) + ([None] if n % 2 else [])
    m = len(ids)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = ids[i], ids[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        ids = [ids[0], ids[-1], *ids[1:-1]]
    return rounds


def max_rounds(n: int) -> int:
    """The rounds the check may run: ceil(log2 n) + 2, at most every round there is. Two pin one bad host;
    the others give two bad hosts, each paired with the other first, a good partner each."""
    if n < 2:
        return 0
    return min(len(round_robin(n)), math.ceil(math.log2(n)) + 2)


def min_rounds(n: int) -> int:
    """Two partners per host from three hosts on: a host's figure is then its best of two links."""
    return 1 if n <= 2 else 2


@dataclass
class Pair:
    round: int
    a: int
    b: int
    ok: bool  # both ends finished and agreed
    gbs: Optional[float] = None  # bandwidth, GB/s (the stage says which: link or all-reduce bus bandwidth)
    latency_s: Optional[float] = None
    reason: str = ""  # why it failed (each end's word)
    slow: bool = False  # set by classify

    @property
    def bad(self) -> bool:
        return not self.ok or self.slow


@dataclass
class Verdict:
    good: set = field(default_factory=set)
    failed: dict = field(default_factory=dict)  # host -> the pairs that named it
    slow: dict = field(default_factory=dict)
    unpinned: set = field(default_factory=set)  # a bad pair each, cannot be told apart
    path_faults: list = field(default_factory=list)  # bad pairs of two good hosts
    median_gbs: Optional[float] = None
    threshold_gbs: Optional[float] = None

    @property
    def named(self) -> set:
        return set(self.failed) | set(self.slow)


def classify(pairs: list[Pair], min_bandwidth: Optional[float] = None) -> tuple[Optional[float], Optional[float]]:
    """Mark the slow pairs; (median, threshold). The median is of each host's best pair: with 4 hosts half
    the pairs of two rounds touch a slow host, while its best pair is slow only for that host. With one
    pair measured the median is that pair: only ``min_bandwidth`` can call it slow."""
    best: dict[int, float] = {}
    for p in pairs:
        if p.ok and p.gbs is not None:
            for h in (p.a, p.b):
                best[h] = max(best.get(h, 0.0), p.gbs)
    if not best:
        return None, None
    median = statistics.median(best.values())
    threshold = SLOW_FRACTION * median
    if min_bandwidth is not None:
        threshold = max(threshold, min_bandwidth)
    for p in pairs:
        p.slow = p.ok and p.gbs is not None and p.gbs < threshold
    return median, threshold


def verdict(hosts: list[int], pairs: list[Pair], min_bandwidth: Optional[float] = None) -> Verdict:
    """Who is good, who is named (failed or slow), who cannot be pinned, from the pairs so far.

    A failed pair with a good partner names its host at once (a hang or an error is not noise); slowness
    must show twice, with two good partners, when there are three hosts or more: one slow pair on a busy
    machine is not enough, and the next round gives the host another partner (as the health screen keeps a
    node on its watch list for the next round)."""
    v = Verdict()
    v.median_gbs, v.threshold_gbs = classify(pairs, min_bandwidth)
    for p in pairs:
        if not p.bad:
            v.good.update((p.a, p.b))
    twice = 2 if len(hosts) >= 3 else 1
    for h in hosts:
        if h in v.good:
            continue
        mine = [p for p in pairs if h in (p.a, p.b) and p.bad]
        pinned = [p for p in mine if (p.b if p.a == h else p.a) in v.good]
        if any(not p.ok for p in pinned):
            v.failed[h] = pinned
        elif len(pinned) >= twice:
            v.slow[h] = pinned
        elif mine:
            v.unpinned.add(h)
    # a failed pair of two good hosts: the path between them; a slow one is not held against them (a host's
    # figure is its best pair's, and one slow exchange on a busy CPU is noise)
    v.path_faults = [p for p in pairs if not p.ok and p.a in v.good and p.b in v.good]
    return v


def settled(v: Verdict, rounds_done: int, n: int) -> bool:
    """Whether more rounds would tell nothing new: every host with a bad pair is named or good."""
    return rounds_done >= min_rounds(n) and not v.unpinned


def pair_of(a: dict, b: dict, round_no: int, ra: int, rb: int) -> Pair:
    """One pair from its two ends' results ({"ok", "gbs", "latency_s", "error"}; {} when an end said
    nothing by the deadline). Both must have finished; the figure is the slower end's."""
    reasons = []
    for r, side in ((ra, a), (rb, b)):
        if not side:
            reasons.append(f"rank {r}: no result by the pair's deadline")
        elif not side.get("ok"):
            reasons.append(f"rank {r}: {side.get('error') or 'failed'}")
    ok = not reasons
    gbs = [s["gbs"] for s in (a, b) if s.get("gbs")]
    lat = [s["latency_s"] for s in (a, b) if s.get("latency_s") is not None]
    return Pair(
        round=round_no,
        a=ra,
        b=rb,
        ok=ok,
        gbs=min(gbs) if ok and gbs else None,
        latency_s=max(lat) if ok and lat else None,
        reason="; ".join(reasons),
    )


def algbw_busbw(nbytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """All-reduce bandwidths in GB/s as nccl-tests define them (NVIDIA/nccl-tests doc/PERFORMANCE.md):
    algbw = S / t; busbw = algbw x 2(n-1)/n. hccl_demo prints the same two (HabanaAI/hccl_demo
    hccl_demo.cpp describeStat: "Algo Bandwidth" = size / time, "NW Bandwidth" = that x stats.factor,
    2(nranks-1)/nranks for all_reduce)."""
    alg = nbytes / seconds / 1e9
    return alg, alg * (2 * (ranks - 1) / ranks if ranks > 1 else 1.0)
