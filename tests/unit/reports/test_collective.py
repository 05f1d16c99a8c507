"""The collective check's verdict (reports/collective.py) from the ranks' marker records: who is slow, who
failed, what the table and the JSON say. Figures are synthetic but shaped like the ranks' own."""

from __future__ import annotations

import json

import pytest

from gaudi_launch import pairrounds
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


def records(n: int, slow=(), failed=(), gbs: float = 1.0, slow_gbs: float = 0.02, stage: str = "tcp", missing=()):
    """What the coordinator prints (runtime/link_check.py): the rounds of pairs it runs until the verdict is
    settled, a pair touching a host in ``slow`` at slow_gbs, one touching ``failed`` timed out."""
    out = [{"step": "start", "rank": r, "host": f"h{r}", "library": stage != "tcp"} for r in range(n)]
    if missing:
        return out + [{"step": "rendezvous", "rank": 0, "missing": list(missing)}]
    pairs = []
    for k, rnd in enumerate(pairrounds.round_robin(n)[: pairrounds.max_rounds(n)]):
        for a, b in rnd:
            res = {}
            for r in (a, b):
                if r in failed:
                    res[r] = {}
                elif {a, b} & set(failed):
                    res[r] = {"ok": False, "error": "PeerTimeout: timed out receiving (0 of 4194304 bytes)"}
                else:
                    res[r] = {"ok": True, "gbs": slow_gbs if {a, b} & set(slow) else gbs, "latency_s": 1e-4}
            p = pairrounds.pair_of(res[a], res[b], k, a, b)
            pairs.append(p)
            rec = {"step": "pair", "stage": stage, "rank": 0, **p.__dict__}
            if stage != "tcp":
                rec.update(ranks=2, backend="gloo")
            out.append(rec)
        if pairrounds.settled(pairrounds.verdict(list(range(n)), pairs), k + 1, n):
            break
    return out


def hosts(n):
    return {r: f"h{r}" for r in range(n)}


def test_marker_lines_are_read_whatever_prefixes_them():
    lines = [f"[rank 1] {MARKER}" + json.dumps({"step": "start", "rank": 1}), "noise", MARKER + "{bad json"]
    assert parse(lines) == [{"step": "start", "rank": 1}]


def test_a_healthy_fabric_passes_with_a_record_per_pair():
    rep = judge(records(4), hosts(4))
    assert rep.ok and [h.status for h in rep.hosts] == ["ok"] * 4
    assert rep.hosts[0].partners == ["h2", "h3"]  # two rounds: (0,3) (1,2), then (0,2) (1,3)
    assert rep.median_gbs == pytest.approx(1.0) and rep.hosts[0].latency_us == pytest.approx(100)
    assert [(p.round, p.hosts) for p in rep.pairs] == [
        (0, ["h0", "h3"]),
        (0, ["h1", "h2"]),
        (1, ["h0", "h2"]),
        (1, ["h1", "h3"]),
    ]
    assert rep.verdict() == "" and rep.library == "tcp"
    data = rep.to_json()
    assert len(data["pairs"]) == 4 and data["pairs"][0]["gbs"] == 1.0 and data["pairs"][0]["stage"] == "tcp"


@pytest.mark.parametrize("n", [3, 4, 8])
def test_only_the_slow_host_is_named_not_its_partners(n):
    rep = judge(records(n, slow={1}), hosts(n))
    assert [h.host for h in rep.bad] == ["h1"] and rep.hosts[1].status == "slow", rep.render_table()
    assert rep.hosts[1].bandwidth_gbs == pytest.approx(0.02)
    assert "slow: h1" in rep.verdict() and "--exclude h1" in rep.verdict()
    data = rep.to_json()
    assert data["slow"] == ["h1"] and data["failed"] == [] and data["ok"] is False


def test_a_busy_but_healthy_host_is_not_slow_a_throttled_one_is():
    # 0.37x the median: the launcher's host under CPU contention in a CI run (healthy); 0.2x: slow.
    assert not judge(records(4, slow={0}, gbs=3.8, slow_gbs=0.37 * 3.8), hosts(4)).bad
    assert [h.host for h in judge(records(4, slow={0}, gbs=3.8, slow_gbs=0.2 * 3.8), hosts(4)).bad] == ["h0"]


def test_two_hosts_cannot_be_told_apart_and_neither_is_named():
    rep = judge(records(2), hosts(2))
    assert rep.ok, rep.render_table()
    rep = judge(records(2), hosts(2), min_bandwidth=5.0)
    assert [h.status for h in rep.hosts] == ["unpinned", "unpinned"] and rep.threshold_gbs == 5.0
    assert not rep.bad and "not pinned: h0, h1" in rep.verdict()


@pytest.mark.parametrize("n", [4, 5, 8])
def test_a_hung_host_is_named_failed_and_only_it(n):
    rep = judge(records(n, failed={2}), hosts(n))
    assert {h.host: h.status for h in rep.hosts} == {f"h{r}": ("failed" if r == 2 else "ok") for r in range(n)}
    assert "no result by the pair's deadline" in rep.hosts[2].reason and "partners that passed" in rep.hosts[2].reason
    assert rep.to_json()["failed"] == ["h2"] and "--exclude h2" in rep.verdict()


def test_two_bad_hosts_are_both_named():
    rep = judge(records(6, failed={1}, slow={4}), hosts(6))
    assert rep.to_json()["failed"] == ["h1"] and rep.to_json()["slow"] == ["h4"], rep.render_table()


def test_a_fault_everywhere_names_nobody():
    rep = judge(records(4, failed={0, 1, 2, 3}), hosts(4))
    assert not rep.bad and {h.status for h in rep.hosts} == {"unpinned"} and not rep.ok
    assert "a fault common to them" in rep.verdict()


def test_an_agent_missing_at_the_rendezvous_is_failed():
    rep = judge(records(4, missing=[3]), hosts(4))
    assert rep.to_json()["failed"] == ["h3"] and "did not join the rendezvous" in rep.hosts[3].reason
    assert [h.status for h in rep.hosts[:3]] == ["not measured"] * 3


def test_when_nobody_reaches_the_rendezvous_its_host_is_named():
    recs = [
        {
            "step": "rendezvous",
            "rank": r,
            "host": f"h{r}",
            "error": "PeerTimeout: timed out connecting to the rendezvous at h0:1",
        }
        for r in (1, 2, 3)
    ]
    rep = judge(recs, hosts(4))
    assert rep.to_json()["failed"] == ["h0"], rep.render_table()


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


def test_the_library_stage_is_shown_when_it_ran_and_a_host_named_over_tcp_stays_named():
    recs = records(4, slow={3}) + [
        r for r in records(3, failed={1}, stage="library") if r["step"] == "pair"
    ]  # the library stage ran on h0-h2 (h3 was named slow over TCP)
    recs.append(
        {"step": "confirm", "rank": 0, "members": [0, 2], "ok": True, "gbs": 2.0, "seconds": 0.01, "bytes": 1 << 20}
    )
    rep = judge(recs, hosts(4))
    assert rep.library == "gloo" and rep.to_json()["slow"] == ["h3"] and rep.to_json()["failed"] == ["h1"]
    assert rep.allreduce_gbs == 2.0 and rep.allreduce_ms == pytest.approx(10)
    assert {p.stage for p in rep.pairs} == {"tcp", "library"}


def test_the_check_job_is_built_from_the_jobs_plan_cards_variables_and_a_fresh_token():
    from gaudi_launch.collective import check_spec

    nodes = [NodePlan("h0", 0, [0, 1, 2, 3, 4, 5, 6, 7], list(range(8))), NodePlan("h1", 1, [4, 5], [8, 9])]
    plan = LaunchPlan(
        "mpirun", 10, "h0", 29500, nodes, {"HCCL_SOCKET_IFNAME": "eth1", "MASTER_ADDR": "x"}, [], ["t.py"]
    )
    plan.spares = {"h2": 8}
    spec = JobSpec(program=["t.py"], hostfile="hf", env={"FOO": "1"})
    job = check_spec(spec, ["h0", "h1", "h2"], "hf2", plan)
    settings = json.loads(job.env["GAUDI_LAUNCH_COLLECTIVE"])
    # one process per card the job uses, on the job's cards (--include h1:4,5: modules 4 and 5, not 0)
    # (8 cards usual; only the host that differs is listed, so a thousand hosts stay a short variable)
    assert settings["cards"] == 8 and list(settings["nodes"]) == ["1"]  # the spare h2: a whole node's place
    assert settings["nodes"]["1"] == {
        "cards": 2,
        "env": {"HABANA_VISIBLE_MODULES": "4,5", "CUDA_VISIBLE_DEVICES": "4,5"},
    }
    from gaudi_launch.runtime.link_check import cards_of, node_of

    assert [cards_of(settings, r) for r in range(3)] == [8, 2, 8] and node_of(settings, 0) == {}
    assert settings["lib_bytes"] == 32 << 20 and settings["lib_loops"] == 1000  # hccl_demo's screen
    # the job's planned variables (its interface), not its rank contract; the user's on top
    assert job.env["HCCL_SOCKET_IFNAME"] == "eth1" and "MASTER_ADDR" not in job.env and job.env["FOO"] == "1"
    token = job.env["GAUDI_LAUNCH_COLLECTIVE_TOKEN"]
    assert len(token) == 64 and token != check_spec(spec, ["h0"], "hf2", plan).env["GAUDI_LAUNCH_COLLECTIVE_TOKEN"]
    assert not any(token in a for a in job.program)


def test_the_library_size_is_configurable_and_checked(monkeypatch):
    from gaudi_launch.collective import library_size

    assert library_size({}) == (32 << 20, 1000)
    assert library_size({"GAUDI_LAUNCH_COLLECTIVE_SIZE": "1m,5"}) == (1 << 20, 5)
    with pytest.raises(UserError, match="is not BYTES,LOOPS") as err:
        library_size({"GAUDI_LAUNCH_COLLECTIVE_SIZE": "lots"})
    assert err.value.exit_code == 2


@pytest.mark.parametrize("backend", ["mpirun", "deepspeed"])
def test_the_token_travels_as_a_job_variable_never_on_a_command_line(tmp_path, backend):
    from gaudi_launch.backends import get_backend
    from gaudi_launch.collective import check_spec
    from gaudi_launch.plan.planner import build_plan

    (tmp_path / "hf").write_text("ha slots=1\nhb slots=1\n")
    spec = JobSpec(program=["t.py"], hostfile=str(tmp_path / "hf"), backend=backend)
    job = check_spec(spec, ["ha", "hb"], str(tmp_path / "hf"))
    plan = build_plan(job, backends=get_backend)
    token = job.env["GAUDI_LAUNCH_COLLECTIVE_TOKEN"]
    assert plan.env.get("GAUDI_LAUNCH_COLLECTIVE_TOKEN") == token or any(
        c.env.get("GAUDI_LAUNCH_COLLECTIVE_TOKEN") == token for c in plan.commands
    )
    assert not any(token in a for c in plan.commands for a in c.argv)
    assert token not in json.dumps(plan.to_dict())  # masked wherever the plan is shown


def test_the_pairs_make_a_symmetric_hosts_by_hosts_matrix_and_report_draws_it(tmp_path):
    from gaudi_launch.reports.collective import pair_matrix

    data = judge(records(4, failed={2}), hosts(4)).to_json()
    names, gbs, state = pair_matrix(data)
    assert names == ["h0", "h1", "h2", "h3"]
    assert all(state[i][j] == state[j][i] and gbs[i][j] == gbs[j][i] for i in range(4) for j in range(4))
    assert {state[2][j] for j in (0, 1, 3) if state[2][j]} == {"failed"} and state[2][2] == ""
    assert state[0][3] == "ok" and gbs[0][3] == 1.0
    pytest.importorskip("matplotlib")
    from gaudi_launch.reports.plots import report

    path = tmp_path / "collective-check.json"
    path.write_text(json.dumps(data))
    assert report(str(path), str(tmp_path / "out")) == 0
    png = tmp_path / "out" / "collective-check-pairs.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_on_gaudi_3_nics_a_pair_under_half_the_line_rate_names_its_host_slow():
    # h1's cards reach 20 GB/s of bus bandwidth, the others 60: a third of the median (not slow by the median
    # rule) but under half of Gaudi 3's 75 GB/s per card (Intel Gaudi Network Configuration)
    recs = [r for r in records(4, slow={1}, gbs=60.0, slow_gbs=20.0, stage="library")]
    for r in recs:
        if r["step"] == "start":
            r["device"] = "HL-325L"
    p0 = {f"h{r}": {"path": "P0"} for r in range(4)}
    rep = judge(recs, hosts(4), scaleout=p0)
    assert rep.to_json()["slow"] == ["h1"] and rep.line_floor_gbs == 37.5, rep.render_table()
    assert "scale-out line rate (37.5 GB/s)" in rep.render_table()
    # not over a host NIC path, nor on a generation without a known rate, nor unknown paths: the median alone
    assert not judge(recs, hosts(4), scaleout={**p0, "h2": {"path": "P2"}}).bad
    assert not judge(recs, hosts(4)).bad
    for r in recs:
        if r["step"] == "start":
            r["device"] = "HL-225"
    assert not judge(recs, hosts(4), scaleout=p0).bad


def test_an_agent_that_failed_by_itself_is_named_and_those_it_stopped_are_not():
    # glq-n9's agent could not bind its pair port; the job ended before any pair: the others only saw
    # their rendezvous close
    recs = [
        {
            "step": "rendezvous",
            "rank": r,
            "host": f"h{r}",
            "error": "PeerTimeout: connection closed waiting for the rendezvous",
        }
        for r in (1, 2, 3)
    ]
    recs.append({"step": "start", "rank": 2, "host": "h2", "error": "OSError: [Errno 22] Invalid argument"})
    recs = [r for r in recs if not (r["rank"] == 2 and "closed" in r["error"])]
    rep = judge(recs, hosts(4))
    assert rep.to_json()["failed"] == ["h2"], rep.render_table()
    assert {h.host: h.status for h in rep.hosts} == {
        "h0": "not measured",
        "h1": "not measured",
        "h2": "failed",
        "h3": "not measured",
    }
