"""The environment the Gaudi bridge reads once, when it is imported. Torch-free.

The code lives in gaudi_launch/scriptflags.py, a root helper: the planner's notes and the rank bootstrap
decide from the same names without importing runtime/ (which runs inside the ranks only). The runtime
(device.py, trainer.py, precision.py) and its tests keep taking the names from here.
"""

from __future__ import annotations

from gaudi_launch.scriptflags import (  # noqa: F401  (this module's API)
    BF16_OPS_VAR,
    FP32_OPS_VAR,
    INT64_VAR,
    LAZY_VAR,
    autocast_enabled,
    hpu_env_for_script,
    int64_support_setting,
    lazy_mode_setting,
    prepare_hpu_env,
    script_hpu_flags,
)
