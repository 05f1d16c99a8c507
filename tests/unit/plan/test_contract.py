"""The rank contract beyond RANK/WORLD_SIZE (issue 10 items 2, 5, 7): device visibility that
means the same physical device whatever the backend, CROSS_SIZE, torchrun's elastic variables.
Real processes for the same things: tests/integration/test_dropin.py and tests/cluster/test_dropin.py."""

from __future__ import annotations

import json

import pytest

from gaudi_launch.plan.contract import (
    elastic_env,
    node_device_env,
    node_layout,
    node_sizes_env,
    read_error_file,
    visible_subset,
)
from gaudi_launch.process.worker import normalize_env
from tests.unit.cli_helpers import plan_of

pytestmark = pytest.mark.usefixtures("isolated")  # tests/unit/conftest.py


def ompi(rank: int, size: int, local_size: int) -> dict:
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % local_size),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
    }


def test_selected_slots_index_the_inherited_visibility():
    assert visible_subset("4,5,6,7", [1, 3]) == "5,7"
    assert visible_subset(" 4, 5 ,6,7 ", [0, 2]) == "4,6"
    assert visible_subset(None, [1, 3]) == visible_subset("", [1, 3]) == "1,3"
    env = node_device_env([[1, 3], [0, 2]], [{"HABANA_VISIBLE_MODULES": "4,5,6,7"}, {}])
    assert env == {"GAUDI_LAUNCH_NODE_DEVICES": "1,3;0,2", "GAUDI_LAUNCH_NODE_HABANA_VISIBLE_MODULES": "5,7;0,2"}


def test_mpirun_plan_maps_subsets_onto_exported_visibility(capsys, tmp_path, monkeypatch):
    # HABANA_VISIBLE_MODULES reaches remote ranks (exported by prefix); this host's
    # CUDA_VISIBLE_DEVICES does not, so on remote hosts a slot is the device of that number.
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "4,5,6,7")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    hostfile = tmp_path / "h"
    hostfile.write_text("worker-0 slots=4\nworker-1 slots=4\n")
    plan = plan_of(
        capsys, "--hostfile", str(hostfile), "--include", "worker-0:1,3@worker-1:0,2", "--backend", "mpirun", "train.py"
    )
    assert plan["env"]["GAUDI_LAUNCH_NODE_HABANA_VISIBLE_MODULES"] == "5,7;4,6"
    assert "GAUDI_LAUNCH_NODE_CUDA_VISIBLE_DEVICES" not in plan["env"]
    argv = plan["commands"][0]["argv"]
    exported = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert {"GAUDI_LAUNCH_NODE_DEVICES", "GAUDI_LAUNCH_NODE_HABANA_VISIBLE_MODULES", "CROSS_SIZE"} <= exported
    # What rank 2 (node 1, local rank 0) then sees, with the exported restriction inherited.
    rank2 = {
        **ompi(2, 4, 2),
        "HABANA_VISIBLE_MODULES": "4,5,6,7",
        "CROSS_SIZE": "2",
        **{k: v for k, v in plan["env"].items() if k.startswith("GAUDI_LAUNCH_NODE_")},
    }
    env = normalize_env(rank2)
    assert (env["HABANA_VISIBLE_MODULES"], env["CUDA_VISIBLE_DEVICES"], env["NODE_RANK"]) == ("4,6", "0,2", "1")


def test_worker_sets_the_planned_ids_over_a_launchers_rewrite():
    # DeepSpeed's launch.py sets CUDA_VISIBLE_DEVICES from its own view (0,1 for --num_gpus 2):
    # the ids the launcher worked out win.
    env = {
        **ompi(1, 2, 2),
        "CUDA_VISIBLE_DEVICES": "0,1",
        "GAUDI_LAUNCH_NODE_DEVICES": "1,3",
        "GAUDI_LAUNCH_NODE_CUDA_VISIBLE_DEVICES": "5,7",
    }
    out = normalize_env(env)
    assert (out["CUDA_VISIBLE_DEVICES"], out["HABANA_VISIBLE_MODULES"]) == ("5,7", "1,3")


def test_cross_size_and_torchrun_variables_from_an_mpi_layout():
    out = normalize_env({**ompi(3, 4, 2), "GAUDI_LAUNCH_JOB_ID": "abc"})
    assert out["CROSS_SIZE"] == out["GROUP_WORLD_SIZE"] == "2"
    assert (out["ROLE_RANK"], out["ROLE_NAME"], out["ROLE_WORLD_SIZE"]) == ("3", "default", "4")
    assert (out["TORCHELASTIC_RUN_ID"], out["TORCHELASTIC_RESTART_COUNT"], out["TORCHELASTIC_MAX_RESTARTS"]) == (
        "abc",
        "0",
        "0",
    )
    assert out["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert "TORCHELASTIC_USE_AGENT_STORE" not in out
    # the user's own setting is kept, as torchrun keeps it; no job id: not launched by us, no elastic names
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in normalize_env(
        {**ompi(0, 2, 2), "GAUDI_LAUNCH_JOB_ID": "abc", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
    )
    assert elastic_env({"RANK": "0", "WORLD_SIZE": "1"}, {}) == {}


def test_local_plan_gives_each_rank_torchruns_variables(capsys):
    plan = plan_of(capsys, "--num_devices", "2", "train.py")
    for rank, cmd in enumerate(plan["commands"]):
        env = cmd["env"]
        assert env["ROLE_RANK"] == env["RANK"] == str(rank)
        assert (env["ROLE_WORLD_SIZE"], env["GROUP_WORLD_SIZE"], env["TORCHELASTIC_RUN_ID"]) == (
            "2",
            "1",
            plan["job_id"],
        )


def test_error_file_written_by_torchs_record(tmp_path):
    path = tmp_path / "error.json"
    assert read_error_file(str(path)) is None
    path.write_text(
        json.dumps(
            {
                "message": {
                    "message": "ValueError: boom",
                    "extraInfo": {
                        "py_callstack": "Traceback (most recent call last):\n...\nValueError: boom\n",
                        "timestamp": "1",
                    },
                }
            }
        )
    )
    assert read_error_file(str(path)) == {
        "message": "ValueError: boom",
        "traceback": "Traceback (most recent call last):\n...\nValueError: boom\n",
    }
    path.write_text("not json")
    assert read_error_file(str(path)) is None


def test_uneven_nodes_under_mpirun_get_their_node_from_the_sizes():
    # mpirun --map-by slot on a:2,b:4: OpenMPI gives LOCAL_RANK/LOCAL_SIZE but no node rank, and
    # RANK // LOCAL_SIZE (the even rule) puts rank 2 (b's first) on node 0 and rank 5 on node 1 only by luck.
    sizes = node_sizes_env([2, 4])
    seen = [
        normalize_env(
            {
                **sizes,
                "OMPI_COMM_WORLD_RANK": str(r),
                "OMPI_COMM_WORLD_LOCAL_RANK": str(local),
                "OMPI_COMM_WORLD_LOCAL_SIZE": str(n),
                "OMPI_COMM_WORLD_SIZE": "6",
                "GAUDI_LAUNCH_NODE_DEVICES": "0,1;",
            }
        )
        for r, local, n in ((0, 0, 2), (1, 1, 2), (2, 0, 4), (3, 1, 4), (5, 3, 4))
    ]
    assert [(e["NODE_RANK"], e.get("LOCAL_RANK", "?")) for e in seen] == [
        ("0", "0"),
        ("0", "1"),
        ("1", "0"),
        ("1", "1"),
        ("1", "3"),
    ]
    assert [e.get("HABANA_VISIBLE_MODULES") for e in seen] == ["0,1", "0,1", None, None, None]


def test_uneven_nodes_under_deepspeed_get_their_place_on_the_node_as_local_rank():
    # --include a:1@b on 2-slot hosts: DeepSpeed's launch.py gives ranks 1 and 2 on b LOCAL_RANK
    # 1 % 2 = 1 and 2 % 2 = 0; the rank's place on its node is 0 and 1.
    assert node_sizes_env([2, 2]) == {}
    sizes = node_sizes_env([1, 2])
    assert sizes == {"GAUDI_LAUNCH_NODE_SIZES": "1,2"}
    seen = [
        normalize_env(
            {
                **sizes,
                "RANK": str(r),
                "LOCAL_RANK": str(r % n),
                "LOCAL_SIZE": str(n),
                "WORLD_SIZE": "3",
                "CROSS_RANK": str(node),
            }
        )
        for r, node, n in ((0, 0, 1), (1, 1, 2), (2, 1, 2))
    ]
    assert [(e.get("LOCAL_RANK", "0"), e.get("LOCAL_WORLD_SIZE")) for e in seen] == [("0", "1"), ("0", "2"), ("1", "2")]
    assert node_layout({"RANK": "2", "CROSS_RANK": "1"}) == {}  # even nodes: DeepSpeed's values stand
