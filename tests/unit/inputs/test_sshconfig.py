"""The one ssh_config reader (inputs/sshconfig.py): OpenSSH's order, Host and Match blocks, Include, and the
one user@host rule; checked against `ssh -G` itself where OpenSSH is installed (CI installs it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from gaudi_launch.inputs.sshconfig import (
    NeedsOpenSSH,
    SshConfig,
    SshConfigError,
    host_key_policy,
    login_user,
    parse,
    split_args,
)
from gaudi_launch.remote.sshresolve import SshOptions, parse_ssh_g, resolve


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def reader(tmp_path, text, **kw):
    return SshConfig(write(tmp_path / "config", text), home=str(tmp_path / "home"), local_user="me", **kw)


def test_first_obtained_value_wins_across_blocks(tmp_path):
    cfg = reader(tmp_path, "Host web*\n  Port 2201\n  User deploy\nHost *\n  Port 2200\n  User nobody\n  HostName x\n")
    web = cfg.lookup("web1")
    assert (web.port, web.user, web.user_from, web.hostname) == (2201, "deploy", "ssh config", "x")
    other = cfg.lookup("db1")
    assert (other.port, other.user) == (2200, "nobody")


def test_host_patterns_with_negation_turn_the_block_off(tmp_path):
    cfg = reader(tmp_path, "Host gpu-* !gpu-bad ?x\n  Port 2222\n")
    assert cfg.lookup("gpu-1").port == 2222
    assert cfg.lookup("gpu-bad").port == 22  # one negated match: the block is off
    assert cfg.lookup("ax").port == 2222 and cfg.lookup("abx").port == 22
    # Host patterns are case-sensitive, against the name as given (ssh -G GPU-1 agrees)
    assert cfg.lookup("GPU-1").port == 22


def test_command_line_port_and_user_beat_the_config_and_hostfile_user_beats_user(tmp_path):
    cfg = reader(tmp_path, "Host n1\n  Port 2222\n  User deploy\n  IdentityFile ~/.ssh/k1\n")
    assert cfg.lookup("n1", port=2300).port == 2300  # -p
    hc = cfg.lookup("ops@n1")  # the hostfile's user@host, as ssh's destination
    assert (hc.user, hc.user_from, hc.name) == ("ops", "hostfile", "n1")
    assert cfg.lookup("ops@n1", user="root").user == "root"  # -l beats user@host, as in ssh.c
    hc = cfg.lookup("n1", identity="/keys/cli")
    assert hc.identity_files == ("/keys/cli", str(tmp_path / "home" / ".ssh" / "k1"))  # -i first, both tried


def test_login_user_rule():
    assert login_user("a", "b", "me") == ("a", "hostfile")
    assert login_user(None, "b", "me") == ("b", "ssh config")
    assert login_user(None, None, "me") == ("me", "local user")
    assert login_user("a", "b", "me", command_line="c") == ("c", "command line")


def test_include_is_followed_where_it_stands_and_relative_to_dot_ssh(tmp_path):
    home = tmp_path / "home"
    write(home / ".ssh" / "conf.d" / "10-ports.conf", "Host n1\n  Port 2201\nHost *\n  User fromdir\n")
    write(home / ".ssh" / "conf.d" / "20-late.conf", "Host n1\n  Port 9999\n  HostName late\n")
    cfg = SshConfig(home=str(home), system=str(tmp_path / "none"), local_user="me")
    write(home / ".ssh" / "config", "Host n1\n  HostName 10.0.0.1\nInclude conf.d/*.conf\nHost *\n  Port 22\n")
    hc = cfg.lookup("n1")
    assert (hc.hostname, hc.port, hc.user) == ("10.0.0.1", 2201, "fromdir")  # sorted glob, first value wins
    # an Include inside a block that does not apply reads nothing
    cfg = SshConfig(home=str(home), system=str(tmp_path / "none"), local_user="me")
    write(home / ".ssh" / "config", "Host other\n  Include conf.d/*.conf\nHost *\n  Port 23\n")
    assert (cfg.lookup("n1").port, cfg.lookup("n1").user) == (23, "me")
    # after the included file the including block's state holds again, whatever Host it ended in
    cfg = SshConfig(home=str(home), system=str(tmp_path / "none"), local_user="me")
    write(home / ".ssh" / "config", "Host n2\n  Include conf.d/20-late.conf\n  Port 2002\n")
    assert cfg.lookup("n2").port == 2002


def test_user_config_then_system_config_and_minus_F_alone(tmp_path):
    home = tmp_path / "home"
    write(home / ".ssh" / "config", "Host n1\n  Port 2201\n")
    system = write(
        tmp_path / "etc" / "ssh_config", "Host *\n  Port 2999\n  User sysuser\n  StrictHostKeyChecking yes\n"
    )
    both = SshConfig(home=str(home), system=system, local_user="me").lookup("n1")
    assert (both.port, both.user, both.strict_host_keys) == (2201, "sysuser", "yes")
    only = SshConfig(write(tmp_path / "f", "Host *\n  Port 2100\n"), home=str(home), system=system, local_user="me")
    assert (only.lookup("n1").port, only.lookup("n1").user) == (2100, "me")  # -F: that file alone
    assert SshConfig("none", home=str(home), system=system, local_user="me").lookup("n1").port == 22


def test_match_host_originalhost_user_and_all(tmp_path):
    cfg = reader(
        tmp_path,
        "Host short\n  HostName long.example.com\n"
        "Match host *.example.com !originalhost short2\n  Port 2001\n"
        "Match user deploy,!root\n  IdentityFile /k/deploy\n"
        "Match originalhost=short\n  User matched\n"
        "Match all\n  Port 2009\n",
    )
    hc = cfg.lookup("short")
    assert (hc.hostname, hc.port, hc.user) == ("long.example.com", 2001, "matched")
    assert cfg.lookup("deploy@x").identity_files == ("/k/deploy",)
    assert cfg.lookup("root@x").identity_files == () and cfg.lookup("root@x").port == 2009


def test_what_only_openssh_can_evaluate_is_said_and_resolve_asks_ssh_g_only_for_it(tmp_path, monkeypatch):
    cfg = reader(tmp_path, 'Host a\n  Port 2001\nHost b\n  Match exec "true"\n  Port 2\nMatch exec "test %h = b"\n')
    with pytest.raises(NeedsOpenSSH, match="line 4: Match exec"):
        cfg.lookup("a")
    cfg2 = reader(tmp_path, "Host a\n  Port 2001\nHost *\n  CanonicalizeHostname yes\n")
    with pytest.raises(NeedsOpenSSH, match="CanonicalizeHostname"):
        cfg2.lookup("a")
    asked = []
    import gaudi_launch.remote.sshresolve as sshresolve

    def fake(entry, opts, local_user):
        asked.append(entry)
        return parse_ssh_g("hostname 10.1.1.1\nport 2444\nuser root\n", entry, local_user)

    monkeypatch.setattr(sshresolve, "from_openssh", fake)
    plain = reader(tmp_path / "p", "Host a\n  Port 2001\nHost b\n  CanonicalizeHostname always\n")
    got = resolve(["a", "b"], SshOptions(config=plain.config), plain)
    assert asked == ["b"] and got["a"].port == 2001 and (got["b"].hostname, got["b"].port) == ("10.1.1.1", 2444)


def test_host_key_policy_reads_no_file_twice_and_never_looks_up_when_unset(tmp_path):
    hosts = [f"node{i}" for i in range(1000)]
    home = tmp_path / "home"
    write(home / ".ssh" / "conf.d" / "a.conf", "Host node5*\n  StrictHostKeyChecking=yes\n")
    main = write(home / ".ssh" / "config", "# StrictHostKeyChecking ask\nHost *\n  User root\n")
    assert host_key_policy(SshConfig(main, home=str(home)), hosts) is None
    write(home / ".ssh" / "config", "Include conf.d/*.conf\nHost *\n  User root\n")
    t0 = time.perf_counter()
    assert host_key_policy(SshConfig(main, home=str(home)), hosts) == "yes"
    assert time.perf_counter() - t0 < 0.5  # node5 is the 6th host; a 1,000-host plan stays fast
    write(home / ".ssh" / "config", "Include conf.d/*.conf\nMatch exec true\n  User x\n")
    assert host_key_policy(SshConfig(main, home=str(home)), ["zzz"]) == "unknown"


def test_tokens_quotes_and_equals(tmp_path):
    assert split_args('"a b" c\\ d \'e"f\' # comment') == ["a b", "c d", 'e"f']
    lines = parse('Port=2222\nHostName = h\n  # note\nProxyCommand ssh -W %h:%p "jump host"\n')
    assert [(x.keyword, x.args) for x in lines][:2] == [("port", ("2222",)), ("hostname", ("h",))]
    assert lines[2].args == ('ssh -W %h:%p "jump host"',)
    with pytest.raises(SshConfigError, match="line 1: invalid quotes"):
        parse('User "x\n', "cfg")
    cfg = reader(tmp_path, "Host n?\n  HostName %h.cluster\n  UserKnownHostsFile ~/kh/%h_%p %r\n  Port 23\n")
    hc = cfg.lookup("n1")
    home = str(tmp_path / "home")
    assert hc.hostname == "n1.cluster" and hc.known_hosts == (f"{home}/kh/n1.cluster_23", "me")


SSH = shutil.which("ssh")

CASES = [
    "Host web*\n  Port 2201\n  User deploy\nHost *\n  Port 2200\n  HostName %h.lan\n",
    "Host gpu-* !gpu-bad\n  Port 2222\nHost gpu-bad\n  User bad\n",
    "Match host *.lan originalhost gpu-*\n  Port 2300\nHost gpu-1\n  HostName x.lan\n  StrictHostKeyChecking no\n",
    "Host *\n  User=eq\n  Port = 2500\n  UserKnownHostsFile /tmp/a /tmp/b\n",
    "Include {inc}\nHost *\n  Port 2600\n",
    "Host other\n  Include {inc}\nHost gpu-1 web1\n  Include {inc}\n  Port 2700\n",
    "Match user deploy\n  Port 2800\nMatch localuser {me}\n  Port 2801\n",
    "Include {plain}\nHost *\n  Port 2950\n",
]


@pytest.mark.skipif(SSH is None and os.environ.get("CI") != "true", reason="OpenSSH's ssh is not installed")
@pytest.mark.parametrize("case", range(len(CASES)))
def test_agrees_with_ssh_G(tmp_path, case):
    """The reader and `ssh -G -F FILE` (OpenSSH evaluating its own config) name the same hostname, port,
    user and host key settings for every host here."""
    inc = write(tmp_path / "inc" / "x.conf", "Host gpu-1\n  Port 2111\n  User incuser\nHost web*\n  User incweb\n")
    import getpass

    me = getpass.getuser()
    plain = write(tmp_path / "plain.conf", "Host gpu-1 web1\n  Port 2900\nHost db\n  User dbuser\n  Port 2901\n")
    path = write(tmp_path / "config", CASES[case].format(inc=inc, me=me, plain=plain))
    cfg = SshConfig(path, local_user=me)
    for entry in ("web1", "gpu-1", "gpu-bad", "deploy@gpu-2", "db"):
        ours = cfg.lookup(entry)
        done = subprocess.run([SSH, "-G", "-F", path, entry], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        theirs = parse_ssh_g(done.stdout, entry, me)
        got = (ours.hostname, ours.port, ours.user, ours.known_hosts[:1], ours.strict_host_keys or "ask")
        want = (theirs.hostname, theirs.port, theirs.user, theirs.known_hosts[:1], theirs.strict_host_keys)
        assert got == want, (entry, CASES[case])


@pytest.mark.skipif(SSH is None and os.environ.get("CI") != "true", reason="OpenSSH's ssh is not installed")
def test_resolve_asks_real_ssh_G_for_a_match_exec_host(tmp_path):
    """Match exec runs a command: the reader says so and resolve() gets that host from `ssh -G` itself."""
    path = write(tmp_path / "config", 'Host n1\n  HostName 10.1.2.3\nMatch exec "test %h = 10.1.2.3"\n  Port 2345\n')
    got = resolve(["ops@n1", "n2"], SshOptions(config=path))
    assert (got["ops@n1"].hostname, got["ops@n1"].port, got["ops@n1"].user) == ("10.1.2.3", 2345, "ops")
    assert got["ops@n1"].user_from == "hostfile" and got["n2"].port == 22
