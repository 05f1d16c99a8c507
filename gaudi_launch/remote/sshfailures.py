"""Why an SSH login failed, and what to do about it: classify_ssh_error turns what the SSH client raised
into a reason and a fix a user can act on (which key was refused, which known_hosts line to remove,
the command to try by hand). Pure."""

from __future__ import annotations

import errno
import os
import shlex
import socket
from typing import Optional

from gaudi_launch.remote.sshclient import AGENT, SshOptions, fingerprint, split_user, strip_brackets


def _keys_of(key_tried: Optional[str]) -> list[str]:
    return [k.strip() for k in (key_tried or "").split(",") if k.strip() and k.strip() != AGENT]


def _known_hosts_name(name: str, port: int) -> str:
    return name if port == 22 else f"[{name}]:{port}"


def _errno_of(exc: BaseException) -> Optional[int]:
    errs = getattr(exc, "errors", None)  # paramiko NoValidConnectionsError: {addr: OSError}
    if isinstance(errs, dict) and errs:
        codes = {getattr(e, "errno", None) for e in errs.values()}
        if errno.ECONNREFUSED in codes:
            return errno.ECONNREFUSED
        return next(iter(codes))
    return getattr(exc, "errno", None)


def classify_ssh_error(exc: BaseException, host: str, opts: SshOptions, key_tried: Optional[str]) -> tuple[str, str]:
    """(reason, fix) for an exception raised while connecting/logging in to ``host``. Pure.

    ``host`` is what we connected to, ``user@name`` or ``name``; ``opts.port`` the port used
    (None means 22); ``key_tried`` a comma-separated list of the keys offered (may include
    "ssh-agent keys").
    """
    import paramiko  # the launcher imports this module lazily; paramiko is a dependency

    port = opts.port or 22
    user, name = split_user(host)
    name = strip_brackets(name)
    target = f"{user}@{name}" if user else name
    port_opt = f" -p {port}" if port != 22 else ""
    kh = opts.known_hosts
    default_kh = os.path.expanduser("~/.ssh/known_hosts")
    kh_opt = f" -f {shlex.quote(kh)}" if kh and kh != default_kh else ""
    kh_name = _known_hosts_name(name, port)
    text = str(exc) or type(exc).__name__
    keys = _keys_of(key_tried)
    tried = key_tried or "no key"  # (paramiko only refuses auth after offering something)

    if isinstance(exc, paramiko.BadHostKeyException):
        got, want = fingerprint(exc.key), fingerprint(exc.expected_key)
        return (
            f"host key changed (server offers {got}, known_hosts has {want})",
            "if the host was reinstalled (not an attack), remove the old key: "
            f"ssh-keygen -R {shlex.quote(kh_name)}{kh_opt}, then run again",
        )

    if isinstance(exc, paramiko.PasswordRequiredException):
        key = keys[0] if keys else "the key"
        return (
            f"key {key} needs a passphrase (the pre-flight never prompts)",
            f"load it into an agent first: eval $(ssh-agent) && ssh-add {key}",
        )

    if isinstance(exc, paramiko.AuthenticationException) and "timeout" in text.lower():
        return (
            f"{name}:{port} did not finish authentication within {opts.timeout:g} s",
            "the server is slow or overloaded (DNS lookups in sshd: UseDNS no); raise --ssh-timeout",
        )

    if isinstance(exc, paramiko.AuthenticationException):
        label = "key" if len(keys) + (AGENT in (key_tried or "")) == 1 else "keys"
        pub = f"{keys[0]}.pub" if keys else "~/.ssh/id_ed25519.pub"
        copy = f"ssh-copy-id -i {shlex.quote(pub)}{port_opt} {target}"
        return (
            f"auth refused for {target} (tried {label} {tried})",
            f"install the public key on {name}: {copy}\n"
            f"(or append {pub} to ~{user or ''}/.ssh/authorized_keys there), "
            "or give the right key with --ssh-identity",
        )

    if isinstance(exc, paramiko.SSHException):
        low = text.lower()
        if "not found in known_hosts" in low:
            file = shlex.quote(kh) if kh and kh != default_kh else "~/.ssh/known_hosts"
            offers = text.split("it offers ", 1)[1].rstrip(")") if "it offers " in text else None
            return (
                f"unknown host key for {kh_name}"
                + (f" ({offers})" if offers else "")
                + f", not in {file}, and new keys are refused "
                "(--strict-host-keys, or StrictHostKeyChecking yes/ask in the ssh config)",
                "check the key's fingerprint with the host's admin, then add it: "
                f"ssh-keyscan{port_opt} {shlex.quote(name)} >> {file}; "
                "or let new keys in (no --strict-host-keys; StrictHostKeyChecking accept-new)",
            )
        if "protocol banner" in low or "no existing session" in low:
            # paramiko says "No existing session" when the handshake never finished (its connect
            # wait ran out just before the banner timeout): not a key problem.
            return (
                f"{name}:{port} did not answer the SSH handshake (no SSH banner within {opts.timeout:g} s)",
                f"check that sshd (not another service) listens on port {port} and is not overloaded "
                "(MaxStartups); raise --ssh-timeout if the host is slow",
            )
        if "no authentication methods available" in low:
            what = (
                f"none of {key_tried} could be used"
                if key_tried
                else "no identity file, no default key in ~/.ssh, no ssh-agent"
            )
            return (
                f"no SSH key to offer ({what})",
                "create a key (ssh-keygen -t ed25519) and install it: "
                f"ssh-copy-id -i ~/.ssh/id_ed25519.pub{port_opt} {target}; or give one with --ssh-identity",
            )
        return (f"ssh failed: {text}", f"try it by hand: ssh -v{port_opt} {target} true")

    if isinstance(exc, socket.gaierror):
        return (
            f"name does not resolve: {name} ({exc.strerror or text})",
            "fix the name in the hostfile, or add it to /etc/hosts (or DNS) on this machine",
        )

    if isinstance(exc, (socket.timeout, TimeoutError)) or _errno_of(exc) in (errno.ETIMEDOUT,):
        return (
            f"timed out after {opts.timeout:g} s connecting to {name}:{port}",
            "check the address in the hostfile, the route to it and firewalls / security groups "
            f"(port {port} must be open); raise --ssh-timeout for slow networks",
        )

    code = _errno_of(exc)
    if isinstance(exc, ConnectionRefusedError) or code == errno.ECONNREFUSED:
        return (
            f"connection refused by {name}:{port}",
            f"is sshd running on {name} and listening on port {port}? "
            "DL1/Gaudi containers often run sshd on 3022: use --ssh-port 3022 (or Port in ~/.ssh/config)",
        )
    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return (
            f"{name}:{port} is unreachable ({os.strerror(code)})",
            "check the address in the hostfile, the route to it and firewalls / security groups",
        )
    if isinstance(exc, (EOFError, ConnectionResetError)):
        return (
            f"{name}:{port} closed the connection ({text})",
            "sshd refused the session early: check its log on that host (AllowUsers, MaxStartups, TCP wrappers)",
        )
    if isinstance(exc, FileNotFoundError) and getattr(exc, "filename", None):
        return (f"cannot read {exc.filename}: {exc.strerror}", "check --ssh-identity / --ssh-config")
    return (f"ssh failed: {type(exc).__name__}: {text}", f"try it by hand: ssh -v{port_opt} {target} true")
