"""``--config job.yaml``: any command-line option as a YAML key; the command line wins."""

from __future__ import annotations

from typing import Any

import yaml

from gaudi_launch.errors import UserError

# Spellings users bring from other launchers, mapped to our option's parameter name.
ALIASES = {
    "num_gpus": "num_devices",
    "nproc_per_node": "num_devices",
    "hostfile_path": "hostfile",
    "training_script": "script",
    "args": "script_args",
    "training_script_args": "script_args",
    "json": "json_out",
    "export_prefix": "export_prefixes",
}
MAX_CONFIG_BYTES = 1 << 20


def normalize_key(key: str) -> str:
    name = key.lstrip("-").replace("-", "_")
    return ALIASES.get(name, name)


def load_config(path: str) -> list[tuple[str, Any, str]]:
    """[(parameter name, value, "path:line")] in file order."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)  # bounded: --config /dev/zero must not eat memory
        if len(data) > MAX_CONFIG_BYTES:
            raise UserError(f"config file is larger than {MAX_CONFIG_BYTES} bytes", where=path)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise UserError("config file does not exist", where=path, hint="check the path given to --config")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read config file: {exc}", where=path)
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        raise UserError(f"not valid YAML: {getattr(exc, 'problem', exc)}", where=where)
    if root is None:
        return []
    if not isinstance(root, yaml.MappingNode):
        raise UserError(
            "a job file is a mapping of option names to values",
            where=f"{path}:{root.start_mark.line + 1}",
            hint="e.g.  hostfile: hostfiles/two-nodes  /  num_devices: 8",
        )
    out = []
    seen: dict[str, str] = {}  # option name -> where it was first given
    for key_node, value_node in root.value:
        where = f"{path}:{key_node.start_mark.line + 1}"
        if not isinstance(key_node, yaml.ScalarNode):
            raise UserError("option names must be plain strings", where=where)
        name = normalize_key(str(key_node.value))
        if name in seen:
            raise UserError(f"'{key_node.value}' is given twice (first at {seen[name]})", where=where)
        seen[name] = where
        try:
            value = yaml.safe_load(yaml.serialize(value_node))
        except (yaml.YAMLError, ValueError, TypeError) as exc:
            raise UserError(
                f"bad value for '{key_node.value}': {getattr(exc, 'problem', None) or exc}",
                where=where,
                hint="use plain YAML scalars, lists and mappings (no tags)",
            )
        out.append((name, value, where))
    return out
