"""gaudi-launch: a multi-node launcher for training on Intel Gaudi (HPU) clusters.

The launcher side (everything importable from here) never imports torch; the worker and the
runtime do.
"""

from __future__ import annotations

from gaudi_launch.version import __version__

__all__ = ["DistributedRunner", "heartbeat", "__version__"]


def heartbeat() -> None:
    """Tell the launcher this rank advanced: call it once per training step in a plain script, for
    --hang-timeout (our Trainer does it itself). Free when the launcher does not watch for hangs."""
    from gaudi_launch.wire import beat

    beat()


def __getattr__(name: str):
    # Lazy so that `import gaudi_launch` stays cheap for the CLI.
    if name == "DistributedRunner":
        from gaudi_launch.runner import DistributedRunner

        return DistributedRunner
    raise AttributeError(name)
