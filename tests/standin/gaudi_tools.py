"""Stood-in Gaudi servers for tests: which hl-smi and fi_info stand-ins a host has, and what they say.

The tools themselves are shell scripts with their sources cited in them: ``bin/hl-smi`` (the only hl-smi
stand-in: cards, module ids, bus ids, NIC ports, processes holding cards, versions) and ``fabric/fi_info``
(libfabric, EFA), and the Python ``perftest/reportNcheck.py`` (Habana's ReportNCheck: passes, fails or
hangs). They read ``GAUDI_STANDIN_*`` variables; a profile here names a whole server as those
variables plus PATH. ``settings(profile)`` is for a local test (monkeypatch.setenv each), ``shell_lines`` for a
cluster host's login (its BASH_ENV file), where per-host differences go.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(HERE, "bin")  # hl-smi
FABRIC = os.path.join(HERE, "fabric")  # fi_info: on PATH only where the host has libfabric
PERFTEST = os.path.join(HERE, "perftest")  # reportNcheck.py: on PATH only when GAUDI_STANDIN_REPORTNCHECK is set

PROFILES: dict[str, dict[str, str]] = {
    # a Gaudi 2 server on its own NICs (scale-out ports 8, 22, 23 enabled and up), no libfabric
    "gaudi2": {"GAUDI_STANDIN_CARDS": "gaudi2"},
    # Gaudi 3 on verbs host NICs (Mellanox mlx5), its Gaudi scale-out ports switched off with hl-fw-loader, libfabric
    # 1.22 (built --with-synapseai, which no tool shows), ib_umem_dmabuf_get in kallsyms, the OFI wrapper built
    # (HabanaAI/hccl_demo README, Host NIC Scale-Out Setup)
    "gaudi3-verbs": {
        "GAUDI_STANDIN_CARDS": "gaudi3",
        "GAUDI_STANDIN_PORTS_DISABLED": "all",
        "GAUDI_STANDIN_LIBFABRIC": "1.22.0",
        "GAUDI_STANDIN_RDMA": "mlx5_0,mlx5_1,hbl_0",
        "GAUDI_STANDIN_DMABUF": "1",
        "GAUDI_STANDIN_OFI_WRAPPER": "1",
    },
    # the same host NICs, but the Gaudi scale-out ports left enabled (the default) and not cabled: HCCL takes P0
    "gaudi3-uncabled": {
        "GAUDI_STANDIN_CARDS": "gaudi3",
        "GAUDI_STANDIN_PORTS_DOWN": "all",
        "GAUDI_STANDIN_LIBFABRIC": "1.22.0",
        "GAUDI_STANDIN_RDMA": "mlx5_0,mlx5_1,hbl_0",
        "GAUDI_STANDIN_DMABUF": "1",
        "GAUDI_STANDIN_OFI_WRAPPER": "1",
    },
    # Gaudi 3 with its own scale-out ports cabled and up
    "gaudi3-gaudinic": {"GAUDI_STANDIN_CARDS": "gaudi3", "GAUDI_STANDIN_LIBFABRIC": "1.22.0"},
    # Gaudi 2 HLS-2 with one scale-out port down on every card
    "gaudi2-portdown": {
        "GAUDI_STANDIN_CARDS": "gaudi2",
        "GAUDI_STANDIN_PORTS_DOWN": "22",
        "GAUDI_STANDIN_LIBFABRIC": "1.22.0",
    },
    # Gaudi 2 on verbs host NICs (ports disabled), libfabric too old for Gaudi Direct
    "gaudi2-oldfabric": {
        "GAUDI_STANDIN_CARDS": "gaudi2",
        "GAUDI_STANDIN_PORTS_DISABLED": "all",
        "GAUDI_STANDIN_LIBFABRIC": "1.15.2",
        "GAUDI_STANDIN_RDMA": "mlx5_0",
        "GAUDI_STANDIN_OFI_WRAPPER": "1",
    },
    # AWS DL1: first-generation Gaudi, EFA, no scale-out ports of its own
    "dl1": {
        "GAUDI_STANDIN_CARDS": "dl1",
        "GAUDI_STANDIN_LIBFABRIC": "1.19.0amzn4.0",
        "GAUDI_STANDIN_EFA": "1",
        "GAUDI_STANDIN_RDMA": "efa_0",
    },
}
VARIABLES = (
    "GAUDI_STANDIN_CARDS",
    "GAUDI_STANDIN_HL_SMI_BUSY",
    "GAUDI_STANDIN_PORTS_DOWN",
    "GAUDI_STANDIN_PORTS_DISABLED",
    "GAUDI_STANDIN_DRIVER",
    "GAUDI_STANDIN_FIRMWARE",
    "GAUDI_STANDIN_CARD_COUNT",
    "GAUDI_STANDIN_HL_SMI_LOG",
    "GAUDI_STANDIN_HL_SMI_SECONDS",
    "GAUDI_STANDIN_HL_SMI_TIMES",
    "GAUDI_STANDIN_LIBFABRIC",
    "GAUDI_STANDIN_EFA",
    "GAUDI_STANDIN_REPORTNCHECK",
)
# What host_tree writes as files (read by the probe through GAUDI_LAUNCH_SYSFS / GAUDI_LAUNCH_PROCFS, and the OFI
# wrapper it looks for in $HCCL_OFI_WRAPPER), not variables a tool reads.
TREE = ("GAUDI_STANDIN_RDMA", "GAUDI_STANDIN_DMABUF", "GAUDI_STANDIN_OFI_WRAPPER")


def host_tree(root, values: Mapping[str, str]) -> dict[str, str]:
    """The files of a stood-in host under ``root`` (a pathlib.Path) and the variables that point the probe at
    them: <root>/sys/class/infiniband/<each GAUDI_STANDIN_RDMA device> (the kernel's RDMA devices; the entries
    only, as the probe lists names), <root>/proc/kallsyms (with ``ib_umem_dmabuf_get`` when GAUDI_STANDIN_DMABUF
    is 1: the symbol HabanaAI/HCL hl_ofi.cpp checkDMABUFSupport looks for) and, with GAUDI_STANDIN_OFI_WRAPPER,
    an empty STAND-IN <root>/ofi/libhccl_ofi_wrapper.so, named by HCCL_OFI_WRAPPER (never dlopened here)."""
    ib = root / "sys" / "class" / "infiniband"
    ib.mkdir(parents=True, exist_ok=True)
    for dev in filter(None, values.get("GAUDI_STANDIN_RDMA", "").split(",")):
        (ib / dev).mkdir(exist_ok=True)
    proc = root / "proc"
    proc.mkdir(parents=True, exist_ok=True)
    symbols = ["0000000000000000 T ib_umem_get [ib_uverbs]"]
    if values.get("GAUDI_STANDIN_DMABUF") == "1":
        symbols.append("0000000000000000 T ib_umem_dmabuf_get [ib_uverbs]")
    (proc / "kallsyms").write_text("\n".join(symbols) + "\n")
    out = {"GAUDI_LAUNCH_SYSFS": str(root / "sys"), "GAUDI_LAUNCH_PROCFS": str(proc)}
    if values.get("GAUDI_STANDIN_OFI_WRAPPER") == "1":
        (root / "ofi").mkdir(exist_ok=True)
        (root / "ofi" / "libhccl_ofi_wrapper.so").write_text("STAND-IN: not a library\n")
        out["HCCL_OFI_WRAPPER"] = str(root / "ofi")
    return out


def settings(profile: str, path: str = "", **overrides: str) -> dict[str, str]:
    """Every stand-in variable for ``profile`` ("" for those it leaves unset) and PATH with the stand-ins first
    (fi_info only when the profile has libfabric, reportNcheck.py only when GAUDI_STANDIN_REPORTNCHECK is set).
    ``overrides``: variables by name, e.g. GAUDI_STANDIN_PORTS_DOWN="22"."""
    values = {name: "" for name in VARIABLES + TREE}
    values.update(PROFILES[profile])
    values.update(overrides)
    tools = [BIN] + ([FABRIC] if values["GAUDI_STANDIN_LIBFABRIC"] else [])
    tools += [PERFTEST] if values["GAUDI_STANDIN_REPORTNCHECK"] else []
    values["PATH"] = os.pathsep.join(tools + ([path] if path else []))
    return values


def apply(monkeypatch, profile: str, root=None, **overrides: str) -> dict[str, str]:
    """Make this process (and what it starts) see ``profile``'s server, with its files under ``root`` (a
    pathlib.Path; host_tree) when given; returns the settings."""
    values = settings(profile, os.environ.get("PATH", ""), **overrides)
    if root is not None:
        values.update(host_tree(root, values))
    for name, value in values.items():
        if name not in TREE:
            monkeypatch.setenv(name, value)
    return values


def shell_lines(values: Mapping[str, str]) -> str:
    """``values`` (from settings, PATH included) as lines a login shell sources; PATH is prepended to the
    host's own."""
    out = []
    for name, value in values.items():
        if name in TREE:
            continue
        if name == "PATH":
            out.append(f'PATH={shlex.quote(value)}:"$PATH"; export PATH')
        else:
            out.append(f"{name}={shlex.quote(value)}; export {name}")
    return "\n".join(out) + "\n"
