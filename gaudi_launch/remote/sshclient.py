"""The pre-flight's own SSH client (paramiko): a host reached as OpenSSH would reach it (the settings
from inputs/sshconfig.py, through sshresolve.py), host keys kept as OpenSSH keeps them (accept-new, or
strict), and one command run on a host.

Used where there is no OpenSSH master connection to run the probe through, and to say why a login
failed (sshfailures.py classifies what it raises). Imports paramiko only when a host is checked.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Optional

from gaudi_launch.inputs.hostnames import split_user
from gaudi_launch.inputs.sshconfig import HostConfig
from gaudi_launch.remote.sshresolve import SshOptions

__all__ = ["SshOptions", "Target", "split_user", "target_of"]

DEFAULT_KEYS = ("id_ed25519", "id_rsa", "id_ecdsa")
AGENT = "ssh-agent keys"  # how keys_description names the agent's keys


def strip_brackets(name: str) -> str:
    return name[1:-1] if name.startswith("[") and name.endswith("]") else name


def fingerprint(key) -> str:
    try:
        return f"{key.get_name()} {key.fingerprint}"
    except Exception:  # very old paramiko, odd key objects
        try:
            return f"{key.get_name()} MD5:{key.get_fingerprint().hex()}"
        except Exception:
            return "?"


@dataclass
class Target:
    entry: str  # as in the hostfile
    name: str  # host part of the entry (no user, no brackets)
    hostname: str  # what we connect to (ssh config HostName, else name)
    user: str
    port: int
    key_files: list[str]  # explicit identity files (existing)
    look_for_keys: bool
    allow_agent: bool
    known_hosts: str
    global_known_hosts: list[str]
    strict: bool
    proxy_command: Optional[str]
    config_error: Optional[str] = None
    proxy_jump: Optional[str] = None


def _expand(path: str) -> str:
    return os.path.expanduser(os.path.expandvars(path))


def target_of(entry: str, opts: SshOptions, conf: HostConfig, config_error: Optional[str] = None) -> Target:
    """What paramiko needs to log in to hostfile ``entry`` as ssh would (``conf``: sshresolve.resolve's)."""
    if opts.identity:
        key_files = [_expand(opts.identity)]
        look = False
    else:
        key_files = [k for k in (_expand(k) for k in conf.identity_files) if os.path.isfile(k)]
        look = not conf.identity_files
    known = opts.known_hosts or (conf.known_hosts[0] if conf.known_hosts else "~/.ssh/known_hosts")
    # "ask" under BatchMode (the job's ssh always has it) refuses an unknown key, as "yes" does.
    strict = opts.strict or conf.strict_host_keys in ("yes", "ask")
    return Target(
        entry=entry,
        name=conf.name,
        hostname=conf.hostname,
        user=conf.user,
        port=conf.port,
        key_files=key_files,
        look_for_keys=look,
        allow_agent=not conf.identities_only,
        known_hosts=_expand(known),
        global_known_hosts=[_expand(g) for g in conf.global_known_hosts],
        strict=strict,
        proxy_command=conf.proxy_command,
        proxy_jump=conf.proxy_jump,
        config_error=config_error,
    )


def unresolved(entry: str, opts: SshOptions, error: str) -> Target:
    """A Target for a host whose ssh settings could not be read (``error`` says why)."""
    _, name = split_user(entry)
    conf = HostConfig(name, name, "?", "?", opts.port or 22, (), False, None, ("~/.ssh/known_hosts",), ())
    return target_of(entry, opts, conf, config_error=error)


def keys_description(t: Target) -> str:
    keys = list(t.key_files)
    if t.look_for_keys:
        home = os.path.expanduser("~/.ssh")
        keys += [os.path.join(home, k) for k in DEFAULT_KEYS if os.path.isfile(os.path.join(home, k))]
    if t.allow_agent and os.environ.get("SSH_AUTH_SOCK"):
        keys.append(AGENT)
    return ", ".join(keys) if keys else ""


_write_lock = threading.Lock()


def _append_known_host(path: str, name: str, key) -> None:
    import paramiko

    line = paramiko.hostkeys.HostKeyEntry([name], key).to_line()
    with _write_lock:
        d = os.path.dirname(path)
        if d and not os.path.isdir(d):
            os.makedirs(d, mode=0o700, exist_ok=True)
        prefix = ""
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                if f.tell() > 0:
                    f.seek(-1, os.SEEK_END)
                    prefix = "" if f.read(1) == b"\n" else "\n"
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(prefix + line)


def policies():
    import paramiko

    class AcceptNew(paramiko.MissingHostKeyPolicy):
        """StrictHostKeyChecking=accept-new: remember a new host's key (appended, never rewritten)."""

        def __init__(self, path: str):
            self.path = path

        def missing_host_key(self, client, hostname, key):
            client.get_host_keys().add(hostname, key.get_name(), key)
            _append_known_host(self.path, hostname, key)

    class Reject(paramiko.MissingHostKeyPolicy):
        def __init__(self, path: str):
            self.path = path

        def missing_host_key(self, client, hostname, key):
            raise paramiko.SSHException(
                f"Server {hostname!r} not found in known_hosts ({self.path}; it offers {fingerprint(key)})"
            )

    return AcceptNew, Reject


def quiet_paramiko() -> None:
    # Transport threads log failures at ERROR; without a handler Python prints them to stderr.
    log = logging.getLogger("paramiko")
    if not log.handlers:
        log.addHandler(logging.NullHandler())


class CommandFailed(Exception):
    """Logged in, but running the command failed (timeout, channel refused)."""


def _connect_kwargs() -> set:
    import inspect

    import paramiko

    return set(inspect.signature(paramiko.SSHClient.connect).parameters)


def run_command(t: Target, opts: SshOptions, command: str, timeout: float) -> tuple[str, str, int]:
    """Log in to t and run command; (stdout, stderr, exit status).

    Login failures raise what paramiko raises (for classify_ssh_error); failures after login
    raise CommandFailed.
    """
    import paramiko

    AcceptNew, Reject = policies()
    client = paramiko.SSHClient()
    try:
        for g in t.global_known_hosts:
            if g != "/dev/null" and os.path.isfile(g):
                try:
                    client.load_system_host_keys(g)
                except Exception:
                    pass
        if os.path.isfile(t.known_hosts):
            client.load_host_keys(t.known_hosts)
        client.set_missing_host_key_policy(Reject(t.known_hosts) if t.strict else AcceptNew(t.known_hosts))
        sock = paramiko.ProxyCommand(t.proxy_command) if t.proxy_command else None
        kwargs = dict(
            port=t.port,
            username=t.user,
            password=None,
            key_filename=t.key_files or None,
            timeout=opts.timeout,
            banner_timeout=opts.timeout,
            auth_timeout=opts.timeout,
            allow_agent=t.allow_agent,
            look_for_keys=t.look_for_keys,
            sock=sock,
        )
        if "channel_timeout" in _connect_kwargs():
            kwargs["channel_timeout"] = opts.timeout
        client.connect(t.hostname, **kwargs)
        try:
            _, stdout, stderr = client.exec_command(command, timeout=timeout)
            stdout.channel.shutdown_write()
            out = stdout.read().decode("utf-8", "replace")
            err = stderr.read().decode("utf-8", "replace")
            return out, err, stdout.channel.recv_exit_status()
        except socket.timeout:
            raise CommandFailed(f"the probe did not finish within {timeout:g} s") from None
        except Exception as e:
            raise CommandFailed(f"could not run the probe: {type(e).__name__}: {e}") from None
    finally:
        client.close()
