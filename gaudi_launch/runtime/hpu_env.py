"""The environment the Gaudi bridge reads once, when it is imported. Torch-free.

Since SynapseAI 1.18 ``import torch`` loads the bridge itself, so lazy mode and the autocast op
lists must be in the environment before the script's first ``import torch``: the worker sets them
from the script's own flags (``--use_lazy_mode``, ``--torch_compile``, ``--bf16``,
``--gaudi_config_name``) before running it. The op lists go to per-job files; optimum-habana's fixed
/tmp paths let two jobs on one host overwrite each other's lists.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, Optional

from .args import GaudiConfig, build_parser

LAZY_VAR = "PT_HPU_LAZY_MODE"
BF16_OPS_VAR = "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"
FP32_OPS_VAR = "PT_HPU_AUTOCAST_FP32_OPS_LIST"
INT64_VAR = "PT_ENABLE_INT64_SUPPORT"

_process_tmpdir: Optional[str] = None


def _op_list_dir(job_dir: Optional[str]) -> str:
    global _process_tmpdir
    if job_dir is not None:
        os.makedirs(job_dir, exist_ok=True)
        return str(job_dir)
    if _process_tmpdir is None:
        _process_tmpdir = tempfile.mkdtemp(prefix=f"gaudi-launch-autocast-{os.getpid()}-")
        atexit.register(shutil.rmtree, _process_tmpdir, True)
    return _process_tmpdir


def _remove_file(path: str) -> None:
    try:
        os.unlink(path)
        os.rmdir(os.path.dirname(path))  # the job's directory, once its last rank is done
    except OSError:
        pass


def _ops_text(ops: Sequence[str]) -> str:
    return "".join(f"{op}\n" for op in ops)  # the bridge reads one op name per line


def _write_ops(ops: Sequence[str], kind: str, job_dir: Optional[str]) -> str:
    # mkstemp: a file of this rank's own even when the ranks of one job share job_dir.
    fd, path = tempfile.mkstemp(prefix=f"autocast_{kind}_ops-", suffix=".txt", dir=_op_list_dir(job_dir))
    with os.fdopen(fd, "w") as f:
        f.write(_ops_text(ops))
    atexit.register(_remove_file, path)
    return path


def lazy_mode_setting(use_lazy_mode: Optional[bool], torch_compile: bool, environ: Mapping[str, str]) -> Optional[str]:
    """The PT_HPU_LAZY_MODE value to put in the environment, or None to leave it as it is. Pure.

    The user's own value always stands. Otherwise the flags decide: --torch_compile needs eager
    mode, --use_lazy_mode false asks for it, --use_lazy_mode asks for lazy mode; with neither
    flag the Gaudi software's own default applies (lazy up to 1.20, eager in newer releases).
    """
    if environ.get(LAZY_VAR):
        return None
    if torch_compile or use_lazy_mode is False:
        return "0"
    return "1" if use_lazy_mode else None


def int64_support_setting(torch_compile: bool, environ: Mapping[str, str]) -> Optional[str]:
    """The PT_ENABLE_INT64_SUPPORT value to put in the environment, or None to leave it. Pure.

    "1" for --torch_compile (HPU eager mode), unless the user set it: optimum-habana's own runs of its
    examples with --torch_compile set it (tests/test_examples.py; examples/language-modeling/README.md,
    "Training in torch.compile mode"; the library itself sets nothing), and transformers' Gaudi guide
    (perf_train_gaudi.md) advises it against long-integer casting problems. Unset, the 1.19 bridge in
    eager mode keeps int64 on Gaudi 2 and 3 but computes it as int32 on first-generation Gaudi
    (common/eager/utils.cpp, IsInt64Supported); set, it decides on every device alike.
    """
    if not torch_compile or environ.get(INT64_VAR):
        return None
    return "1"


def autocast_enabled(args: Any, gaudi_config: Optional[GaudiConfig]) -> bool:
    """Whether the forward runs under bf16 autocast on HPU, as optimum-habana decides it: --bf16 or
    the gaudi config's use_torch_autocast, never under DeepSpeed (it manages precision). Pure."""
    if getattr(args, "deepspeed", None):
        return False
    return bool(getattr(args, "bf16", False) or (gaudi_config is not None and gaudi_config.use_torch_autocast))


def prepare_hpu_env(
    args: Any,
    gaudi_config: Optional[GaudiConfig] = None,
    environ: MutableMapping[str, str] = os.environ,
    job_dir: Optional[str] = None,
) -> dict[str, str]:
    """Put lazy mode and the op lists for these arguments in the environment; return what changed.

    Idempotent: settings already in place (the user's, or the worker's before the script imported
    torch) are kept, so calling it again from the runtime writes nothing and does not warn. Once
    the bridge is loaded nothing is changed: it would not take effect, and would make the
    environment disagree with the bridge.
    """
    out: dict[str, str] = {}
    lazy = lazy_mode_setting(getattr(args, "use_lazy_mode", None), bool(getattr(args, "torch_compile", False)), environ)
    if lazy is not None:
        out[LAZY_VAR] = lazy
    int64 = int64_support_setting(bool(getattr(args, "torch_compile", False)), environ)
    if int64 is not None:
        out[INT64_VAR] = int64
    # optimum-habana writes op lists only for its hpu_amp backend (not cpu_amp) and not under DeepSpeed.
    if (
        autocast_enabled(args, gaudi_config)
        and gaudi_config is not None
        and getattr(args, "half_precision_backend", "hpu_amp") != "cpu_amp"
    ):
        for var, ops, kind in (
            (BF16_OPS_VAR, gaudi_config.autocast_bf16_ops, "bf16"),
            (FP32_OPS_VAR, gaudi_config.autocast_fp32_ops, "fp32"),
        ):
            if ops and not environ.get(var):
                out[var] = _write_ops(ops, kind, job_dir)
    changed = {k: v for k, v in out.items() if environ.get(k) != v}
    if changed and environ is os.environ and _bridge_loaded():
        for path in (v for k, v in changed.items() if k not in (LAZY_VAR, INT64_VAR)):
            _remove_file(path)
        warnings.warn(
            f"habana_frameworks is already imported: {', '.join(sorted(changed))} cannot take effect "
            "now and is left unset; start the script with gaudi-launch, which sets them from the "
            "script's flags before it runs",
            stacklevel=2,
        )
        return {}
    environ.update(changed)
    return changed


def _bridge_loaded() -> bool:
    return any(name == "habana_frameworks.torch" or name.startswith("habana_frameworks.torch.") for name in sys.modules)


@dataclasses.dataclass
class _HpuFlags:
    """The script flags that decide the bridge's import-time settings (TrainingArguments' names)."""

    use_lazy_mode: Optional[bool] = None  # None: not given, the Gaudi software's default applies
    torch_compile: bool = False
    torch_compile_backend: Optional[str] = None
    bf16: bool = False
    gaudi_config_name: Optional[str] = None
    deepspeed: Optional[str] = None
    half_precision_backend: str = "hpu_amp"

    def __post_init__(self) -> None:
        if self.torch_compile_backend is not None:
            self.torch_compile = True  # a backend implies --torch_compile, as in TrainingArguments


def script_hpu_flags(script_argv: list[str]) -> Optional[_HpuFlags]:
    """Those flags read from a script's command line, or None when it cannot be read that way. Pure."""
    parser = build_parser((_HpuFlags,), add_help=False)  # the script's -h is the script's
    parser.exit_on_error = False
    try:
        ns, _ = parser.parse_known_args(script_argv)
    except (argparse.ArgumentError, SystemExit):
        return None
    return _HpuFlags(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(_HpuFlags)})


def hpu_env_for_script(
    script_argv: list[str], environ: MutableMapping[str, str], job_dir: Optional[str]
) -> dict[str, str]:
    """What the worker puts in the environment before running a script on HPU; the user's own
    PT_HPU_LAZY_MODE wins. A gaudi config that does not load is left for the script to report."""
    flags = script_hpu_flags(script_argv) or _HpuFlags()
    config = None
    if flags.gaudi_config_name:
        try:
            config = GaudiConfig.from_pretrained(flags.gaudi_config_name)
        except (OSError, ValueError):
            pass
    return prepare_hpu_env(flags, config, environ=dict(environ), job_dir=job_dir)
