"""Stand-in for habana_frameworks.torch.utils.internal: lazy mode is read once and then frozen.

As python_packages/habana_frameworks/torch/utils/internal.py (bridge 1.19): ``is_lazy`` caches
PT_HPU_LAZY_MODE != "0" on first use, and ``lazy_only`` turns a function into a no-op (warning
once) when the process is in eager mode.
"""

from __future__ import annotations

import os
import warnings


def is_lazy() -> bool:
    if is_lazy._is_lazy is None:
        is_lazy._is_lazy = os.getenv("PT_HPU_LAZY_MODE", "1") != "0"
    return is_lazy._is_lazy


is_lazy._is_lazy = None


def lazy_only(func):
    if is_lazy():
        return func

    warned = []

    def non_lazy(*args, **kwargs):
        if not warned:
            warned.append(True)
            warnings.warn(
                f"Calling {func.__name__} function does not have any effect. It's lazy mode only functionality.",
                stacklevel=2,
            )

    non_lazy.__name__ = func.__name__
    return non_lazy
