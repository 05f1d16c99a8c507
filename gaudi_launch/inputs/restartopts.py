"""The restart options read (--max-restarts, --restart-on): which causes restart a failed job. Pure;
process/restarts.py decides and runs the attempts."""

from __future__ import annotations

import enum

from gaudi_launch.errors import UserError


class Cause(str, enum.Enum):
    """Why an attempt failed, as --restart-on names it."""

    RANK = "rank"  # a rank failed
    HOST = "host"  # a host stopped answering
    HANG = "hang"  # no rank advanced for --hang-timeout seconds

    def __str__(self) -> str:
        return self.value


CAUSES = tuple(Cause)
MAX_RESTARTS = 1000  # a typo guard, not a policy


def parse_restart_on(text: str) -> frozenset[Cause]:
    """'rank,hang' -> {'rank', 'hang'}; 'all' is every cause. Pure."""
    names = [n.strip().lower() for n in str(text).split(",") if n.strip()]
    if names == ["all"]:
        return frozenset(CAUSES)
    unknown = [n for n in names if n not in CAUSES]
    if unknown or not names:
        raise UserError(f"{text!r}: a comma-separated list of {', '.join(CAUSES)} (or all)", where="--restart-on")
    return frozenset(Cause(n) for n in names)
