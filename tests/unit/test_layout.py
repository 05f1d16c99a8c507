"""docs/architecture.md's Layout section is drawn from the package tree: every module is named under its own
package there, and every module named there exists."""

from __future__ import annotations

import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
PKG = os.path.join(ROOT, "gaudi_launch")
PY = re.compile(r"(?<![\w/.])((?:\w+/)*\w+\.py)\b")


def layout_block() -> str:
    page = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    section = page[page.index("\n## Layout\n") :]
    return section.split("```\n")[1]


def named_in_layout(block: str) -> tuple[set[str], set[str], set[str]]:
    """(modules named as package-relative paths, packages given a line of their own, runtime stems). Pure."""
    modules, packages, runtime = set(), set(), set()
    package, in_runtime = "", False
    for line in block.splitlines():
        if not line.startswith(" "):
            if not line.startswith("gaudi_launch/"):
                break
            continue
        head = re.match(r"  (\w+)/\s", line)
        if head:
            package, in_runtime = head.group(1), head.group(1) == "runtime"
            packages.add(package)
        elif re.match(r"  \w", line):
            package, in_runtime = "", False  # a top-level module's line
        if in_runtime:
            runtime |= set(re.findall(r"\b[a-z_0-9]+\b", line.split("runtime/", 1)[-1]))
            continue
        for path in PY.findall(line):
            modules.add(path if "/" in path else (f"{package}/{path}" if package else path))
    return modules, packages, runtime


def tree() -> dict[str, set[str]]:
    """package ('' for the top) -> its module files."""
    out: dict[str, set[str]] = {}
    for entry in sorted(os.listdir(PKG)):
        path = os.path.join(PKG, entry)
        if entry.endswith(".py"):
            out.setdefault("", set()).add(entry)
        elif os.path.isfile(os.path.join(path, "__init__.py")):
            out[entry] = {f for f in os.listdir(path) if f.endswith(".py")}
    return out


def test_every_module_is_named_under_its_package_and_every_named_one_exists():
    modules, packages, runtime = named_in_layout(layout_block())
    t = tree()
    assert packages == set(t) - {""}
    real = {(f"{p}/{m}" if p else m) for p, files in t.items() if p != "runtime" for m in files}
    assert modules - real == set(), "named in docs/architecture.md's Layout but not in the tree"
    missing = {m for m in real - modules if os.path.basename(m) not in ("__init__.py", "__main__.py")}
    assert missing == set(), "in the tree but not in docs/architecture.md's Layout"
    assert {m[:-3] for m in t["runtime"] if m != "__init__.py"} <= runtime


def test_the_parser_reads_packages_and_flags_what_is_missing():
    block = (
        "gaudi_launch/  x\n  cli.py  the CLI (inputs/options.py)\n  inputs/  what\n    spec.py  a;  hostfile.py  b\n"
        "  runtime/  args, device\nscripts/  x\n"
    )
    modules, packages, runtime = named_in_layout(block)
    assert modules == {"cli.py", "inputs/options.py", "inputs/spec.py", "inputs/hostfile.py"}
    assert packages == {"inputs", "runtime"} and {"args", "device"} <= runtime
