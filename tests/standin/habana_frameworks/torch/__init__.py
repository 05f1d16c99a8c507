"""Stand-in for habana_frameworks.torch (the Gaudi PyTorch bridge).

As the real package's __init__.py: importing it (which importing any of its submodules does)
loads the bridge once, freezing the import-time settings (lazy mode, autocast op lists), and
imports core, distributed.hccl and hpu.
"""

import hpu_stand_in_device as _bridge
from habana_frameworks import record
from habana_frameworks.torch.utils.internal import is_lazy

_autocast_ops = _bridge.load()
record("bridge.load", lazy=is_lazy(), autocast_bf16=len(_autocast_ops["bf16"]))

import habana_frameworks.torch.core  # noqa: E402,F401
import habana_frameworks.torch.distributed.hccl  # noqa: E402,F401
import habana_frameworks.torch.hpu  # noqa: E402,F401
