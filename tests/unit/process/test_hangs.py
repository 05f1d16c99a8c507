"""--hang-timeout: reading faulthandler's stacks, finding where each rank waits, grouping ranks,
and the watch's decision from real heartbeat files."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from gaudi_launch.backends import get_backend
from gaudi_launch.errors import UserError
from gaudi_launch.inputs.idranges import rank_words
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.process.attempts import with_heartbeats
from gaudi_launch.process.hangs import (
    HangWatch,
    Place,
    check_watchable,
    known_cause,
    main_thread,
    parse_stacks,
    summarize,
    where_waiting,
)
from gaudi_launch.wire import HEARTBEAT_DIR
from tests.helpers import job_env
from tests.unit.cli_helpers import plan_of, user_error

pytestmark = pytest.mark.usefixtures("isolated")  # tests/unit/conftest.py

DUMP = """\
Thread 0x00007f13ffdff6c0 (most recent call first):
  File "/opt/gl/gaudi_launch/process/worker.py", line 319 in watch
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f1401068b80 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/home/u/train.py", line 41 in step
  File "/home/u/train.py", line 60 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "/opt/gl/gaudi_launch/process/worker.py", line 417 in _run
"""
SOURCE = {("/home/u/train.py", 41): "        dist.all_reduce(t)\n", ("/home/u/train.py", 30): "    time.sleep(600)\n"}


def source(path, line):
    return SOURCE.get((path, line), "")


def test_the_main_threads_wait_is_the_innermost_library_call_from_user_code():
    threads = parse_stacks(DUMP)
    assert [len(t.frames) for t in threads] == [3, 6]
    main = main_thread(threads)
    assert main is threads[1]  # not the bootstrap's watchdog thread
    place = where_waiting(main.frames, source)
    assert place == Place("all_reduce", "distributed_c10d.py:3252", "step", "train.py:41", "dist.all_reduce(t)")
    assert place.describe() == "all_reduce (distributed_c10d.py:3252) from step() at train.py:41"


def test_waiting_in_c_code_is_named_by_the_call_on_the_users_line():
    dump = (
        'Current thread 0x1 (most recent call first):\n  File "/home/u/train.py", line 30 in <module>\n'
        '  File "<frozen runpy>", line 88 in _run_code\n'
    )
    frames = main_thread(parse_stacks(dump)).frames
    assert where_waiting(frames, source) == Place("time.sleep", "", "", "train.py:30", "time.sleep(600)")
    assert where_waiting(frames, source).describe() == "time.sleep at train.py:30"  # top level: no function


def test_the_users_function_is_the_innermost_outside_libraries_and_our_runtime():
    dump = (
        "Current thread 0x1 (most recent call first):\n"
        f'  File "{threading.__file__}", line 629 in wait\n'
        '  File "/venv/lib/python3.11/site-packages/gaudi_launch/runtime/fast_ddp.py", line 120 in sync\n'
        '  File "/home/u/train.py", line 30 in wait_for_peer\n'
        '  File "/home/u/train.py", line 60 in <module>\n'
        '  File "<frozen runpy>", line 88 in _run_code\n'
    )
    frames = main_thread(parse_stacks(dump)).frames
    assert where_waiting(frames, source).describe() == "wait (threading.py:629) from wait_for_peer() at train.py:30"
    # only our runtime (python -m gaudi_launch.runtime...): its innermost frame is the one named
    runtime_only = [f for f in frames if "train.py" not in f.file]
    assert where_waiting(runtime_only, source).describe() == "wait (threading.py:629) from sync() at fast_ddp.py:120"
    c_call = [f for f in frames if "train.py" in f.file]  # waiting in C code called on the user's line
    assert where_waiting(c_call, source).describe() == "time.sleep from wait_for_peer() at train.py:30"


def test_a_second_dump_replaces_the_first():
    later = DUMP.replace("line 41 in step", "line 44 in step")
    assert main_thread(parse_stacks(DUMP + later)).frames[2].line == 44


def test_ranks_are_grouped_the_odd_one_out_first():
    assert rank_words([3]) == "rank 3" and rank_words([0, 1, 2, 5, 7, 8]) == "ranks 0-2,5,7-8"
    places = {r: Place("all_reduce", "distributed_c10d.py:3252", "step", "train.py:41", "") for r in (0, 1, 2)}
    places[3] = Place("time.sleep", "", "", "train.py:30", "")
    assert summarize(places, 6, 20.4) == (
        "no rank advanced for 20 s: rank 3 in time.sleep at train.py:30; "
        "ranks 0-2 in all_reduce (distributed_c10d.py:3252) from step() at train.py:41; "
        "ranks 4-5: no stack (on another host, or not running)"
    )


def test_the_watch_fires_once_when_no_heartbeat_is_newer_than_the_timeout(tmp_path):
    directory = str(tmp_path / "hb")
    watch = HangWatch(10, directory, log_dir=str(tmp_path / "logs"))
    watch.create()
    assert oct(os.stat(directory).st_mode & 0o777) == "0o700"
    watch.begin(2, "abcd1234")
    assert watch.check() is None  # just started
    watch.started -= 60  # the attempt began a minute ago...
    beat = tmp_path / "hb" / "rank-1.beat"
    beat.touch()  # ...and rank 1 advanced just now
    assert watch.check() is None
    old = time.time() - 30
    os.utime(beat, (old, old))
    text = watch.check()
    assert text.startswith("no rank advanced for 30 s: ranks 0-1: no stack")  # no pid files: nothing to ask
    assert open(tmp_path / "logs" / "hang-abcd1234.txt").read().startswith(text.splitlines()[0])
    assert watch.check() is None  # once per attempt
    watch.begin(2, "ef567890")  # the next attempt starts clean
    assert not beat.exists() and not watch.fired
    watch.close()
    assert not os.path.exists(directory)


def test_heartbeat_directory_reaches_the_ranks_and_bad_timeouts_are_refused(capsys):
    spec = with_heartbeats(JobSpec(program=["t.py"], hang_timeout=20))
    assert os.path.basename(spec.env[HEARTBEAT_DIR]).startswith("gaudi-launch-")
    assert with_heartbeats(JobSpec(program=["t.py"])).env == {}
    plan = plan_of(capsys, "--num_devices", "2", "--hang-timeout", "30", "t.py")
    assert set(job_env(plan["env"])) == {HEARTBEAT_DIR}
    open("t.py", "w").close()
    assert "--hang-timeout: a number of seconds, at least 1, got 0.5" in user_error(
        capsys, "--hang-timeout", "0.5", "t.py"
    )


def test_hang_detection_needs_a_rank_on_this_host(tmp_path):
    from gaudi_launch.plan.planner import build_plan

    hosts = tmp_path / "hosts"
    hosts.write_text("worker-1 slots=2\n")
    with pytest.raises(UserError) as exc:
        check_watchable(
            build_plan(JobSpec(program=["t.py"], hostfile=str(hosts), ssh_check=False), backends=get_backend)
        )
    assert exc.value.where == "--hang-timeout"
    check_watchable(build_plan(JobSpec(program=["t.py"], num_devices=2), backends=get_backend))  # this host: fine


def test_only_the_ranks_own_live_processes_are_asked_for_stacks(tmp_path):
    import socket
    import subprocess

    from gaudi_launch.process.heartbeats import start_time

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        directory = tmp_path / "hb"
        asked = []
        watch = HangWatch(5, str(directory), signal_rank=lambda pid, sig: asked.append((pid, sig)))
        watch.create()
        watch.begin(3, "j")
        me, pid = socket.gethostname(), sleeper.pid
        (directory / "rank-0.pid").write_text(f"{me} {pid} {start_time(pid)}\n")  # the rank itself
        (directory / "rank-1.pid").write_text(f"{me} {pid} {start_time(pid) + 1}\n")  # a reused pid
        (directory / "rank-2.pid").write_text(f"other-host {pid} {start_time(pid)}\n")  # another host's
        watch.dump(6.0)
        assert asked == [(pid, signal.SIGUSR2)]
        watch.close()
    finally:
        sleeper.kill()
        sleeper.wait()


BATON_DUMP = """\
Current thread 0x00007f1401068b80 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/utils/file_baton.py", line 50 in wait
  File "/venv/lib/python3.11/site-packages/torch/utils/cpp_extension.py", line 2400 in _jit_compile
  File "/venv/lib/python3.11/site-packages/deepspeed/ops/op_builder/builder.py", line 600 in jit_load
  File "/venv/lib/python3.11/site-packages/deepspeed/comm/torch.py", line 51 in build_shm_op
  File "/home/u/train.py", line 12 in <module>
  File "<frozen runpy>", line 88 in _run_code
"""


def test_a_rank_waiting_on_torchs_orphaned_build_lock_is_told_which_file_to_remove():
    # A DeepSpeed rank on CPU killed while it JIT-loaded shm_comm leaves torch's lock file: every later
    # job on that host waits in FileBaton.wait for ever. The hang report says so; an all_reduce does not.
    baton = main_thread(parse_stacks(BATON_DUMP)).frames
    cause = known_cause(baton)
    assert cause is not None and "torch_extensions" in cause and "'lock'" in cause and "remove" in cause
    assert where_waiting(baton, source).describe() == "wait (file_baton.py:50) at train.py:12"
    assert known_cause(main_thread(parse_stacks(DUMP)).frames) is None
