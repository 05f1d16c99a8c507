"""Issue 36 item 2: every place the package opens a file for writing, found on its syntax tree, is either
safewrite.py or a writer listed here with the reason it cannot be turned against the user (a name another
user can plant a link at is never written with plain open()). A new writer fails this test until it goes
through gaudi_launch.safewrite or is listed with its reason. And safewrite itself, against a second local
account's planted links, hard links and FIFOs."""

from __future__ import annotations

import ast
import os
import stat

import pytest

from gaudi_launch import safewrite
from tests.other_user import other_uid

PKG = os.path.join(os.path.dirname(__file__), "..", "..", "gaudi_launch")
_WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC")

# "module:function" -> why its writes are safe. Keep reasons short and true.
SAFE = {
    "safewrite:write_whole": "the helper: a new O_EXCL temporary file renamed over the name",
    "safewrite:open_own": "the helper: O_NOFOLLOW, a plain file of ours with one link, truncated after the check",
    "wire:write_private": "O_CREAT|O_EXCL|O_NOFOLLOW in the job's private (0700) directory",
    "wire:create_private": "relative to a descriptor of a directory checked ours and 0700, O_NOFOLLOW",
    "process.heartbeats:install_stack_dump": "wire.create_private in the heartbeat directory (ours, 0700)",
    "process.gate:_leave_verdict": "wire.create_private (O_EXCL) in the job's directory (checked ours, 0700), renamed "
    "within it",
    "process.gate:checks_here": "os.devnull, and the forked child's own stdout (fd 1, the pipe to its parent): no "
    "file made or opened by a name",
    "collective:run_check": "a hostfile in a new TemporaryDirectory (0700, ours)",
    "completion:install": "the user's own shell start-up files in their home",
    "remote.authkeys:add_keys": "the user's own ~/.ssh/authorized_keys (the container's, at start)",
    "remote.authkeys:setup": "the user's own ~/.ssh/authorized_keys (the container's, at start)",
    "remote.sshclient:_append_known_host": "the user's own known_hosts file",
    "remote.treeprobe:run_round": "its hostfile in the tempfile.TemporaryDirectory its callers make (mkdtemp: 0700, a "
    "random name)",
    "scriptflags:_write_ops": "tempfile.mkstemp (O_EXCL, 0600, a random name)",
    "runtime.checkpoint:_save": "inside .tmp-checkpoint-STEP-PID, made new by os.makedirs (fails if it exists)",
    "runtime.checkpoint:_write_json": "inside .tmp-checkpoint-STEP-PID, made new by os.makedirs",
    "process.logfiles:walk": "directories opened read-only (O_RDONLY|O_DIRECTORY|O_NOFOLLOW in a variable)",
    "process.logfiles:_open_dir_trusting_own_links": "the working directory opened read-only (O_DIRECTORY)",
}


def writers_in(source: str) -> list[tuple[str, str, int]]:
    """(function, call, line) of every call that opens a file for writing. Pure."""
    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            # a writer is known by the function (or class) it is written in
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else where
            if isinstance(child, ast.Call):
                kind = _writer(child)
                if kind:
                    found.append((where or "<module>", kind, child.lineno))
            visit(child, inner)

    visit(ast.parse(source), "")
    return found


def _writer(call: ast.Call) -> str:
    name = ast.unparse(call.func)
    if name in ("open", "io.open", "builtins.open", "os.fdopen", "codecs.open"):
        mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
            return f"{name}(mode {mode.value!r})" if set(mode.value) & set("wax+") else ""
        return f"{name}(mode unknown)" if mode is not None else ""
    if name == "os.open":
        flags = ast.unparse(call.args[1]) if len(call.args) > 1 else ""
        read_only = "O_RDONLY" in flags and not any(f in flags for f in _WRITE_FLAGS)
        return "" if read_only else "os.open(for writing)"
    if name.endswith((".write_text", ".write_bytes")):
        return name
    if name in ("shutil.copy", "shutil.copyfile", "shutil.copy2"):
        return name
    return ""


def inventory() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for directory, _, files in os.walk(PKG):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            module = os.path.relpath(path, PKG)[:-3].replace(os.sep, ".")
            with open(path, encoding="utf-8") as f:
                for function, kind, line in writers_in(f.read()):
                    out.setdefault(f"{module}:{function}", []).append(f"{kind} at line {line}")
    return out


def test_every_writer_in_the_package_is_safe_or_says_why():
    found = inventory()
    unknown = {k: v for k, v in found.items() if k not in SAFE}
    assert not unknown, (
        "a new file writer: write through gaudi_launch.safewrite (write_whole / open_own), or list it in SAFE "
        f"with why another user cannot plant a link at its name: {unknown}"
    )
    # the review's writers go through the helper: collective-check.json, metrics.jsonl, results.json
    assert not [k for k in found if k.startswith(("collective:write_finding", "runtime.metrics:", "runtime.examples:"))]


def test_stale_entries_are_dropped():
    assert set(SAFE) <= set(inventory()), set(SAFE) - set(inventory())


def test_the_inventory_finds_the_usual_shapes():
    src = "def f(p):\n    with open(p, 'w') as x: pass\n\ndef g(p):\n    os.open(p, os.O_WRONLY | os.O_CREAT)\n"
    src += "def h(p):\n    open(p).read()\n    os.open(p, os.O_RDONLY | os.O_NOFOLLOW)\n\ndef i(p):\n    p.write_text('x')\n"
    assert [(w, line) for w, _, line in writers_in(src)] == [("f", 2), ("g", 5), ("i", 11)]


# ---- the helper against another user's planted files --------------------------------------------------


@pytest.fixture
def shared_dir(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o1777)
    return d


def test_write_whole_replaces_a_planted_link_and_leaves_its_target(shared_dir, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = shared_dir / "collective-check.json"
    link.symlink_to(victim)
    os.lchown(link, other_uid(), other_uid())
    safewrite.write_whole(link, '{"ok": true}\n')
    assert victim.read_text() == "precious\n"
    assert not link.is_symlink() and link.read_text() == '{"ok": true}\n'
    assert [p.name for p in shared_dir.iterdir()] == ["collective-check.json"]  # no temporary file left


def test_open_own_refuses_a_planted_link_a_hard_link_another_users_file_and_a_fifo(shared_dir, tmp_path):
    uid = other_uid()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (shared_dir / "link").symlink_to(victim)
    os.link(victim, shared_dir / "hard")
    theirs = shared_dir / "theirs"
    theirs.write_text("theirs\n")
    os.chown(theirs, uid, uid)
    os.mkfifo(shared_dir / "fifo")
    for name in ("link", "hard", "theirs", "fifo"):
        with pytest.raises(OSError):
            safewrite.open_own(shared_dir / name, append=name == "theirs")
    assert victim.read_text() == "precious\n" and theirs.read_text() == "theirs\n"


def test_open_own_appends_to_our_file_and_makes_a_new_one_with_the_mode(tmp_path):
    with safewrite.open_own(tmp_path / "m.jsonl", append=True, mode=0o644) as f:
        f.write("a\n")
    with safewrite.open_own(tmp_path / "m.jsonl", append=True) as f:
        f.write("b\n")
    assert (tmp_path / "m.jsonl").read_text() == "a\nb\n"
    assert stat.S_IMODE(os.stat(tmp_path / "m.jsonl").st_mode) == 0o644
