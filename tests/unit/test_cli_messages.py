"""Messages name what the user wrote: a job file's line for its values, the option's flag (never an
internal name), and no job is announced that is refused before it starts."""

from __future__ import annotations

import contextlib
import io

import pytest

from gaudi_launch.cli import main

pytestmark = pytest.mark.usefixtures("isolated")  # tests/unit/conftest.py


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "yaml, said",
    [
        ("num_devices: 0\n", "job.yaml:2: --num_devices: must be at least 1, got 0"),
        ("grace: -1\n", "job.yaml:2: --grace: must not be negative, got -1.0"),
        ("ranks: x\n", "job.yaml:2: --ranks 'x': rank numbers separated by commas"),
        ("json: maybe\n", "job.yaml:2: --json is true or false, got 'maybe'"),
        ("json: true\n", "job.yaml:2: --json only applies to --dry-run"),
        ("master_port: 70000\n", "job.yaml:2: --master_port: port 70000 is out of range 1-65535"),
    ],
)
def test_a_job_files_bad_value_is_named_by_its_line(isolated, yaml, said):
    (isolated.cwd / "job.yaml").write_text("# a job\n" + yaml)
    (isolated.cwd / "train.py").write_text("")
    rc, out, err = run(["--config", "job.yaml", "--num_nodes", "1", "train.py"])
    assert rc == 2 and err.startswith(f"gaudi-launch: error: {said}"), err
    assert "json_out" not in err and "ranks_filter" not in err
    # the same value on the command line is named by its flag
    rc, out, err = run(["--num_devices", "0", "train.py"])
    assert rc == 2 and err.startswith("gaudi-launch: error: --num_devices: must be at least 1"), err


def test_no_job_is_announced_when_the_log_dir_is_refused(isolated):
    (isolated.cwd / "train.py").write_text("")
    (isolated.cwd / "afile").write_text("")
    rc, out, err = run(["--num_devices", "1", "--log-dir", "afile/logs", "train.py"])
    assert rc == 2 and err.startswith("gaudi-launch: error: --log-dir afile/logs: the log directory cannot be "), err
    assert "Not a directory" in err and "a file may be in the way" in err and "link" not in err
    assert "job " not in err and "rank(s)" not in err


def test_no_example_of_help_trips_the_launchers_own_notes():
    # An example whose script argument is also a launcher option (--config) got the "after the script
    # goes to the script" note from the launcher it documents.
    import shlex

    from gaudi_launch.cli import HELP
    from gaudi_launch.inputs.habits import misplaced_options
    from gaudi_launch.launch import option_names

    examples = [shlex.split(line.strip()) for line in HELP.splitlines() if line.strip().startswith("gaudi-launch --")]
    assert len(examples) >= 3
    for words in examples:
        script = next(i for i, w in enumerate(words) if w.endswith(".py"))
        assert misplaced_options(words[script + 1 :], option_names(), "") == [], words
