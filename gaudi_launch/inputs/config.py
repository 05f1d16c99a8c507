"""``--config job.yaml``: any command-line option as a YAML key; the command line wins."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.readfile import read_bounded

if TYPE_CHECKING:
    import yaml

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
# A job file is flat (option: value, a list or a mapping for env/exclude): deeper nesting is a mistake or an
# attack (yaml.compose recurses: RecursionError).
MAX_DEPTH = 16
_ENV_HINT = 'env: {NAME: "value"} or env: ["NAME=value"]'


def normalize_key(key: str) -> str:
    name = key.lstrip("-").replace("-", "_")
    return ALIASES.get(name, name)


def load_config(path: str) -> list[tuple[str, Any, str]]:
    """[(parameter name, value, "path:line")] in file order."""
    try:
        # bounded, non-blocking, a regular file: --config /dev/zero or a FIFO must not eat memory or hang
        data = read_bounded(path, MAX_CONFIG_BYTES)
        if len(data) > MAX_CONFIG_BYTES:
            raise UserError(f"config file is larger than {MAX_CONFIG_BYTES} bytes", where=path)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise UserError("config file does not exist", where=path, hint="check the path given to --config")
    except OSError as exc:
        raise UserError(f"cannot read config file: {exc.strerror or exc}", where=path)
    except UnicodeDecodeError as exc:
        raise UserError(f"cannot read config file: {exc}", where=path)
    import yaml  # here: a launch without --config does not pay its import

    try:
        _check_shape(text, path)  # before compose: aliases and depth are refused from the event stream
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
        if name == "env":
            _check_env_node(value_node, path)
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


def _check_shape(text: str, path: str) -> None:
    """Refuse an alias of a list or mapping (``*name``: an 845-byte file of nested aliases expands to
    gigabytes; an alias of one scalar cannot grow) and nesting deeper than MAX_DEPTH, reading the parser's
    events (which need no recursion), file:line named."""
    import yaml

    depth = 0
    collections: set[str] = set()  # anchors of lists and mappings
    for event in yaml.parse(text):
        if isinstance(event, yaml.AliasEvent) and event.anchor in collections:
            raise UserError(
                f"YAML aliases of a list or mapping (*{event.anchor}) are not allowed in a job file",
                where=f"{path}:{event.start_mark.line + 1}",
                hint="write the value out where it is used",
            )
        if isinstance(event, yaml.CollectionStartEvent):
            if event.anchor is not None:
                collections.add(event.anchor)
            depth += 1
            if depth > MAX_DEPTH:
                raise UserError(
                    f"nested deeper than {MAX_DEPTH} levels",
                    where=f"{path}:{event.start_mark.line + 1}",
                    hint="a job file maps option names to values, lists or (env) mappings of text",
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.ScalarEvent) and event.anchor is not None:
            collections.discard(event.anchor)  # an anchor may be reused for a scalar


def _check_env_node(node: yaml.Node, path: str) -> None:
    """env's values are text: a mapping of NAME: scalar, or a list of NAME=value scalars (or one scalar)."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        items = [v for _, v in node.value] + [k for k, _ in node.value]
    elif isinstance(node, yaml.SequenceNode):
        items = list(node.value)
    else:
        items = [node]
    for item in items:
        if not isinstance(item, yaml.ScalarNode):
            raise UserError(
                "--env takes text, not a nested list or mapping",
                where=f"{path}:{item.start_mark.line + 1}",
                hint=_ENV_HINT,
            )
