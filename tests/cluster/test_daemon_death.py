"""mpirun's daemon on one host dies after it detached and before it reported back (OpenMPI 4, the
flat path over the job's sessions, where ORTE starts every orted with --daemonize): ORTE never notices
and mpirun waits for it for ever (before the fix: until --start-timeout, 900 s by default). The launch
must end with a launch failure that names the host and says the daemon died.

The daemon is OpenMPI's real orted: on one host, the command mpirun runs for its daemons
(orte_launch_agent) sets ORTE's own fault injection, orte_daemon_fail, to that daemon's vpid, so the
orted detaches (opal_daemon_init) and then fails in orted_main after orte_init, before its callback."""

from __future__ import annotations

from tests.cluster.test_multinode import launch_argv

FAILING_ORTED = """#!/bin/sh
if [ "$(hostname)" = {host} ]; then
    prev=
    for a in "$@"; do
        if [ "$prev" = ess_base_vpid ]; then
            OMPI_MCA_orte_daemon_fail=$a
            export OMPI_MCA_orte_daemon_fail
        fi
        prev=$a
    done
fi
exec orted "$@"
"""


def test_a_daemon_that_dies_after_detaching_ends_the_launch_naming_its_host(cluster, tmp_path):
    orted = tmp_path / "failing-orted"
    orted.write_text(FAILING_ORTED.format(host=cluster.names[1]))
    orted.chmod(0o755)
    (tmp_path / "job.py").write_text("print('rank up', flush=True)\n")
    hostfile = cluster.hostfile(slots=1, hosts=[0, 1])
    env = {**cluster.env(), "OMPI_MCA_orte_launch_agent": str(orted)}  # mpirun's command for its daemons
    # No --start-timeout: its default (900 s) is far beyond this test's own limit, so the old code, which
    # waited for the dead daemon until then, fails here with subprocess.TimeoutExpired.
    res = cluster.run_on(
        0,
        launch_argv(cluster, "mpirun", hostfile, "job.py"),
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=150,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 127, out[-3000:]
    assert (
        "first failure: mpirun's daemon (orted) died after it detached and before it reported back to "
        f"mpirun, on {cluster.names[1]} (orted, pid " in out
    ), out[-3000:]
    assert ", exit code 1): mpirun starts no rank until every daemon has reported" in out, out[-3000:]
    assert f"run `ssh {cluster.names[1]} orted --version`" in out
    assert f"{cluster.names[0]} (orted" not in out  # the healthy host is not blamed
    assert "rank up" not in out  # no rank ran anywhere: ORTE starts none before every daemon reported
