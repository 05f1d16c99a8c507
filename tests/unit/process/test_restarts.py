"""--max-restarts: the pure decisions (what restarts, how long to wait, what the ranks see, the summary)."""

from __future__ import annotations

import os

import pytest

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.restartopts import Cause, parse_restart_on
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.contract import elastic_env
from gaudi_launch.plan.launchplan import LaunchPlan, NodePlan
from gaudi_launch.plan.restarthosts import HostsExhausted, hosts_for_attempt
from gaudi_launch.process.attempts import attempt_spec
from gaudi_launch.process.failures import Culprit, ProcResult
from gaudi_launch.process.restarts import (
    Attempt,
    backoff_s,
    failure_cause,
    format_attempts,
    lost_hosts_in,
    run_job,
    should_restart,
)
from gaudi_launch.process.supervise import JobResult
from gaudi_launch.wire import restart_count
from tests.helpers import job_env
from tests.unit.cli_helpers import plan_of, user_error

pytestmark = pytest.mark.usefixtures("isolated")  # tests/unit/conftest.py


def result(code, *, interrupted=None, rank_failed=True):
    proc = ProcResult(rank=1, host="h", name="rank 1", pid=5, returncode=code, state="failed", runtime_s=1.0)
    failed = rank_failed and code not in (0, 4)
    return JobResult(
        exit_code=code,
        procs=[proc],
        first_failure=proc if failed else None,
        culprit=Culprit(1, "h", f"exit code {code}", []) if failed else None,
        interrupted_by=interrupted,
        summary="",
    )


def test_which_failures_restart():
    assert failure_cause(result(0)) is None
    assert failure_cause(result(9)) is Cause.RANK and str(Cause.RANK) == "rank"
    assert failure_cause(result(4, rank_failed=False)) is Cause.HOST
    assert failure_cause(result(143, interrupted="SIGTERM", rank_failed=False)) is None  # stopped on purpose
    assert failure_cause(result(9, interrupted="SIGINT")) is None  # Ctrl-C while a rank failed: still a stop
    every = parse_restart_on("all")
    assert should_restart(result(9), 0, 1, every) and not should_restart(result(9), 1, 1, every)
    assert not should_restart(result(9), 0, 0, every)  # --max-restarts 0: as before
    assert not should_restart(result(9), 0, 3, parse_restart_on("host,hang"))


def test_restart_on_spellings():
    assert parse_restart_on("all") == parse_restart_on("rank,host,hang") == {"rank", "host", "hang"}
    assert parse_restart_on(" Hang , rank") == {Cause.HANG, Cause.RANK}
    for bad in ("", "rank,disk", "always"):
        with pytest.raises(UserError) as exc:
            parse_restart_on(bad)
        assert exc.value.where == "--restart-on"


def test_backoff_doubles_up_to_a_cap():
    assert [backoff_s(n, 1.0) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff_s(20, 1.0) == 60.0 and backoff_s(3, 0) == 0


def test_ranks_see_the_attempt_under_both_names():
    spec = JobSpec(program=["t.py"], max_restarts=2, env={"A": "1"})
    env = attempt_spec(spec, 1).env
    assert env == {"A": "1", "GAUDI_LAUNCH_RESTART_COUNT": "1", "GAUDI_LAUNCH_MAX_RESTARTS": "2"}
    assert spec.env == {"A": "1"}  # the original spec is untouched
    assert attempt_spec(JobSpec(program=["t.py"]), 0).env == {}  # no restarts: plans as before
    elastic = elastic_env({"RANK": "0", "WORLD_SIZE": "1"}, {"GAUDI_LAUNCH_JOB_ID": "ab", **env})
    assert (elastic["TORCHELASTIC_RESTART_COUNT"], elastic["TORCHELASTIC_MAX_RESTARTS"]) == ("1", "2")
    assert restart_count(env) == 1 and restart_count({"TORCHELASTIC_RESTART_COUNT": "3"}) == 3
    assert restart_count({}) == 0 and restart_count({"GAUDI_LAUNCH_RESTART_COUNT": "x"}) == 0


def test_dry_run_shows_the_restart_variables(capsys):
    plan = plan_of(capsys, "--num_devices", "2", "--max-restarts", "3", "t.py")
    assert job_env(plan["env"]) == {"GAUDI_LAUNCH_RESTART_COUNT": "0", "GAUDI_LAUNCH_MAX_RESTARTS": "3"}
    assert {c["env"]["TORCHELASTIC_MAX_RESTARTS"] for c in plan["commands"]} == {"3"}
    assert {c["env"]["TORCHELASTIC_RESTART_COUNT"] for c in plan["commands"]} == {"0"}


def test_bad_restart_options_name_the_option(capsys):
    open("t.py", "w").close()
    assert "--max-restarts: a whole number from 0 to 1000, got -1" in user_error(capsys, "--max-restarts", "-1", "t.py")
    assert "--restart-backoff: a number of seconds" in user_error(
        capsys, "--max-restarts", "1", "--restart-backoff", "nan", "t.py"
    )
    err = user_error(capsys, "--backend", "slurm", "--sbatch", "job.sh", "--max-restarts", "1", "t.py")
    assert "--max-restarts: the batch script --sbatch writes runs the job once" in err


def test_attempt_summary():
    attempts = [
        Attempt(1, 9, "rank", "rank 1 on h", "exit code 9", 12.34, backoff_s=1.0),
        Attempt(2, 0, None, None, "exit code 0", 20.0),
    ]
    text = format_attempts(attempts, 2, 0)
    assert "attempt 1: rank failure: rank 1 on h, exit code 9 after 12.3 s (then 1 s back-off)" in text
    assert "attempt 2: finished after 20.0 s" in text
    assert "time lost: 13.3 s in failed attempts and back-off" in text
    assert text.rstrip().splitlines()[-2] == "exit code: 0"


def hosts(*names):
    return [(n, [0, 1]) for n in names]


def test_a_spare_takes_a_lost_hosts_place():
    chosen, note = hosts_for_attempt(hosts("a", "b", "c"), [], 1, None)
    assert chosen == hosts("a", "b") and note == "spare host(s) held back: c"
    chosen, note = hosts_for_attempt(hosts("a", "b", "c"), ["b"], 1, None)
    assert chosen == hosts("a", "c") and note == "left out (lost in an earlier attempt): b"
    with pytest.raises(HostsExhausted) as exc:  # no spare left, no --min-nodes: stop as a lost host does
        hosts_for_attempt(hosts("a", "b", "c"), ["b", "c"], 1, None)
    assert exc.value.exit_code == 4 and "2 host(s) lost (b, c): 1 left, the job needs 2" in exc.value.message
    chosen, note = hosts_for_attempt(hosts("a", "b", "c"), ["b", "c"], 1, 1)  # --min-nodes 1: smaller
    assert chosen == hosts("a") and "running on 1 of 2 host(s) (--min-nodes 1)" in note
    with pytest.raises(UserError) as exc:
        hosts_for_attempt(hosts("a", "b"), [], 2, None)
    assert exc.value.where == "--spare-hosts"
    assert lost_hosts_in("host b stopped answering: no reply", ["a", "b", "bb"]) == ["b"]
    assert lost_hosts_in(None, ["a"]) == []


def test_dry_run_holds_the_spares_back(capsys, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("worker-0 slots=2\nworker-1 slots=2\nworker-2 slots=2\n")
    plan = plan_of(capsys, "--hostfile", str(hostfile), "--max-restarts", "2", "--spare-hosts", "1", "t.py")
    assert [n["host"] for n in plan["nodes"]] == ["worker-0", "worker-1"] and plan["world_size"] == 4
    assert "spare host(s) held back: worker-2" in plan["notes"]
    err = user_error(capsys, "--hostfile", str(hostfile), "--spare-hosts", "1", "--dry-run", "t.py")
    assert "--spare-hosts: a lost host is replaced on a restart: add --max-restarts N" in err
    err = user_error(capsys, "--num_devices", "2", "--max-restarts", "1", "--min-nodes", "1", "--dry-run", "t.py")
    assert "--min-nodes: spare hosts and smaller restarts are for several hosts" in err


def test_every_attempt_keeps_the_hosts_the_collective_check_left_out(tmp_path):
    # the first plan says which host the check left out; a restart's plan is built anew and must say it too,
    # or the last attempt's summary forgets it
    spec = JobSpec(program=["t.py"], max_restarts=1)

    def plan(spec):  # a plan made anew, as the planner makes each attempt's
        nodes = [NodePlan(host=h, node_rank=i, devices=[0], ranks=[i]) for i, h in enumerate(["n0", "n1"])]
        return LaunchPlan("mpirun", 2, "n0", 1, nodes, {}, [], ["t.py"], spec=spec)

    first = plan(spec)
    first.left_out = ["n3 (slow: 0.02 GB/s with its best partner, under 0.5 GB/s)"]
    seen = []

    def start(plan, **_):
        seen.append(list(plan.left_out))
        return result(1 if len(seen) == 1 else 0, rank_failed=len(seen) == 1)

    run_job(spec, first, build=plan, start=start, err=open(os.devnull, "w"), wait=lambda s, say: None)
    assert seen == [first.left_out, first.left_out]


def test_a_restart_whose_pre_flight_fails_inside_its_attempt_still_says_the_attempts(tmp_path):
    """The one-pass tree checks the hosts inside the attempt (its start raises the pre-flight's failure, not its
    plan): the summary of the attempts so far comes before the error, as when a restart's plan fails."""
    from types import SimpleNamespace

    from gaudi_launch.plan.multinode import PreflightFailed

    spec = JobSpec(program=["t.py"], max_restarts=2)

    def plan(spec):
        return LaunchPlan(
            "mpirun",
            1,
            "n0",
            1,
            [NodePlan(host="n0", node_rank=0, devices=[0], ranks=[0])],
            {},
            [],
            ["t.py"],
            spec=spec,
        )

    starts = []

    def start(plan, **_):
        starts.append(plan)
        if len(starts) == 2:
            raise PreflightFailed(SimpleNamespace(render_table=lambda: "n0  failed  cannot reach"))
        return result(1, rank_failed=True)

    err = tmp_path / "err"
    with open(err, "w") as stream, pytest.raises(UserError) as exc:
        run_job(spec, plan(spec), build=plan, start=start, err=stream, wait=lambda s, say: None)
    assert exc.value.exit_code == 3 and len(starts) == 2
    said = err.read_text()
    assert "attempt 1: rank failure" in said and said.rstrip().splitlines()[-2] == "exit code: 3"
