"""Lean in-process training runtime: arguments, device set-up and the Gaudi accelerations.

Nothing is imported here: ``gaudi_launch.runtime.args`` must stay importable without torch, and the
device modules import torch (and habana_frameworks) only when used.
"""
