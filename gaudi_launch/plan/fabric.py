"""Network fabric decisions: which variables ranks inherit, which NIC carries the traffic, EFA setup.

Everything here is a pure function of its inputs except the two thin I/O helpers
(``efa_present`` and the caller running ``ip -o addr show``), so each decision can be tested
with crafted data from several hosts.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Callable

from gaudi_launch.errors import UserError

# ---------------------------------------------------------------- exported environment

EXPORT_PREFIXES = ("HCCL_", "PT_HPU_", "HABANA_", "GC_", "HLS_", "HBN_", "SYN")
EXPORT_NAMES = ("LD_LIBRARY_PATH", "PYTHONPATH")

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def exported_names(environ: Mapping[str, str], extra_prefixes: Sequence[str] = ()) -> list[str]:
    """Names from the launcher's environment that remote ranks get by default.

    Those starting with one of ``EXPORT_PREFIXES`` or ``extra_prefixes`` (``--export-prefix``),
    plus ``EXPORT_NAMES`` when set. Names a shell cannot ``export`` (e.g. ``BASH_FUNC_f%%``)
    are left out. Sorted, without duplicates.
    """
    for prefix in extra_prefixes:
        if not prefix:
            raise UserError(
                "an empty prefix would export the whole environment (PATH, HOME, secrets...)",
                where="--export-prefix",
                hint="give a real prefix such as --export-prefix MY_, or name variables with -x NAME",
            )
    prefixes = tuple(EXPORT_PREFIXES) + tuple(extra_prefixes)
    names = {name for name in environ if _NAME_RE.match(name) and (name.startswith(prefixes) or name in EXPORT_NAMES)}
    return sorted(names)


# ---------------------------------------------------------------- interfaces


@dataclass
class Interface:
    name: str
    addresses: list[str] = field(default_factory=list)  # CIDRs as `ip -o addr` prints them


def parse_ip_addr(text: str) -> list[Interface]:
    """Parse ``ip -o addr show`` output: one Interface per name, in first-seen order.

    Lines look like ``2: eth0    inet 10.213.0.10/24 brd 10.213.0.255 scope global eth0\\ ...``.
    Link lines (``link/ether``), garbage and unparsable addresses are ignored. A point-to-point
    address printed without a prefix (``inet 10.0.0.1 peer 10.0.0.2/32``) is taken as a host route.
    """
    by_name: dict[str, Interface] = {}
    for line in text.splitlines():
        tokens = line.split()
        if len(tokens) < 4 or not tokens[0].endswith(":") or not tokens[0][:-1].isdigit():
            continue
        name, family, addr = tokens[1], tokens[2], tokens[3]
        if family not in ("inet", "inet6"):
            continue
        name = name.rstrip(":").split("@", 1)[0]
        if not name:
            continue
        try:
            iface = ipaddress.ip_interface(addr)
        except ValueError:
            continue
        if (family == "inet") != (iface.version == 4):
            continue
        if "/" not in addr:
            addr = f"{addr}/{iface.max_prefixlen}"
        entry = by_name.setdefault(name, Interface(name, []))
        if addr not in entry.addresses:
            entry.addresses.append(addr)
    return list(by_name.values())


VIRTUAL_PREFIXES = ("lo", "docker", "virbr", "veth")  # addresses every such machine has alike
_FALLBACK_SKIP = ("lo", "docker")

IFNAME_HINT = "set HCCL_SOCKET_IFNAME (e.g. -x HCCL_SOCKET_IFNAME=eth0) or fix the hosts' addressing"


def _master_ip(master_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    text = master_addr.strip()
    if text.startswith("[") and text.endswith("]"):  # [fe80::1] as in URLs
        text = text[1:-1]
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone id (fe80::1%eth0)
    except ValueError:
        raise UserError(
            f"{master_addr!r} is not an IP address",
            where="--master-addr",
            hint="give the master's IPv4 or IPv6 address (resolve host names first)",
        ) from None
    if ip.version == 6 and ip.ipv4_mapped is not None:  # ::ffff:10.0.0.1 is an IPv4 peer
        return ip.ipv4_mapped
    return ip


def _networks_containing(ip, iface: Interface) -> list:
    found = []
    for cidr in iface.addresses:
        try:
            net = ipaddress.ip_interface(cidr).network
        except ValueError:
            continue
        if net.version == ip.version and ip in net:
            found.append(net)
    return found


def _is_virtual(name: str, prefixes: Sequence[str] = VIRTUAL_PREFIXES) -> bool:
    return name.startswith(tuple(prefixes))


def _describe_hosts(ip, host_interfaces: Mapping[str, list[Interface]]) -> str:
    lines = []
    for host, ifaces in host_interfaces.items():
        if not ifaces:
            lines.append(f"  {host}: no interfaces with addresses")
            continue
        parts = []
        for iface in ifaces:
            mark = " (on the master's subnet)" if _networks_containing(ip, iface) else ""
            addrs = " ".join(iface.addresses) or "no address"
            parts.append(f"{iface.name} {addrs}{mark}")
        lines.append(f"  {host}: " + "; ".join(parts))
    return "\n".join(lines)


def choose_interface(master_addr: str, host_interfaces: Mapping[str, list[Interface]]) -> tuple[str, str]:
    """Pick the interface name for HCCL/GLOO/NCCL_SOCKET_IFNAME and mpirun's *_tcp_if_include.

    Returns ``(name, how)``: ``how`` is ``"subnet"`` when every host has an interface of that name
    on the subnet holding ``master_addr``, or ``"fallback"`` when no host is on that subnet at all
    (then: the first interface, in the first host's order, not named lo*/docker* that every host
    has). Raises UserError (where HCCL_SOCKET_IFNAME) when no single name works on every host.
    """
    if not host_interfaces:
        raise ValueError("choose_interface needs at least one host")
    ip = _master_ip(master_addr)

    on_subnet = {
        host: [i.name for i in ifaces if _networks_containing(ip, i)] for host, ifaces in host_interfaces.items()
    }

    if any(on_subnet.values()):
        common = None
        for names in on_subnet.values():
            common = set(names) if common is None else common & set(names)
        if common:
            best = sorted(common, key=lambda n: (_is_virtual(n), n))[0]
            return best, "subnet"
        missing = [h for h, names in on_subnet.items() if not names]
        why = (
            f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no interface on its subnet"
            if missing
            else "the hosts reach it through differently named interfaces"
        )
        raise UserError(
            f"no interface name reaches master address {ip} on every host ({why}):\n"
            + _describe_hosts(ip, host_interfaces),
            where="HCCL_SOCKET_IFNAME",
            hint=IFNAME_HINT,
        )

    # No host is on the master's subnet (e.g. the master was named by a public address):
    # the seed's rule, a same-named non-loopback, non-docker interface present everywhere.
    hosts = list(host_interfaces)
    first = host_interfaces[hosts[0]]
    others = [{i.name for i in host_interfaces[h]} for h in hosts[1:]]
    for iface in first:
        if _is_virtual(iface.name, _FALLBACK_SKIP):
            continue
        if all(iface.name in names for names in others):
            return iface.name, "fallback"
    raise UserError(
        f"no host has an interface on the subnet of master address {ip}, and no interface name "
        "other than lo*/docker* exists on every host:\n" + _describe_hosts(ip, host_interfaces),
        where="HCCL_SOCKET_IFNAME",
        hint=IFNAME_HINT,
    )


def subnet_cidr(master_addr: str, interfaces: list[Interface], name: str) -> str | None:
    """The network CIDR (e.g. ``10.213.0.0/24``) of interface ``name`` that holds ``master_addr``.

    For mpirun's ``btl_tcp_if_include`` (OpenMPI accepts CIDRs). None when that interface has no
    address on the master's subnet. When several addresses match, the narrowest network wins.
    """
    ip = _master_ip(master_addr)
    nets = [net for iface in interfaces if iface.name == name for net in _networks_containing(ip, iface)]
    if not nets:
        return None
    return str(max(nets, key=lambda n: n.prefixlen))


# ---------------------------------------------------------------- EFA


def efa_present(sys_root: str = "/", run: Callable = subprocess.run) -> bool:
    """True when this host has an AWS EFA device. Never raises.

    Looks for ``<sys_root>/sys/class/infiniband/efa*`` or ``rdmap*`` entries, then asks
    ``fi_info -p efa`` (when on PATH), which exits 0 only when the EFA provider finds a device.
    """
    try:
        ib = os.path.join(sys_root, "sys", "class", "infiniband")
        if any(e.startswith(("efa", "rdmap")) for e in os.listdir(ib)):
            return True
    except Exception:  # missing directory, permissions, odd sys_root: just not found here
        pass
    try:
        fi_info = shutil.which("fi_info")
        if not fi_info:
            return False
        done = run(
            [fi_info, "-p", "efa"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=15, check=False
        )
        return getattr(done, "returncode", 1) == 0
    except Exception:
        return False


def local_generation(run: Callable = subprocess.run) -> int | None:
    """This host's Gaudi generation from hl-smi's card name (plan/scaleout.generation_of), or None without
    hl-smi or an answer. Never raises."""
    from gaudi_launch.plan.scaleout import generation_of

    try:
        done = run(["hl-smi", "-Q", "name", "-f", "csv,noheader"], capture_output=True, text=True, timeout=20)
        first = next((line for line in done.stdout.splitlines() if line.strip()), "") if done.returncode == 0 else ""
        return generation_of(first)
    except Exception:  # no hl-smi, a hang, odd output: not known here
        return None


def ofi_recipe_without_facts(flag: bool | None, efa_here: bool, generation: int | None) -> tuple[bool, str]:
    """(set first-generation Gaudi's OFI recipe, note) when no pre-flight probed the hosts (--no-ssh-check, the
    collective check's own job, Slurm from a login node): ``flag`` --efa/--no-efa, ``efa_here`` EFA devices on
    this host, ``generation`` this host's Gaudi generation (None: no hl-smi here). Pure.

    HCCL_OVER_OFI=1 makes HCCL for Gaudi 2 and 3 skip its own choice (HabanaAI/HCL hcl_idevice.cpp
    IHclDevice::setScaleoutMode: "ofi selected by user", no Gaudi Direct) and it never takes EFA (hl_ofi.cpp
    get_core_provider: tcp and verbs only), so it is set only for first-generation Gaudi (AWS DL1), whose recipe
    it is (Scale-out via Host NIC), and otherwise HCCL's auto-detection is left alone and the plan says so."""
    left = "the scale-out path is left to HCCL's own choice (no pre-flight probed the hosts; HCCL_OVER_OFI not set)"
    recipe = "EFA: HCCL_OVER_OFI=1 and the OFI wrapper and EFA libraries on LD_LIBRARY_PATH, first-generation Gaudi's (DL1) recipe"
    if generation in (2, 3):
        ignored = " (--efa ignored: it would force HCCL's slowest path)" if flag else ""
        return False, f"{left}: this host is Gaudi {generation}, whose HCCL chooses for itself{ignored}"
    if flag:
        return True, recipe + (" (--efa)" if generation is None else " (--efa, first-generation Gaudi here)")
    if flag is None and efa_here and generation == 1:
        return True, recipe + " (EFA devices and first-generation Gaudi on this host)"
    if flag is None and efa_here:
        return False, f"{left}; EFA devices here but no Gaudi generation known: give --efa for DL1's recipe"
    return False, left


DEFAULT_OFI_WRAPPER = "/root/hccl_ofi_wrapper"
AMAZON_LIBS = ("/opt/amazon/openmpi/lib", "/opt/amazon/efa/lib")


def _path_key(entry: str) -> str:
    return entry.rstrip("/") or "/"  # "/opt/x/" and "/opt/x" are the same directory


def _join_paths(entries: Sequence[str]) -> str:
    """Join search-path entries with ':' dropping empty ones (= current dir) and later duplicates."""
    seen: set[str] = set()
    kept: list[str] = []
    for entry in entries:
        if not entry:
            continue
        key = _path_key(entry)
        if key in seen:
            continue
        seen.add(key)
        kept.append(entry)
    return ":".join(kept)


def _is_set(base: Mapping[str, str], name: str) -> bool:
    return bool(base.get(name))


def efa_env(base: Mapping[str, str], wrapper_dir: str | None = None) -> dict[str, str]:
    """Variables to add or change for HCCL over EFA (libfabric). Pure and idempotent.

    ``HCCL_OVER_OFI=1`` unless the user set it; ``LD_LIBRARY_PATH`` = the HCCL OFI wrapper dir,
    the Amazon OpenMPI and EFA libs, then the existing entries, without duplicates or empty
    entries (an empty entry makes the loader search the current directory).
    """
    wrapper = wrapper_dir or base.get("HCCL_OFI_WRAPPER") or DEFAULT_OFI_WRAPPER
    existing = base.get("LD_LIBRARY_PATH", "").split(":")
    out: dict[str, str] = {}
    if not _is_set(base, "HCCL_OVER_OFI"):
        out["HCCL_OVER_OFI"] = "1"
    out["LD_LIBRARY_PATH"] = _join_paths([wrapper, *AMAZON_LIBS, *existing])
    return out


def with_lib_dirs(current: str, dirs: Sequence[str]) -> str:
    """LD_LIBRARY_PATH with ``dirs`` first (where the probe found HCCL's OFI wrapper), then ``current``'s
    entries, without duplicates or empty entries. Pure."""
    return _join_paths([*dirs, *current.split(":")])


SOCKET_IFNAME_VARS = ("HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def efa_libs_env(base: Mapping[str, str], wrapper_dir: str | None = None) -> dict[str, str]:
    """``efa_env`` without HCCL_OVER_OFI: the OFI wrapper and EFA libraries for a host-NIC path over EFA
    that HCCL chooses itself (Gaudi 2 and 3, plan/scaleout.py). Pure."""
    return {k: v for k, v in efa_env({**base, "HCCL_OVER_OFI": "set"}, wrapper_dir).items() if k != "HCCL_OVER_OFI"}


def fabric_env(
    base: Mapping[str, str], *, efa: bool, ifname: str | None, wrapper_dir: str | None = None
) -> dict[str, str]:
    """Everything the fabric adds for every rank. Pure.

    EFA: ``efa_env``. Gaudi NIC scale-out (``efa`` False) sets no OFI variables. With ``ifname``,
    the HCCL/GLOO/NCCL socket interface variables, each only where the user has not set it.
    """
    out: dict[str, str] = {}
    if efa:
        out.update(efa_env(base, wrapper_dir))
    if ifname:
        for var in SOCKET_IFNAME_VARS:
            if not _is_set(base, var):
                out[var] = ifname
    return out
