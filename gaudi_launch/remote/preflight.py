"""SSH pre-flight: before a multi-node job starts, check every host in parallel.

For each host of the hostfile: can we log in with a key (and which one was refused), does the
workers' Python exist, is the script there, how many Gaudi devices does ``hl-smi`` see, which
OpenMPI / DeepSpeed versions are installed, can the host reach the master, and (on the master)
is the master port free. Every failure comes with a reason and a fix, as one table.

Pure parts (``classify_ssh_error``, ``CheckReport``; the probe itself is probe.py)
are tested without a network; ``check_hosts`` does the I/O. Never imports torch.
"""

from __future__ import annotations

import dataclasses
import errno
import getpass
import logging
import os
import shlex
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from gaudi_launch.remote import probe
from gaudi_launch.remote.fanout import per_host
from gaudi_launch.remote.sshmux import SESSION_AGENT, read_until

DEFAULT_KEYS = ("id_ed25519", "id_rsa", "id_ecdsa")
PROBE_TIMEOUT = 60.0  # seconds for the probe command itself, once logged in
_AGENT = "ssh-agent keys"


# ---------------------------------------------------------------- data


@dataclass
class SshOptions:
    port: Optional[int] = None  # --ssh-port; None: from the ssh config for that host, else 22
    identity: Optional[str] = None  # --ssh-identity; None: ssh config / default keys / agent
    config: Optional[str] = None  # --ssh-config; None: ~/.ssh/config if it exists
    timeout: float = 10.0  # --ssh-timeout: connect timeout (also banner and auth)
    strict: bool = False  # --strict-host-keys: refuse unknown host keys (else accept-new)
    known_hosts: Optional[str] = None  # None: UserKnownHostsFile of the ssh config, else ~/.ssh/known_hosts


@dataclass
class HostFacts:
    host: str  # as in the hostfile (may be user@host)
    ok: bool
    reason: Optional[str] = None
    fix: Optional[str] = None
    hostname: Optional[str] = None
    ip_addr: str = ""  # raw `ip -o addr show` output of that host
    ncpus: Optional[int] = None
    python_ok: Optional[bool] = None
    script_ok: Optional[bool] = None
    devices: Optional[int] = None  # hl-smi count when hl-smi exists, else None (not checked)
    openmpi: Optional[str] = None  # `mpirun --version` first line
    deepspeed: Optional[str] = None  # deepspeed version of the workers' python
    master_reachable: Optional[bool] = None
    port_free: Optional[bool] = None  # only for the master host
    elapsed_s: float = 0.0


@dataclass
class CheckReport:
    facts: dict[str, HostFacts]
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.facts.values())

    def failures(self) -> list[HostFacts]:
        return [f for f in self.facts.values() if not f.ok]

    def render_table(self) -> str:
        """host | OK/failed | reason (the fix on the next line), then the warnings."""
        rows: list[tuple[str, str, str, Optional[str]]] = []
        for f in self.facts.values():
            if f.ok:
                rows.append((f.host, "OK", _summary(f), None))
            else:
                rows.append((f.host, "failed", f.reason or "failed", f.fix))
        w_host = max([len("host")] + [len(r[0]) for r in rows])
        w_status = max([len("status")] + [len(r[1]) for r in rows])
        lines = [f"{'host':<{w_host}}  {'status':<{w_status}}  details"]
        pad = " " * (w_host + w_status + 4)
        for host, status, text, fix in rows:
            text_lines = (text or "").splitlines() or [""]
            lines.append(f"{host:<{w_host}}  {status:<{w_status}}  {text_lines[0]}".rstrip())
            lines += [pad + extra for extra in text_lines[1:]]
            if fix:
                fix_lines = fix.splitlines()
                lines.append(f"{pad}fix: {fix_lines[0]}")
                lines += [pad + "     " + extra for extra in fix_lines[1:]]
        for w in self.warnings:
            lines.append(f"warning: {w}")
        return "\n".join(lines)


def _summary(f: HostFacts) -> str:
    parts = []
    if f.hostname:
        parts.append(f.hostname)
    if f.ncpus is not None:
        parts.append(f"{f.ncpus} cpus")
    if f.devices is not None:
        parts.append(f"{f.devices} devices")
    parts.append(f"{f.elapsed_s:.2f} s")
    return ", ".join(parts)


# ---------------------------------------------------------------- classification (pure)


def _split_user(host: str) -> tuple[Optional[str], str]:
    if "@" in host:
        user, name = host.rsplit("@", 1)
        return (user or None), name
    return None, host


def _strip_brackets(name: str) -> str:
    return name[1:-1] if name.startswith("[") and name.endswith("]") else name


def _keys_of(key_tried: Optional[str]) -> list[str]:
    return [k.strip() for k in (key_tried or "").split(",") if k.strip() and k.strip() != _AGENT]


def _known_hosts_name(name: str, port: int) -> str:
    return name if port == 22 else f"[{name}]:{port}"


def _fingerprint(key) -> str:
    try:
        return f"{key.get_name()} {key.fingerprint}"
    except Exception:  # very old paramiko, odd key objects
        try:
            return f"{key.get_name()} MD5:{key.get_fingerprint().hex()}"
        except Exception:
            return "?"


def _errno_of(exc: BaseException) -> Optional[int]:
    errs = getattr(exc, "errors", None)  # paramiko NoValidConnectionsError: {addr: OSError}
    if isinstance(errs, dict) and errs:
        codes = {getattr(e, "errno", None) for e in errs.values()}
        if errno.ECONNREFUSED in codes:
            return errno.ECONNREFUSED
        return next(iter(codes))
    return getattr(exc, "errno", None)


def classify_ssh_error(exc: BaseException, host: str, opts: SshOptions, key_tried: Optional[str]) -> tuple[str, str]:
    """(reason, fix) for an exception raised while connecting/logging in to ``host``. Pure.

    ``host`` is what we connected to, ``user@name`` or ``name``; ``opts.port`` the port used
    (None means 22); ``key_tried`` a comma-separated list of the keys offered (may include
    "ssh-agent keys").
    """
    import paramiko  # the launcher imports this module lazily; paramiko is a dependency

    port = opts.port or 22
    user, name = _split_user(host)
    name = _strip_brackets(name)
    target = f"{user}@{name}" if user else name
    port_opt = f" -p {port}" if port != 22 else ""
    kh = opts.known_hosts
    default_kh = os.path.expanduser("~/.ssh/known_hosts")
    kh_opt = f" -f {shlex.quote(kh)}" if kh and kh != default_kh else ""
    kh_name = _known_hosts_name(name, port)
    text = str(exc) or type(exc).__name__
    keys = _keys_of(key_tried)
    tried = key_tried or "no key"  # (paramiko only refuses auth after offering something)

    if isinstance(exc, paramiko.BadHostKeyException):
        got, want = _fingerprint(exc.key), _fingerprint(exc.expected_key)
        return (
            f"host key changed (server offers {got}, known_hosts has {want})",
            "if the host was reinstalled (not an attack), remove the old key: "
            f"ssh-keygen -R {shlex.quote(kh_name)}{kh_opt}, then run again",
        )

    if isinstance(exc, paramiko.PasswordRequiredException):
        key = keys[0] if keys else "the key"
        return (
            f"key {key} needs a passphrase (the pre-flight never prompts)",
            f"load it into an agent first: eval $(ssh-agent) && ssh-add {key}",
        )

    if isinstance(exc, paramiko.AuthenticationException) and "timeout" in text.lower():
        return (
            f"{name}:{port} did not finish authentication within {opts.timeout:g} s",
            "the server is slow or overloaded (DNS lookups in sshd: UseDNS no); raise --ssh-timeout",
        )

    if isinstance(exc, paramiko.AuthenticationException):
        label = "key" if len(keys) + (_AGENT in (key_tried or "")) == 1 else "keys"
        pub = f"{keys[0]}.pub" if keys else "~/.ssh/id_ed25519.pub"
        copy = f"ssh-copy-id -i {shlex.quote(pub)}{port_opt} {target}"
        return (
            f"auth refused for {target} (tried {label} {tried})",
            f"install the public key on {name}: {copy}\n"
            f"(or append {pub} to ~{user or ''}/.ssh/authorized_keys there), "
            "or give the right key with --ssh-identity",
        )

    if isinstance(exc, paramiko.SSHException):
        low = text.lower()
        if "not found in known_hosts" in low:
            file = shlex.quote(kh) if kh and kh != default_kh else "~/.ssh/known_hosts"
            offers = text.split("it offers ", 1)[1].rstrip(")") if "it offers " in text else None
            return (
                f"unknown host key for {kh_name}"
                + (f" ({offers})" if offers else "")
                + f", not in {file}, and new keys are refused "
                "(--strict-host-keys, or StrictHostKeyChecking yes/ask in the ssh config)",
                "check the key's fingerprint with the host's admin, then add it: "
                f"ssh-keyscan{port_opt} {shlex.quote(name)} >> {file}; "
                "or let new keys in (no --strict-host-keys; StrictHostKeyChecking accept-new)",
            )
        if "protocol banner" in low or "no existing session" in low:
            # paramiko says "No existing session" when the handshake never finished (its connect
            # wait ran out just before the banner timeout): not a key problem.
            return (
                f"{name}:{port} did not answer the SSH handshake (no SSH banner within {opts.timeout:g} s)",
                f"check that sshd (not another service) listens on port {port} and is not overloaded "
                "(MaxStartups); raise --ssh-timeout if the host is slow",
            )
        if "no authentication methods available" in low:
            what = (
                f"none of {key_tried} could be used"
                if key_tried
                else "no identity file, no default key in ~/.ssh, no ssh-agent"
            )
            return (
                f"no SSH key to offer ({what})",
                "create a key (ssh-keygen -t ed25519) and install it: "
                f"ssh-copy-id -i ~/.ssh/id_ed25519.pub{port_opt} {target}; or give one with --ssh-identity",
            )
        return (f"ssh failed: {text}", f"try it by hand: ssh -v{port_opt} {target} true")

    if isinstance(exc, socket.gaierror):
        return (
            f"name does not resolve: {name} ({exc.strerror or text})",
            "fix the name in the hostfile, or add it to /etc/hosts (or DNS) on this machine",
        )

    if isinstance(exc, (socket.timeout, TimeoutError)) or _errno_of(exc) in (errno.ETIMEDOUT,):
        return (
            f"timed out after {opts.timeout:g} s connecting to {name}:{port}",
            "check the address in the hostfile, the route to it and firewalls / security groups "
            f"(port {port} must be open); raise --ssh-timeout for slow networks",
        )

    code = _errno_of(exc)
    if isinstance(exc, ConnectionRefusedError) or code == errno.ECONNREFUSED:
        return (
            f"connection refused by {name}:{port}",
            f"is sshd running on {name} and listening on port {port}? "
            "DL1/Gaudi containers often run sshd on 3022: use --ssh-port 3022 (or Port in ~/.ssh/config)",
        )
    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return (
            f"{name}:{port} is unreachable ({os.strerror(code)})",
            "check the address in the hostfile, the route to it and firewalls / security groups",
        )
    if isinstance(exc, (EOFError, ConnectionResetError)):
        return (
            f"{name}:{port} closed the connection ({text})",
            "sshd refused the session early: check its log on that host (AllowUsers, MaxStartups, TCP wrappers)",
        )
    if isinstance(exc, FileNotFoundError) and getattr(exc, "filename", None):
        return (f"cannot read {exc.filename}: {exc.strerror}", "check --ssh-identity / --ssh-config")
    return (f"ssh failed: {type(exc).__name__}: {text}", f"try it by hand: ssh -v{port_opt} {target} true")


# ---------------------------------------------------------------- SSH plumbing


@dataclass
class _Target:
    entry: str  # as in the hostfile
    name: str  # host part of the entry (no user, no brackets)
    hostname: str  # what we connect to (ssh config HostName, else name)
    user: str
    port: int
    key_files: list[str]  # explicit identity files (existing)
    look_for_keys: bool
    allow_agent: bool
    known_hosts: str
    global_known_hosts: list[str]
    strict: bool
    proxy_command: Optional[str]
    config_error: Optional[str] = None
    proxy_jump: Optional[str] = None


def _expand(path: str) -> str:
    return os.path.expanduser(os.path.expandvars(path))


def _config_path(opts: SshOptions) -> Optional[str]:
    if opts.config:
        return _expand(opts.config)
    default = os.path.expanduser("~/.ssh/config")
    return default if os.path.isfile(default) else None


def _load_config(opts: SshOptions):
    """paramiko.SSHConfig or None, and an error text."""
    import paramiko

    path = _config_path(opts)
    if path is None:
        return None, None
    try:
        return paramiko.SSHConfig.from_path(path), None
    except Exception as e:  # unreadable, bad syntax
        return None, f"cannot read ssh config {path}: {e}"


def _target(entry: str, opts: SshOptions, config) -> _Target:
    user, name = _split_user(entry)
    name = _strip_brackets(name)
    conf: dict = {}
    error = None
    if config is not None:
        try:
            conf = dict(config.lookup(name))
        except Exception as e:  # Match exec without `invoke`, bad tokens...
            error = f"ssh config lookup for {name} failed: {e}"
    hostname = conf.get("hostname") or name
    port = opts.port
    if port is None:
        try:
            port = int(conf.get("port", 22))
        except ValueError:
            port = 22
    user = user or conf.get("user") or getpass.getuser()
    if opts.identity:
        key_files = [_expand(opts.identity)]
        look = False
    else:
        key_files = [_expand(k) for k in conf.get("identityfile", []) or []]
        key_files = [k for k in key_files if os.path.isfile(k)]
        look = not conf.get("identityfile")
    identities_only = str(conf.get("identitiesonly", "no")).lower() == "yes"
    known = opts.known_hosts
    if not known:
        files = str(conf.get("userknownhostsfile", "")).split()
        known = files[0] if files else "~/.ssh/known_hosts"
    globals_ = str(conf.get("globalknownhostsfile", "/etc/ssh/ssh_known_hosts")).split()
    # "ask" under BatchMode (the job's ssh always has it) refuses an unknown key, as "yes" does.
    strict = opts.strict or str(conf.get("stricthostkeychecking", "")).lower() in ("yes", "ask")
    return _Target(
        entry=entry,
        name=name,
        hostname=hostname,
        user=user,
        port=port,
        key_files=key_files,
        look_for_keys=look,
        allow_agent=not identities_only,
        known_hosts=_expand(known),
        global_known_hosts=[_expand(g) for g in globals_],
        strict=strict,
        proxy_command=conf.get("proxycommand") if str(conf.get("proxycommand", "")).lower() != "none" else None,
        proxy_jump=conf.get("proxyjump"),
        config_error=error,
    )


def _keys_description(t: _Target) -> str:
    keys = list(t.key_files)
    if t.look_for_keys:
        home = os.path.expanduser("~/.ssh")
        keys += [os.path.join(home, k) for k in DEFAULT_KEYS if os.path.isfile(os.path.join(home, k))]
    if t.allow_agent and os.environ.get("SSH_AUTH_SOCK"):
        keys.append(_AGENT)
    return ", ".join(keys) if keys else ""


_write_lock = threading.Lock()


def _append_known_host(path: str, name: str, key) -> None:
    import paramiko

    line = paramiko.hostkeys.HostKeyEntry([name], key).to_line()
    with _write_lock:
        d = os.path.dirname(path)
        if d and not os.path.isdir(d):
            os.makedirs(d, mode=0o700, exist_ok=True)
        prefix = ""
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                if f.tell() > 0:
                    f.seek(-1, os.SEEK_END)
                    prefix = "" if f.read(1) == b"\n" else "\n"
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(prefix + line)


def _policies():
    import paramiko

    class AcceptNew(paramiko.MissingHostKeyPolicy):
        """StrictHostKeyChecking=accept-new: remember a new host's key (appended, never rewritten)."""

        def __init__(self, path: str):
            self.path = path

        def missing_host_key(self, client, hostname, key):
            client.get_host_keys().add(hostname, key.get_name(), key)
            _append_known_host(self.path, hostname, key)

    class Reject(paramiko.MissingHostKeyPolicy):
        def __init__(self, path: str):
            self.path = path

        def missing_host_key(self, client, hostname, key):
            raise paramiko.SSHException(
                f"Server {hostname!r} not found in known_hosts ({self.path}; it offers {_fingerprint(key)})"
            )

    return AcceptNew, Reject


def _quiet_paramiko() -> None:
    # Transport threads log failures at ERROR; without a handler Python prints them to stderr.
    log = logging.getLogger("paramiko")
    if not log.handlers:
        log.addHandler(logging.NullHandler())


class _ProbeFailed(Exception):
    """Logged in, but running the probe command failed (timeout, channel refused)."""


def _connect_kwargs() -> set:
    import inspect

    import paramiko

    return set(inspect.signature(paramiko.SSHClient.connect).parameters)


def _ssh_run(t: _Target, opts: SshOptions, command: str) -> tuple[str, str, int]:
    """Log in to t and run command; (stdout, stderr, exit status).

    Login failures raise what paramiko raises (for classify_ssh_error); failures after login
    raise _ProbeFailed.
    """
    import paramiko

    AcceptNew, Reject = _policies()
    client = paramiko.SSHClient()
    try:
        for g in t.global_known_hosts:
            if g != "/dev/null" and os.path.isfile(g):
                try:
                    client.load_system_host_keys(g)
                except Exception:
                    pass
        if os.path.isfile(t.known_hosts):
            client.load_host_keys(t.known_hosts)
        client.set_missing_host_key_policy(Reject(t.known_hosts) if t.strict else AcceptNew(t.known_hosts))
        sock = paramiko.ProxyCommand(t.proxy_command) if t.proxy_command else None
        kwargs = dict(
            port=t.port,
            username=t.user,
            password=None,
            key_filename=t.key_files or None,
            timeout=opts.timeout,
            banner_timeout=opts.timeout,
            auth_timeout=opts.timeout,
            allow_agent=t.allow_agent,
            look_for_keys=t.look_for_keys,
            sock=sock,
        )
        if "channel_timeout" in _connect_kwargs():
            kwargs["channel_timeout"] = opts.timeout
        client.connect(t.hostname, **kwargs)
        try:
            _, stdout, stderr = client.exec_command(command, timeout=PROBE_TIMEOUT)
            stdout.channel.shutdown_write()
            out = stdout.read().decode("utf-8", "replace")
            err = stderr.read().decode("utf-8", "replace")
            return out, err, stdout.channel.recv_exit_status()
        except socket.timeout:
            raise _ProbeFailed(f"the probe did not finish within {PROBE_TIMEOUT:g} s") from None
        except Exception as e:
            raise _ProbeFailed(f"could not run the probe: {type(e).__name__}: {e}") from None
    finally:
        client.close()


def _master_run(connections, host: str, command: str, opts: SshOptions) -> tuple[Optional[str], str]:
    """Run the probe with OpenSSH as the host's master connection: (stdout, stderr), or (None, stderr)
    when ssh itself failed (exit 255 without the probe's end marker). A connect timeout is raised as
    one, so the host is not waited for twice. After the probe, the session's shell becomes the job's
    agent (sshmux.SESSION_AGENT: the sweep, mpirun's daemon) and this ssh is kept (connections.adopt)."""
    proc = subprocess.Popen(
        connections.master_argv(host, command),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )  # Ctrl-C is the launcher's to handle
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    marker = (probe.END + "\n").encode()
    data = read_until(proc.stdout.fileno(), marker, time.monotonic() + PROBE_TIMEOUT + 3 * opts.timeout)
    if marker in data:
        connections.adopt(host, proc)
        return data.decode("utf-8", "replace"), ""
    if proc.poll() is None:
        try:
            proc.wait(0.5)  # ended its output without the marker: let it exit
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            proc.stdin.close()
            proc.stdout.close()
            proc.stderr.close()
            raise subprocess.TimeoutExpired(proc.args, PROBE_TIMEOUT) from None
    err_bytes = proc.stderr.read()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        pipe.close()
    out = data.decode("utf-8", "replace")
    err = err_bytes.decode("utf-8", "replace")
    if proc.returncode == 255 and probe.END not in out:
        low = err.lower()
        if "banner exchange" in low:  # connected, but no SSH greeting came ("timed out during banner exchange")
            import paramiko

            raise paramiko.SSHException("Error reading SSH protocol banner")
        if "connection timed out" in low or "operation timed out" in low:
            raise socket.timeout("timed out")
        return None, err
    return out, err


def _local_run(command: str) -> tuple[str, str, int]:
    done = subprocess.run(["sh", "-c", command], stdin=subprocess.DEVNULL, capture_output=True, timeout=PROBE_TIMEOUT)
    return (done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace"), done.returncode)


# ---------------------------------------------------------------- judging one host


def _judge(
    facts: HostFacts,
    found: probe.ProbeResult,
    *,
    python: str,
    script: Optional[str],
    cwd: str,
    master_addr: str,
    master_port: Optional[int],
    master_ssh_port: int,
    is_master: bool,
    needed: int,
    where: str,
) -> None:
    """Fill facts from the parsed probe and set ok / reason / fix (the first problem wins)."""
    facts.hostname = found.hostname
    facts.ip_addr = found.ip_addr
    facts.ncpus = found.ncpus
    facts.python_ok = found.python_ok
    facts.script_ok = found.script_ok if script is not None else None
    facts.devices = found.devices
    facts.openmpi = found.openmpi
    facts.deepspeed = found.deepspeed
    facts.master_reachable = found.master_reachable
    if is_master and facts.port_free is None:
        facts.port_free = found.port_free

    problems: list[tuple[str, str]] = []
    if not found.complete:
        problems.append(
            (
                "the probe did not finish (is the login shell a POSIX shell?)",
                f"try it by hand: ssh {facts.host} 'sh -c true'",
            )
        )
    if facts.python_ok is False:
        path = found.python_path
        how = f"found at {path} but does not run" if path else "not found or not executable"
        problems.append(
            (
                f"python {python} {how} on {where}",
                "install Python at the same path on every host, or give --python with a path that exists everywhere",
            )
        )
    if found.cwd_ok is False:
        problems.append(
            (
                f"working directory {cwd} does not exist on {where}",
                "run from a directory that exists on every host (a shared filesystem), or create it there",
            )
        )
    elif script is not None and facts.script_ok is False:
        problems.append(
            (
                f"script {script} not found on {where} (cwd {cwd})",
                "copy the script to the same path on every host, or put it on a shared filesystem",
            )
        )
    if facts.devices is not None and needed and facts.devices < needed:
        extra = f"; {found.devices_error}" if found.devices_error else ""
        problems.append(
            (
                f"hl-smi sees {facts.devices} Gaudi device(s), {needed} needed{extra}",
                "lower slots= for this host in the hostfile (or --num_devices / --include), "
                "or check the devices with hl-smi",
            )
        )
    if facts.master_reachable is False:
        why = found.master_error or "connection failed"
        problems.append(
            (
                f"cannot reach the master {master_addr}:{master_ssh_port} from here ({why})",
                "check routing and firewalls between the hosts, or give --master_addr an address every host can reach",
            )
        )
    if is_master and master_port is not None and facts.port_free is False:
        why = found.port_error or "in use"
        problems.append(
            (
                f"master port {master_port} is busy on {where} ({why})",
                f"choose another --master_port, or stop what holds it (ss -ltnp 'sport = :{master_port}')",
            )
        )
    if problems:
        facts.ok = False
        facts.reason = "; ".join(p[0] for p in problems)
        facts.fix = "\n".join(p[1] for p in problems)
    else:
        facts.ok = True


def _versions_warning(what: str, by_host: dict[str, Optional[str]]) -> Optional[str]:
    groups: dict[str, list[str]] = {}
    for host, v in by_host.items():
        groups.setdefault(v or "not installed", []).append(host)
    if len(groups) < 2:
        return None
    return f"{what} differs across hosts: " + "; ".join(f"{v} on {', '.join(hs)}" for v, hs in groups.items())


# ---------------------------------------------------------------- check_hosts


def check_hosts(
    hosts: list[str],
    *,
    python: str,
    script: Optional[str],
    cwd: str,
    master_host: str,
    master_addr: str,
    master_port: Optional[int],
    devices_needed: dict[str, int],
    ssh: SshOptions,
    local: Callable[[str], bool],
    progress: Optional[Callable[[str, str], None]] = None,
    connections=None,
) -> CheckReport:
    """Probe every host in parallel (threads): over SSH (paramiko, keys only, never a prompt), or
    with ``sh -c`` for hosts where ``local(host)`` is true. See the module docstring.

    With ``connections`` (sshmux.Connections) the probe runs through the job's own ssh, whose
    connection stays open for the rest of the job; when that ssh fails before the probe ran,
    paramiko connects again to tell why (a failure costs a second attempt, a success nothing)."""
    _quiet_paramiko()
    loaded: dict = {}
    load_lock = threading.Lock()

    def config_of():
        """The ssh config as paramiko reads it (and its error): only when paramiko connects, or to
        name a remote master's port (importing paramiko alone costs a tenth of a second or more)."""
        with load_lock:
            if "config" not in loaded:
                loaded["config"] = _load_config(ssh)
        return loaded["config"]

    def target(host: str) -> _Target:
        return _target(host, ssh, config_of()[0])

    master_local = bool(local(master_host))

    # What the workers TCP-connect to for "master reachable": the master's sshd, or, when the master
    # is this machine (no sshd needed), a listener of ours: on the master port itself when it is free.
    listener: Optional[socket.socket] = None
    master_port_free: Optional[bool] = None
    if master_local:
        listener, master_port_free = _local_listener(master_port)
        master_probe_port = listener.getsockname()[1] if listener else (master_port or 22)
    else:
        master_probe_port = target(master_host).port

    def one(host: str) -> HostFacts:
        t0 = time.monotonic()
        facts = HostFacts(host=host, ok=False)
        is_master = host == master_host
        check_port = master_port if (is_master and not master_local) else None
        if is_master and master_local:
            facts.port_free = master_port_free
        cmd = probe.command(python, script, cwd, master_addr, master_probe_port, check_port)
        t: Optional[_Target] = None
        try:
            if local(host):
                where = f"{host} (this machine)"
                out, err, _ = _local_run(cmd)
            else:
                where = host
                try:
                    out = None
                    if connections is not None:  # the job's own ssh, left open as its connection
                        out, err = _master_run(
                            connections,
                            host,
                            probe.command(
                                python, script, cwd, master_addr, master_probe_port, check_port, agent=SESSION_AGENT
                            ),
                            ssh,
                        )
                    if out is None:  # no connection, or ssh failed before the probe: paramiko says why
                        config_error = config_of()[1]
                        t = target(host)
                        if config_error or t.config_error:
                            facts.reason = config_error or t.config_error
                            facts.fix = "fix the ssh config (--ssh-config)"
                            return facts
                        if t.proxy_jump and not t.proxy_command:
                            facts.reason = f"ProxyJump {t.proxy_jump} (ssh config) is not supported by the pre-flight"
                            facts.fix = f"use ProxyCommand ssh -W %h:%p {t.proxy_jump} in the ssh config instead"
                            return facts
                        missing = [k for k in t.key_files if not os.path.isfile(k)]
                        if missing:
                            facts.reason = f"identity file {missing[0]} does not exist"
                            facts.fix = "give an existing private key with --ssh-identity"
                            return facts
                        out, err, _ = _ssh_run(t, ssh, cmd)
                except _ProbeFailed as exc:
                    facts.reason = str(exc)
                    facts.fix = (
                        "check the host by hand: ssh to it and run hl-smi, mpirun --version and "
                        f"{python} -c 'import sys' (one of them may hang)"
                    )
                    return facts
                except Exception as exc:  # classified below: every failure becomes a reason + fix
                    t = t or target(host)
                    o = dataclasses.replace(ssh, port=t.port, known_hosts=t.known_hosts, strict=t.strict)
                    facts.reason, facts.fix = classify_ssh_error(
                        exc, f"{t.user}@{t.hostname}", o, _keys_description(t) or None
                    )
                    if t.hostname != t.name:
                        facts.reason += f" ({t.name} = {t.hostname} in the ssh config)"
                    return facts
            assert out is not None  # (every way above gave output or returned)
            found = probe.parse(out)
            _judge(
                facts,
                found,
                python=python,
                script=script,
                cwd=cwd,
                master_addr=master_addr,
                master_port=master_port,
                master_ssh_port=master_probe_port,
                is_master=is_master,
                needed=int(devices_needed.get(host, 0) or 0),
                where=where,
            )
            if not found.complete and err.strip():
                facts.reason = (facts.reason or "") + f" (stderr: {err.strip().splitlines()[-1][:200]})"
            return facts
        except subprocess.TimeoutExpired:
            facts.reason = f"the probe did not finish within {PROBE_TIMEOUT:g} s"
            facts.fix = (
                "check this machine by hand: run hl-smi, mpirun --version and "
                f"{python} -c 'import sys' (one of them may hang)"
            )
            return facts
        except Exception as exc:  # never let one host take the whole check down
            facts.reason = f"pre-flight failed: {type(exc).__name__}: {exc}"
            facts.fix = "rerun with GAUDI_LAUNCH_DEBUG=1 and report it"
            return facts
        finally:
            facts.elapsed_s = time.monotonic() - t0

    def done(host: str, f: HostFacts) -> None:
        if progress is not None:
            progress(host, "OK" if f.ok else f"failed: {f.reason}")

    try:
        facts_by_host = per_host(hosts, one, on_done=done, name="preflight")
    finally:
        if listener is not None:
            listener.close()

    ordered = {h: facts_by_host[h] for h in hosts}
    return CheckReport(facts=ordered, warnings=_warnings(ordered))


def _local_listener(port: Optional[int]) -> tuple[Optional[socket.socket], Optional[bool]]:
    """A listening socket on this machine: on ``port`` when it is free (then True), else on any port."""
    free: Optional[bool] = None
    if port is not None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
            s.listen(128)
            return s, True
        except OSError:
            s.close()
            free = False
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("", 0))
        s.listen(128)
    except OSError:
        s.close()
        return None, free
    return s, free


def _warnings(facts: dict[str, HostFacts]) -> list[str]:
    probed = {h: f for h, f in facts.items() if f.hostname is not None or f.python_ok is not None}
    out = []
    w = _versions_warning("OpenMPI version", {h: f.openmpi for h, f in probed.items()})
    if w:
        out.append(w)
    w = _versions_warning("DeepSpeed version", {h: f.deepspeed for h, f in probed.items() if f.python_ok})
    if w:
        out.append(w)
    no_smi = [h for h, f in probed.items() if f.devices is None]
    if no_smi:
        out.append(f"device count not checked (no hl-smi) on {', '.join(no_smi)}")
    return out
