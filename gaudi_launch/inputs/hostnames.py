"""Host names as the hostfile writes them: 'user@host', and which ones mean this machine. Pure."""

from __future__ import annotations

import socket
from typing import Optional

_LOOPBACK = {"localhost", "localhost.localdomain", "ip6-localhost", "::1"}


def split_user(entry: str) -> tuple[Optional[str], str]:
    """'user@host' -> ('user', 'host'); 'host' -> (None, 'host'); IPv6 brackets dropped. The one place a
    hostfile entry is taken apart (sshconfig.login_user says whose user wins)."""
    user, sep, host = entry.rpartition("@")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return (user or None) if sep else None, host


def bare_host(name: str) -> str:
    """'user@host' -> 'host'."""
    return split_user(name)[1]


def is_local_host(name: str, hostname: Optional[str] = None) -> bool:
    """True for names that mean this machine, decided without any DNS lookup."""
    host = bare_host(name).lower()
    me = (hostname or socket.gethostname()).lower()
    return host in _LOOPBACK or host.startswith("127.") or host in (me, me.split(".")[0])
