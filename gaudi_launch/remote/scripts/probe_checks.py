# The pre-flight probe's checks that need Python, run by the workers' interpreter on each host (probe.sh
# passes this text to `python -c`): one interpreter start does them all, since each start costs tens of
# milliseconds of the host's CPU and a job probes every host. Stdlib only; prints key=value lines.
# argv: SEARCH MASTER_ADDR MASTER_SSH_PORT (0: only resolve the master) [PORT_TO_CHECK]
# SEARCH: the directories the ranks have first on sys.path (the job's working directory, then the PYTHONPATH
# the job exports to them), joined with ":".
import socket
import sys

_search = [p for p in sys.argv.pop(1).split(":") if p]
print("python_ok=1")
print(f"python_version={sys.version.split()[0]}")
# The ranks start as `python -m gaudi_launch.process.worker` from the job's working directory: -m finds the
# module as importlib.util.find_spec does (runpy), which imports gaudi_launch and gaudi_launch.process (two
# docstrings) but not the worker itself.
_path = list(sys.path)
try:
    import importlib.util

    # (not where this interpreter started: python -c put that first, the ranks' -m puts the job's directory)
    sys.path[:] = _search + [p for p in _path if p not in ("", ".")]
    _spec = importlib.util.find_spec("gaudi_launch.process.worker")
    if _spec is None:
        raise ModuleNotFoundError("No module named 'gaudi_launch.process.worker'")
    print("gaudi_launch_ok=1")
    print(f"gaudi_launch_path={sys.modules['gaudi_launch'].__path__[0]}")
except Exception as e:
    print("gaudi_launch_ok=0")
    print(f"gaudi_launch_error={type(e).__name__}: {e}".splitlines()[0])
    if "gaudi_launch" in sys.modules:
        print(f"gaudi_launch_path={list(getattr(sys.modules['gaudi_launch'], '__path__', ['?']))[0]}")
finally:
    sys.path[:] = _path
    for _name in [m for m in sys.modules if m == "gaudi_launch" or m.startswith("gaudi_launch.")]:
        del sys.modules[_name]
try:
    import importlib.util

    found_spec = importlib.util.find_spec("deepspeed")
    if found_spec is None:
        raise ImportError
    try:
        # the dist-info beside the package names the version (importlib.metadata would read every
        # installed distribution's metadata first: a tenth of a second per host)
        import glob
        import os

        site = os.path.dirname(list(found_spec.submodule_search_locations or [])[0])
        found = sorted(glob.glob(os.path.join(site, "deepspeed-*.dist-info")))
        if len(found) == 1:
            print("deepspeed={}".format(os.path.basename(found[0])[len("deepspeed-") : -len(".dist-info")]))
        else:
            from importlib.metadata import version

            print("deepspeed={}".format(version("deepspeed")))
    except Exception:
        print("deepspeed=unknown")
except Exception:
    pass
# The versions that must agree across hosts (remote/versions.py): each package's dist-info beside the
# package this interpreter would import, found without importing it (torch alone costs a second).
for _key, _pkg, _dist in (
    ("torch", "torch", "torch"),
    ("transformers", "transformers", "transformers"),
    ("habana_bridge", "habana_frameworks", "habana_torch_plugin"),
):
    try:
        import glob
        import importlib.util
        import os

        _spec = importlib.util.find_spec(_pkg)
        if _spec is None:
            continue
        _site = os.path.dirname(list(_spec.submodule_search_locations or [])[0])
        _found = sorted(glob.glob(os.path.join(_site, _dist + "-*.dist-info")))
        print(
            "{}={}".format(
                _key, os.path.basename(_found[0])[len(_dist) + 1 : -len(".dist-info")] if _found else "unknown"
            )
        )
    except Exception:
        print(f"{_key}=unknown")
sys.stdout.flush()
addr, port = sys.argv[1], int(sys.argv[2])
try:  # the master's address as this host resolves it (the interface that carries its subnet is picked from it)
    print(f"master_ip={socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)[0][4][0]}")
except Exception:
    pass
if port:  # 0: nothing listens for it yet (Slurm: no sshd), only the name is resolved
    try:
        socket.create_connection((addr, port), 3).close()
        print("master_reachable=1")
    except socket.gaierror as e:
        print("master_reachable=0")
        print(f"master_error={addr} does not resolve ({e})")
    except Exception as e:
        print("master_reachable=0")
        print(f"master_error={e}")
sys.stdout.flush()
if len(sys.argv) > 3:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", int(sys.argv[3])))
        print("port_free=1")
    except Exception as e:
        print("port_free=0")
        print(f"port_error={e}")
    finally:
        s.close()
