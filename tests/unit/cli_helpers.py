"""Driving the CLI in-process for unit tests (with the `isolated` fixture from conftest.py)."""

from __future__ import annotations

import json

from gaudi_launch.cli import main


def run_cli(capsys, *argv):
    # No SSH pre-flight in unit tests: their hosts are names only (nothing may be looked up).
    rc = main(["--no-ssh-check", *[str(a) for a in argv]])
    out, err = capsys.readouterr()
    return rc, out, err


def plan_of(capsys, *argv) -> dict:
    rc, out, err = run_cli(capsys, "--dry-run", "--json", *argv)
    assert rc == 0, err
    assert err == ""
    return json.loads(out)


def user_error(capsys, *argv) -> str:
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2, (out, err)
    assert out == ""
    assert "Traceback" not in err and "internal error" not in err
    assert err.startswith("gaudi-launch: error: ")
    return err
