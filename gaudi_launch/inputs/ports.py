"""Master port: pick a free one, or check that a given one is free and name who holds it."""

from __future__ import annotations

import os
import socket
from typing import Optional

from gaudi_launch.errors import UserError


def pick_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    # SO_REUSEADDR as the rendezvous store uses it: a port in TIME_WAIT is fine, a listener is not.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _listening(port: int) -> list[list[str]]:
    """The rows of /proc/net/tcp and tcp6 that listen on ``port`` (every user's sockets show there)."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A = LISTEN
                        rows.append(fields)
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    return rows


def port_holder(port: int) -> Optional[str]:
    """'pid 123 (python)' for the process listening on ``port``, when /proc tells (best effort)."""
    inodes = {f"socket:[{fields[9]}]" for fields in _listening(port) if len(fields) > 9}
    if not inodes:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    with open(f"/proc/{pid}/comm") as f:
                        return f"pid {pid} ({f.read().strip()})"
        except OSError:
            continue
    return None


def listener_uid(port: int) -> Optional[int]:
    """The user id of whoever listens on TCP ``port`` here: /proc/net/tcp shows it for every user's sockets,
    where their process itself may be hidden from us."""
    uids = [fields[7] for fields in _listening(port) if len(fields) > 7 and fields[7].isdigit()]
    return int(uids[0]) if uids else None


def describe_holder(port: int) -> str:
    """'user NAME (uid N), pid P (comm)' as far as this host tells, for a message about a taken port."""
    parts = []
    uid = listener_uid(port)
    if uid is not None:
        try:
            import pwd  # noqa: PLC0415 (POSIX only, and only for this message)

            parts.append(f"user {pwd.getpwuid(uid).pw_name} (uid {uid})")
        except (ImportError, KeyError):
            parts.append(f"uid {uid}")
    holder = port_holder(port)
    if holder:
        parts.append(holder)
    return ", ".join(parts) or "a process this user cannot see"


def check_port(port: int, option: str = "--master_port") -> None:
    if not 1 <= port <= 65535:
        raise UserError(f"port {port} is out of range 1-65535", where=option)
    if not port_is_free(port):
        holder = port_holder(port)
        raise UserError(
            f"port {port} is already in use on this host" + (f" by {holder}" if holder else ""),
            where=option,
            hint="choose another --master_port, or leave it out and a free one is picked",
        )
