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
    # a Gaudi 2 server: cards and Gaudi NICs, no libfabric
    "gaudi2": {"GAUDI_STANDIN_CARDS": "gaudi2"},
    # Gaudi 3 server with host NICs (EFA) and its Gaudi scale-out ports not cabled
    "gaudi3-hostnic": {
        "GAUDI_STANDIN_CARDS": "gaudi3",
        "GAUDI_STANDIN_PORTS_DOWN": "all",
        "GAUDI_STANDIN_LIBFABRIC": "1.22.0amzn4.0",
        "GAUDI_STANDIN_EFA": "1",
    },
    # Gaudi 3 with its own scale-out ports cabled and up
    "gaudi3-gaudinic": {"GAUDI_STANDIN_CARDS": "gaudi3", "GAUDI_STANDIN_LIBFABRIC": "1.22.0"},
    # Gaudi 2 HLS-2 with one scale-out port down on every card
    "gaudi2-portdown": {
        "GAUDI_STANDIN_CARDS": "gaudi2",
        "GAUDI_STANDIN_PORTS_DOWN": "9",
        "GAUDI_STANDIN_LIBFABRIC": "1.22.0",
    },
    # Gaudi 2 with host NICs, libfabric too old for Gaudi Direct
    "gaudi2-oldfabric": {
        "GAUDI_STANDIN_CARDS": "gaudi2",
        "GAUDI_STANDIN_PORTS_DOWN": "all",
        "GAUDI_STANDIN_LIBFABRIC": "1.15.2amzn1.0",
        "GAUDI_STANDIN_EFA": "1",
    },
    # AWS DL1: first-generation Gaudi, EFA, no scale-out ports of its own
    "dl1": {"GAUDI_STANDIN_CARDS": "dl1", "GAUDI_STANDIN_LIBFABRIC": "1.19.0amzn4.0", "GAUDI_STANDIN_EFA": "1"},
}
VARIABLES = (
    "GAUDI_STANDIN_CARDS",
    "GAUDI_STANDIN_HL_SMI_BUSY",
    "GAUDI_STANDIN_PORTS_DOWN",
    "GAUDI_STANDIN_DRIVER",
    "GAUDI_STANDIN_CARD_COUNT",
    "GAUDI_STANDIN_LIBFABRIC",
    "GAUDI_STANDIN_EFA",
    "GAUDI_STANDIN_REPORTNCHECK",
)


def settings(profile: str, path: str = "", **overrides: str) -> dict[str, str]:
    """Every stand-in variable for ``profile`` ("" for those it leaves unset) and PATH with the stand-ins first
    (fi_info only when the profile has libfabric, reportNcheck.py only when GAUDI_STANDIN_REPORTNCHECK is set).
    ``overrides``: variables by name, e.g. GAUDI_STANDIN_PORTS_DOWN="22"."""
    values = {name: "" for name in VARIABLES}
    values.update(PROFILES[profile])
    values.update(overrides)
    tools = [BIN] + ([FABRIC] if values["GAUDI_STANDIN_LIBFABRIC"] else [])
    tools += [PERFTEST] if values["GAUDI_STANDIN_REPORTNCHECK"] else []
    values["PATH"] = os.pathsep.join(tools + ([path] if path else []))
    return values


def apply(monkeypatch, profile: str, **overrides: str) -> dict[str, str]:
    """Make this process (and what it starts) see ``profile``'s server; returns the settings."""
    values = settings(profile, os.environ.get("PATH", ""), **overrides)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def shell_lines(values: Mapping[str, str]) -> str:
    """``values`` (from settings, PATH included) as lines a login shell sources; PATH is prepended to the
    host's own."""
    out = []
    for name, value in values.items():
        if name == "PATH":
            out.append(f'PATH={shlex.quote(value)}:"$PATH"; export PATH')
        else:
            out.append(f"{name}={shlex.quote(value)}; export {name}")
    return "\n".join(out) + "\n"
