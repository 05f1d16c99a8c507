"""``--include``/``--exclude`` selectors and the choice of hosts and devices to launch on.

``parse_selector`` reads DeepSpeed's syntax (``worker-0:0,2@worker-1``) and ``select``
turns a hostfile's hosts plus options into the list of ``(host, device ids)`` to launch
on. Pure functions; every mistake is a ``UserError`` naming the option and what to do.
"""

from __future__ import annotations

from typing import Optional

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.hostfile import _DIGITS_RE, _EXAMPLE_LINE, Host, _host_key, _ipv6, _name_key

__all__ = ["parse_selector", "select"]


# --------------------------------------------------------------------------- selectors


def _parse_slot_list(text: str, part: str, option: str) -> list[int]:
    slots: list[int] = []
    for token in text.split(","):
        token = token.strip()
        if not token:
            raise UserError(
                f"empty slot number in '{part}'",
                where=option,
                hint="write slots as comma-separated numbers, e.g. worker-0:0,1",
            )
        if token.startswith("-") and _DIGITS_RE.fullmatch(token[1:]):
            raise UserError(
                f"slot numbers cannot be negative: '{token}' in '{part}'",
                where=option,
                hint="slots are numbered from 0, e.g. worker-0:0,1",
            )
        if not _DIGITS_RE.fullmatch(token):
            raise UserError(
                f"slot '{token}' in '{part}' is not a number",
                where=option,
                hint="write slots as comma-separated numbers, e.g. worker-0:0,1; "
                "separate hosts with '@', e.g. worker-0:0@worker-1",
            )
        slots.append(int(token))
    return sorted(set(slots))  # a slot named twice is one slot, as DeepSpeed reads it


def _check_selector_name(name: str, part: str, option: str) -> None:
    if not name:
        raise UserError(
            f"missing host name in '{part}'",
            where=option,
            hint="write HOST or HOST:SLOTS, e.g. worker-0:0,1",
        )
    if "," in name:
        raise UserError(
            f"bad host name '{name}'",
            where=option,
            hint="separate hosts with '@', e.g. "
            + "@".join(n for n in name.split(",") if n)
            + "; ',' separates slots, e.g. worker-0:0,1",
        )
    if "=" in name or any(c.isspace() for c in name) or "[" in name or "]" in name:
        raise UserError(
            f"bad host name '{name}'",
            where=option,
            hint="write HOST or HOST:SLOTS as in the hostfile, e.g. worker-0:0,1; "
            "IPv6 hosts with slots need brackets, e.g. [fe80::1]:0,1",
        )


def parse_selector(expr: str, option: str) -> dict[str, Optional[list[int]]]:
    """Parse ``NAME[:SLOT[,SLOT...]][@NAME[:SLOTS]]...``; errors name ``option``.

    Returns ``{name: sorted slots or None for the whole host}`` in the order written.
    Names have IPv6 brackets stripped. ``@`` separates hosts, so a selector names a
    host without its ``user@`` part.
    """
    result: dict[str, Optional[list[int]]] = {}
    keys: dict[str, str] = {}
    for part in expr.split("@"):
        part = part.strip()
        if not part:
            raise UserError(
                f"empty host in '{expr}'",
                where=option,
                hint="write HOST[:SLOTS] parts separated by single '@', e.g. worker-0:0,2@worker-1",
            )
        slots: Optional[list[int]] = None
        if part.startswith("["):
            close = part.find("]")
            if close < 0:
                raise UserError(
                    f"missing ']' in '{part}'",
                    where=option,
                    hint="write bracketed IPv6 hosts as [fe80::1] or [fe80::1]:0,1",
                )
            name = part[1:close].strip()
            after = part[close + 1 :]
            if _ipv6(name) is None:
                raise UserError(
                    f"'{part[: close + 1]}' is not an IPv6 address",
                    where=option,
                    hint="brackets are only for IPv6 addresses, e.g. [fe80::1]:0,1",
                )
            if after:
                if not after.startswith(":"):
                    raise UserError(
                        f"unexpected '{after}' after ']' in '{part}'",
                        where=option,
                        hint="write [IPV6] or [IPV6]:SLOTS, e.g. [fe80::1]:0,1",
                    )
                slots = _parse_slot_list(after[1:], part, option)
        elif part.count(":") > 1:
            name = part  # a bare IPv6 address: the whole host
            if _ipv6(name) is None:
                raise UserError(
                    f"'{part}' is not an IPv6 address",
                    where=option,
                    hint="to pick slots on an IPv6 host, bracket it: [fe80::1]:0,1",
                )
        else:
            name, colon, slot_text = part.partition(":")
            name = name.strip()
            _check_selector_name(name, part, option)
            if colon:
                slots = _parse_slot_list(slot_text, part, option)

        key = _host_key(name)
        if key in keys:
            # DeepSpeed merges a host's parts (worker-0:1@worker-0:0,1 is worker-0:0,1). A whole
            # host and some of its slots have no clear meaning (DeepSpeed takes only the slots).
            first = keys[key]
            before = result[first]
            if (before is None) != (slots is None):
                raise UserError(
                    f"host '{name}' is named both whole and with slots",
                    where=option,
                    hint=f"write '{first}' for all its slots, or '{first}:0,1' for some",
                )
            if before is not None and slots is not None:
                result[first] = sorted(set(before) | set(slots))
            continue
        keys[key] = name
        result[name] = slots
    return result


# --------------------------------------------------------------------------- selection


def _known_hosts_hint(hosts: list[Host]) -> str:
    names = [h.name for h in hosts]
    shown = ", ".join(names[:10])
    if len(names) > 10:
        shown += f", ... ({len(names) - 10} more)"
    return f"hosts in the hostfile: {shown}"


def _resolve(
    hosts: list[Host], selector: dict[str, Optional[list[int]]], option: str
) -> dict[int, Optional[list[int]]]:
    """Map hostfile index -> selected slots (None = all), checking names and slot ranges."""
    by_key = {_name_key(h.name): i for i, h in enumerate(hosts)}
    resolved: dict[int, Optional[list[int]]] = {}
    for name, slots in selector.items():
        index = by_key.get(_host_key(name))
        if index is None:
            raise UserError(
                f"Hostname '{name}' not found in hostfile",
                where=option,
                hint=_known_hosts_hint(hosts),
            )
        host = hosts[index]
        for slot in slots or ():
            if slot >= host.slots:
                raise UserError(
                    f"No slot {slot} on host '{host.name}' (slots={host.slots})",
                    where=option,
                    hint=f"slots on '{host.name}' are numbered 0 to {host.slots - 1}",
                )
        resolved[index] = slots
    return resolved


def _check_count(value: object, option: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(
            f"{option} must be at least 1, got {value!r}",
            where=option,
            hint=f"pass the number of {what} to use, or leave {option} out to use all of them",
        )
    return value


def select(
    hosts: list[Host],
    *,
    include: Optional[str] = None,
    exclude: Optional[str] = None,
    num_nodes: Optional[int] = None,
    num_devices: Optional[int] = None,
) -> list[tuple[str, list[int]]]:
    """Apply include/exclude, then num_nodes, then num_devices.

    Returns ``[(host name, ascending device ids)]`` in hostfile order. ``None`` means
    an option was not given; an empty string is an (invalid) empty selector.
    """
    if include is not None and exclude is not None:
        raise UserError(
            "--include and --exclude are mutually exclusive",
            where="--include/--exclude",
            hint="use only one: --include to list the hosts/slots to use, or --exclude to list those to leave out",
        )
    if num_nodes is not None:
        _check_count(num_nodes, "--num_nodes", "nodes")
    if num_devices is not None:
        _check_count(num_devices, "--num_devices", "devices per node")
    if not hosts:
        raise UserError(
            "no hosts to run on",
            where="hostfile",
            hint=f"list at least one host in the hostfile, e.g. '{_EXAMPLE_LINE}'",
        )

    chosen: list[tuple[str, list[int]]]
    if include is not None:
        wanted = _resolve(hosts, parse_selector(include, "--include"), "--include")
        chosen = []
        for index, host in enumerate(hosts):
            if index in wanted:
                slots = wanted[index]
                chosen.append((host.name, list(slots) if slots is not None else list(range(host.slots))))
    elif exclude is not None:
        unwanted = _resolve(hosts, parse_selector(exclude, "--exclude"), "--exclude")
        chosen = []
        for index, host in enumerate(hosts):
            if index in unwanted:
                dropped = unwanted[index]
                if dropped is None:
                    continue
                left = [s for s in range(host.slots) if s not in dropped]
            else:
                left = list(range(host.slots))
            if left:
                chosen.append((host.name, left))
        if not chosen:
            raise UserError(
                "--exclude leaves no hosts to run on",
                where="--exclude",
                hint="exclude fewer hosts or slots; " + _known_hosts_hint(hosts),
            )
    else:
        chosen = [(h.name, list(range(h.slots))) for h in hosts]

    if num_nodes is not None:
        if num_nodes > len(chosen):
            raise UserError(
                f"asked for {num_nodes} nodes but the hostfile selection has {len(chosen)}",
                where="--num_nodes",
                hint=f"pass --num_nodes {len(chosen)} or fewer (DeepSpeed silently runs on the "
                f"{len(chosen)} there are), or add hosts to the hostfile"
                + (" / widen --include/--exclude" if include is not None or exclude is not None else ""),
            )
        chosen = chosen[:num_nodes]

    if num_devices is not None:
        for name, devices in chosen:
            if len(devices) < num_devices:
                shown = ",".join(str(d) for d in devices)
                raise UserError(
                    f"host '{name}' has only {len(devices)} selected device(s) "
                    f"(slots {shown}) but {num_devices} were asked for",
                    where="--num_devices",
                    hint=f"pass --num_devices {len(devices)} or fewer, or select more slots on '{name}'",
                )
        chosen = [(name, devices[:num_devices]) for name, devices in chosen]

    return chosen
