"""The cards the pre-flight read reach the ranks on the namespace cluster (issue 34): gl-n1 and gl-n2 are stood-in
Gaudi 3 servers (tests/cluster/test_scaleout_path.py's hosts: the hl-smi stand-in first on PATH, a sysfs copy
of their own), each with the recording hl-smi stand-in's log (GAUDI_STANDIN_HL_SMI_LOG). Through the SSH
pre-flight and mpirun, each host's probe asks hl-smi for the cards once, and the ranks there bind from what the
plan carried for their own hostname instead of asking again."""

from __future__ import annotations

import json

from gaudi_launch.inputs import cards
from tests.cluster.test_scaleout_path import HOSTS, launch
from tests.standin import gaudi_tools

BINDING_QUERY = "hl-smi " + " ".join(cards.QUERY[1:])
# What a rank would bind to from the cards that came with the job for its hostname (None: none came).
RANK = """import json, os, socket, sys
from gaudi_launch.plan import gaudi
from gaudi_launch.inputs.idranges import id_ranges
host = gaudi.rank_cards(os.environ, socket.gethostname())
cores = gaudi.rank_binding(os.environ, host) if host is not None else None
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as f:
    json.dump({"host": socket.gethostname(), "cores": id_ranges(cores) if cores else None}, f)
"""


def test_ranks_bind_from_the_preflights_cards_without_hl_smi_stand_in(cluster, tmp_path):
    logs = {h: tmp_path / f"hl-smi-{h}.log" for h in HOSTS}
    servers = {h: gaudi_tools.settings("gaudi3-verbs", GAUDI_STANDIN_HL_SMI_LOG=str(logs[h])) for h in HOSTS}
    out = tmp_path / "ranks"
    out.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    res = launch(cluster, tmp_path / "job", servers, script=(str(script), str(out)))
    assert res.returncode == 0, res.stdout + res.stderr
    got = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    # module ids 0 and 1 sit on NUMA node 1 of each host (test_scaleout_path.sysfs_copy): half its cores each
    want = {"0": ("gl-n1", "16-23,48-55"), "1": ("gl-n1", "24-31,56-63")}
    want.update({"2": ("gl-n2", "16-23,48-55"), "3": ("gl-n2", "24-31,56-63")})
    assert {r: (v["host"], v["cores"]) for r, v in got.items()} == want
    for host in HOSTS:  # the probe's one query per host; the two ranks there asked nothing
        assert logs[host].read_text().splitlines().count(BINDING_QUERY) == 1, logs[host].read_text()
