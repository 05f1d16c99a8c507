"""Stand-ins for the host tools the pre-flight reads about scale-out: ``hl-smi`` and ``fi_info``.

``install(directory, profile)`` writes both as shell scripts into ``directory``; a test puts it first on
PATH (of a local ``sh -c`` probe, or of one host's login via its environment). Each prints what the real
tool prints for the queries the launcher makes, and fails like it for anything else (hl-smi exits 1 with its
usage line on an option it does not know; fi_info exits 1 with ``fi_getinfo: -61`` when no provider matches).

Formats copied from:
- hl-smi: Habana, "System Management Interface Tool (hl-smi)" (docs.habana.ai/en/latest/Management_and_
  Monitoring/Embedded_System_Tools_Guide/System_Management_Interface_Tool.html): ``-Q <types> -f csv[,noheader]``
  with the types name, bus_id, driver_version, module_id, index, serial, one card per line, values joined by
  ", " and a header of the type names. Product names: HL-205 (first-generation Gaudi, AWS DL1), HL-225
  (Gaudi 2), HL-325L (Gaudi 3). That page lists ``-n`` without sample output: the ``port  N:        UP``
  lines of ``-n link`` and the per-port internal/external lines of ``-n ports`` are as Habana's qualification
  and health-check scripts parse them (port number, colon, state), which is all the launcher reads; the
  external port numbers (Gaudi 2 HLS-2: 1, 8, 9; Gaudi 3: 8, 22, 23, three per chip as "Intel Gaudi Network
  Configuration" says) are the ones those scripts list. Doubtful in detail, honest in shape.
- fi_info: libfabric's util/info.c (ofiwg/libfabric): ``--version`` prints ``fi_info: V``, ``libfabric: V``,
  ``libfabric api: MAJOR.MINOR``; ``-p efa`` prints the provider's entries (AWS, "Get started with EFA and
  MPI", the ``fi_info -p efa -t FI_EP_RDM`` check) or, with no EFA device, ``fi_getinfo: -61 (No data
  available)`` on stderr and exit 1.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field


@dataclass
class Profile:
    name: str  # hl-smi product name
    driver: str
    cards: int
    ports: int  # NIC ports per card
    external: tuple[int, ...]  # scale-out ports
    down: tuple[int, ...] = ()  # external ports DOWN on every card
    libfabric: str = ""  # "" : no fi_info
    efa: bool = False
    extra: dict = field(default_factory=dict)


PROFILES = {
    # Gaudi 3 server with host NICs (EFA) and its Gaudi scale-out ports not cabled
    "gaudi3-hostnic": Profile(
        "HL-325L", "1.22.0-8a1c0f4", 8, 24, (8, 22, 23), down=(8, 22, 23), libfabric="1.22.0amzn4.0", efa=True
    ),
    # Gaudi 3 with its own scale-out ports cabled and up
    "gaudi3-gaudinic": Profile("HL-325L", "1.22.0-8a1c0f4", 8, 24, (8, 22, 23), libfabric="1.22.0"),
    # Gaudi 2 HLS-2 with one scale-out port down on every card
    "gaudi2-portdown": Profile("HL-225", "1.22.0-8a1c0f4", 8, 24, (1, 8, 9), down=(9,), libfabric="1.22.0"),
    # Gaudi 2 with host NICs, libfabric too old for Gaudi Direct
    "gaudi2-oldfabric": Profile(
        "HL-225", "1.21.3-2f7c1b9", 8, 24, (1, 8, 9), down=(1, 8, 9), libfabric="1.15.2amzn1.0", efa=True
    ),
    # AWS DL1: first-generation Gaudi, EFA, no scale-out ports of its own
    "dl1": Profile("HL-205", "1.21.3-2f7c1b9", 8, 10, (), libfabric="1.19.0amzn4.0", efa=True),
}


def _bus(i: int) -> str:
    return f"0000:{0x19 + 0x10 * i:02x}:00.0"


def _hl_smi(p: Profile) -> str:
    cards = []
    for i in range(p.cards):
        cards.append(
            {
                "index": str(i),
                "module_id": str(i),
                "name": p.name,
                "bus_id": _bus(i),
                "driver_version": p.driver,
                "serial": f"AN{1000 + i}",
            }
        )
    link = "\n".join(f"port {n:>2}:        {'DOWN' if n in p.down else 'UP'}" for n in range(p.ports))
    ports = "\n".join(f"port {n:>2}:        {'external' if n in p.external else 'internal'}" for n in range(p.ports))
    table = shlex.quote("\n".join(";".join(f"{k}={v}" for k, v in c.items()) for c in cards))
    buses = " ".join(c["bus_id"] for c in cards)
    return f"""#!/bin/sh
# STAND-IN for Habana's hl-smi (tests/standin/gaudi_tools.py says what it copies). Not the real tool.
usage() {{ echo "hl-smi: unrecognized option: $*" >&2; echo "Usage: hl-smi [<options>]" >&2; exit 1; }}
cards={table}
bus_known() {{ for b in {buses}; do [ "$b" = "$1" ] && return 0; done; return 1; }}
case "$1" in
-Q)
    [ "$3" = -f ] || usage "$@"
    fields=$2; fmt=$4
    case $fmt in csv|csv,noheader) ;; *) usage "$@" ;; esac
    for f in $(echo "$fields" | tr , ' '); do
        case " index module_id name bus_id driver_version serial " in *" $f "*) ;; *) usage "$@" ;; esac
    done
    [ "$fmt" = csv ] && echo "$fields" | sed 's/,/, /g'
    printf '%s\\n' "$cards" | while IFS= read -r card; do
        line=""
        for f in $(echo "$fields" | tr , ' '); do
            v=$(printf '%s\\n' "$card" | tr ';' '\\n' | sed -n "s/^$f=//p")
            line="${{line:+$line, }}$v"
        done
        echo "$line"
    done ;;
-n)
    [ "$3" = -i ] && bus_known "$4" || usage "$@"
    case $2 in
    link) printf '%s\\n' {shlex.quote(link)} ;;
    ports) printf '%s\\n' {shlex.quote(ports)} ;;
    *) usage "$@" ;;
    esac ;;
-v) echo "hl-smi version hl-{p.driver}" ;;
*) usage "$@" ;;
esac
"""


def _fi_info(p: Profile) -> str:
    efa = (
        "provider: efa\n    fabric: efa\n    domain: rdmap16s27-rdm\n    version: 122.0\n"
        "    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA"
    )
    api = ".".join(p.libfabric.split(".")[:2])
    nodata = "echo 'fi_getinfo: -61 (No data available)' >&2; exit 1"
    efa_branch = f"printf '%s\\n' {shlex.quote(efa)}" if p.efa else nodata
    return f"""#!/bin/sh
# STAND-IN for libfabric's fi_info (tests/standin/gaudi_tools.py says what it copies). Not the real tool.
case "$*" in
--version) printf 'fi_info: %s\\nlibfabric: %s\\nlibfabric api: %s\\n' {p.libfabric} {p.libfabric} {api} ;;
"-p efa") {efa_branch} ;;
*) echo "fi_getinfo: -61 (No data available)" >&2; exit 1 ;;
esac
"""


def install(directory: str, profile: str) -> str:
    """Write the stand-ins of ``profile`` into ``directory`` (made if missing); returns it."""
    p = PROFILES[profile]
    os.makedirs(directory, exist_ok=True)
    tools = {"hl-smi": _hl_smi(p)}
    if p.libfabric:
        tools["fi_info"] = _fi_info(p)
    for name, text in tools.items():
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
    return directory
