"""Pure parts of the multi-host backends: mpirun flags per OpenMPI version, output reassembly,
failure reports, the job file, job-scoped teardown, the host watch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from gaudi_launch.backends import deepspeed, mpirun
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.launchplan import LaunchPlan, NodePlan
from gaudi_launch.process.worker import normalize_env, read_job_argv
from gaudi_launch.remote import jobdir
from gaudi_launch.remote.teardown import signal_job
from gaudi_launch.remote.watch import HostWatch, reachable


def two_node_plan(**kw) -> LaunchPlan:
    nodes = [NodePlan("gl-n0", 0, [0, 1], [0, 1]), NodePlan("gl-n1", 1, [0, 1], [2, 3])]
    return LaunchPlan(
        backend="mpirun",
        world_size=4,
        master_addr="gl-n0",
        master_port=29600,
        nodes=nodes,
        env={"A": "1"},
        commands=[],
        program=["t.py", "--x"],
        job_id="j1",
        **kw,
    )


def test_mpirun_argv_openmpi4_without_core_count():
    argv = mpirun.build_argv(
        two_node_plan(), JobSpec(program=["t.py"], python="/py"), version=4, root=True, exported=["A", "MASTER_ADDR"]
    )
    assert argv[:6] == ["mpirun", "--allow-run-as-root", "-n", "4", "--host", "gl-n0:2,gl-n1:2"]
    assert argv[argv.index("--map-by") + 1] == "ppr:2:node"
    assert argv[argv.index("--bind-to") + 1] == "none"
    assert argv[argv.index("--rank-by") + 1] == "slot"
    assert "--tag-output" in argv and "--output" not in argv
    assert argv[-5:] == ["/py", "-u", "-m", "gaudi_launch.process.worker", "t.py"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-x"] == ["A", "MASTER_ADDR"]


def test_mpirun_argv_openmpi5_binds_cores_and_passes_ssh_and_network():
    argv = mpirun.build_argv(
        two_node_plan(),
        JobSpec(program=["t.py"], python="/py"),
        version=5,
        root=False,
        exported=[],
        cores_per_host=16,
        tcp_cidr="10.0.0.0/24",
        rsh_args=["-p", "3022", "-F", "/cfg"],
    )
    assert "--allow-run-as-root" not in argv
    assert argv[argv.index("--map-by") + 1] == "ppr:2:node:PE=8"
    assert argv[argv.index("--bind-to") + 1] == "core"
    assert argv[argv.index("--output") + 1] == "tag" and "--tag-output" not in argv
    # OpenMPI 5 (PRRTE) names, as `prte_info --all` of 5.0.8 lists them; the MPI library's btl kept its name
    assert argv[argv.index("btl_tcp_if_include") - 1 : argv.index("btl_tcp_if_include") + 2] == [
        "--mca",
        "btl_tcp_if_include",
        "10.0.0.0/24",
    ]
    assert argv[argv.index("prte_if_include") - 1 : argv.index("prte_if_include") + 2] == [
        "--prtemca",
        "prte_if_include",
        "10.0.0.0/24",
    ]
    assert argv[argv.index("plm_ssh_args") - 1 : argv.index("plm_ssh_args") + 2] == [
        "--prtemca",
        "plm_ssh_args",
        "-p 3022 -F /cfg",
    ]
    assert not [a for a in argv if "plm_rsh" in a or "oob_tcp" in a or a.startswith("orte_")]


def test_mpirun_argv_openmpi4_keeps_the_orte_names_and_5_daemons_skip_tree_spawn_under_prte_names():
    spec = JobSpec(program=["t.py"], python="/py")
    kw = dict(root=False, exported=[], tcp_cidr="10.0.0.0/24", rsh_args=["-p", "3022"])
    four = mpirun.build_argv(two_node_plan(), spec, version=4, **kw)
    assert four[four.index("--rank-by") :][:2] == ["--rank-by", "slot"]
    assert four[four.index("--tag-output") + 1 :][:9] == [
        "--mca",
        "btl_tcp_if_include",
        "10.0.0.0/24",
        "--mca",
        "oob_tcp_if_include",
        "10.0.0.0/24",
        "--mca",
        "plm_rsh_args",
        "-p 3022",
    ]
    five = mpirun.over_connections(mpirun.build_argv(two_node_plan(), spec, version=5, **kw), ["-o", "X=1"], 5)
    i = five.index("plm_ssh_args")
    assert five[i - 1 : i + 5] == [
        "--prtemca",
        "plm_ssh_args",
        "-p 3022 -o X=1",
        "--prtemca",
        "plm_ssh_no_tree_spawn",
        "1",
    ]
    assert five[five.index("--rank-by") + 1] == "slot" and "core" not in five
    four = mpirun.over_connections(four, ["-o", "X=1"], 4)
    assert four[four.index("plm_rsh_args") + 1 :][:4] == ["-p 3022 -o X=1", "--mca", "plm_rsh_no_tree_spawn", "1"]
    # one host's loopback network: OpenMPI 4's daemons take it, PRRTE's refuse it (tests/integration/test_openmpi5.py)
    lo = dict(kw, tcp_cidr="127.0.0.0/8")
    assert "oob_tcp_if_include" in mpirun.build_argv(two_node_plan(), spec, version=4, **lo)
    five = mpirun.build_argv(two_node_plan(), spec, version=5, **lo)
    assert "prte_if_include" not in five and five[five.index("btl_tcp_if_include") + 1] == "127.0.0.0/8"


def test_ompi_demux_reassembles_lines_split_across_ranks():
    demux = mpirun.OmpiDemux()
    out = []
    for line in [
        "[1,0]<stdout>:hi 0 line 1[1,1]<stdout>:hi 1 line 0",
        "[1,0]<stdout>:",
        "[1,0]<stdout>:hi[1,0]<stdout>: 0 line 2[1,0]<stdout>:",
        "--------------------------------------------------------------------------",
        "[1,1]<stderr>:partial",
    ]:
        out += demux(line)
    out += demux(None)
    assert out == [(1, "hi 1 line 0"), (0, "hi 0 line 1"), (0, "hi 0 line 2"), (None, "-" * 74), (1, "partial")]


def test_ompi5_demux_takes_the_space_of_its_tag_and_keeps_the_programs_own():
    # OpenMPI 5 (PMIx iof) formats "[%s,%s]<%s>: ": job suffix, rank, stream, then one space.
    demux = mpirun.OmpiDemux(5)
    out = []
    for line in [
        "[1,0]<stdout>: hello",
        "[1,1]<stderr>:   indented",
        "[prterun-h-42,2]<stdout>: odd namespace",
        "[1,3]<stdout>: no newline[1,0]<stdout>: next",
        "[1,0]<stddiag>: diag",
        "[1,0]<stdout>:no space is not a v5 tag",
    ]:
        out += demux(line)
    assert out == [
        (0, "hello"),
        (1, "  indented"),
        (2, "odd namespace"),
        (0, "next"),
        (0, "diag"),
        (None, "[1,0]<stdout>:no space is not a v5 tag"),
    ]
    assert demux(None) == [(3, "no newline")]
    assert mpirun.OmpiDemux(4)("[1,0]<stdout>: kept")[0] == (0, " kept")  # v4: the space is the program's


def test_mpirun_explains_its_own_failure_reports():
    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}
    c = mpirun.explain(["mpirun noticed that process rank 2 with PID 0 on node b exited on signal 9 (Killed)."], hosts)
    assert (c.rank, c.host, c.status) == (2, "b", "killed by SIGKILL")
    c = mpirun.explain(["  Process name: [[28933,1],1]", "  Exit code:    3"], hosts)
    assert (c.rank, c.host, c.status) == (1, "a", "exit code 3")
    assert mpirun.explain(["nothing here"], hosts) is None
    # OpenMPI 5 (PRRTE's help-prun.txt): the same reports, worded and named differently.
    c = mpirun.explain(
        ["prterun noticed that process rank 3 with PID 0 on node b exited on", "signal 15 (Terminated)."], hosts
    )
    assert (c.rank, c.host, c.status) == (3, "b", "killed by SIGTERM")
    c = mpirun.explain(["   Process name: [prterun-a-4242@1,2]", "   Exit code:    7"], hosts)
    assert (c.rank, c.host, c.status) == (2, "b", "exit code 7")


def test_deepspeed_argv_names_a_job_file_and_a_hostfile_of_the_selection(tmp_path):
    plan = two_node_plan(exported=["HCCL_X"])
    plan.nodes[1].host = "root@gl-n1"
    plan.nodes[1].devices = [1, 3]
    spec = JobSpec.build(program=["t.py", "a b", "$(x)"], python="/nowhere/py", launcher_args="-l root", grace=3)
    environ = {"HCCL_X": "v w", "OTHER": "no"}
    argv = deepspeed.build_argv(plan, spec, environ, str(tmp_path))
    assert argv[:6] == [
        "/nowhere/py",
        "-m",
        "gaudi_launch.backends.ds_runner",
        "--hostfile",
        f"{tmp_path}/hostfile",
        "--force_multi",
    ]
    # No --include (DeepSpeed splits it on '@', user@host too): the hostfile holds the selection's
    # rank counts, the device subset travels in the job file.
    assert "--include" not in argv and "--exclude" not in argv
    assert "--launcher_args=-l root" in argv and "--no_local_rank" in argv
    assert not any(v in " ".join(argv) for v in ("v w", "a b", "$(x)", "t.py"))
    # What the worker reads back from the file argv names, checked against the digest on argv.
    os.chmod(tmp_path, 0o700)
    jobdir.write_private(str(tmp_path / "job.json"), deepspeed.job_payload(plan, spec, environ))
    job = read_job_argv(argv[-2:])
    assert job["argv"] == ["t.py", "a b", "$(x)"] and job["module"] is False and job["cwd"] == os.getcwd()
    assert job["env"] == {"HCCL_X": "v w", "A": "1", "GAUDI_LAUNCH_JOB_ID": "j1", "GAUDI_LAUNCH_GRACE": "3"}
    assert deepspeed.hostfile_text(plan) == "gl-n0 slots=2\nroot@gl-n1 slots=2\n"


def test_pdsh_output_goes_to_the_rank_its_relay_tagged_and_recognises_node_failures():
    demux = deepspeed.PdshDemux(["gl-n0", "root@gl-n1"])
    assert demux("gl-n1: hello") == [(None, "gl-n1: hello")]  # DeepSpeed's own line there
    assert demux("gl-n1: @@gaudi-launch-rank@@3 hello") == [(3, "hello")]
    assert demux("@@gaudi-launch-rank@@0 local  line ") == [(0, "local  line ")]  # one node: no pdsh
    assert demux("gl-n1: @@gaudi-launch-rank@@3 @@gaudi-launch-error-record@@ {}") == [
        (3, "@@gaudi-launch-error-record@@ {}")
    ]
    assert demux("gl-n2: @@gaudi-launch-rank@@3 x") == [(None, "gl-n2: @@gaudi-launch-rank@@3 x")]  # not ours
    assert deepspeed.node_failed("pdsh@gl-n0: gl-n1: ssh exited with exit code 1")
    assert not deepspeed.node_failed("pdsh@gl-n0: gl-n1: ssh exited with exit code 0")


def test_job_file_round_trips_anything_and_refuses_another_file(tmp_path):
    env = {"A": 'x "y" $(z) `w` ; \\ \n', "J": '{"k": [1]}'}
    data = jobdir.payload(env, ["s.py", "--", "ünï", ""], True, "/w d", key="k1")
    path = str(tmp_path / "job.json")
    jobdir.write_private(path, data)
    assert os.stat(path).st_mode & 0o777 == 0o600
    job = jobdir.read_job(path, jobdir.digest(data))
    assert (job["env"], job["argv"], job["module"], job["cwd"]) == (env, ["s.py", "--", "ünï", ""], True, "/w d")
    with pytest.raises(jobdir.JobDirError):
        jobdir.read_job(path, jobdir.digest(data + b" "))
    with pytest.raises(FileExistsError):  # never overwritten
        jobdir.write_private(path, b"{}")
    os.chmod(path, 0o644)
    with pytest.raises(jobdir.JobDirError):  # readable by others: not ours to trust
        jobdir.read_job(path, jobdir.digest(data))
    # The digest says nothing about a short value: a random key is part of what it covers.
    assert jobdir.digest(data) != jobdir.digest(jobdir.payload(env, ["s.py", "--", "ünï", ""], True, "/w d", "k2"))


def test_worker_maps_openmpi_and_deepspeed_layouts():
    ompi = normalize_env(
        {
            "OMPI_COMM_WORLD_RANK": "5",
            "OMPI_COMM_WORLD_SIZE": "8",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            "OMPI_COMM_WORLD_NODE_RANK": "1",
        }
    )
    assert (ompi["RANK"], ompi["WORLD_SIZE"], ompi["LOCAL_RANK"], ompi["NODE_RANK"]) == ("5", "8", "1", "1")
    ds = normalize_env(
        {
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "LOCAL_SIZE": "2",
            "CROSS_RANK": "1",
            "MASTER_ADDR": "m",
            "MASTER_PORT": "1",
        }
    )
    assert (ds["LOCAL_WORLD_SIZE"], ds["NODE_RANK"], ds["GROUP_RANK"]) == ("2", "1", "1")


def test_signal_job_touches_only_its_own_job():
    code = "import time; time.sleep(60)"
    mine = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "GAUDI_LAUNCH_JOB_ID": "jobA"})
    other = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "GAUDI_LAUNCH_JOB_ID": "jobAB"})
    plain = subprocess.Popen([sys.executable, "-c", code])
    try:
        hits = signal_job(
            ["localhost"], "jobA", signal.SIGTERM, ssh_args=[], python=sys.executable, is_local=lambda h: True
        )
        assert hits == {"localhost": 1}
        assert mine.wait(timeout=10) == -signal.SIGTERM
        assert other.poll() is None and plain.poll() is None
    finally:
        for p in (mine, other, plain):
            p.kill()
            p.wait()


def test_host_watch_reports_a_host_after_consecutive_misses(monkeypatch):
    answers = {"a": [True, False, False, False], "b": [True, True, True, True]}
    monkeypatch.setattr("gaudi_launch.remote.watch.reachable", lambda addr, port, timeout: answers[addr].pop(0))
    watch = HostWatch([("a", "a", 22), ("b", "b", 22)], misses=3)
    assert [watch.probe() for _ in range(3)] == [None, None, None]
    message = watch.probe()
    assert message.startswith("host a stopped answering") and watch.lost == {"a"}


def test_refused_counts_as_reachable():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert reachable("127.0.0.1", port, 1.0)  # nothing listens: refused, the machine is there


def test_worker_gives_each_rank_its_share_of_the_cores():
    base = {"RANK": "0", "WORLD_SIZE": "1"}
    assert "PT_HPU_LAZY_MODE" not in normalize_env(base)  # the HPU settings come from hpu_env (Gaudi hosts only)
    assert normalize_env({**base, "LOCAL_WORLD_SIZE": "2"}, cpu_count=16)["OMP_NUM_THREADS"] == "8"
    assert "OMP_NUM_THREADS" not in normalize_env({**base, "OMP_NUM_THREADS": "3"}, cpu_count=16)


def test_device_option_reaches_every_rank(isolated, capsys):
    import json

    from gaudi_launch.cli import main

    assert main(["--dry-run", "--json", "--num_devices", "2", "--device", "cpu", "t.py"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["env"]["GAUDI_LAUNCH_DEVICE"] == "cpu"
    assert main(["--dry-run", "--device", "tpu", "t.py"]) == 2
    assert "--device: unknown device 'tpu'" in capsys.readouterr().err


def test_openmpi_outside_the_system_directories_gets_its_prefix():
    from gaudi_launch.backends.mpirun import mpirun_and_prefix

    # Habana's RHEL images: on PATH only through Docker's ENV here; ssh sessions on the other hosts lack it.
    habana = "/opt/habanalabs/openmpi"
    assert mpirun_and_prefix(f"{habana}/bin/mpirun", [habana]) == (f"{habana}/bin/mpirun", habana)
    # not on PATH at all (a login shell without that ENV): the installed one, by its path
    assert mpirun_and_prefix(None, [habana]) == (f"{habana}/bin/mpirun", habana)
    # the distribution's OpenMPI: as before, no prefix
    assert mpirun_and_prefix("/usr/bin/mpirun", [habana]) == ("mpirun", None)
    assert mpirun_and_prefix(None, []) == ("mpirun", None)
