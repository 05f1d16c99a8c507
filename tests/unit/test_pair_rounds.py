"""The collective check's pair schedule and verdict (pairrounds.py): a simulated cluster where some
hosts are bad, run round by round as the coordinator does, must name exactly those hosts."""

from __future__ import annotations

import itertools

import pytest

from gaudi_launch.pairrounds import (
    Pair,
    algbw_busbw,
    max_rounds,
    round_robin,
    settled,
    verdict,
)


@pytest.mark.parametrize("n", range(2, 18))
def test_round_robin_meets_every_pair_once_in_disjoint_rounds(n):
    rounds = round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [p for r in rounds for p in r]
    assert sorted(seen) == sorted(itertools.combinations(range(n), 2))  # every pair once
    for r in rounds:
        hosts = [h for p in r for h in p]
        assert len(hosts) == len(set(hosts)) and len(r) == n // 2  # disjoint, n/2 pairs


def simulate(n, failed=(), slow=(), min_bandwidth=None):
    """Run rounds as the coordinator does; a pair with a failed host fails, one with a slow host is slow."""
    pairs, v, done = [], None, 0
    for k, rnd in enumerate(round_robin(n)[: max_rounds(n)]):
        for a, b in rnd:
            bad = a in failed or b in failed
            gbs = 0.01 if (a in slow or b in slow) else 1.0
            pairs.append(
                Pair(round=k, a=a, b=b, ok=not bad, gbs=None if bad else gbs, reason="timed out" if bad else "")
            )
        done = k + 1
        v = verdict(list(range(n)), pairs, min_bandwidth)
        if settled(v, done, n):
            break
    return v, done


@pytest.mark.parametrize("n", [3, 4, 5, 7, 8, 16])
@pytest.mark.parametrize("bad", [0, 1, 2])
def test_one_failed_host_is_named_alone_within_two_rounds(n, bad):
    for host in {bad, n - 1}:
        v, rounds = simulate(n, failed={host})
        assert set(v.failed) == {host} and not v.slow and not v.unpinned, (n, host, v)
        assert v.good == set(range(n)) - {host}
        # two rounds; with an odd n the host that sat out may need a third to meet a good partner
        assert rounds == 2 if n % 2 == 0 else rounds <= 3


@pytest.mark.parametrize("n", [3, 4, 5, 9, 16])
def test_one_slow_host_is_named_slow(n):
    v, rounds = simulate(n, slow={1})
    assert set(v.slow) == {1} and not v.failed and not v.unpinned and rounds <= (2 if n % 2 == 0 else 3), v


@pytest.mark.parametrize("n", [4, 5, 6, 8, 16])
def test_two_failed_hosts_are_both_named_paired_together_or_not(n):
    for x, y in itertools.combinations(range(n), 2):
        v, rounds = simulate(n, failed={x, y})
        assert set(v.failed) == {x, y} and not v.unpinned, (n, x, y, v)
        assert rounds <= max_rounds(n)


def test_a_failed_and_a_slow_host_are_told_apart():
    v, _ = simulate(6, failed={1}, slow={4})
    assert set(v.failed) == {1} and set(v.slow) == {4}


def test_two_hosts_cannot_be_told_apart_and_neither_is_named():
    v, rounds = simulate(2, failed={1})
    assert not v.named and v.unpinned == {0, 1} and rounds == 1


def test_a_fault_common_to_all_names_no_host():
    v, rounds = simulate(5, failed=set(range(5)))
    assert not v.named and v.unpinned == set(range(5)) and rounds == max_rounds(5)


def test_a_bad_pair_of_two_good_hosts_is_a_path_fault_not_a_host():
    pairs = [
        Pair(0, 0, 1, True, 1.0),
        Pair(0, 2, 3, True, 1.0),
        Pair(1, 0, 2, False, reason="timed out"),
        Pair(1, 1, 3, True, 1.0),
    ]
    v = verdict([0, 1, 2, 3], pairs)
    assert not v.named and [(p.a, p.b) for p in v.path_faults] == [(0, 2)]


def test_min_bandwidth_sets_a_floor_even_for_two_hosts():
    v = verdict([0, 1], [Pair(0, 0, 1, True, 0.5)], min_bandwidth=1.0)
    assert v.unpinned == {0, 1} and v.threshold_gbs == 1.0


def test_bandwidths_follow_nccl_tests():
    alg, bus = algbw_busbw(32 << 20, 0.01, 16)
    assert alg == pytest.approx((32 << 20) / 0.01 / 1e9)
    assert bus == pytest.approx(alg * 2 * 15 / 16)
