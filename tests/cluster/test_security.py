"""Issue 12 on real hosts: the job's ssh honours the user's host-key policy, never forwards the agent,
and cannot be handed extra options through a path; a silent sshd is named as such."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.cluster.test_multinode import BACKENDS, ROOT, launch_argv
from tests.helpers import wait_for

PROBE = (
    "import json, os, socket\n"
    "print(json.dumps({'rank': os.environ['RANK'], 'host': socket.gethostname(),"
    " 'agent': os.environ.get('SSH_AUTH_SOCK')}))\n"
)


def user_config(cluster, tmp_path, *, strict: str, known_hosts: str, extra=()) -> str:
    """The cluster's ssh config with the user's own StrictHostKeyChecking and known_hosts."""
    text = open(cluster.ssh_config).read()
    text = text.replace("StrictHostKeyChecking accept-new", f"StrictHostKeyChecking {strict}")
    text = re.sub(r"UserKnownHostsFile \S+", f"UserKnownHostsFile {known_hosts}", text)
    text = text.replace("    BatchMode yes", "\n".join(["    BatchMode yes", *extra]))
    path = tmp_path / "user_ssh_config"
    path.write_text(text)
    return str(path)


def job(cluster, backend, tmp_path, config, *args, extra=(), timeout=180):
    hostfile = cluster.hostfile(slots=1, hosts=[0, 1])
    argv = launch_argv(cluster, backend, hostfile, *args, extra=["--ssh-config", config, *extra])
    return cluster.run_on(
        0, argv, env=cluster.env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=timeout
    )


def probe_script(tmp_path) -> str:
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    return str(path)


def ranks(stdout: str) -> list:
    return [json.loads(line[line.index("{") :]) for line in stdout.splitlines() if '"rank"' in line]


# ---- item 8: the user's ssh_config decides host-key checking ------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_users_strict_host_key_checking_wins_without_preflight(cluster, backend, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    config = user_config(cluster, tmp_path, strict="yes", known_hosts=str(known))
    res = job(cluster, backend, tmp_path, config, probe_script(tmp_path), extra=["--no-ssh-check"])
    assert res.returncode != 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "Host key verification failed" in res.stdout + res.stderr
    assert not any(r["host"] == "gl-n1" for r in ranks(res.stdout))
    assert known.read_text() == ""  # nothing was trusted behind the user's back


@pytest.mark.parametrize("strict", ["yes", "ask"])
def test_preflight_follows_the_users_strict_host_key_checking(cluster, strict, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    config = user_config(cluster, tmp_path, strict=strict, known_hosts=str(known))
    res = job(cluster, "mpirun", tmp_path, config, probe_script(tmp_path))
    assert res.returncode == 3, res.stdout[-2000:] + res.stderr[-2000:]
    assert "unknown host key for 10.213.0.11" in res.stderr and "new keys are refused" in res.stderr, res.stderr
    assert "gaudi-launch: job" not in res.stderr and known.read_text() == ""


@pytest.mark.parametrize("backend", BACKENDS)
def test_strict_host_keys_applies_to_the_jobs_own_ssh(cluster, backend, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    config = user_config(cluster, tmp_path, strict="accept-new", known_hosts=str(known))
    res = job(
        cluster, backend, tmp_path, config, probe_script(tmp_path), extra=["--no-ssh-check", "--strict-host-keys"]
    )
    assert res.returncode != 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert not any(r["host"] == "gl-n1" for r in ranks(res.stdout))
    assert known.read_text() == ""


def test_default_accepts_a_new_key_and_remembers_it(cluster, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    config = user_config(cluster, tmp_path, strict="accept-new", known_hosts=str(known))
    config_text = open(config).read().replace("    StrictHostKeyChecking accept-new\n", "")
    open(config, "w").write(config_text)  # the user's config says nothing: our default, accept-new
    res = job(cluster, "mpirun", tmp_path, config, probe_script(tmp_path), extra=["--no-ssh-check"])
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert {r["host"] for r in ranks(res.stdout)} == {"gl-n0", "gl-n1"}
    assert known.read_text().strip()


# ---- item 10: no agent forwarding -------------------------------------------------------------------


@pytest.fixture
def agent(tmp_path):
    sock = str(tmp_path / "agent.sock")
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: os.path.exists(sock), timeout=10)
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_agent_is_not_forwarded_even_when_the_user_config_asks(cluster, backend, tmp_path, agent):
    config = user_config(
        cluster, tmp_path, strict="accept-new", known_hosts=cluster.known_hosts, extra=["    ForwardAgent yes"]
    )
    env = {**cluster.env(), "SSH_AUTH_SOCK": agent}
    # The config as given does forward the agent to a plain ssh: the job's ssh must not.
    plain = cluster.run_on(
        0,
        ["/usr/bin/ssh", "-F", config, "gl-n1", "printenv", "SSH_AUTH_SOCK"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert plain.stdout.strip(), plain.stderr
    hostfile = cluster.hostfile(slots=1, hosts=[0, 1])
    argv = launch_argv(cluster, backend, hostfile, probe_script(tmp_path), extra=["--ssh-config", config])
    res = cluster.run_on(0, argv, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    remote = [r for r in ranks(res.stdout) if r["host"] == "gl-n1"]
    assert remote and all(r["agent"] is None for r in remote), remote


# ---- item 9: nothing reaches mpirun's space-split plm_rsh_args ------------------------------------------


@pytest.mark.parametrize("option", ["--ssh-identity", "--ssh-config"])
def test_a_space_in_an_ssh_path_cannot_inject_ssh_options(cluster, option, tmp_path):
    marker = tmp_path / "injected"
    value = f"{cluster.key if option == '--ssh-identity' else cluster.ssh_config} -oProxyCommand=touch {marker}"
    hostfile = cluster.hostfile(slots=1, hosts=[0, 1])
    argv = launch_argv(cluster, "mpirun", hostfile, probe_script(tmp_path), extra=["--no-ssh-check", option, value])
    res = cluster.run_on(0, argv, env=cluster.env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"gaudi-launch: error: {option}: the path " in res.stderr
    assert "gaudi-launch: job" not in res.stderr  # nothing was started
    assert not marker.exists()


# ---- item 17: an sshd that never says hello ----------------------------------------------------------

SILENT = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind((sys.argv[1], 2222)); s.listen(8); print('ready', flush=True)\n"
    "held = []\n"
    "while True:\n"
    "    held.append(s.accept()[0])\n"
)


def test_a_host_that_never_sends_the_ssh_banner_is_named_as_such(cluster, tmp_path):
    silent = cluster.popen_on(
        2, [sys.executable, "-c", SILENT, cluster.hosts[2].addr], stdout=subprocess.PIPE, text=True
    )
    try:
        assert silent.stdout.readline().strip() == "ready"
        hostfile = cluster.hostfile(slots=1, hosts=[2])
        argv = launch_argv(cluster, "mpirun", hostfile, "--check-only", "--ssh-port", "2222", "--ssh-timeout", "2")
        res = cluster.run_on(0, argv, env=cluster.env(), cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        silent.kill()
        silent.wait()
    assert res.returncode == 3, res.stdout + res.stderr
    text = res.stdout + res.stderr
    assert "gl-n2" in text and "did not answer the SSH handshake" in text, text
    assert "no SSH key to offer" not in text


# ---- item 7: a remote rank's daemon does not outlive the job -----------------------------------------

DAEMON = (
    "import os, socket, sys, time\n"
    "if os.environ['RANK'] == '1':\n"
    "    if os.fork() == 0:\n"
    "        os.setsid()\n"
    "        if os.fork() == 0:\n"
    "            null = os.open(os.devnull, os.O_RDWR)\n"  # a daemon lets go of the job's output
    "            for fd in (0, 1, 2):\n"
    "                os.dup2(null, fd)\n"
    "            os.closerange(3, 4096)\n"  # mpirun waits for EOF on its stddiag pipe (fd 3)
    "            open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\n"
    "            os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "            time.sleep(900)\n"
    "        os._exit(0)\n"
    "while not os.path.exists(sys.argv[1]):\n"  # every rank: rank 0's exit 3 must not come first
    "    time.sleep(0.02)\n"
    "if os.environ['RANK'] == '1':\n"
    "    print('daemon on', socket.gethostname(), flush=True)\n"
    "else:\n"
    "    time.sleep(1)\n"
    "sys.exit(int(sys.argv[2]))\n"
)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("code", [0, 3])
def test_a_remote_ranks_daemon_does_not_outlive_the_job(cluster, backend, code, tmp_path):
    from tests.helpers import alive

    script = tmp_path / "daemon.py"
    script.write_text(DAEMON)
    pid_file = tmp_path / "daemon.pid"
    hostfile = cluster.hostfile(slots=1, hosts=[0, 1])
    argv = launch_argv(cluster, backend, hostfile, str(script), str(pid_file), str(code))
    res = cluster.run_on(0, argv, env=cluster.env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=180)
    daemon = int(pid_file.read_text())
    try:
        assert res.returncode == code, res.stdout[-2000:] + res.stderr[-2000:]
        assert "daemon on gl-n1" in res.stdout
        assert wait_for(lambda: not alive(daemon), timeout=10), "the remote rank's daemon survived the job"
    finally:
        if alive(daemon):
            os.kill(daemon, 9)


# ---- issue 36 item 9: another user's process a remote rank left behind is reported -----------------------

# Rank 1 (on gl-n1) starts a process of another user in its process group, as `sudo -u OTHER` does with a
# reset environment (no job id in it), and exits at once (os._exit: nothing of the bootstrap's ends its
# group). No process of the job is left there to tie it to the job: only the group the rank led, which the
# rank's start-up line gave the launcher.
ORPHAN = (
    "import os, sys, time\n"
    "if os.environ['RANK'] == '1':\n"
    "    child = os.fork()\n"
    "    if child == 0:\n"
    "        null = os.open(os.devnull, os.O_RDWR)\n"
    "        for fd in (0, 1, 2):\n"
    "            os.dup2(null, fd)\n"
    "        os.closerange(3, 4096)\n"  # mpirun waits for EOF on its stddiag pipe (fd 3)
    "        os.setgroups([]); os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[2]))\n"
    "        os.execve('/bin/sleep', ['sleep', '120'], {})\n"
    "    open(sys.argv[1] + '.tmp', 'w').write(str(child))\n"
    "    os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "    os._exit(0)\n"
    "time.sleep(1)\n"
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_another_users_process_left_by_an_exited_remote_rank_is_reported(cluster, backend, tmp_path):
    from tests.helpers import alive
    from tests.other_user import other_uid

    other = other_uid()
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN)
    pid_file = tmp_path / "orphan.pid"
    hostfile = cluster.hostfile(slots=1, hosts=[0, 1])
    argv = launch_argv(cluster, backend, hostfile, str(script), str(pid_file), str(other))
    res = cluster.run_on(0, argv, env=cluster.env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=180)
    assert pid_file.exists(), res.stdout[-2000:] + res.stderr[-2000:]  # rank 1 got as far as its fork
    orphan = int(pid_file.read_text())
    try:
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        assert alive(orphan)  # another user's: not ours to end, but named
        found = [line for line in res.stderr.splitlines() if line.startswith("gaudi-launch: on gl-n1,")]
        assert any(
            f"pid {orphan} (sleep, uid {other}): another user's process in the job's session" in line for line in found
        ), res.stderr[-3000:]
    finally:
        if alive(orphan):
            os.kill(orphan, 9)
