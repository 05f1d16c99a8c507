"""Shell completion through Typer's own mechanism.

The shell's completion function calls ``gaudi-launch`` with ``_GAUDI_LAUNCH_COMPLETE=complete_bash``
(complete_zsh, complete_fish) and Typer answers from the launch command's options. The script to source
is what Typer prints for ``_GAUDI_LAUNCH_COMPLETE=source_<shell>``: ``gaudi-launch completion [SHELL]``
prints it, with ``--install`` it is written where the shell reads it (Typer's own ``--show-completion`` and
``--install-completion`` do the same for the shell they find running). Scripts installed by the click-based versions (``bash_complete``) are told to
install again.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import Any, Optional

from gaudi_launch.errors import UserError

PROG = "gaudi-launch"
VAR = "_GAUDI_LAUNCH_COMPLETE"
# Where each shell finds the script: (file under $HOME, start-up file that must source it or None).
_INSTALL = {
    "bash": (".bash_completions/gaudi-launch.sh", ".bashrc"),
    "zsh": (".zfunc/gaudi-launch.zsh", ".zshrc"),
    "fish": (".config/fish/completions/gaudi-launch.fish", None),
}


def _shell(value: Optional[str]) -> str:
    shell = value or os.path.basename(os.environ.get("SHELL", "")) or "bash"
    if shell not in _INSTALL:
        raise UserError(f"no completion for the shell {shell!r}", where="completion", hint="bash, zsh or fish")
    return shell


def script(command: Any, shell: Optional[str]) -> str:
    """The completion script of ``command`` (the launch command) for ``shell``, as Typer writes it."""
    shell = _shell(shell)
    out, before = io.StringIO(), os.environ.get(VAR)
    os.environ[VAR] = f"source_{shell}"
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            command.main(args=[], prog_name=PROG, standalone_mode=False)
    finally:
        if before is None:
            del os.environ[VAR]
        else:
            os.environ[VAR] = before
    return out.getvalue().strip("\n")


def show(command: Any, shell: Optional[str]) -> int:
    print(script(command, shell))
    return 0


def install(command: Any, shell: Optional[str]) -> int:
    shell = _shell(shell)
    text = script(command, shell)
    home = os.path.expanduser("~")
    target, rc = _INSTALL[shell]
    path = os.path.join(home, target)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text + "\n")
    if rc:
        line = f"source {path}" if shell == "bash" else f"autoload -Uz compinit && compinit; source {path}"
        rc_path = os.path.join(home, rc)
        old = open(rc_path).read() if os.path.exists(rc_path) else ""
        if line not in old:
            with open(rc_path, "a") as f:
                f.write(("" if old.endswith("\n") or not old else "\n") + line + "\n")
    print(f"{shell} completion installed in {path}; it takes effect in a new shell")
    return 0


def requested() -> bool:
    """Whether the shell asks for completions now (they need every option of the command)."""
    return bool(os.environ.get(VAR))


def old_request() -> bool:
    """A completion request from a script the click-based versions installed: say to install again."""
    if os.environ.get(VAR) not in ("bash_complete", "zsh_complete", "fish_complete"):
        return False
    print(
        "gaudi-launch: this completion script is from an older gaudi-launch; run: gaudi-launch completion --install",
        file=sys.stderr,
    )
    return True
