"""The scale-out path each host's HCCL will take, decided from what the pre-flight's probe found.

Habana, "Scale-out via Host NIC" (https://docs.habana.ai/en/latest/API_Reference_Guides/HCCL_APIs/
Scale_Out_via_Host_NIC.html): HCCL picks the path itself, in this order:
  P0 Gaudi NICs, when the Gaudi scale-out ports are connected;
  P1 host NIC Gaudi Direct: EFA with libfabric >= 1.16.1, or verbs with libfabric 1.20.0, and Linux >= 5.12
     (on EFA also RDMAV_FORK_SAFE=1 and FI_EFA_USE_DEVICE_RDMA=1; verbs GDR only on Gaudi 2 and 3);
  P2 host NICs through host memory (libfabric with the efa, verbs or tcp provider);
  P3 no scale-out.
HCCL_OVER_OFI turns that choice off and forces P2: the recipe of first-generation Gaudi on AWS DL1, a
slowdown on Gaudi 2 and 3, so it is set only where P2 is the right path.

Everything here is pure: ``parse_probe_block`` reads the raw tool output that scripts/probe.sh prints between
its ``@@scaleout`` markers, ``decide`` turns one host's facts into a path, ``combine`` makes the job's.
"""

from __future__ import annotations

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

EFA_MIN = (1, 16, 1)  # libfabric for Gaudi Direct over EFA (Scale-out via Host NIC, P1)
VERBS_MIN = (1, 20, 0)  # libfabric for Gaudi Direct over verbs (same page)
KERNEL_MIN = (5, 12)  # Linux for Gaudi Direct (same page)
# Host NIC Gaudi Direct Setup (same page): on EFA both, with verbs fork safety.
EFA_GDR_ENV = {"RDMAV_FORK_SAFE": "1", "FI_EFA_USE_DEVICE_RDMA": "1"}
VERBS_GDR_ENV = {"RDMAV_FORK_SAFE": "1"}


@dataclass(frozen=True)
class HostFabric:
    """One host's scale-out facts. None: not known (the tool was missing or said nothing)."""

    device_name: Optional[str] = None  # hl-smi's name of card 0: HL-205 (first gen), HL-225, HL-325L...
    driver: Optional[str] = None  # hl-smi's driver_version
    kernel: Optional[str] = None  # uname -r
    libfabric: Optional[str] = None  # `fi_info --version`'s "libfabric:" line
    rdma_devices: tuple[str, ...] = ()  # /sys/class/infiniband entries: efa_0, mlx5_0, hbl_0, ...
    efa_provider: bool = False  # `fi_info -p efa` found an EFA device
    external_ports: tuple[int, ...] = ()  # Gaudi scale-out ports (hl-smi -n ports on card 0)
    ports_up: Optional[int] = None  # external ports UP over all cards (hl-smi -n link); None: not read
    ports_down: tuple[str, ...] = ()  # "BUS port N" of each external port DOWN

    @property
    def generation(self) -> Optional[int]:
        return generation_of(self.device_name)

    @property
    def efa(self) -> bool:
        return self.efa_provider or any(d.startswith(("efa", "rdmap")) for d in self.rdma_devices)

    @property
    def verbs(self) -> bool:
        """A host RDMA NIC other than EFA and Gaudi's own (hbl_N): mlx5_N, irdma...: the verbs provider."""
        return any(not d.startswith(("efa", "rdmap", "hbl")) for d in self.rdma_devices)


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


def parse_probe_block(text: str) -> HostFabric:
    """The facts from the lines probe.sh prints between its scale-out markers: sections headed by
    ``@@<the command>`` with that command's output verbatim. Unknown sections and garbage are skipped."""
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
    cards = []
    for line in sections.get("hl-smi -Q name,driver_version,bus_id -f csv,noheader", []):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].startswith("HL-"):
            name, driver = name or parts[0], driver or parts[1]
            cards.append(parts[2])
    external: tuple[int, ...] = ()
    ports_up: Optional[int] = None
    down: list[str] = []
    for key, lines in sections.items():
        if key.startswith("hl-smi -n ports -i "):
            external = tuple(sorted(_ports(lines, ("external",))))
    if external:
        for key, lines in sections.items():
            if not key.startswith("hl-smi -n link -i "):
                continue
            bus = key.rsplit(" ", 1)[-1]
            states = _ports(lines, ("UP", "DOWN"))
            for port in external:
                if states.get(port) == "UP":
                    ports_up = (ports_up or 0) + 1
                elif port in states:
                    ports_up = ports_up or 0
                    down.append(f"{bus} port {port}")
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


# ---------------------------------------------------------------- the decision


@dataclass(frozen=True)
class ScaleOutPath:
    code: str  # P0, P1, P2, P3, or "?" when the host said too little (no hl-smi)
    name: str
    why: str
    env: Mapping[str, str] = field(default_factory=dict)  # what this path needs set for the ranks
    ofi_recipe: bool = False  # the DL1 recipe: HCCL_OVER_OFI=1, the OFI wrapper and EFA libraries
    efa_libs: bool = False  # over EFA: the OFI wrapper and EFA libraries on LD_LIBRARY_PATH

    def as_dict(self) -> dict:
        env = {"HCCL_OVER_OFI": "1", **self.env} if self.ofi_recipe else dict(self.env)
        return {"path": self.code, "name": self.name, "why": self.why, "env": env, "page": SCALE_OUT_PAGE}


def _dl1_recipe(why: str) -> ScaleOutPath:
    return ScaleOutPath("P2", "host NIC over OFI, forced (HCCL_OVER_OFI=1)", why, {}, ofi_recipe=True, efa_libs=True)


def decide(f: HostFabric, efa: Optional[bool] = None) -> ScaleOutPath:
    """The path HCCL will take on a host with facts ``f``. ``efa``: --efa (True) / --no-efa (False) override
    what the host's EFA devices say. Pure."""
    has_efa = f.efa if efa is None else efa
    gen = f.generation
    kernel_ok = _at_least(f.kernel, KERNEL_MIN)
    if f.ports_up and not f.ports_down:
        return ScaleOutPath("P0", "Gaudi NICs", f"{f.ports_up} Gaudi scale-out port(s) up")
    if f.ports_up:
        # Some up, some down. The page's P0 condition ("Gaudi scale-out NICs are connected") says nothing
        # of partly-down ports; assumed, as the pre-flight does (port_finding): HCCL still takes the Gaudi
        # NICs, and its collectives over the down ports fail.
        return ScaleOutPath(
            "P0",
            "Gaudi NICs",
            f"{f.ports_up} Gaudi scale-out port(s) up but {_shown(f.ports_down)} down: HCCL still takes the "
            "Gaudi NICs and the down port(s) break its collectives (a pre-flight failure until they are up)",
        )
    if gen is None:
        if has_efa:  # no hl-smi answer: the generation is not known; keep the recipe this launcher always used
            return _dl1_recipe("EFA, device generation unknown (no hl-smi answer): the first-generation (DL1) recipe")
        return ScaleOutPath("?", "left to HCCL", "device generation unknown (no hl-smi answer): nothing set")
    if gen == 1:
        if has_efa:
            return _dl1_recipe("first-generation Gaudi (DL1) with EFA: HCCL_OVER_OFI is its scale-out recipe")
        if f.libfabric:
            return ScaleOutPath("P2", "host NIC through host memory", "first-generation Gaudi, libfabric, no EFA")
        return ScaleOutPath("P3", "none", "first-generation Gaudi without scale-out ports up, EFA or libfabric")
    # the generation first: it is why HCCL_OVER_OFI (first-generation Gaudi's recipe) is not set
    ports = f"Gaudi {gen} ({f.device_name}), its scale-out ports {'down' if f.ports_down else 'not seen'}"
    kernel_note = f"kernel {f.kernel or 'unknown'}"
    if has_efa:
        lib_ok = _at_least(f.libfabric, EFA_MIN)
        if lib_ok and kernel_ok:
            return ScaleOutPath(
                "P1",
                "host NIC Gaudi Direct (EFA)",
                f"{ports}; EFA, libfabric {f.libfabric} >= 1.16.1, {kernel_note} >= 5.12",
                EFA_GDR_ENV,
                efa_libs=True,
            )
        short = (
            "libfabric version unknown (no fi_info)"
            if lib_ok is None
            else (f"libfabric {f.libfabric} < 1.16.1" if not lib_ok else f"{kernel_note} < 5.12 or unknown")
        )
        return ScaleOutPath(
            "P2", "host NIC through host memory (EFA)", f"{ports}; EFA but {short}: no Gaudi Direct", efa_libs=True
        )
    if f.verbs:
        lib_ok = _at_least(f.libfabric, VERBS_MIN)
        if lib_ok and kernel_ok:
            return ScaleOutPath(
                "P1",
                "host NIC Gaudi Direct (verbs)",
                f"{ports}; RDMA NIC {', '.join(d for d in f.rdma_devices if not d.startswith('hbl'))}, "
                f"libfabric {f.libfabric} >= 1.20.0, {kernel_note} >= 5.12",
                VERBS_GDR_ENV,
            )
        if f.libfabric:
            return ScaleOutPath(
                "P2", "host NIC through host memory (verbs)", f"{ports}; libfabric {f.libfabric} < 1.20.0 or old kernel"
            )
    if f.libfabric:
        return ScaleOutPath(
            "P2", "host NIC through host memory (tcp)", f"{ports}; no RDMA NIC; libfabric {f.libfabric}"
        )
    return ScaleOutPath("P3", "none", f"{ports}; no host RDMA NIC and no libfabric (fi_info not found)")


def combine(paths: Mapping[str, ScaleOutPath]) -> tuple[dict[str, str], bool, bool, list[str]]:
    """The job's variables from each host's path: (env, ofi_recipe, efa_libs, warnings); the recipe's own
    variables (fabric.efa_env) are the caller's. Every rank gets the same
    environment, so a variable one host's path needs is set for all (Gaudi Direct's are harmless on a
    host that does not use them). Pure."""
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


def port_finding(f: HostFabric) -> Optional[tuple[str, str, bool]]:
    """(reason, fix, fatal) when Gaudi scale-out ports are down, else None. Fatal when others are up: HCCL
    then takes the Gaudi NICs (P0) and the down port breaks the job's collectives; with all of them down
    it falls back to a host NIC path, slower but working. Pure."""
    if not f.ports_down:
        return None
    return (
        f"Gaudi scale-out NIC port(s) down: {_shown(f.ports_down)}",
        "check each port with hl-smi -n link -i BUS and its cable and switch port; ports switched off with "
        f"hl-fw-loader stay off until the next power cycle ({NIC_PAGE})",
        bool(f.ports_up),
    )


def _shown(ports: tuple[str, ...]) -> str:
    """Down ports for a message: the first six, then how many more. Pure."""
    return ", ".join(ports[:6]) + (f" and {len(ports) - 6} more" if len(ports) > 6 else "")
