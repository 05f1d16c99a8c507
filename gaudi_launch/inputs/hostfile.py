"""DeepSpeed-style hostfiles (the --include/--exclude selectors over them: hostselect.py).

A hostfile lists one host per line::

    # rack 3
    worker-0 slots=8
    deploy@worker-1 slots=8   # trailing comments are fine
    10.0.0.7 slots=4
    [fe80::1] slots=8

Everything here is a pure function except ``read_hostfile``; every mistake a user
can make is a ``UserError`` that names the file and line and says what to do.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.readfile import read_bounded

__all__ = ["Host", "parse_hostfile", "read_hostfile"]


@dataclass(frozen=True)
class Host:
    """One hostfile entry.

    ``name`` is as written, except that IPv6 brackets are stripped
    (``[fe80::1]`` -> ``fe80::1``, ``user@[fe80::1]`` -> ``user@fe80::1``).
    ``line`` is the 1-based line in the file, 0 when the host did not come from a file.
    """

    name: str
    slots: int
    line: int = 0


_HOSTNAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*", re.ASCII)
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*", re.ASCII)
_DIGITS_RE = re.compile(r"[0-9]+", re.ASCII)
_DOTTED_NUMBERS_RE = re.compile(r"[0-9.]+", re.ASCII)

_EXAMPLE_LINE = "worker-0 slots=8"


# --------------------------------------------------------------------------- host names


def _split_user(name: str) -> tuple[str | None, str]:
    if "@" in name:
        user, _, host = name.partition("@")
        return user, host
    return None, name


# A zone id names an interface (fe80::1%eth0) or its index; anything else (';', '$', '/') would
# reach ssh and remote command lines as part of a host name.
_ZONE_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}", re.ASCII)
MAX_HOSTFILE_BYTES = 1 << 20  # a hostfile of a million bytes is already ~40,000 hosts
MAX_SLOTS = 65536  # per host (as spec.MAX_DEVICES)


def _ipv6(text: str) -> ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.IPv6Address(text)
    except ValueError:
        return None
    if addr.scope_id is not None and not _ZONE_RE.fullmatch(addr.scope_id):
        return None
    return addr


def _host_key(host: str) -> str:
    """Canonical form of a host part (no user): lower-case, IPv6 compressed."""
    addr = _ipv6(host)
    if addr is not None:
        return str(addr)
    return host.lower()


def _name_key(name: str) -> str:
    """Key that identifies a machine: the host part of ``name``, canonicalised."""
    return _host_key(_split_user(name)[1])


def _check_host_name(raw: str, where: str) -> str:
    """Validate a hostfile host token; return it with IPv6 brackets stripped."""
    if "=" in raw:
        raise UserError(
            f"bad host name '{raw}': a host name cannot contain '='",
            where=where,
            hint=f"each line must start with a host name, then slots=N, e.g. '{_EXAMPLE_LINE}'",
        )
    if "," in raw:
        raise UserError(
            f"bad host name '{raw}': a host name cannot contain ','",
            where=where,
            hint=f"put one host per line, e.g. '{_EXAMPLE_LINE}'",
        )
    if raw.count("@") > 1:
        raise UserError(
            f"bad host name '{raw}': '@' appears more than once",
            where=where,
            hint="write at most one user, as user@host",
        )
    user, host = _split_user(raw)
    if user == "":
        raise UserError(
            f"bad host name '{raw}': nothing before '@'",
            where=where,
            hint="write user@host, e.g. 'deploy@worker-0 slots=8', or just the host name",
        )
    if user is not None and not _USER_RE.fullmatch(user):
        raise UserError(
            f"bad user name '{user}' in '{raw}'",
            where=where,
            hint="write user@host with a plain user name (letters, digits, '.', '_', '-'), "
            "or leave the user out and set it in ~/.ssh/config",
        )
    prefix = f"{user}@" if user is not None else ""

    if host.startswith("[") or host.endswith("]"):
        inner = host[1:-1] if host.startswith("[") and host.endswith("]") else None
        if inner is not None and "%" in inner and _ipv6(inner) is None and _ipv6(inner.split("%", 1)[0]):
            raise UserError(
                f"bad IPv6 zone id in '{raw}'",
                where=where,
                hint="a zone id is an interface name or number: letters, digits, '.', '_', '-' (fe80::1%eth0)",
            )
        if inner is None or _ipv6(inner) is None:
            raise UserError(
                f"bad host name '{raw}': brackets are only for IPv6 addresses",
                where=where,
                hint="write an IPv6 address as [fe80::1] (or bare fe80::1); "
                "write host names and IPv4 addresses without brackets",
            )
        return prefix + inner

    if ":" in host:
        if _ipv6(host) is not None:
            return raw
        if "%" in host and _ipv6(host.split("%", 1)[0]) is not None:
            raise UserError(
                f"bad IPv6 zone id in '{raw}'",
                where=where,
                hint="a zone id is an interface name or number: letters, digits, '.', '_', '-' (fe80::1%eth0)",
            )
        if host.count(":") == 1:
            hint = (
                "ports cannot be given in a hostfile; set the ssh port in ~/.ssh/config "
                "(Host ... / Port ...) and write just the host name here"
            )
        else:
            hint = "write an IPv6 address as [fe80::1] or fe80::1; host names cannot contain ':'"
        raise UserError(f"bad host name '{raw}': unexpected ':'", where=where, hint=hint)

    if not host:
        raise UserError(
            f"bad host name '{raw}': nothing after '@'",
            where=where,
            hint="write user@host, e.g. 'deploy@worker-0 slots=8'",
        )
    if _DOTTED_NUMBERS_RE.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise UserError(
                f"bad host name '{raw}': '{host}' is not a valid IPv4 address",
                where=where,
                hint="an IPv4 address is four numbers 0-255 separated by dots, e.g. 10.0.0.7",
            ) from None
        return raw
    if not _HOSTNAME_RE.fullmatch(host):
        raise UserError(
            f"bad host name '{raw}'",
            where=where,
            hint="a host name may use letters, digits, '.', '_' and '-' and must not start "
            "with '-' or '.'; IPv6 addresses look like fe80::1 or [fe80::1]",
        )
    return raw


# --------------------------------------------------------------------------- hostfile


def _parse_slots(value: str, where: str) -> int:
    if not _DIGITS_RE.fullmatch(value):
        raise UserError(
            f"slots must be a positive integer, got '{value}'",
            where=where,
            hint="write the number of devices on the host, e.g. slots=8",
        )
    if len(value) > 6 or int(value) > MAX_SLOTS:
        raise UserError(
            f"slots={value} is more than {MAX_SLOTS}",
            where=where,
            hint="write the number of devices on the host, e.g. slots=8",
        )
    slots = int(value)
    if slots < 1:
        raise UserError(
            f"slots must be at least 1, got {value}",
            where=where,
            hint="remove the line or comment it out with '#' to leave a host unused",
        )
    return slots


def parse_hostfile(text: str, source: str) -> list[Host]:
    """Parse hostfile ``text``; ``source`` names it in errors (``source:LINE``)."""
    hosts: list[Host] = []
    seen: dict[str, Host] = {}
    for number, raw_line in enumerate(text.split("\n"), start=1):
        content = raw_line.split("#", 1)[0]
        tokens = content.split()
        if not tokens:
            continue
        where = f"{source}:{number}"
        head, rest = tokens[0], tokens[1:]
        if "=" in head:
            raise UserError(
                f"bad line: expected a host name before '{head}'",
                where=where,
                hint=f"each line is a host name followed by slots=N, e.g. '{_EXAMPLE_LINE}'",
            )
        name = _check_host_name(head, where)

        slots: int | None = None
        for token in rest:
            if "=" not in token:
                if token.isdigit() and slots is None and len(rest) == 1:
                    hint = f"write '{head} slots={token}'"
                else:
                    hint = f"write key=value with no spaces around '=', e.g. '{_EXAMPLE_LINE}'"
                raise UserError(f"bad line: unexpected '{token}' (expected slots=N)", where=where, hint=hint)
            key, _, value = token.partition("=")
            if key != "slots":
                raise UserError(
                    f"unknown key '{key}' (only slots=N is understood)",
                    where=where,
                    hint=f"write the line as '{head} slots=N'"
                    + (" (keys are lower-case)" if key.lower() == "slots" else ""),
                )
            if slots is not None:
                raise UserError(
                    "slots is given twice",
                    where=where,
                    hint=f"keep a single slots=N, e.g. '{head} slots={slots}'",
                )
            slots = _parse_slots(value, where)
        if slots is None:
            raise UserError(
                f"missing slots for host '{head}'",
                where=where,
                hint=f"say how many devices the host has, e.g. '{head} slots=8'",
            )

        key = _name_key(name)
        first = seen.get(key)
        if first is not None:
            raise UserError(
                f"duplicate host '{head}' (already listed on line {first.line} as '{first.name}')",
                where=where,
                hint="list each host once; remove or comment out one of the lines",
            )
        host = Host(name=name, slots=slots, line=number)
        seen[key] = host
        hosts.append(host)

    if not hosts:
        raise UserError(
            "the hostfile lists no hosts",
            where=source,
            hint=f"add one line per host, e.g. '{_EXAMPLE_LINE}'",
        )
    return hosts


def read_hostfile(path: str) -> list[Host]:
    """Read and parse the hostfile at ``path``; a missing or unreadable file is a UserError."""
    try:
        # bounded, non-blocking, a regular file: --hostfile /dev/zero or a FIFO must not eat memory or hang
        data = read_bounded(path, MAX_HOSTFILE_BYTES)
        if len(data) > MAX_HOSTFILE_BYTES:
            raise UserError(
                f"hostfile is larger than {MAX_HOSTFILE_BYTES} bytes",
                where=path,
                hint="pass the hostfile itself (one 'HOST slots=N' line per host) with --hostfile",
            )
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise UserError(
            "hostfile not found",
            where=path,
            hint=f"create it with one line per host (e.g. '{_EXAMPLE_LINE}') or pass the right path with --hostfile",
        ) from None
    except IsADirectoryError:
        raise UserError(
            "hostfile is a directory, not a file",
            where=path,
            hint="pass the path of the hostfile itself with --hostfile",
        ) from None
    except PermissionError:
        raise UserError(
            "hostfile cannot be read: permission denied",
            where=path,
            hint="check the file's permissions (e.g. chmod a+r) or copy it somewhere readable",
        ) from None
    except UnicodeDecodeError as exc:
        raise UserError(
            f"hostfile is not valid UTF-8 text ({exc.reason} at byte {exc.start})",
            where=path,
            hint="save the hostfile as plain UTF-8 text",
        ) from None
    except OSError as exc:
        raise UserError(
            f"hostfile cannot be read: {exc.strerror or exc}",
            where=path,
            hint="check that the path is a readable file",
        ) from None
    return parse_hostfile(text, path)


if __name__ == "__main__":  # `python -m gaudi_launch.inputs.hostfile FILE`: check it (docker/entrypoint.sh does)
    import sys

    try:
        read_hostfile(sys.argv[1])
    except UserError as exc:
        sys.exit(str(exc))
