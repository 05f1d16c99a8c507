"""What a training script's flags and gaudi config make the Gaudi bridge read at import, without torch.

Shared by both sides of the rank boundary, so a root helper (it imports nothing of ours, as wire.py): the
planner's notes (plan/gaudi.py: lazy mode), the rank bootstrap (process/worker.py: sets the environment before
the script runs) and the training runtime (runtime/args.py, runtime/hpu_env.py re-export these names).
The launcher imports nothing of runtime/, so these live here.

Since SynapseAI 1.18 ``import torch`` loads the bridge itself, so lazy mode and the autocast op
lists must be in the environment before the script's first ``import torch``: the worker sets them
from the script's own flags (``--use_lazy_mode``, ``--torch_compile``, ``--bf16``,
``--gaudi_config_name``) before running it. The op lists go to per-job files; optimum-habana's fixed
/tmp paths let two jobs on one host overwrite each other's lists. The flags are read as the runtime's
HfArgumentParser-style parser reads them (``build_parser``), and the config as optimum-habana's
gaudi_config.json (``GaudiConfig``).
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import glob
import json
import os
import shutil
import sys
import tempfile
import types
import typing
import warnings
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

# ----------------------------------------------------------------------------------------------
# A dataclass's fields as command-line flags (HfArgumentParser's conventions)


def _str2bool(text: str) -> bool:
    low = text.lower()
    if low in ("true", "t", "yes", "y", "1", "on"):
        return True
    if low in ("false", "f", "no", "n", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def _type_hints(cls: type) -> dict[str, Any]:
    # `from __future__ import annotations` makes every annotation a string; a script may use
    # Optional/List without importing them at runtime, so fall back to typing's namespace.
    try:
        return typing.get_type_hints(cls)
    except NameError:
        return typing.get_type_hints(cls, localns=dict(vars(typing)))


def _unwrap_optional(tp: Any) -> Any:
    union_types = (typing.Union,) + ((types.UnionType,) if hasattr(types, "UnionType") else ())
    if typing.get_origin(tp) in union_types:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _add_field(parser: argparse.ArgumentParser, f: dataclasses.Field, tp: Any) -> None:
    names = [f"--{f.name}"]
    if "_" in f.name:
        names.append(f"--{f.name.replace('_', '-')}")
    kwargs: dict[str, Any] = {"dest": f.name, "help": f.metadata.get("help") or None}
    if f.default is not dataclasses.MISSING:
        kwargs["default"] = f.default
    elif f.default_factory is not dataclasses.MISSING:
        kwargs["default"] = f.default_factory()
    else:
        kwargs["required"] = True
    tp = _unwrap_optional(tp)
    choices = f.metadata.get("choices")
    if typing.get_origin(tp) is typing.Literal:
        choices = typing.get_args(tp)
        tp = type(choices[0])
    if tp is bool:
        # `--flag`, `--flag true|false` and `--no_flag`, as HfArgumentParser accepts them.
        parser.add_argument(*names, type=_str2bool, nargs="?", const=True, metavar="BOOL", **kwargs)
        no_names = [f"--no_{f.name}", f"--no-{f.name.replace('_', '-')}"]
        parser.add_argument(
            *dict.fromkeys(no_names),
            dest=f.name,
            action="store_false",
            default=argparse.SUPPRESS,
            help=f"set {f.name} to False",
        )
        return
    if typing.get_origin(tp) in (list, list) or tp is list:
        item = (typing.get_args(tp) or (str,))[0]
        kwargs.update(nargs="+", type=item)
    elif tp in (int, float, str):
        kwargs["type"] = tp
    elif tp in (dict, dict) or typing.get_origin(tp) is dict:
        kwargs["type"] = json.loads
    else:
        kwargs["type"] = str
    if choices:
        kwargs["choices"] = list(choices)
    parser.add_argument(*names, **kwargs)


def build_parser(
    dataclass_types: Sequence[type], prog: Optional[str] = None, add_help: bool = True
) -> argparse.ArgumentParser:
    # allow_abbrev=False: `--learning 1` must not silently mean --learning_rate.
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False, add_help=add_help)
    owner: dict[str, str] = {}
    for cls in dataclass_types:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls!r} is not a dataclass")
        hints = _type_hints(cls)
        group = parser.add_argument_group(cls.__name__)
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            if f.name in owner:
                raise ValueError(f"argument --{f.name} is defined by both {owner[f.name]} and {cls.__name__}")
            owner[f.name] = cls.__name__
            _add_field(group, f, hints.get(f.name, str))  # type: ignore[arg-type]
    return parser


# ----------------------------------------------------------------------------------------------
# Gaudi config

CONFIG_NAME = "gaudi_config.json"
# shipped with the training runtime (package data of gaudi_launch/runtime/), read here as files (os.path, not
# pathlib: the planner imports this module, and pathlib would add urllib.parse and ipaddress to its start-up)
_SHIPPED = os.path.join(os.path.dirname(os.path.realpath(__file__)), "runtime", "gaudi_configs")


@dataclass
class GaudiConfig:
    """optimum-habana's gaudi_config.json: which Gaudi-specific accelerations to use."""

    use_torch_autocast: bool = False
    autocast_bf16_ops: Optional[list[str]] = None
    autocast_fp32_ops: Optional[list[str]] = None
    use_dynamic_shapes: bool = False
    use_fused_adam: bool = False
    use_fused_clip_norm: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> GaudiConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            # Hub configs carry keys of other optimum-habana versions (hmp_*, ...): not fatal.
            warnings.warn(f"{source}: ignoring unknown gaudi config keys: {', '.join(unknown)}", stacklevel=3)
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike) -> GaudiConfig:
        path = os.fspath(name_or_path)
        if os.path.isdir(path):
            path = os.path.join(path, CONFIG_NAME)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{name_or_path}: no {CONFIG_NAME} in this directory")
        elif not os.path.isfile(path):
            name = str(name_or_path).strip("/")
            if name not in shipped_gaudi_configs():
                raise FileNotFoundError(
                    f"gaudi config {str(name_or_path)!r} is neither a file, a directory with {CONFIG_NAME}, "
                    f"nor a shipped name ({', '.join(shipped_gaudi_configs()) or 'none'}); the Hugging Face "
                    f"Hub is not consulted, so download the file and pass its path"
                )
            path = os.path.join(_SHIPPED, name, CONFIG_NAME)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.loads(f.read())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object")
        return cls.from_dict(data, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def shipped_gaudi_configs() -> list[str]:
    """Names like 'Habana/gpt2' that ship with the package."""
    found = glob.glob(os.path.join(glob.escape(_SHIPPED), "*", "*", CONFIG_NAME))
    return sorted(os.path.relpath(os.path.dirname(p), _SHIPPED) for p in found)


# ----------------------------------------------------------------------------------------------
# The bridge's import-time environment

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
