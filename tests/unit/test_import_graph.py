"""The launcher's layers, enforced on its import graph (issue 26): data flows one way, from what the user gives
to the command line that runs it.

    inputs < plan < remote < process < backends < reports < collective < launch, runner < completion, helptext <
commands < plainline, typercli < cli

A package (or root module) imports only from the layers below its own; imports under ``if TYPE_CHECKING:``
count too (a type-only import still ties a layer to the one it names). The root helpers (errors.py,
exitcodes.py, wire.py, safewrite.py, scriptflags.py) import no other module of ours and every layer may import
them. runtime/ runs inside the ranks only: of the launcher it imports only the wire module, safewrite.py and
scriptflags.py (and errors.py, which imports nothing: its DataError is a UserError); the launcher (everything
else, the rank bootstrap process/worker.py included: the launcher imports it) imports nothing of runtime/, what
both sides share lives in a root helper (issue 37 item 3). No module cycles. And imports of our modules inside functions are counted, not whitelisted: each one
hides an edge until the day it runs first in a new order.
"""

from __future__ import annotations

import ast
import os
import re

PKG = os.path.join(os.path.dirname(__file__), "..", "..", "gaudi_launch")

# Lowest first. Where the root modules sit: reports/ reads plans and hosts (env, report, the collective
# table) beside the launch; collective.py runs a job of its own through backends/; launch.py (the command
# line's composition root) and runner.py (DistributedRunner's, for Python callers) put everything together;
# cli.py only parses (completion.py: its shell completion); on top `python -m gaudi_launch` and "", the package
# itself, whose lazy attributes are the public API.
LAYERS = (
    ("inputs",),
    ("plan",),
    ("remote",),
    ("process",),
    ("backends",),
    ("reports",),
    ("collective",),
    ("launch", "runner"),
    ("completion", "helptext"),
    ("commands",),
    ("plainline", "typercli"),
    ("cli",),
    ("__main__", ""),
)
ROOT_HELPERS = ("errors", "exitcodes", "wire", "safewrite", "scriptflags", "pairrounds", "version")
RANK_SIDE = "runtime"
RANK_SIDE_MAY_IMPORT = ("wire", "errors", "safewrite", "scriptflags", "pairrounds")
HEAVY = ("torch", "transformers", "deepspeed", "habana_frameworks")
# 10: the package's lazy API (2), launch.py for a command, the Typer command for a line the plain reader leaves to
# it (cli.py: a plain launch never imports Typer), one each in plan/fabric.py and runtime/examples.py, the
# three a job that starts loads and a dry run does not (issue 37, its start-up budget): the ssh pre-flight
# (backends/job.py), the supervisor (backends/local.py) and the collective test (launch.py), and the rank
# bootstrap's card-side steps, which a rank on a host without cards never loads (process/worker.py, issue 34).
MAX_FUNCTION_LEVEL_IMPORTS = 10
# A GAUDI_LAUNCH_* variable as code spells it: the name, or the name and "=" (an env line, a grep needle).
VARIABLE = re.compile(r"GAUDI_LAUNCH_[A-Z0-9_]+=?\s?")


def modules() -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(PKG):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, os.path.dirname(PKG))[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


def _type_only_nodes(tree: ast.Module) -> set[int]:
    return {
        id(n)
        for b in tree.body
        if isinstance(b, ast.If) and "TYPE_CHECKING" in ast.unparse(b.test)
        for n in ast.walk(b)
    }


def imported(tree: ast.Module, me: str, known: dict[str, str], type_only: bool = False) -> set[str]:
    """gaudi_launch modules this module imports anywhere; under `if TYPE_CHECKING:` too when ``type_only``."""
    skip = set() if type_only else _type_only_nodes(tree)
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
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


def graph(type_only: bool = False) -> dict[str, set[str]]:
    known = modules()
    return {m: imported(ast.parse(open(p).read()), m, known, type_only) for m, p in known.items()}


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


def part(module: str) -> str:
    """The package or root module a module belongs to: 'gaudi_launch.plan.slurm' -> 'plan', the package -> ''."""
    return module.split(".")[1] if "." in module else ""


def layer_breaches(g: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Every import that goes up or sideways between layers, or breaks the root helpers' and the rank side's
    rules, as 'importer -> imported (why)'. Pure."""
    rank = {name: i for i, names in enumerate(layers) for name in names}
    out = []
    for src in sorted(g):
        a = part(src)
        for dst in sorted(g[src]):
            b = part(dst)
            if a == b or b == "":  # inside one package; the package itself (imported with any of its modules)
                continue
            if a in ROOT_HELPERS:
                out.append(f"{src} -> {dst} (a root helper imports no module of ours)")
            elif a == RANK_SIDE:
                if b not in RANK_SIDE_MAY_IMPORT:
                    out.append(f"{src} -> {dst} (runtime/ imports only {', '.join(RANK_SIDE_MAY_IMPORT)})")
            elif b == RANK_SIDE:
                out.append(f"{src} -> {dst} (the launcher imports nothing of runtime/: it runs inside the ranks)")
            elif b in ROOT_HELPERS:
                continue  # importable by all
            elif a not in rank or b not in rank:
                out.append(f"{src} -> {dst} (not in a layer: place {a if a not in rank else b} in LAYERS)")
            elif rank[b] >= rank[a]:
                out.append(
                    f"{src} -> {dst} ({a} may not import {b}: {'same layer' if rank[a] == rank[b] else 'above'})"
                )
    return out


def function_level_imports(tree: ast.Module) -> list[int]:
    """Line numbers of imports of our modules inside functions. Pure."""
    lines = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("gaudi_launch")):
                    lines.append(node.lineno)
                elif isinstance(node, ast.Import) and any(a.name.startswith("gaudi_launch") for a in node.names):
                    lines.append(node.lineno)
    return sorted(set(lines))


def heavy_at_import(tree: ast.Module) -> list[str]:
    """What a module imports at its top level (not in functions) of torch and its kind. Pure."""
    found = []
    for node in tree.body:
        for sub in (
            ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else ()
        ):
            if isinstance(sub, ast.Import):
                found += [a.name for a in sub.names if a.name.split(".")[0] in HEAVY]
            elif isinstance(sub, ast.ImportFrom) and (sub.module or "").split(".")[0] in HEAVY and not sub.level:
                found.append(sub.module or "")
    return found


def variables_spelled(tree: ast.Module) -> list[str]:
    """GAUDI_LAUNCH_* names written as string (or bytes) constants, f-strings' parts included; not prose. Pure."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
            if VARIABLE.fullmatch(text):
                found.append(text.strip())
    return found


# ---------------------------------------------------------------- the checkers can fail


def test_the_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_layer_check_names_an_upward_a_sideways_and_a_rank_side_import():
    g = {
        "gaudi_launch.plan.planner": {"gaudi_launch.backends.slurm", "gaudi_launch.inputs.spec", "gaudi_launch.wire"},
        "gaudi_launch.launch": {"gaudi_launch.runner", "gaudi_launch.backends.job"},
        "gaudi_launch.runtime.trainer": {"gaudi_launch.process.heartbeats", "gaudi_launch.wire"},
        "gaudi_launch.wire": {"gaudi_launch.errors"},
        "gaudi_launch.cli": {"gaudi_launch", "gaudi_launch.launch"},
        "gaudi_launch.process.worker": {"gaudi_launch.runtime.hpu_env", "gaudi_launch.scriptflags"},
    }
    assert layer_breaches(g) == [
        "gaudi_launch.launch -> gaudi_launch.runner (launch may not import runner: same layer)",
        "gaudi_launch.plan.planner -> gaudi_launch.backends.slurm (plan may not import backends: above)",
        "gaudi_launch.process.worker -> gaudi_launch.runtime.hpu_env "
        "(the launcher imports nothing of runtime/: it runs inside the ranks)",
        "gaudi_launch.runtime.trainer -> gaudi_launch.process.heartbeats "
        "(runtime/ imports only wire, errors, safewrite, scriptflags, pairrounds)",
        "gaudi_launch.wire -> gaudi_launch.errors (a root helper imports no module of ours)",
    ]
    assert layer_breaches({"gaudi_launch.newpkg.x": {"gaudi_launch.plan.y"}}) == [
        "gaudi_launch.newpkg.x -> gaudi_launch.plan.y (not in a layer: place newpkg in LAYERS)"
    ]


def test_imports_inside_functions_and_torch_at_import_are_seen():
    tree = ast.parse(
        "import torch.nn\nfrom gaudi_launch import wire\n"
        "def f():\n    from gaudi_launch.plan import planner\n    import gaudi_launch.runner\n    import json\n"
        "class C:\n    def g(self):\n        from . import x\n"
        "def h():\n    import deepspeed\n"
    )
    assert function_level_imports(tree) == [4, 5, 9]
    assert heavy_at_import(tree) == ["torch.nn"]


def test_a_variable_spelled_out_is_seen_and_prose_is_not():
    tree = ast.parse(
        'A = "GAUDI_LAUNCH_JOB_ID"\nB = b"GAUDI_LAUNCH_JOB_ID="\nC = f"GAUDI_LAUNCH_GRACE={x}"\n'
        'D = "set GAUDI_LAUNCH_DEBUG=1 for tracebacks"\n'
    )
    assert variables_spelled(tree) == ["GAUDI_LAUNCH_JOB_ID", "GAUDI_LAUNCH_JOB_ID=", "GAUDI_LAUNCH_GRACE="]


# ---------------------------------------------------------------- the package


def test_no_import_cycle_between_gaudi_launch_modules():
    g = graph()
    assert "gaudi_launch.plan.slurm" in g["gaudi_launch.plan.planner"]  # the graph is read at all
    assert cycles(g) == []


def test_every_import_goes_down_the_layers_type_only_imports_included():
    g = graph(type_only=True)
    assert "gaudi_launch.inputs.spec" in g["gaudi_launch.process.restarts"]  # a TYPE_CHECKING import, seen
    assert {part(m) for m in g} - {name for names in LAYERS for name in names} == {*ROOT_HELPERS, RANK_SIDE}
    assert layer_breaches(g) == []


def test_the_launcher_takes_nothing_from_runtime():
    g = graph(type_only=True)
    assert {(m, d) for m, ds in g.items() if part(m) != RANK_SIDE for d in ds if part(d) == RANK_SIDE} == set()


def test_imports_of_our_modules_inside_functions_are_few():
    """Each one is an edge the module-level graph does not show at import time (the package's lazy public
    API, the command's modules, the Typer command): at most MAX_FUNCTION_LEVEL_IMPORTS in the whole package."""
    found = [
        f"{m}:{line}"
        for m, p in sorted(modules().items())
        for line in function_level_imports(ast.parse(open(p).read()))
    ]
    assert found, "none left: lower MAX_FUNCTION_LEVEL_IMPORTS to 0"
    assert len(found) <= MAX_FUNCTION_LEVEL_IMPORTS, found


def test_every_gaudi_launch_variable_is_named_in_the_wire_module_only():
    """Both sides of the rank boundary take the names from wire.py, so they cannot drift apart."""
    spelled = {
        m: names
        for m, p in sorted(modules().items())
        if m != "gaudi_launch.wire" and (names := variables_spelled(ast.parse(open(p).read())))
    }
    assert spelled == {}
    assert variables_spelled(ast.parse(open(modules()["gaudi_launch.wire"]).read()))  # and there they are
