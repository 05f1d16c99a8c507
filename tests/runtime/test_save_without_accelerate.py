"""The [train] extra has no accelerate: saving a model must not need it (found by scripts/check-wheel.sh, the
demo's first steps from a clean install of the wheel)."""

from __future__ import annotations

import sys

from gaudi_launch.runtime import trainer


def test_saving_hides_deepspeed_only_where_accelerate_is_installed(monkeypatch):
    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)
    for name in ("accelerate", "accelerate.utils", "accelerate.utils.other"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ModuleNotFoundError, as without it
    with trainer._deepspeed_unseen():
        pass
