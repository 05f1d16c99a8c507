"""--fan-out's decisions (plan/fanoutmode.py) and the tree's pure pieces (remote/treehop.py, remote/treeprobe.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gaudi_launch.backends.mpirun import with_radix
from gaudi_launch.errors import UserError
from gaudi_launch.plan import fanoutmode
from gaudi_launch.remote import probe, treehop, treeprobe
from gaudi_launch.wire import TREE_PASSES


def test_auto_is_flat_below_the_threshold_and_tree_from_it():
    n = fanoutmode.TREE_FROM_HOSTS
    assert fanoutmode.choose("auto", n - 1, True) == "flat"
    assert fanoutmode.choose("auto", n, True) == "tree"
    # the tree in one pass crosses flat from fewer hosts (bench_scale's model: 175 against 485)
    one = fanoutmode.ONE_PASS_FROM_HOSTS
    assert one < n
    assert fanoutmode.choose("auto", one - 1, True, one_pass=True) == "flat"
    assert fanoutmode.choose("auto", one, True, one_pass=True) == "tree"
    assert fanoutmode.choose("auto", one, True, one_pass=False) == "flat"
    assert fanoutmode.choose("tree", 2, True) == "tree"
    assert fanoutmode.choose("flat", 10_000, True) == "flat"
    # no engine for this backend, or no remote host: flat whatever was asked
    assert fanoutmode.choose("tree", 100, False) == "flat"
    assert fanoutmode.choose("tree", 0, True) == "flat"


def test_depth_of_a_radix_tree():
    assert fanoutmode.depth(2, 2) == 1
    assert fanoutmode.depth(6, 2) == 2  # 2 + 4
    assert fanoutmode.depth(7, 2) == 3
    assert fanoutmode.depth(64, None) == 1
    assert fanoutmode.depth(1024, None) == 2


def test_radix_from_the_environment():
    assert fanoutmode.radix({}) is None
    assert fanoutmode.radix({fanoutmode.RADIX_ENV: "2"}) == 2
    with pytest.raises(UserError):
        fanoutmode.radix({fanoutmode.RADIX_ENV: "0"})
    assert with_radix(["mpirun", "-n", "2"], 2)[:7] == [
        "mpirun",
        "--mca",
        "routed",
        "radix",
        "--mca",
        "routed_radix",
        "2",
    ]
    assert with_radix(["mpirun", "-n", "2"], None) == ["mpirun", "-n", "2"]


def test_the_hop_reads_ssh_s_command_line_as_ssh_does():
    argv = ["-o", "BatchMode=yes", "-F", "/c", "-oConnectTimeout=3", "-x", "host-a", " orted", "-mca", "x"]
    assert treehop.split(argv) == (argv[:6], "host-a", [" orted", "-mca", "x"])
    with pytest.raises(ValueError):
        treehop.split(["-o", "X=1", "host-only"])


def test_a_failed_hop_is_named_and_read_back():
    line = treehop.failure_line("host-b", 255, "noise\nConnection timed out during banner exchange\n")
    text = "ORTE was unable to reliably start one or more daemons.\n" + line + "other\n"
    assert treehop.parse_failures(text) == {"host-b": (255, "Connection timed out during banner exchange")}


def test_each_rank_s_output_goes_to_its_host_only_when_complete():
    out = (
        f"[1,0]<stdout>:{probe.BEGIN}\n[1,1]<stdout>:{probe.BEGIN}\n[1,0]<stdout>:hostname=a\n"
        f"[1,0]<stdout>:{probe.END}\n[1,1]<stdout>:hostname=b\n"
    )
    got = treeprobe.split_output(out, ["a", "b"])
    assert list(got) == ["a"]
    assert probe.parse(got["a"]).hostname == "a" and probe.parse(got["a"]).complete


def test_what_the_tree_could_not_tell_is_said_once():
    from gaudi_launch.remote.hostchecks import tree_warning

    result = treeprobe.TreeResult(outputs={"a": "x"}, failed={"b": (255, "refused")}, error="one\ntwo\nlast words")
    text = tree_warning(result, ["a", "b", "c", "d"])
    assert "no answer for 2 host(s)" in text and "last words" in text and "--fan-out flat" in text


def test_the_hop_runs_as_its_own_file_where_every_hop_runs_on_the_launcher():
    here = os.path.abspath(treehop.__file__)
    assert treehop.agent("/py", launcher_only=True) == f"/py -S -I {here}"
    assert treehop.agent("/py", launcher_only=False) == "/py -m gaudi_launch.remote.treehop"
    # OpenMPI splits the agent at spaces: a path with one goes by the module's name
    assert treehop.agent("/py", True, here="/a b/treehop.py") == "/py -m gaudi_launch.remote.treehop"
    # as a file without site it runs: the usage error is its own, not an import failure
    done = subprocess.run([sys.executable, "-S", "-I", here, "only-a-host"], capture_output=True, text=True)
    assert done.returncode == 255 and "usage: treehop" in done.stderr


def test_a_hop_that_timed_out_is_classified_as_the_flat_path_would_and_nothing_else_is():
    from gaudi_launch.remote.preflight import hop_timeout

    banner = hop_timeout("Connection timed out during banner exchange")
    assert banner is not None and "banner" in str(banner)
    assert isinstance(hop_timeout("ssh: connect to host h port 22: Connection timed out"), TimeoutError)
    # refused, a key refused, a host key changed: probed the flat way, which says exactly why
    assert hop_timeout("ssh: connect to host h port 22: Connection refused") is None
    assert hop_timeout("Permission denied (publickey).") is None


def test_a_round_maps_rank_i_to_the_hostfile_s_line_i_and_names_its_hop():
    common = dict(hostfile="/p/h", mpirun="mpirun", prefix=None, ssh_args=["-o", "BatchMode=yes"], tcp_cidr=None)
    argv = treeprobe.argv(["a", "b"], hop_python="/py", radix=2, root=False, rank_argv=["true"], **common)
    assert argv[argv.index("rmaps") - 1 : argv.index("rmaps") + 2] == ["--mca", "rmaps", "seq"]
    # radix 2, two hosts: one level, every hop on the launcher: the hop's file itself, without site
    assert argv[argv.index("plm_rsh_agent") + 1] == f"/py -S -I {os.path.abspath(treehop.__file__)}"
    assert argv[argv.index("plm_rsh_args") + 1] == "-o BatchMode=yes"
    assert argv[argv.index("routed_radix") + 1] == "2" and argv[-1] == "true"
    deeper = treeprobe.argv(["a", "b", "c"], hop_python="/py", radix=2, root=False, rank_argv=["true"], **common)
    assert deeper[deeper.index("plm_rsh_agent") + 1] == "/py -m gaudi_launch.remote.treehop"  # found on each host
    sweep = treeprobe.argv(["a"], hop_python=None, radix=None, root=False, rank_argv=["x"], **common)
    assert "plm_rsh_agent" not in sweep and "routed_radix" not in sweep


def test_mpirun_s_own_words_come_before_its_boxed_explanation():
    err = (
        "/py: No module named gaudi_launch\n" + "-" * 40 + "\nORTE was unable to reliably start one or more daemons.\n"
    )
    assert treeprobe._tail(err) == "/py: No module named gaudi_launch"
    assert treeprobe._tail("-" * 40 + "\nORTE was unable\n") == "ORTE was unable"


def test_the_tree_goes_in_one_pass_unless_something_needs_the_pre_flight_first():
    from types import SimpleNamespace

    from gaudi_launch.inputs.spec import JobSpec

    def plan(hosts=("a", "b"), backend="mpirun", spares=None):
        return SimpleNamespace(backend=backend, nodes=[SimpleNamespace(host=h) for h in hosts], spares=spares or {})

    spec = JobSpec(program=["t.py"])
    assert fanoutmode.one_pass_possible(plan(), spec, {})
    assert not fanoutmode.one_pass_possible(plan(backend="deepspeed"), spec, {})  # no daemon tree of OpenMPI's
    assert not fanoutmode.one_pass_possible(plan(hosts=("localhost",)), spec, {})  # no remote host
    assert not fanoutmode.one_pass_possible(plan(spares={"c": 2}), spec, {})  # a spare is not in the job's mpirun
    assert not fanoutmode.one_pass_possible(plan(), JobSpec(program=["t.py"], wait_hosts=30), {})
    assert not fanoutmode.one_pass_possible(plan(), JobSpec(program=["t.py"], collective_check=True), {})
    assert not fanoutmode.one_pass_possible(plan(), spec, {"OMPI_MCA_plm_rsh_agent": "ssh"})  # the user's hops
    assert not fanoutmode.one_pass_possible(plan(), spec, {TREE_PASSES: "3"})
