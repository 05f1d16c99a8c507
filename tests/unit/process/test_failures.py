"""The failure decisions (process/failures.py): which rank is the culprit and the job's exit code, from results only."""

from __future__ import annotations

from gaudi_launch.exitcodes import ExitCode
from gaudi_launch.process.failures import (
    Culprit,
    ProcResult,
    ProcState,
    find_culprit,
    format_success,
    format_summary,
    job_exit_code,
    output_dir,
)


def launcher(returncode: int, records: list[dict]) -> ProcResult:
    """mpirun (or srun, deepspeed's runner) that started ranks 0-3 on two hosts."""
    return ProcResult(
        rank=0,
        host="n0",
        name="mpirun",
        pid=7,
        returncode=returncode,
        state=ProcState.FAILED,
        runtime_s=2.0,
        records=records,
        rank_hosts={0: "n0", 1: "n0", 2: "n1", 3: "n1"},
        launcher=True,
        started=[0, 1, 2, 3],
    )


def test_the_first_record_names_the_culprit_and_its_own_exit_code_is_the_jobs():
    first = launcher(1, [{"rank": 2, "exit_code": 3, "exc_type": "ValueError", "message": "bad"}, {"rank": 0}])
    culprit = find_culprit(first)
    assert (culprit.rank, culprit.host, culprit.status) == (2, "n1", "exit code 3 (ValueError: bad)")
    assert job_exit_code(first, culprit) == 3  # the rank's own code, not mpirun's 1


def test_a_launcher_that_reports_its_ranks_own_code_wins_over_its_own():
    first = launcher(143, [])
    assert job_exit_code(first, Culprit(1, "n0", "exit code 7", [], exit_code=7)) == 7  # srun: 143, the task: 7
    assert job_exit_code(first, Culprit(1, "n0", "killed", [])) == 143


def test_a_signal_is_128_plus_its_number_and_what_stopped_a_healthy_job_decides_otherwise():
    one = ProcResult(rank=0, host="h", name="rank 0", pid=5, returncode=-9, state=ProcState.FAILED, runtime_s=1.0)
    assert job_exit_code(one, find_culprit(one)) == 137
    assert job_exit_code(None, None, lost="n1 stopped answering", hung="x") == ExitCode.HOST_LOST
    assert job_exit_code(None, None, hung="rank 0 waits in all_reduce") == ExitCode.HUNG
    assert job_exit_code(None, None, not_started="not every rank started") == ExitCode.CANNOT_EXECUTE
    assert job_exit_code(None, None, interrupted="SIGTERM") == 143
    assert job_exit_code(None, None) == 0


def test_both_summaries_repeat_the_hosts_the_collective_check_left_out():
    left = ["n3 (slow: 0.01x the median)", "n5 (failed: no answer in 20 s)"]
    done = format_success(8, 2, 3725.4, None, results="out", left_out=left).splitlines()
    assert done[2:-1] == [
        "all 8 rank(s) on 2 host(s) ended well, wall time 1:02:05 (3725 s)",
        "left out by the collective check: n3 (slow: 0.01x the median)",
        "left out by the collective check: n5 (failed: no answer in 20 s)",
        "per-rank logs: not kept (--log-dir DIR keeps them)",
        "results: out (the script's --output_dir)",
        "exit code: 0",
    ]
    one = ProcResult(rank=0, host="h", name="rank 0", pid=5, returncode=1, state=ProcState.FAILED, runtime_s=1.0)
    failed = format_summary(one, find_culprit(one), [one], None, 1, "logs", left_out=left[:1]).splitlines()
    assert failed[-4:-1] == [
        "left out by the collective check: n3 (slow: 0.01x the median)",
        "per-rank logs: logs",
        "exit code: 1",
    ]


def test_srun_placed_ranks_are_counted_without_hosts_and_short_runs_in_seconds():
    assert format_success(4, None, 12.34, "logs").splitlines()[2] == "all 4 rank(s) ended well, wall time 12.3 s"


def test_the_results_are_where_the_scripts_last_output_dir_says():
    assert output_dir(["train.py", "--output_dir", "a", "--lr", "1", "--output-dir=b"]) == "b"
    assert output_dir(["train.py", "--output_dir=./x y"]) == "./x y"
    assert output_dir(["train.py", "--output_dir"]) is None  # no value: argparse fails the script itself
    assert output_dir(["train.py", "--output_directory", "a"]) is None
