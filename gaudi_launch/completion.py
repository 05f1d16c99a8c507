"""Shell completion through click's own mechanism.

The shell's completion function calls ``gaudi-launch`` with ``_GAUDI_LAUNCH_COMPLETE=bash_complete``
(zsh_complete, fish_complete) and click answers from the options themselves. ``--show-completion
[SHELL]`` prints the function to source, ``--install-completion [SHELL]`` writes it where the shell
reads it. Scripts installed by versions built on typer ask with ``complete_bash``; they still get
their bare words.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

import click
from click.shell_completion import BashComplete, get_completion_class

from gaudi_launch.errors import UserError

PROG = "gaudi-launch"
VAR = "_GAUDI_LAUNCH_COMPLETE"
# Where each shell finds the script: (file under $HOME, start-up file that must source it or None).
_INSTALL = {
    "bash": (".bash_completions/gaudi-launch.sh", ".bashrc"),
    "zsh": (".zfunc/gaudi-launch.zsh", ".zshrc"),
    "fish": (".config/fish/completions/gaudi-launch.fish", None),
}


def script(command: click.Command, shell: str) -> str:
    cls = get_completion_class(shell) if shell in _INSTALL else None
    if cls is None:
        raise UserError(f"no completion for the shell {shell!r}", where="--show-completion", hint="bash, zsh or fish")
    return cls(command, {}, PROG, VAR).source()


def _shell(value: str) -> str:
    return value or os.path.basename(os.environ.get("SHELL", "")) or "bash"


def _show(ctx: click.Context, _param: click.Parameter, value: Optional[str]) -> None:
    if value is None or ctx.resilient_parsing:
        return
    click.echo(script(ctx.command, _shell(value)))
    ctx.exit()


def _install(ctx: click.Context, _param: click.Parameter, value: Optional[str]) -> None:
    if value is None or ctx.resilient_parsing:
        return
    shell = _shell(value)
    text = script(ctx.command, shell)
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
    click.echo(f"{shell} completion installed in {path}; it takes effect in a new shell")
    ctx.exit()


def _option(
    name: str, callback: Callable[[click.Context, click.Parameter, Optional[str]], None], help: str
) -> click.Option:
    """An eager option with an optional value (the shell): --NAME alone means the current shell."""
    return click.Option(
        [name.lstrip("-").replace("-", "_"), name],
        callback=callback,
        help=help,
        is_flag=False,
        flag_value="",
        default=None,
        expose_value=False,
        is_eager=True,
        metavar="[SHELL]",
    )


def completion_options() -> list[click.Option]:
    return [
        _option("--install-completion", _install, "Install completion for the current shell (or bash, zsh, fish)."),
        _option(
            "--show-completion",
            _show,
            "Show completion for the current shell, to copy it or customize the installation.",
        ),
    ]


def legacy_bash(command: click.Command) -> Optional[str]:
    """The answer to a completion script installed by an earlier (typer) version, else None."""
    if os.environ.get(VAR) != "complete_bash":
        return None
    comp = BashComplete(command, {}, PROG, VAR)
    args, incomplete = comp.get_completion_args()
    return "\n".join(item.value for item in comp.get_completions(args, incomplete))
