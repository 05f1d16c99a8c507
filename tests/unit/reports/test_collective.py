"""The collective check's verdict (reports/collective.py) from the ranks' marker records: who is slow, who
failed, what the table and the JSON say. Figures are synthetic but shaped like the ranks' own."""

from __future__ import annotations

import json

import pytest

from gaudi_launch.collective import (
    CollectiveCheckFailed,
    leave_out_slurm_nodes,
    read_exclusions,
    replace_bad_hosts,
    slurm_check_port,
)
from gaudi_launch.errors import UserError
from gaudi_launch.exitcodes import ExitCode
from gaudi_launch.inputs import slurm
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.launchplan import LaunchPlan, NodePlan
from gaudi_launch.reports.collective import MARKER, judge, parse

MB4 = 4 << 20


def records(n: int, slow=(), gbs: float = 1.0, slow_gbs: float = 0.02, stop: dict = None) -> list[dict]:
    """What n ranks print: a link touching a host in ``slow`` runs at slow_gbs. ``stop``: rank -> (step,
    error or None): that rank says nothing from that step on (None) or reports the error there."""
    stop = stop or {}
    out = []
    steps = ["start", "allreduce"] + [f"ring+{s}" for s in ([1] if n <= 2 else [1, 2])] + ["done"]
    for r in range(n):
        for step in steps:
            if r in stop and stop[r][0] == step:
                if stop[r][1]:
                    out.append({"step": step, "rank": r, "host": f"h{r}", "error": stop[r][1]})
                break
            rec = {"step": step, "rank": r, "host": f"h{r}"}
            if step == "start":
                rec["backend"] = "gloo"
            elif step == "allreduce":
                rec.update(seconds=0.01, bytes=MB4)
            elif step.startswith("ring+"):
                src = (r - int(step[5:])) % n
                bw = slow_gbs if (src in slow or r in slow) else gbs
                rec.update(src=src, seconds=MB4 / bw / 1e9, latency_s=1e-4, bytes=MB4)
            out.append(rec)
    return out


def hosts(n):
    return {r: f"h{r}" for r in range(n)}


def test_marker_lines_are_read_whatever_prefixes_them():
    lines = [f"[rank 1] {MARKER}" + json.dumps({"step": "start", "rank": 1}), "noise", MARKER + "{bad json"]
    assert parse(lines) == [{"step": "start", "rank": 1}]


def test_a_healthy_fabric_passes():
    rep = judge(records(4), hosts(4))
    assert rep.ok and [h.status for h in rep.hosts] == ["ok"] * 4
    assert rep.hosts[0].partners == ["h1", "h2", "h3"]
    assert rep.median_gbs == pytest.approx(1.0) and rep.hosts[0].latency_us == pytest.approx(100)
    assert rep.allreduce_gbs == pytest.approx(MB4 * 1.5 / 0.01 / 1e9)
    assert rep.verdict() == ""


@pytest.mark.parametrize("n", [3, 4, 8])
def test_only_the_slow_host_is_named_not_its_neighbours(n):
    rep = judge(records(n, slow={1}), hosts(n))
    assert [h.host for h in rep.bad] == ["h1"] and rep.hosts[1].status == "slow"
    assert rep.hosts[1].bandwidth_gbs == pytest.approx(0.02)
    assert "slow: h1" in rep.verdict() and "--exclude h1" in rep.verdict()
    data = rep.to_json()
    assert data["slow"] == ["h1"] and data["failed"] == [] and data["ok"] is False


def test_a_busy_but_healthy_host_is_not_slow_a_throttled_one_is():
    # 0.37x the median: the launcher's host under CPU contention in a CI run (healthy); 0.2x: slow.
    assert not judge(records(4, slow={0}, gbs=3.8, slow_gbs=0.37 * 3.8), hosts(4)).bad
    assert [h.host for h in judge(records(4, slow={0}, gbs=3.8, slow_gbs=0.2 * 3.8), hosts(4)).bad] == ["h0"]


def test_two_hosts_finish_and_only_min_bandwidth_can_call_them_slow():
    rep = judge(records(2), hosts(2))
    assert rep.ok, rep.render_table()  # no shifted ring with two hosts: still finished
    rep = judge(records(2), hosts(2), min_bandwidth=5.0)
    assert [h.status for h in rep.hosts] == ["slow", "slow"] and rep.threshold_gbs == 5.0


def test_a_silent_host_is_failed_and_those_that_waited_on_it_are_not():
    stop = {2: ("allreduce", None), 0: ("allreduce", "RuntimeError: [gloo] Timed out waiting 30000ms")}
    stop[1] = stop[3] = stop[0]
    rep = judge(records(4, stop=stop), hosts(4))
    assert {h.host: h.status for h in rep.hosts} == {
        "h0": "not measured",
        "h1": "not measured",
        "h2": "failed",
        "h3": "not measured",
    }
    assert "did not answer at step allreduce" in rep.hosts[2].reason
    assert rep.to_json()["failed"] == ["h2"] and not rep.ok


def test_a_rank_with_its_own_error_is_failed():
    stop = {3: ("ring+1", "RuntimeError: out of memory")}
    rep = judge(records(4, stop=stop), hosts(4))
    assert [h.host for h in rep.bad] == ["h3"] and "out of memory" in rep.hosts[3].reason


def _plan(job, spares):
    nodes = [NodePlan(host=h, node_rank=i, devices=[0], ranks=[i]) for i, h in enumerate(job)]
    plan = LaunchPlan("mpirun", len(job), job[0], 1, nodes, {}, [], ["t.py"])
    plan.spares = {h: 1 for h in spares}
    return plan


def test_slow_hosts_go_to_the_spares_and_without_one_nothing_starts(tmp_path):
    spec = JobSpec(program=["t.py"], hostfile="hf", max_restarts=1, spare_hosts=1)
    rep = judge(records(4, slow={1}), hosts(4))
    new, left_out = replace_bad_hosts(spec, _plan(["h0", "h1", "h2"], ["h3"]), rep)
    assert new.lost_hosts == ["h1"] and left_out[0].startswith("h1 (slow: 0.02 GB/s with its best partner")
    with pytest.raises(CollectiveCheckFailed) as err:
        replace_bad_hosts(spec, _plan(["h0", "h1", "h2", "h3"], []), rep)
    assert err.value.exit_code == ExitCode.PREFLIGHT and "0 good spare(s)" in str(err.value)
    path = tmp_path / "collective-check.json"
    path.write_text(json.dumps(rep.to_json()))
    assert read_exclusions(str(path)) == ["h1"]
    path.write_text("[1]")
    with pytest.raises(UserError, match="--exclude-from"):
        read_exclusions(str(path))


def test_slow_slurm_nodes_join_exclude_and_the_nodes_past_num_nodes_take_their_places(monkeypatch):
    spec = JobSpec(program=["t.py"], num_nodes=3, exclude="h9")
    rep = judge(records(4, slow={1}), hosts(4))
    rep.backend = "slurm"
    plan = _plan(["h0", "h1", "h2"], [])
    plan.backend = "slurm"
    new, left_out = leave_out_slurm_nodes(spec, plan, ["h0", "h1", "h2", "h3"], rep)
    assert new.exclude == "h9@h1" and left_out[0].startswith("h1 (slow: ")
    with pytest.raises(CollectiveCheckFailed) as err:  # no node past --num_nodes: no spare
        leave_out_slurm_nodes(spec, plan, ["h0", "h1", "h2"], rep)
    assert err.value.exit_code == ExitCode.PREFLIGHT and "--spare-hosts needs a hostfile" in str(err.value)
    assert "--exclude h1 to run on fewer" in str(err.value) and "--max-restarts" not in (err.value.hint or "")
    # the check's port: never the job's (both derived from the job id), always in Slurm's range
    monkeypatch.setenv("SLURM_JOB_ID", "39999")
    port = slurm_check_port(JobSpec(program=["t.py"]))
    assert port != slurm.port_for_job("39999") and slurm.PORT_BASE <= port < slurm.PORT_BASE + slurm.PORT_SPAN


def test_the_options_are_checked_before_anything_runs():
    with pytest.raises(UserError, match="give a --hostfile") as err:  # auto may be Slurm's allocation: planned
        JobSpec(program=["t.py"], backend="local", collective_check=True).validate()
    assert err.value.where == "--collective-check"
    with pytest.raises(UserError, match="a positive number of GB/s") as err:
        JobSpec(program=["t.py"], hostfile="hf", min_bandwidth=-1.0).validate()
    assert err.value.where == "--min-bandwidth"


def tcp_records(n: int, **kw) -> list[dict]:
    """What the torch-free stage's ranks print (runtime/link_check.py): no all-reduce, stage "tcp"."""
    out = [r for r in records(n, **kw) if r["step"] != "allreduce"]
    for r in out:
        r["stage"] = "tcp"
        if r["step"] == "start":
            r["backend"] = "tcp"
    return out


def test_the_tcp_stage_alone_is_judged_by_its_own_steps():
    rep = judge(tcp_records(4, slow=(1,)), hosts(4))
    assert [h.status for h in rep.hosts] == ["ok", "slow", "ok", "ok"]
    assert rep.library == "tcp" and rep.allreduce_gbs is None
    assert "links measured over TCP" in rep.render_table() and "all-reduce of" not in rep.render_table()
    stop = {2: ("start", None), 0: ("start", "PeerTimeout: timed out at the rendezvous: no answer from rank(s) 2")}
    stop[1] = stop[3] = stop[0]
    rep = judge(tcp_records(4, stop=stop), hosts(4))
    assert rep.to_json()["failed"] == ["h2"] and "did not answer at step start" in rep.hosts[2].reason


def test_the_library_stage_is_the_verdict_when_it_ran():
    # on hccl or nccl the library stage follows the rendezvous: its figures decide, not the TCP records
    both = [{"step": "start", "rank": r, "host": f"h{r}", "backend": "tcp", "stage": "tcp"} for r in range(4)]
    both += records(4, slow=(3,))
    rep = judge(both, hosts(4))
    assert rep.library == "gloo" and [h.host for h in rep.bad] == ["h3"] and rep.allreduce_gbs is not None
