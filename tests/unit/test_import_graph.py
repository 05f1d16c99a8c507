"""The launcher's modules import each other without cycles, counting imports inside functions too
(a function-level import hides a cycle until the day it runs first in a new order)."""

from __future__ import annotations

import ast
import os

PKG = os.path.join(os.path.dirname(__file__), "..", "..", "gaudi_launch")


def modules() -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(PKG):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, os.path.dirname(PKG))[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


def imported(tree: ast.Module, me: str, known: dict[str, str]) -> set[str]:
    """gaudi_launch modules this module imports anywhere, except under `if TYPE_CHECKING:`."""
    typing_only = {
        id(n)
        for b in tree.body
        if isinstance(b, ast.If) and "TYPE_CHECKING" in ast.unparse(b.test)
        for n in ast.walk(b)
    }
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = me.split(".")
                keep = len(parts) - node.level + (1 if known.get(me, "").endswith("__init__.py") else 0)
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            names = subs or [base]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != me:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imported(ast.parse(open(p).read()), m, known) for m, p in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_the_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_gaudi_launch_modules():
    g = graph()
    assert "gaudi_launch.plan.planner" in g and "gaudi_launch.plan.slurm" in g["gaudi_launch.plan.planner"]
    assert cycles(g) == []


# Where an import inside a function is the point: the command line imports what a run needs only when
# it runs (--help and --dry-run stay fast), and `import gaudi_launch` stays cheap for every rank.
LAZY_ALLOWED = {"gaudi_launch.cli", "gaudi_launch"}


def test_our_modules_import_each_other_at_the_top():
    known = modules()
    inside = []
    for module, path in sorted(known.items()):
        tree = ast.parse(open(path).read())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("gaudi_launch")):
                    inside.append((module, node.lineno))
    assert inside and all(m in LAZY_ALLOWED for m, _ in inside), [x for x in inside if x[0] not in LAZY_ALLOWED]
