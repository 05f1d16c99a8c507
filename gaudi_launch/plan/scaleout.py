"""The scale-out path each host's HCCL will take, decided from what the pre-flight's probe found.

The decision follows Habana's open HCCL for Gaudi 2 and 3 (HabanaAI/HCL, 1.21 content, commit 54fed3a), which
beats the page where they differ:
- ``IHclDevice::setScaleoutMode`` (hcl/src/interfaces/hcl_idevice.cpp): HCCL_OVER_OFI set by the user -> OFI;
  else any *enabled* Gaudi scale-out port -> Gaudi NICs (P0); else, when the OFI plugin loads, OFI with an
  attempt at Gaudi Direct (``setGaudiDirect``); else no scale-out (P3). The count it is given,
  ``getNumScaleOutPortsGlbl`` (gen2_arch_common/runtime_connectivity.cpp), is the driver's enabled external
  ports (``hcl_ibverbs_t::get_port_mask``: ``hbldv_query_device``'s ext_ports_mask) under HCL's
  SCALE_OUT_PORTS_MASK (hcl_consts.h: 0xc00100 = ports 8, 22, 23 on Gaudi 2; 0xFFFFFF on Gaudi 3). Link state
  never enters: an enabled port with no cable still means P0, and a hang at the first collective.
- ``OfiPlugin::initializeOFIPluginIfNeeded`` (hcl/src/hccl/ofi_plugin.cpp) dlopens ``libhccl_ofi_wrapper.so``;
  when it does not resolve there is no host-NIC path at all.
- ``ofi_t::get_core_provider`` (hcl/src/libfabric/hl_ofi.cpp) takes the ``tcp`` and ``verbs`` providers only;
  ``efa`` is skipped: EFA is no Gaudi 2/3 path (an EFA host falls to tcp).
- ``ofi_t::init`` (same file): Gaudi Direct needs libfabric >= 1.20 (hl_ofi.h MINIMAL_LIBFABRIC_VERSION) and
  ``ib_umem_dmabuf_get`` in /proc/kallsyms (``checkDMABUFSupport``; the kernel version is only named in its
  message), then a provider with FI_HMEM_SYNAPSEAI (hl_ofi_component.cpp), i.e. libfabric built
  ``--with-synapseai`` (HabanaAI/hccl_demo README), with PCIe ACS off (same README). Failing that, OFI without
  Gaudi Direct: P2.
First-generation Gaudi (AWS DL1) is not in HCL; its recipe stays the page's (Scale-out via Host NIC, Scale-Out
Topology): HCCL_OVER_OFI=1 with the OFI wrapper and the EFA libraries.

Everything here is pure: ``parse_probe_block`` reads the raw tool output that scripts/probe.sh prints between
its ``@@scaleout`` markers, ``decide`` turns one host's facts into a path, ``combine`` makes the job's.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

SCALE_OUT_PAGE = "https://docs.habana.ai/en/latest/API_Reference_Guides/HCCL_APIs/Scale_Out_via_Host_NIC.html"
HL_SMI_PAGE = (
    "https://docs.habana.ai/en/latest/Management_and_Monitoring/Embedded_System_Tools_Guide/"
    "System_Management_Interface_Tool.html"
)
NIC_PAGE = (
    "https://docs.habana.ai/en/latest/Management_and_Monitoring/Embedded_System_Tools_Guide/"
    "Disable_Enable_External_NICs.html"
)
HCL_SOURCE = "HabanaAI/HCL"
OFI_WRAPPER = "libhccl_ofi_wrapper.so"
# HabanaAI/hccl_demo README, "Build HCCL OFI wrapper": what makes ofi_plugin.cpp's dlopen succeed.
OFI_WRAPPER_FIX = (
    "build HabanaAI/hccl_ofi_wrapper against libfabric (make), copy libhccl_ofi_wrapper.so to "
    "/usr/lib/habanalabs/, run ldconfig and put /usr/lib/habanalabs on LD_LIBRARY_PATH "
    "(HabanaAI/hccl_demo README, 'Build HCCL OFI wrapper')"
)
# HCL hcl/src/hcl_consts.h DEFAULT_SCALEOUT_PORTS_MASK (Gaudi 2) and DEFAULT_G3_SCALEOUT_PORTS_MASK, applied as
# GCFG_SCALE_OUT_PORTS_MASK (hcl_global_conf.cpp) to the driver's external ports.
SCALE_OUT_MASK = {2: 0xC00100, 3: 0xFFFFFF}

EFA_MIN = (1, 16, 1)  # libfabric for DL1's EFA (Scale-out via Host NIC)
VERBS_MIN = (1, 20)  # HCL hl_ofi.h MINIMAL_LIBFABRIC_VERSION: Gaudi Direct
KERNEL_MIN = (5, 12)  # HCL hl_ofi.h REQUIRED_KERNEL_MAJOR/MINOR: what it names when dmabuf is missing
# Verbs Gaudi Direct: HCL's setScaleoutMode sets MLX5_SCATTER_TO_CQE=0 and RDMAV_HUGEPAGES_SAFE=1 itself but
# warns that under MPI the setting may not take, so the plan sets them; ofi_t::init sets RDMAV_FORK_SAFE=1
# (hccl_demo README, Gaudi Direct, lists it too).
VERBS_GDR_ENV = {"MLX5_SCATTER_TO_CQE": "0", "RDMAV_HUGEPAGES_SAFE": "1", "RDMAV_FORK_SAFE": "1"}
# What the plan cannot see, and on which verbs Gaudi Direct depends (hccl_demo README: libfabric configured
# --with-synapseai; Gaudi Direct: PCIe ACS disabled).
VERBS_GDR_UNSEEN = ("libfabric was built --with-synapseai", "PCIe ACS is off")


@dataclass(frozen=True)
class HostFabric:
    """One host's scale-out facts. None: not known (the tool was missing or said nothing)."""

    device_name: Optional[str] = None  # hl-smi's name of card 0: HL-205 (first gen), HL-225, HL-325L...
    driver: Optional[str] = None  # hl-smi's driver_version
    kernel: Optional[str] = None  # uname -r
    libfabric: Optional[str] = None  # `fi_info --version`'s "libfabric:" line
    rdma_devices: tuple[str, ...] = ()  # <sysfs>/class/infiniband entries: efa_0, mlx5_0, hbl_0, ...
    efa_provider: bool = False  # `fi_info -p efa` found an EFA device
    external_ports: tuple[int, ...] = ()  # the driver's external (scale-out) ports (hl-smi -n ports, card 0)
    ports_up: Optional[int] = None  # enabled scale-out ports UP over all cards (hl-smi -n link); None: not read
    ports_down: tuple[str, ...] = ()  # "BUS port N" of each enabled scale-out port DOWN in any read
    internal_down: tuple[str, ...] = ()  # "BUS port N" of each scale-up (internal) port DOWN in any read
    flapping: tuple[str, ...] = ()  # "BUS port N" UP in one read and DOWN in another
    dmabuf: Optional[bool] = None  # ib_umem_dmabuf_get in /proc/kallsyms (HCL checkDMABUFSupport)
    ofi_wrapper: Optional[tuple[str, ...]] = None  # where libhccl_ofi_wrapper.so was found; None: not looked
    firmware: tuple[str, ...] = ()  # each card's firmware (hl-smi --fw-versions), in card order
    gaudinet: Optional[tuple[str, str]] = None  # (path, text) of the L3 Gaudi-NIC file HCL reads, when there is one

    @property
    def generation(self) -> Optional[int]:
        return generation_of(self.device_name)

    @property
    def efa(self) -> bool:
        return self.efa_provider or any(d.startswith(("efa", "rdmap")) for d in self.rdma_devices)

    @property
    def verbs_nics(self) -> tuple[str, ...]:
        """Host RDMA NICs other than EFA and Gaudi's own (hbl_N): mlx5_N, irdma...: the verbs provider's."""
        return tuple(d for d in self.rdma_devices if not d.startswith(("efa", "rdmap", "hbl")))

    @property
    def scaleout_ports(self) -> tuple[int, ...]:
        """The ports HCL counts for P0: the driver's external ports under HCL's default SCALE_OUT_PORTS_MASK."""
        mask = SCALE_OUT_MASK.get(self.generation or 0, 0xFFFFFF)
        return tuple(p for p in self.external_ports if mask >> p & 1)


def generation_of(name: Optional[str]) -> Optional[int]:
    """Gaudi generation from hl-smi's product name: HL-20x first generation (DL1's HL-205), HL-22x and the
    HL-28x PCIe card Gaudi 2, HL-3xx Gaudi 3. None when unknown."""
    m = re.match(r"HL-(\d)(\d)", (name or "").strip())
    if not m:
        return None
    if m.group(1) == "3":
        return 3
    if m.group(1) == "2":
        return 1 if m.group(2) == "0" else 2
    return None


def version_tuple(text: Optional[str]) -> Optional[tuple[int, ...]]:
    """(1, 22, 0) from '1.22.0amzn4.0' or '6.8.0-45-generic'; None when it starts with no number."""
    m = re.match(r"\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", text or "")
    if not m:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def _at_least(version: Optional[str], minimum: tuple[int, ...]) -> Optional[bool]:
    got = version_tuple(version)
    if got is None:
        return None
    return got + (0,) * (len(minimum) - len(got)) >= minimum


# ---------------------------------------------------------------- the probe's raw block

DMABUF_SECTION = "grep -c ib_umem_dmabuf_get kallsyms"
WRAPPER_SECTION = "find " + OFI_WRAPPER


def parse_probe_block(text: str) -> HostFabric:
    """The facts from the lines probe.sh prints between its scale-out markers: sections headed by
    ``@@<the command>`` with that command's output verbatim (a command run several times appends to its
    section). Unknown sections and garbage are skipped."""
    sections: dict[str, list[str]] = {}
    current: Optional[list[str]] = None
    for line in text.splitlines():
        if line.startswith("@@"):
            current = sections.setdefault(line[2:].strip(), [])
        elif current is not None:
            current.append(line)
    kernel = next((s.strip() for s in sections.get("uname -r", []) if s.strip()), None)
    rdma = tuple(s.strip() for s in sections.get("ls /sys/class/infiniband", []) if s.strip())
    libfabric = None
    for line in sections.get("fi_info --version", []):  # libfabric's util/info.c prints "libfabric: X"
        if line.startswith("libfabric:"):
            libfabric = line.split(":", 1)[1].strip() or None
    efa_provider = any(line.strip() == "provider: efa" for line in sections.get("fi_info -p efa", []))
    name = driver = None
    for line in sections.get("hl-smi -Q name,driver_version,bus_id -f csv,noheader", []):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].startswith("HL-"):
            name, driver = name or parts[0], driver or parts[1]
    external: tuple[int, ...] = ()
    internal: tuple[int, ...] = ()
    for key, lines in sections.items():
        if key.startswith("hl-smi -n ports -i "):
            types = _ports(lines, ("external", "internal"))
            external = tuple(sorted(p for p, t in types.items() if t == "external"))
            internal = tuple(sorted(p for p, t in types.items() if t == "internal"))
    scaleout = HostFabric(device_name=name, external_ports=external).scaleout_ports
    read = any(k.startswith("hl-smi -n link -i ") for k in sections)
    ports_up: Optional[int] = 0 if read else None
    down: list[str] = []
    inner_down: list[str] = []
    flapping: list[str] = []
    for key, lines in sections.items():
        if not key.startswith("hl-smi -n link -i "):
            continue
        bus = key.rsplit(" ", 1)[-1]
        seen = _port_reads(lines)
        for port, states in sorted(seen.items()):
            where = f"{bus} port {port}"
            if "DOWN" in states and "UP" in states:
                flapping.append(where)
            if port in scaleout:
                ports_up = (ports_up or 0) + (states == {"UP"})
                if "DOWN" in states:
                    down.append(where)
            elif port in internal and "DOWN" in states:
                inner_down.append(where)
    dmabuf_lines = [s.strip() for s in sections.get(DMABUF_SECTION, []) if s.strip()]
    dmabuf = (dmabuf_lines[0] != "0") if dmabuf_lines and dmabuf_lines[0].isdigit() else None
    wrapper = None
    if WRAPPER_SECTION in sections:
        wrapper = tuple(s.strip() for s in sections[WRAPPER_SECTION] if s.strip())
    firmware = tuple(
        line.rsplit(": ", 1)[1].strip()
        for line in sections.get("hl-smi --fw-versions", [])
        if line.startswith("[") and ": " in line
    )
    gaudinet = next(
        ((k.split(" ", 1)[1], "\n".join(v)) for k, v in sections.items() if k.startswith("gaudinet.json ")), None
    )
    return HostFabric(
        device_name=name,
        driver=driver,
        kernel=kernel,
        libfabric=libfabric,
        rdma_devices=rdma,
        efa_provider=efa_provider,
        external_ports=external,
        ports_up=ports_up,
        ports_down=tuple(down),
        internal_down=tuple(inner_down),
        flapping=tuple(flapping),
        dmabuf=dmabuf,
        ofi_wrapper=wrapper,
        firmware=firmware,
        gaudinet=gaudinet,
    )


_PORT_RE = re.compile(r"^\s*port\s+(\d+):\s*(\S+)\s*$", re.IGNORECASE)


def _ports(lines: list[str], wanted: tuple[str, ...]) -> dict[int, str]:
    """hl-smi -n link / -n ports lines ``port  8:        UP`` as {8: 'UP'}, values in ``wanted`` only."""
    out: dict[int, str] = {}
    for line in lines:
        m = _PORT_RE.match(line)
        if m:
            value = next((w for w in wanted if w.lower() == m.group(2).lower()), None)
            if value:
                out[int(m.group(1))] = value
    return out


def _port_reads(lines: list[str]) -> dict[int, set[str]]:
    """Every state each port showed over several reads of hl-smi -n link (Intel Gaudi Health Screen,
    IGNodes.py check_link_state: a port DOWN in any of its reads is down)."""
    out: dict[int, set[str]] = {}
    for line in lines:
        m = _PORT_RE.match(line)
        if m and m.group(2).upper() in ("UP", "DOWN"):
            out.setdefault(int(m.group(1)), set()).add(m.group(2).upper())
    return out


# ---------------------------------------------------------------- the decision


@dataclass(frozen=True)
class ScaleOutPath:
    code: str  # P0, P1, P2, P3, or "?" when the host said too little (no hl-smi)
    name: str
    why: str
    env: Mapping[str, str] = field(default_factory=dict)  # what this path needs set for the ranks
    ofi_recipe: bool = False  # the DL1 recipe: HCCL_OVER_OFI=1, the OFI wrapper and EFA libraries
    efa_libs: bool = False  # DL1 over EFA: the OFI wrapper and EFA libraries on LD_LIBRARY_PATH
    lib_dirs: tuple[str, ...] = ()  # directories the ranks' LD_LIBRARY_PATH needs (where the OFI wrapper is)
    unless: tuple[str, ...] = ()  # conditions the plan could not see: this path if they hold, else ``otherwise``
    otherwise: Optional[str] = None

    def as_dict(self) -> dict:
        env = {"HCCL_OVER_OFI": "1", **self.env} if self.ofi_recipe else dict(self.env)
        out: dict[str, object] = {"path": self.code, "name": self.name, "why": self.why, "env": env}
        out["page"] = SCALE_OUT_PAGE
        if self.unless:
            out["if"], out["else"] = list(self.unless), self.otherwise
        return out

    @property
    def shown(self) -> str:
        """``P1 NAME if A and B, else P2`` where the plan could not see every condition, else ``P0 NAME``."""
        text = f"{self.code} {self.name}"
        return text + (f" if {' and '.join(self.unless)}, else {self.otherwise}" if self.unless else "")


def _dl1_recipe(why: str) -> ScaleOutPath:
    return ScaleOutPath("P2", "host NIC over OFI, forced (HCCL_OVER_OFI=1)", why, {}, ofi_recipe=True, efa_libs=True)


def _wrapper_dirs(f: HostFabric) -> tuple[str, ...]:
    """Directories to put on LD_LIBRARY_PATH so dlopen finds the wrapper (none when ldconfig's cache has it)."""
    found = f.ofi_wrapper or ()
    if any(w.startswith("ldconfig ") for w in found):
        return ()
    return tuple(w.split(" ", 1)[1] for w in found if w.startswith("dir "))[:1]


def decide(f: HostFabric, efa: Optional[bool] = None) -> ScaleOutPath:
    """The path HCCL will take on a host with facts ``f``. ``efa``: --efa (True) / --no-efa (False) override
    what the host's EFA devices say, for first-generation Gaudi (DL1) and hosts whose generation is unknown;
    HCCL for Gaudi 2 and 3 never takes EFA. Pure."""
    has_efa = f.efa if efa is None else efa
    gen = f.generation
    if gen is None:
        if has_efa:  # no hl-smi answer: the generation is not known; keep the recipe this launcher always used
            return _dl1_recipe("EFA, device generation unknown (no hl-smi answer): the first-generation (DL1) recipe")
        return ScaleOutPath("?", "left to HCCL", "device generation unknown (no hl-smi answer): nothing set")
    if gen == 1:
        if has_efa:
            return _dl1_recipe(
                "first-generation Gaudi (DL1) with EFA: HCCL_OVER_OFI is its scale-out recipe; it forces P2, so "
                "peer direct (FI_EFA_USE_DEVICE_RDMA) is left off (Scale-out via Host NIC: setting HCCL_OVER_OFI "
                "disables HCCL's auto-detection, force P2)"
            )
        if f.libfabric:
            return ScaleOutPath("P2", "host NIC through host memory", "first-generation Gaudi, libfabric, no EFA")
        return ScaleOutPath("P3", "none", "first-generation Gaudi without EFA or libfabric")
    head = f"Gaudi {gen} ({f.device_name})"
    enabled = f.scaleout_ports
    if enabled:
        # HCL setScaleoutMode: enabled ports, whatever their link state, mean the Gaudi NICs
        if f.ports_down:
            return ScaleOutPath(
                "P0",
                "Gaudi NICs",
                f"{head}: scale-out ports {_ports_text(enabled)} enabled, {_shown(f.ports_down)} down: HCCL counts "
                "enabled ports, not links (HCL setScaleoutMode), takes the Gaudi NICs and hangs at the first "
                "collective (a pre-flight failure until they are cabled or disabled)",
            )
        links = "link state not read" if f.ports_up is None else f"{f.ports_up} up over all cards"
        return ScaleOutPath("P0", "Gaudi NICs", f"{head}: scale-out ports {_ports_text(enabled)} enabled, {links}")
    head += ", no Gaudi scale-out port enabled" if f.ports_up is not None else ", its scale-out ports not read"
    if f.ofi_wrapper is not None and not f.ofi_wrapper:
        return ScaleOutPath(
            "P3", "none", f"{head}; {OFI_WRAPPER} not found: HCCL cannot load its OFI plugin (HCL ofi_plugin.cpp)"
        )
    if not f.libfabric:
        return ScaleOutPath("P3", "none", f"{head}; no libfabric (fi_info not found)")
    libs = _wrapper_dirs(f)
    nics = f.verbs_nics
    if nics:
        lib_ok = _at_least(f.libfabric, VERBS_MIN)
        dmabuf = f.dmabuf if f.dmabuf is not None else _at_least(f.kernel, KERNEL_MIN)
        seen = "ib_umem_dmabuf_get in /proc/kallsyms" if f.dmabuf else f"kernel {f.kernel or 'unknown'} >= 5.12"
        if lib_ok and dmabuf:
            return ScaleOutPath(
                "P1",
                "host NIC Gaudi Direct (verbs)",
                f"{head}; verbs NIC {', '.join(nics)}, libfabric {f.libfabric} >= 1.20, {seen}",
                VERBS_GDR_ENV,
                lib_dirs=libs,
                unless=VERBS_GDR_UNSEEN,
                otherwise="P2",
            )
        short = f"libfabric {f.libfabric} < 1.20" if not lib_ok else "no ib_umem_dmabuf_get in /proc/kallsyms"
        return ScaleOutPath(
            "P2",
            "host NIC through host memory (verbs)",
            f"{head}; verbs NIC but {short}: no Gaudi Direct",
            lib_dirs=libs,
        )
    efa_note = (
        "; EFA is no provider HCCL takes (HCL hl_ofi.cpp get_core_provider: tcp and verbs only)" if has_efa else ""
    )
    return ScaleOutPath(
        "P2",
        "host NIC through host memory (tcp)",
        f"{head}; no verbs RDMA NIC{efa_note}: libfabric {f.libfabric}'s tcp provider",
        lib_dirs=libs,
    )


def combine(paths: Mapping[str, ScaleOutPath]) -> tuple[dict[str, str], bool, bool, list[str]]:
    """The job's variables from each host's path: (env, ofi_recipe, efa_libs, warnings); the recipe's own
    variables (fabric.efa_env) are the caller's, and so are the library directories (``lib_dirs``). Every
    rank gets the same environment, so a variable one host's path needs is set for all (Gaudi Direct's are
    harmless on a host that does not use them). Pure."""
    env: dict[str, str] = {}
    for p in paths.values():
        env.update(p.env)
    warnings = []
    codes = sorted({p.code for p in paths.values()})
    if len(codes) > 1:
        warnings.append(
            "hosts take different scale-out paths ("
            + "; ".join(f"{h}: {p.code}" for h, p in paths.items())
            + "): HCCL is fastest, and only reliable, when every host can take the same one ("
            + SCALE_OUT_PAGE
            + ")"
        )
    none = [h for h, p in paths.items() if p.code == "P3"]
    if none and len(paths) > 1:
        warnings.append(f"no scale-out path on {', '.join(none)}: HCCL cannot reach the other hosts from there")
    ofi = any(p.ofi_recipe for p in paths.values())
    return env, ofi, any(p.efa_libs for p in paths.values()), warnings


def lib_dirs(paths: Mapping[str, ScaleOutPath]) -> list[str]:
    """Every directory some host's path needs on LD_LIBRARY_PATH, first seen first. Pure."""
    out: list[str] = []
    for p in paths.values():
        out += [d for d in p.lib_dirs if d not in out]
    return out


def port_finding(f: HostFabric) -> Optional[tuple[str, str, bool]]:
    """(reason, fix, fatal) when enabled Gaudi scale-out ports are down, else None. Fatal on Gaudi 2 and 3
    (HCL setScaleoutMode takes the Gaudi NICs for any enabled port, cabled or not, and hangs), and wherever
    some ports are up. Pure."""
    if not f.ports_down:
        return None
    return (
        f"Gaudi scale-out NIC port(s) enabled but down: {_shown(f.ports_down)}",
        "HCCL takes the Gaudi NICs whenever a scale-out port is enabled (HCL setScaleoutMode), so: cable them "
        "(check each with hl-smi -n link -i BUS, its cable and switch port), or, for a host-NIC fabric, disable "
        f"every Gaudi scale-out port with hl-fw-loader (off until the next power cycle) ({NIC_PAGE})",
        f.generation in (2, 3) or bool(f.ports_up),
    )


def link_findings(f: HostFabric) -> list[tuple[str, str]]:
    """(reason, fix) for scale-up (internal) ports down and for ports that flap between reads: the Intel Gaudi
    Health Screen (HabanaAI/Setup_and_Install utils/intel_gaudi_health_screen, IGNodes.py check_link_state)
    marks a card bad for any port DOWN in any of its reads, internal ones too. Pure."""
    out = []
    if f.internal_down and not _pcie_card(f.device_name):
        out.append(
            (
                f"Gaudi scale-up (internal) port(s) down: {_shown(f.internal_down)}",
                "the cards of this host cannot all reach each other: reset or reseat the cards named (hl-smi -n "
                "link -i BUS), or leave this host out",
            )
        )
    flaps = [p for p in f.flapping if p not in f.ports_down and p not in f.internal_down]
    if flaps:
        out.append((f"Gaudi NIC port(s) flapping between reads: {_shown(tuple(flaps))}", "check the cables"))
    return out


def _pcie_card(name: Optional[str]) -> bool:
    """A PCIe card (Gaudi 2 HL-28x, Gaudi 3 HL-338): no scale-up mesh between cards is assumed, so its internal
    ports' state is not judged (an assumption: docs/multinode.md, "Unproven without hardware")."""
    return bool(re.match(r"HL-(28|33)\d", (name or "").strip()))


def wrapper_finding(f: HostFabric, path: ScaleOutPath) -> Optional[tuple[str, str]]:
    """(reason, fix) when this host needs HCCL's OFI plugin and its wrapper was not found. Pure."""
    if f.ofi_wrapper is None or f.ofi_wrapper or f.generation not in (2, 3) or path.code == "P0":
        return None
    return (
        f"{OFI_WRAPPER} not found (LD_LIBRARY_PATH, ldconfig, /usr/lib/habanalabs): HCCL has no host-NIC "
        "scale-out without it (HCL ofi_plugin.cpp dlopens it)",
        OFI_WRAPPER_FIX,
    )


GAUDINET_KEYS = ("NIC_MAC", "NIC_IP", "SUBNET_MASK", "GATEWAY_MAC")


def gaudinet_problem(f: HostFabric) -> Optional[tuple[str, str]]:
    """(reason, fix) when the host's gaudinet.json would stop HCCL at its start, else None. HCL reads the file
    whenever it exists (HabanaAI/HCL hcl_device_config.cpp HclDeviceConfig::parseGaudinet) and fails on invalid
    JSON, no NIC_NET_CONFIG list, an entry without NIC_MAC, NIC_IP, SUBNET_MASK or GATEWAY_MAC, or an IP or mask
    of 0. Pure."""
    if f.gaudinet is None:
        return None
    path, text = f.gaudinet
    try:
        data = json.loads(text)
    except ValueError as exc:
        why = f"not valid JSON ({exc})"
    else:
        entries = data.get("NIC_NET_CONFIG") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            why = "no NIC_NET_CONFIG list"
        else:
            why = next((_gaudinet_entry(i, e) for i, e in enumerate(entries) if _gaudinet_entry(i, e)), "")
    if not why:
        return None
    return (
        f"{path}: {why}: HCCL fails at its start (HCL parseGaudinet reads it whenever it exists)",
        f"fix it (one NIC_NET_CONFIG entry per Gaudi port: {', '.join(GAUDINET_KEYS)}; Habana's 'Configure E2E "
        "Test in L2/L3'), or remove it where the Gaudi NICs are not an L3 fabric",
    )


def _gaudinet_entry(index: int, entry) -> str:
    if not isinstance(entry, dict):
        return f"NIC_NET_CONFIG entry {index} is not an object"
    missing = [k for k in GAUDINET_KEYS if k not in entry]
    if missing:
        return f"NIC_NET_CONFIG entry {index} has no {', '.join(missing)}"
    for key in ("NIC_IP", "SUBNET_MASK"):
        try:
            if int(ipaddress.IPv4Address(str(entry[key]))) == 0:
                raise ValueError
        except ValueError:
            return f"NIC_NET_CONFIG entry {index}: {key} {entry[key]!r} is not an IPv4 address"
    return ""


def _ports_text(ports: tuple[int, ...]) -> str:
    return ", ".join(str(p) for p in ports)


def _shown(ports: tuple[str, ...]) -> str:
    """Down ports for a message: the first six, then how many more. Pure."""
    return ", ".join(ports[:6]) + (f" and {len(ports) - 6} more" if len(ports) > 6 else "")
