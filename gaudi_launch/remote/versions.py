"""Software that must be the same on every host of a job (issue 25): Python's minor version, torch, the
Gaudi bridge, DeepSpeed, transformers, OpenMPI's major version, and (issue 32) the Gaudi driver and every
card's firmware, as each host's pre-flight probe found them for the workers' interpreter; a host whose driver
and bridge are of different releases fails too. A difference is a pre-flight error with a table of what differs (the
ranks would otherwise fail, or silently disagree, at the first collective), unless
--allow-version-mismatch, which leaves it a warning with the same table. Pure.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Callable, Optional

from gaudi_launch.remote import openmpi


def _python_minor(f) -> Optional[str]:
    parts = (f.python_version or "").split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else None


def _openmpi_major(f) -> Optional[str]:
    found = openmpi.major(f.openmpi)
    return None if found is None else str(found)


def _driver(f) -> Optional[str]:
    """hl-smi's driver_version (plan/scaleout.py); None without hl-smi."""
    return f.fabric.driver if f.fabric is not None else None


def _firmware(f) -> Optional[str]:
    """Each firmware version among the host's cards (hl-smi --fw-versions), joined; None without an answer."""
    found = sorted(set(f.fabric.firmware)) if f.fabric is not None else []
    return " + ".join(found) or None


# (row name, the value from a host's HostFacts; None: not known, which is never a difference)
ROWS: tuple[tuple[str, Callable], ...] = (
    ("Python", _python_minor),
    ("torch", lambda f: f.torch or "not installed"),
    ("Gaudi bridge", lambda f: f.habana_bridge or "not installed"),
    ("DeepSpeed", lambda f: f.deepspeed or "not installed"),
    ("transformers", lambda f: f.transformers or "not installed"),
    ("OpenMPI", _openmpi_major),  # a host without mpirun is not compared (pdsh and ssh jobs need none)
    # Habana installs driver, firmware and bridge of one release together (Support Matrix, "Installation
    # Guide"); HCCL's peers exchange their setup at the first collective, so one release everywhere.
    ("Gaudi driver", _driver),
    ("Gaudi firmware", _firmware),
)
SUPPORT_MATRIX_PAGE = "https://docs.habana.ai/en/latest/Support_Matrix/Support_Matrix.html"


def _release(text: Optional[str]) -> Optional[str]:
    """'1.22' from '1.22.1-97ec1a4' (driver) or '1.22.0.740' (bridge); None when it does not read."""
    m = re.match(r"\s*(\d+)\.(\d+)", text or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def release_mismatch(f) -> Optional[str]:
    """Why this host's Gaudi driver and bridge are of different releases, or None (also when either is not
    known): the support matrix pairs each bridge release with its own driver. Pure."""
    driver, bridge = _release(_driver(f)), _release(f.habana_bridge)
    if driver is None or bridge is None or driver == bridge:
        return None
    return f"Gaudi driver {_driver(f)} with Gaudi bridge {f.habana_bridge}: releases {driver} and {bridge}"


def differences(facts: dict) -> list[tuple[str, dict[str, Optional[str]]]]:
    """(row, {host: value}) of each row whose known values differ between the probed hosts."""
    probed = {h: f for h, f in facts.items() if f.python_ok}
    out = []
    for name, get in ROWS:
        values = {h: get(f) for h, f in probed.items()}
        if len({v for v in values.values() if v is not None}) > 1:
            out.append((name, values))
    return out


def table(diffs: list[tuple[str, dict[str, Optional[str]]]]) -> str:
    """What differs, one row per piece of software and a column per host."""
    hosts = list(diffs[0][1]) if diffs else []
    rows = [["", *hosts]] + [[name, *(values.get(h) or "?" for h in hosts)] for name, values in diffs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _odd_ones(values: dict[str, Optional[str]]) -> dict[str, str]:
    """Hosts whose value is not the most common one (ties: the first host's), with that value."""
    known = [v for v in values.values() if v is not None]
    counts = Counter(known)
    top = max(counts.values())
    usual = next(v for v in known if counts[v] == top)
    return {h: v for h, v in values.items() if v is not None and v != usual}


def judge(report, allow: bool) -> None:
    """Fail each host whose software differs from the others' (a preflight.CheckReport, in place), with the
    table; with ``allow`` (--allow-version-mismatch), a warning with the table instead."""
    _judge_releases(report, allow)
    diffs = differences(report.facts)
    if not diffs:
        return
    shown = table(diffs)
    if allow:
        report.warnings.append("software differs across hosts (--allow-version-mismatch: going on):\n" + shown)
        return
    for name, values in diffs:
        usual = next(v for v in values.values() if v is not None and v not in _odd_ones(values).values())
        for host, value in _odd_ones(values).items():
            facts = report.facts[host]
            reason = f"{name} {value} here, {usual} on the other hosts"
            if facts.ok:
                facts.ok, facts.reason = False, f"software differs across hosts: {reason}\n{shown}"
                facts.fix = (
                    f"install the same {name} on every host (the workers' --python), "
                    "or go on anyway with --allow-version-mismatch"
                )
            elif reason not in (facts.reason or ""):
                facts.reason = f"{facts.reason}; {reason}"


def _judge_releases(report, allow: bool) -> None:
    """Fail each host whose Gaudi driver and bridge are of different releases (a warning with ``allow``)."""
    for host, facts in report.facts.items():
        why = release_mismatch(facts) if facts.python_ok else None
        if not why:
            continue
        if allow:
            report.warnings.append(f"{host}: {why} (--allow-version-mismatch: going on)")
        elif facts.ok:
            facts.ok, facts.reason = False, f"{why}, not a supported pair ({SUPPORT_MATRIX_PAGE})"
            facts.fix = (
                "install the driver and firmware of the bridge's release (or the bridge of the driver's), "
                "or go on anyway with --allow-version-mismatch"
            )
        else:
            facts.reason = f"{facts.reason}; {why}"
