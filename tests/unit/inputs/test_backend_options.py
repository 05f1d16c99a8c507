"""Options a backend declares for itself (inputs/backend_options.py): the same flags, job-file keys and
DistributedRunner keywords as before they left JobSpec, in their backend's --help panel; a backend's
option given with another backend is an error naming both."""

from __future__ import annotations

import dataclasses

import pytest

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.backend_options import REGISTRY, DeepSpeedOptions, SlurmOptions, backend_option_fields
from gaudi_launch.inputs.options import PANELS
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.runner import DistributedRunner
from tests.unit.cli_helpers import plan_of, user_error

pytestmark = pytest.mark.usefixtures("isolated")  # tests/unit/conftest.py


def test_each_backend_declares_its_options_in_its_own_panel_under_names_of_its_own():
    own = {f.name for f in dataclasses.fields(JobSpec)}
    seen = set()
    for backend, f, option in backend_option_fields():
        assert REGISTRY[backend].panel == option.panel and option.panel in PANELS, f.name
        assert f.name not in own and f.name not in seen, f.name  # one flat name space: flags, keys, keywords
        seen.add(f.name)
    assert seen == {"launcher", "launcher_args", "partition", "time", "account", "sbatch", "slurm_args"}


def test_a_backends_flag_with_another_backend_names_both(capsys):
    err = user_error(capsys, "--dry-run", "--backend", "mpirun", "--partition", "gaudi", "t.py")
    assert "--partition: --partition is an option of --backend slurm, not of --backend mpirun" in err
    assert "use --backend slurm, or leave --partition out" in err
    err = user_error(capsys, "--dry-run", "--backend", "deepspeed", "--launcher", "openmpi", "--time", "1:00", "t.py")
    assert "--launcher is an option of --backend deepspeed and --time one of --backend slurm" in err


def test_with_backend_auto_it_is_an_error_once_auto_has_chosen(capsys):
    err = user_error(capsys, "--dry-run", "--launcher-args", "-l root", "t.py")  # one host: auto is local
    assert "--launcher-args is an option of --backend deepspeed, --backend auto chose local for this job" in err


def test_the_flags_keys_and_keywords_reach_the_backends_options(capsys, isolated):
    plan = plan_of(capsys, "--backend", "deepspeed", "--launcher-args", "-l root", "t.py")
    assert "--launcher_args=-l root" in plan["commands"][0]["argv"]
    assert plan["request"]["launcher_args"] == "-l root" and plan["request"]["partition"] is None  # flat, as before
    (isolated.cwd / "job.yaml").write_text("backend: deepspeed\nlauncher: openmpi\n")
    plan = plan_of(capsys, "--config", "job.yaml", "t.py")
    assert plan["commands"][0]["argv"][plan["commands"][0]["argv"].index("--launcher") + 1] == "openmpi"
    spec = DistributedRunner(["t.py"], backend="slurm", partition="p", slurm_args="--exclusive").spec_for("t.py")
    assert spec.backend_options == SlurmOptions(partition="p", slurm_args="--exclusive")
    assert spec.options(DeepSpeedOptions) == DeepSpeedOptions()  # another backend's: its defaults
    with pytest.raises(UserError, match="--slurm-args is an option of --backend slurm, not of --backend mpirun"):
        DistributedRunner(["t.py"], backend="mpirun", slurm_args="--exclusive").spec_for("t.py")


def test_a_request_keeps_them_flat_and_builds_the_same_spec_again():
    spec = JobSpec.build(program=["t.py"], backend="slurm", partition="p", time="1:00")
    request = spec.as_request("/w")
    assert (request["partition"], request["time"], request["launcher"]) == ("p", "1:00", "pdsh")
    assert "backend_options" not in request
    assert JobSpec.build(**{k: v for k, v in request.items() if k != "cwd"}) == spec
    assert JobSpec.build(program=["t.py"], launcher="pdsh").backend_options is None  # a default says nothing
