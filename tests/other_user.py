"""A second local account, to play "another user" of a shared directory, as issue 36's review did.

`other_uid()` makes the account gl-other (useradd, as root) once and returns its uid; without root a test
that needs it is skipped (failed under CI, which runs as root)."""

from __future__ import annotations

import os
import pwd
import subprocess

import pytest

NAME = "gl-other"


def other_uid() -> int:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("needs root to make a second local account")
        pytest.skip("needs root to make a second local account")
    try:
        return pwd.getpwnam(NAME).pw_uid
    except KeyError:
        pass
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", NAME],
        capture_output=True,
        text=True,
    )
    if made.returncode not in (0, 9):  # 9: made meanwhile by another test process
        pytest.fail(f"useradd {NAME} failed: {made.stderr.strip()}")
    return pwd.getpwnam(NAME).pw_uid
