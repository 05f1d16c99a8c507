"""Errors a user can cause and fix: printed as one clear message, never a traceback."""

from __future__ import annotations


class UserError(ValueError):
    """Bad input. ``where`` names the file:line, the option or the host; ``hint`` says what to do.

    A ValueError, as optimum-habana's DistributedRunner raises for bad arguments: Python callers'
    ``except ValueError`` keeps working.
    """

    exit_code = 2  # ExitCode.USAGE (not imported: errors.py stays dependency-free)

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.where = where
        self.hint = hint

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text
