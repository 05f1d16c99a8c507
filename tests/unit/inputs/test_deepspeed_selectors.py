"""--include/--exclude read as DeepSpeed reads them (issue 10 item 8).

The cases of DeepSpeed's own tests/unit/launcher/test_run.py (test_parser_local,
test_parser_multinode, test_parse_inclusion_exclusion, test_parser_errors), ported to
``select``, then every selector compared with the installed DeepSpeed's parse_resource_filter.
Deliberate differences (docs/migrating.md): leaving no
host is an error here (DeepSpeed returns an empty pool and fails later), and a host named both
whole and with slots is refused (DeepSpeed silently takes only the slots).
"""

from __future__ import annotations

import pytest

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.hostfile import Host
from gaudi_launch.inputs.hostselect import select

ONE = [Host("worker-0", 4, 1)]
TWO = [Host("worker-0", 4, 1), Host("worker-1", 4, 2)]


def pool(hosts, **kw) -> dict:
    return dict(select(hosts, **kw))


def test_parser_local():
    assert pool(ONE) == {"worker-0": [0, 1, 2, 3]}
    assert pool(ONE, exclude="worker-0:1") == {"worker-0": [0, 2, 3]}
    assert pool(ONE, exclude="worker-0:1,2") == {"worker-0": [0, 3]}
    assert pool(ONE, include="worker-0:1") == {"worker-0": [1]}
    # including slots multiple times shouldn't break things
    assert pool(ONE, include="worker-0:1,1") == {"worker-0": [1]}
    assert pool(ONE, include="worker-0:1@worker-0:0,1") == {"worker-0": [0, 1]}
    assert pool(ONE, include="worker-0") == {"worker-0": [0, 1, 2, 3]}
    # DeepSpeed returns {} for these; an empty job is an error here, naming the option
    for spec in ("worker-0", "worker-0:0,1,2,3"):
        with pytest.raises(UserError, match="leaves no hosts") as err:
            select(ONE, exclude=spec)
        assert err.value.where == "--exclude"


def test_parser_multinode():
    assert pool(TWO) == {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]}
    assert pool(TWO, include="worker-1:0,3") == {"worker-1": [0, 3]}
    assert pool(TWO, exclude="worker-1") == {"worker-0": [0, 1, 2, 3]}
    assert pool(TWO, exclude="worker-0:0,1@worker-1:3") == {"worker-0": [2, 3], "worker-1": [0, 1, 2]}


def test_parse_inclusion_exclusion():
    assert pool(TWO, include="worker-0") == {"worker-0": [0, 1, 2, 3]}
    assert pool(TWO, include="worker-0@worker-1:0,2") == {"worker-0": [0, 1, 2, 3], "worker-1": [0, 2]}
    assert pool(TWO, include="worker-1:0,2") == {"worker-1": [0, 2]}
    assert pool(TWO, exclude="worker-0:1") == {"worker-0": [0, 2, 3], "worker-1": [0, 1, 2, 3]}


@pytest.mark.parametrize("option", ["include", "exclude"])
@pytest.mark.parametrize("spec", ["worker-0:4", "worker-0:99", "worker-0:0,4", "jeff", "worker-1@worker-0:1@5"])
def test_parser_errors(option, spec):
    with pytest.raises(UserError) as err:
        select(TWO, **{option: spec})
    assert err.value.where == f"--{option}" and err.value.hint


def test_mutually_exclusive():
    with pytest.raises(UserError, match="mutually exclusive"):
        select(TWO, include="worker-0", exclude="worker-1")


SAME_AS_DEEPSPEED = [
    ("include", "worker-0:1,1"),
    ("include", "worker-0:1@worker-0:0,1"),
    ("include", "worker-1:3@worker-1:0"),
    ("include", "worker-1@worker-0:2"),
    ("include", "worker-0@worker-0"),
    ("include", "worker-0:3,2,3"),
    ("exclude", "worker-0:1,1"),
    ("exclude", "worker-0:1@worker-0:2"),
    ("exclude", "worker-1@worker-1"),
    ("exclude", "worker-0:0,1@worker-1:3@worker-0:1"),
]


@pytest.mark.parametrize("option, spec", SAME_AS_DEEPSPEED)
def test_same_pool_as_the_installed_deepspeed(option, spec):
    runner = _deepspeed_runner()
    theirs = runner.parse_resource_filter({h.name: list(range(h.slots)) for h in TWO}, **{f"{option}_str": spec})
    assert pool(TWO, **{option: spec}) == {h: sorted(s) for h, s in theirs.items()}


def test_a_host_named_whole_and_with_slots_is_refused_with_both_spellings():
    # DeepSpeed takes only slot 1 here; which one the user meant is not clear.
    with pytest.raises(UserError, match="both whole and with slots") as err:
        select(TWO, include="worker-0@worker-0:1")
    assert "'worker-0'" in err.value.hint and "'worker-0:0,1'" in err.value.hint


def _deepspeed_runner():
    # The tests (not the launcher) may import DeepSpeed; it is part of the [dev] extra.
    from deepspeed.launcher import runner

    return runner
