"""Each host's ssh settings when the launcher is about to contact it (the pre-flight's own client, the
host watch, ``--wait-hosts``): the one reader (inputs/sshconfig.py) for every host, and ``ssh -G`` (OpenSSH
evaluating its own files) for just the hosts whose config the reader cannot evaluate (``Match exec``,
hostname canonicalisation), all of those at once (fanout.py). A plan never comes here: it reads the
config alone, so a dry run spawns nothing.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from gaudi_launch.inputs.hostnames import split_user
from gaudi_launch.inputs.sshconfig import (
    DEFAULT_GLOBAL_KNOWN_HOSTS,
    DEFAULT_KNOWN_HOSTS,
    HostConfig,
    NeedsOpenSSH,
    SshConfig,
    login_user,
    strict_value,
)
from gaudi_launch.remote.fanout import per_host

SSH_G_TIMEOUT = 10.0  # ssh -G reads files and may run a Match exec command; it never connects


@dataclass
class SshOptions:
    port: Optional[int] = None  # --ssh-port; None: from the ssh config for that host, else 22
    identity: Optional[str] = None  # --ssh-identity; None: ssh config / default keys / agent
    config: Optional[str] = None  # --ssh-config; None: ~/.ssh/config, then /etc/ssh/ssh_config
    timeout: float = 10.0  # --ssh-timeout: connect timeout (also banner and auth)
    strict: bool = False  # --strict-host-keys: refuse unknown host keys (else accept-new)
    known_hosts: Optional[str] = None  # None: UserKnownHostsFile of the ssh config, else ~/.ssh/known_hosts


def resolve(entries: Sequence[str], opts: SshOptions, reader: Optional[SshConfig] = None) -> dict[str, HostConfig]:
    """{entry: how ssh reaches it} for hostfile entries ('host' or 'user@host'), in their order. Raises
    inputs.sshconfig.SshConfigError for a config ssh itself would refuse, and RuntimeError when ``ssh -G``
    fails for a host that needs it."""
    reader = reader or SshConfig(opts.config)
    found: dict[str, HostConfig] = {}
    ask: list[str] = []
    for entry in dict.fromkeys(entries):
        try:
            found[entry] = reader.lookup(entry, port=opts.port, identity=opts.identity)
        except NeedsOpenSSH:
            ask.append(entry)
    if ask:
        found.update(per_host(ask, lambda e: from_openssh(e, opts, reader.local_user), name="ssh-G"))
    return {e: found[e] for e in entries}


def ssh_g_argv(entry: str, opts: SshOptions) -> list[str]:
    """``ssh -G`` with the options every ssh of the job gets that decide what it prints. Pure."""
    argv = ["ssh", "-G"]
    if opts.config:
        argv += ["-F", opts.config]
    if opts.port:
        argv += ["-p", str(opts.port)]
    if opts.identity:
        argv += ["-i", opts.identity]
    return argv + ["--", entry]


def from_openssh(entry: str, opts: SshOptions, local_user: str) -> HostConfig:
    try:
        done = subprocess.run(
            ssh_g_argv(entry, opts), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=SSH_G_TIMEOUT
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"ssh -G {entry} failed: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"ssh -G {entry} exited {done.returncode}: {last}")
    return parse_ssh_g(done.stdout, entry, local_user)


def parse_ssh_g(text: str, entry: str, local_user: str) -> HostConfig:
    """``ssh -G``'s "keyword value" lines as a HostConfig. Pure. ssh -G prints its defaults as well, so
    StrictHostKeyChecking reads "ask" when nothing set it (under BatchMode, as strict as yes)."""
    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        values.setdefault(key.lower(), []).append(value.strip())
    entry_user, name = split_user(entry)
    user = values.get("user", [local_user])[0]
    _, source = login_user(entry_user, None if user == local_user else user, local_user)

    def one(key: str) -> Optional[str]:
        value = values.get(key, [None])[0]
        return None if value is None or value.lower() == "none" else value

    return HostConfig(
        name=name,
        hostname=one("hostname") or name,
        user=user,
        user_from=source,
        port=int(one("port") or 22),
        identity_files=tuple(values.get("identityfile", [])),
        identities_only=(one("identitiesonly") or "no").lower() == "yes",
        strict_host_keys=strict_value(one("stricthostkeychecking")),
        known_hosts=tuple((one("userknownhostsfile") or " ".join(DEFAULT_KNOWN_HOSTS)).split()),
        global_known_hosts=tuple((one("globalknownhostsfile") or " ".join(DEFAULT_GLOBAL_KNOWN_HOSTS)).split()),
        proxy_command=one("proxycommand"),
        proxy_jump=one("proxyjump"),
    )
