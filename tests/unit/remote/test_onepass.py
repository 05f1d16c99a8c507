"""The launcher's side of the one-pass tree (remote/onepass.py, hostchecks._after_one_pass): pure parts."""

from __future__ import annotations

from types import SimpleNamespace

from gaudi_launch.remote import hostchecks, onepass, treeprobe


def test_a_plan_whose_preflight_was_left_to_the_job_is_told_from_one_that_ran():
    assert onepass.deferred(SimpleNamespace(preflight={"ok": True, "hosts": [], "warnings": [], "table": ""}))
    ran = {"ok": True, "hosts": [{"host": "a", "ok": True, "reason": None, "fix": None}], "warnings": [], "table": ""}
    assert not onepass.deferred(SimpleNamespace(preflight=ran))
    assert not onepass.deferred(SimpleNamespace(preflight=None))  # --no-ssh-check


def test_the_jobs_answers_are_judged_as_they_came_when_its_mpirun_did_not_fail():
    given = treeprobe.TreeResult(outputs={"a": "x"}, failed={})
    assert hostchecks._after_one_pass(given, None, None, ["a", "b"], None, 22) is given  # b: the flat way


def test_after_a_failed_start_no_host_is_probed_again_when_every_one_was_answered_or_named():
    given = treeprobe.TreeResult(outputs={"a": "x"}, failed={"b": (255, "Connection timed out")}, error="ended")
    got = hostchecks._after_one_pass(given, None, None, ["a", "b"], None, 22)  # (no mpirun run: none left)
    assert got.outputs == {"a": "x"} and got.failed == {"b": (255, "Connection timed out")} and not got.error


def test_the_hosts_check_a_remote_master_on_the_port_the_ssh_config_gives_it(tmp_path):
    """One pass, a remote master: each host TCP-connects to the master's sshd for "master reachable", on the
    Port of its ssh config entry (as the flat pre-flight's target), --ssh-port before it, else 22."""
    from gaudi_launch.inputs.spec import JobSpec

    config = tmp_path / "ssh_config"
    config.write_text("Host master-0\n  HostName 10.9.9.9\n  Port 2222\n")
    spec = JobSpec(program=["t.py"], ssh_config=str(config))
    assert hostchecks.master_ssh_port("master-0", spec) == 2222
    assert hostchecks.master_ssh_port("other-1", spec) == 22
    assert (
        hostchecks.master_ssh_port("master-0", JobSpec(program=["t.py"], ssh_config=str(config), ssh_port=2200)) == 2200
    )
