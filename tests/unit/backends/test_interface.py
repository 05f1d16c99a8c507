"""Every backend module has the Backend interface: same functions, same parameters."""

from __future__ import annotations

import inspect

import pytest

from gaudi_launch.backends import NAMES, Backend, get_backend


def parameters(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", NAMES)
def test_backend_module_matches_the_protocol(name):
    module = get_backend(name)
    for function in ("detect", "commands", "run"):
        wanted = parameters(getattr(Backend, function))[1:]  # without self
        assert parameters(getattr(module, function)) == wanted, (name, function)


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown backend 'pdsh'"):
        get_backend("pdsh")
