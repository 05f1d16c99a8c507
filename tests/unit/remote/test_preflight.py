"""The SSH pre-flight's pure parts: login failures classified (sshfailures.py), the host-key policies
(sshclient.py), a probe's result judged and the report (preflight.py)."""

from __future__ import annotations

import errno
import socket

import paramiko
import pytest

from gaudi_launch.remote.preflight import CheckReport, HostFacts, _judge, _versions_warning, _warnings
from gaudi_launch.remote.probe import ProbeResult
from gaudi_launch.remote.sshclient import SshOptions, policies
from gaudi_launch.remote.sshfailures import classify_ssh_error

OPTS = SshOptions(port=22, identity="/keys/id_ed25519", timeout=7.0, known_hosts="/tmp/kh")
KEY = "/home/u/.ssh/id_ed25519"


# ---------------------------------------------------------------- classify_ssh_error


def test_auth_refused_names_the_key_and_how_to_install_it():
    reason, fix = classify_ssh_error(
        paramiko.AuthenticationException("Authentication failed."), "root@gl-n1", OPTS, KEY
    )
    assert reason.startswith("auth refused") and f"tried key {KEY}" in reason
    assert f"ssh-copy-id -i {KEY}.pub root@gl-n1" in fix and "authorized_keys" in fix


def test_auth_refused_several_keys_and_agent():
    reason, fix = classify_ssh_error(
        paramiko.AuthenticationException("x"), "gl-n1", SshOptions(port=3022), f"{KEY}, /k/id_rsa, ssh-agent keys"
    )
    assert f"tried keys {KEY}, /k/id_rsa, ssh-agent keys" in reason
    assert f"ssh-copy-id -i {KEY}.pub -p 3022 gl-n1" in fix


def test_auth_timeout_is_not_a_refusal():
    reason, fix = classify_ssh_error(paramiko.AuthenticationException("Authentication timeout."), "h", OPTS, KEY)
    assert "did not finish authentication within 7 s" in reason and "--ssh-timeout" in fix


def test_passphrase_protected_key():
    reason, fix = classify_ssh_error(
        paramiko.PasswordRequiredException("private key file is encrypted"), "gl-n1", OPTS, KEY
    )
    assert "passphrase" in reason and KEY in reason and f"ssh-add {KEY}" in fix


def test_no_key_at_all():
    reason, fix = classify_ssh_error(
        paramiko.SSHException("No authentication methods available"), "gl-n1", SshOptions(), None
    )
    assert "no SSH key" in reason and "no ssh-agent" in reason
    assert "ssh-keygen" in fix and "--ssh-identity" in fix


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
        paramiko.ssh_exception.NoValidConnectionsError(
            {
                ("10.0.0.5", 22): ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
                ("::ffff:10.0.0.5", 22, 0, 0): ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
            }
        ),
    ],
)
def test_connection_refused(exc):
    reason, fix = classify_ssh_error(exc, "gl-n2", OPTS, KEY)
    assert reason == "connection refused by gl-n2:22"
    assert "sshd" in fix and "3022" in fix and "--ssh-port" in fix


def test_connection_refused_names_the_port_used():
    reason, _ = classify_ssh_error(ConnectionRefusedError(errno.ECONNREFUSED, "x"), "u@h", SshOptions(port=3022), None)
    assert reason == "connection refused by h:3022"


@pytest.mark.parametrize(
    "exc", [socket.timeout("timed out"), TimeoutError("timed out"), OSError(errno.ETIMEDOUT, "Connection timed out")]
)
def test_timeout(exc):
    reason, fix = classify_ssh_error(exc, "10.213.0.99", OPTS, KEY)
    assert reason == "timed out after 7 s connecting to 10.213.0.99:22"
    assert "security group" in fix and "route" in fix and "--ssh-timeout" in fix


def test_unreachable():
    exc = paramiko.ssh_exception.NoValidConnectionsError(
        {("10.213.0.99", 22): OSError(errno.EHOSTUNREACH, "No route to host")}
    )
    reason, fix = classify_ssh_error(exc, "10.213.0.99", OPTS, KEY)
    assert "unreachable" in reason and "No route to host" in reason and "route" in fix


@pytest.mark.parametrize(
    "code, text",
    [(socket.EAI_NONAME, "Name or service not known"), (socket.EAI_AGAIN, "Temporary failure in name resolution")],
)
def test_dns(code, text):
    reason, fix = classify_ssh_error(socket.gaierror(code, text), "root@gl-nowhere.invalid", OPTS, KEY)
    assert reason.startswith("name does not resolve: gl-nowhere.invalid") and text in reason
    assert "hostfile" in fix and "/etc/hosts" in fix


def test_real_gaierror():
    try:
        socket.getaddrinfo("no such host name", 22)  # spaces: rejected without any DNS query
    except socket.gaierror as e:
        exc = e
    else:
        pytest.skip("the resolver accepted a name with spaces")
    assert classify_ssh_error(exc, "x", OPTS, None)[0].startswith("name does not resolve")


def test_host_key_changed():
    got, want = paramiko.RSAKey.generate(1024), paramiko.RSAKey.generate(1024)
    exc = paramiko.BadHostKeyException("10.213.0.11", got, want)
    reason, fix = classify_ssh_error(exc, "root@10.213.0.11", OPTS, KEY)
    assert reason.startswith("host key changed")
    assert got.fingerprint in reason and want.fingerprint in reason
    assert "ssh-keygen -R 10.213.0.11 -f /tmp/kh" in fix


def test_host_key_changed_non_default_port_uses_bracket_name():
    got, want = paramiko.RSAKey.generate(1024), paramiko.RSAKey.generate(1024)
    reason, fix = classify_ssh_error(paramiko.BadHostKeyException("h", got, want), "h", SshOptions(port=3022), None)
    assert "ssh-keygen -R '[h]:3022'" in fix


def test_unknown_host_key_strict():
    exc = paramiko.SSHException("Server 'gl-n1' not found in known_hosts")  # RejectPolicy's message
    reason, fix = classify_ssh_error(exc, "gl-n1", SshOptions(strict=True, known_hosts="/tmp/kh"), None)
    assert "unknown host key" in reason and "--strict-host-keys" in reason
    assert "ssh-keyscan gl-n1 >> /tmp/kh" in fix


class _Client:
    def _log(self, *args):
        pass


def test_real_reject_policies_are_classified():
    key = paramiko.RSAKey.generate(1024)
    with pytest.raises(paramiko.SSHException) as info:
        paramiko.RejectPolicy().missing_host_key(_Client(), "gl-n1", key)
    reason, _ = classify_ssh_error(info.value, "gl-n1", SshOptions(strict=True), None)
    assert "unknown host key" in reason
    _, Reject = policies()  # ours also names the offered key's fingerprint
    with pytest.raises(paramiko.SSHException) as info:
        Reject("/tmp/kh").missing_host_key(_Client(), "gl-n1", key)
    reason, _ = classify_ssh_error(info.value, "gl-n1", SshOptions(strict=True), None)
    assert "unknown host key for gl-n1" in reason and key.fingerprint in reason


def test_banner_and_other_errors():
    reason, fix = classify_ssh_error(paramiko.SSHException("Error reading SSH protocol banner"), "h", OPTS, KEY)
    assert "no SSH banner" in reason and "sshd" in fix
    reason, fix = classify_ssh_error(EOFError(), "h", OPTS, KEY)
    assert "closed the connection" in reason
    reason, fix = classify_ssh_error(RuntimeError("weird"), "u@h", OPTS, KEY)
    assert "weird" in reason and "ssh -v u@h true" in fix


# ---------------------------------------------------------------- judging, warnings, the report


def judge(probe, **kw):
    f = HostFacts(host="gl-n1", ok=False)
    args = dict(
        python="/py",
        script="train.py",
        cwd="/work",
        master_addr="10.0.0.1",
        master_port=29500,
        master_ssh_port=22,
        is_master=False,
        needed=0,
        where="gl-n1",
    )
    args.update(kw)
    _judge(f, ProbeResult(**{"complete": True, **probe}), **args)
    return f


GOOD = dict(hostname="gl-n1", ncpus=8, python_ok=True, cwd_ok=True, script_ok=True, master_reachable=True)


def test_judge_ok_and_each_failure():
    assert judge(GOOD).ok
    f = judge({**GOOD, "python_ok": False})
    assert not f.ok and "/py" in f.reason and "--python" in f.fix
    f = judge({**GOOD, "script_ok": False})
    assert not f.ok and "train.py" in f.reason and "/work" in f.reason
    f = judge({**GOOD, "cwd_ok": False, "script_ok": False})
    assert "working directory /work" in f.reason
    f = judge({**GOOD, "devices": 4}, needed=8)
    assert not f.ok and "4" in f.reason and "8 needed" in f.reason
    assert judge({**GOOD, "devices": 8}, needed=8).ok
    assert judge({**GOOD}, needed=8).ok  # no hl-smi: not checked
    f = judge({**GOOD, "master_reachable": False, "master_error": "timed out"})
    assert not f.ok and "10.0.0.1:22" in f.reason and "timed out" in f.reason
    f = judge({**GOOD, "port_free": False}, is_master=True)
    assert not f.ok and "29500" in f.reason and "--master_port" in f.fix
    assert judge({**GOOD, "port_free": False}, is_master=False).ok
    f = judge({**GOOD, "python_ok": False, "script_ok": False})
    assert f.reason.count(";") == 1 and len(f.fix.splitlines()) == 2


def test_judge_a_python_that_cannot_import_gaudi_launch():
    from gaudi_launch import __version__
    from gaudi_launch.remote.preflight import launcher_problem

    assert judge({**GOOD, "gaudi_launch_ok": True, "gaudi_launch_path": "/site/gaudi_launch"}).ok
    missing = {**GOOD, "python_path": "/opt/py/bin/python3", "gaudi_launch_ok": False}
    f = judge({**missing, "gaudi_launch_error": "ModuleNotFoundError: No module named 'gaudi_launch'"})
    assert not f.ok
    assert f.reason == (
        "python /opt/py/bin/python3 cannot import gaudi_launch on gl-n1 (with /work first on sys.path, as the "
        "ranks have it): ModuleNotFoundError: No module named 'gaudi_launch'"
    )
    assert f.fix == (
        f"install it in that Python there (/opt/py/bin/python3 -m pip install gaudi-launch=={__version__}, the "
        "launcher's version), or give --python an interpreter that has it on every host"
    )
    # the interpreter as given when `command -v` said nothing; the error text when the probe gave none
    reason, _ = launcher_problem(False, None, "/py", "/work", "gl-n0 (this machine)")
    assert reason.startswith("python /py cannot import gaudi_launch on gl-n0 (this machine)") and "not found" in reason
    # not found out (no python: said on its own; an older probe): no finding
    assert launcher_problem(None, None, "/py", "/work", "gl-n1") is None
    f = judge({**GOOD, "python_ok": False})
    assert "gaudi_launch" not in f.reason
    # with the other findings, in the same reason / fix lines
    f = judge({**missing, "script_ok": False})
    assert f.reason.count(";") == 1 and "gaudi_launch" in f.reason and len(f.fix.splitlines()) == 2


def test_warnings():
    facts = {
        "a": HostFacts(
            "a", True, hostname="a", python_ok=True, openmpi="mpirun (Open MPI) 4.1.5", deepspeed="0.14.0", devices=8
        ),
        "b": HostFacts(
            "b", True, hostname="b", python_ok=True, openmpi="mpirun (Open MPI) 4.1.5", deepspeed="0.14.0", devices=8
        ),
        "c": HostFacts(
            "c", True, hostname="c", python_ok=True, openmpi="mpirun (Open MPI) 5.0.0", deepspeed="0.15.1", devices=8
        ),
        "d": HostFacts("d", False, reason="auth refused"),  # never probed: not part of the comparison
        # no python there: its (unknown) DeepSpeed is not "not installed"
        "e": HostFacts("e", False, hostname="e", python_ok=False, openmpi="mpirun (Open MPI) 4.1.5"),
    }
    w = _warnings(facts)
    assert len(w) == 3, w
    assert w[0].startswith("OpenMPI version differs") and "5.0.0 on c" in w[0] and "4.1.5 on a, b, e" in w[0]
    assert w[1] == "DeepSpeed version differs across hosts: 0.14.0 on a, b; 0.15.1 on c"
    assert w[2] == "device count not checked (no hl-smi) on e"
    facts["b"].devices = None
    assert _warnings(facts)[2] == "device count not checked (no hl-smi) on b, e"
    assert _versions_warning("X", {"a": None, "b": "1"}) == "X differs across hosts: not installed on a; 1 on b"
    assert _versions_warning("X", {"a": "1", "b": "1"}) is None


def test_report_ok_failures_and_table():
    ok = HostFacts("gl-n0", True, hostname="gl-n0", ncpus=4, elapsed_s=0.25)
    bad = HostFacts("root@gl-n1", False, reason="auth refused (tried key /k)", fix="ssh-copy-id -i /k.pub root@gl-n1")
    report = CheckReport(facts={"gl-n0": ok, "root@gl-n1": bad}, warnings=["OpenMPI version differs"])
    assert not report.ok and report.failures() == [bad]
    table = report.render_table()
    lines = table.splitlines()
    assert lines[0].split() == ["host", "status", "details"]
    assert lines[1].startswith("gl-n0") and " OK " in lines[1] and "4 cpus" in lines[1]
    assert lines[2].startswith("root@gl-n1") and "failed" in lines[2] and "auth refused (tried key /k)" in lines[2]
    assert lines[3].strip() == "fix: ssh-copy-id -i /k.pub root@gl-n1"
    assert lines[3].index("fix:") == lines[2].index("auth refused")  # aligned under the reason
    assert lines[4] == "warning: OpenMPI version differs"
    assert CheckReport(facts={"gl-n0": ok}, warnings=[]).ok
    assert CheckReport(facts={}, warnings=[]).ok


def test_a_handshake_that_never_finished_is_not_called_a_key_problem():
    # paramiko's connect wait can run out just before its banner timeout: auth then says this.
    reason, fix = classify_ssh_error(paramiko.SSHException("No existing session"), "h", OPTS, KEY)
    assert "did not answer the SSH handshake" in reason and "no SSH key" not in reason
