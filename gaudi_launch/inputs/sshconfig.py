"""The user's ssh_config, read as OpenSSH reads it: where each host's ssh goes and as whom.

One reader for everything the launcher decides from ssh's configuration (the pre-flight's own
client, the ssh options every backend passes, the host watch, ``--wait-hosts``, teardown): the
endpoint (HostName), user, port, identity files and host key policy (StrictHostKeyChecking,
UserKnownHostsFile) of a host, and the one rule for its login user (``login_user``).

Why a reader of our own and not ``ssh -G HOST`` (OpenSSH evaluating its own files exactly): ``ssh -G``
is a process per host, 7 ms each here (50 in a row: 0.35 s), so a 1,000-host dry run would spend
seconds on it; this reader takes about 25 us a host with a 260-line config and its Include'd files
(2 cores, measured), and paramiko's SSHConfig neither follows Include nor reads /etc/ssh/ssh_config.
It follows readconf.c for what the launcher needs (tests/unit/inputs/test_sshconfig.py compares it
with ``ssh -G``), and says so (``NeedsOpenSSH``) where only OpenSSH can decide: ``Match exec`` (runs a
command), ``canonical``/``final`` with hostname canonicalisation (DNS), ``localnetwork``, ``tagged``
and the like. The launcher then asks ``ssh -G`` for just those hosts when it is about to connect
(remote/sshresolve.py); a plan (a dry run) never spawns one: where only ssh can tell the host key
policy, the job's ssh options leave it to ssh.

OpenSSH's order, as readconf.c has it: command-line values first (``-p``, ``-l``, ``-i``, and a
``user@`` in the destination when no ``-l``), then the ``-F`` file alone, or else ~/.ssh/config then
/etc/ssh/ssh_config; the first value obtained for an option wins (IdentityFile accumulates). ``Host``
patterns match the name as given (``*``, ``?``, ``!`` negation: one negated match turns the block
off); ``Match host`` matches the HostName found so far (lowercase, comma lists). ``Include`` reads its
files (globbed, relative to ~/.ssh in user files and /etc/ssh in the system file) where it stands,
starting in the including block's state; one reached from an inactive block sets nothing.

Pure but for reading the config files (each file read once per ``SshConfig``).
"""

from __future__ import annotations

import functools
import getpass
import glob
import os
import re
from dataclasses import dataclass
from typing import Optional

from gaudi_launch.inputs.hostnames import split_user
from gaudi_launch.inputs.readfile import MAX_INPUT_BYTES, read_bounded

SYSTEM_CONFIG = "/etc/ssh/ssh_config"
MAX_DEPTH = 16  # readconf.c's READCONF_MAX_DEPTH
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
# Match criteria this reader evaluates itself; any other one is OpenSSH's to decide (NeedsOpenSSH).
_MATCH_OWN = ("all", "host", "originalhost", "user", "localuser")
_MULTI = ("identityfile", "certificatefile", "localforward", "remoteforward", "dynamicforward", "sendenv")
_RAW = ("proxycommand", "localcommand", "remotecommand", "knownhostscommand")  # the rest of the line, unsplit


class NeedsOpenSSH(Exception):
    """The config asks for something only OpenSSH can evaluate (names the file and line)."""


class SshConfigError(ValueError):
    """A config line OpenSSH itself would refuse (bad quotes, an option without its value)."""


@dataclass(frozen=True)
class HostConfig:
    """One host as ssh would reach it."""

    name: str  # the host part of the hostfile entry (what Host lines match)
    hostname: str  # where ssh connects: HostName (%h expanded), else name
    user: str  # login user (login_user's rule)
    user_from: str  # where that user came from: "command line", "hostfile", "ssh config", "local user"
    port: int
    identity_files: tuple[str, ...]  # -i, then IdentityFile lines, expanded (may not exist)
    identities_only: bool
    strict_host_keys: Optional[str]  # StrictHostKeyChecking (strict_value's yes/no/ask/accept-new), None: not set
    known_hosts: tuple[str, ...]  # UserKnownHostsFile (expanded), else ssh's defaults
    global_known_hosts: tuple[str, ...]
    proxy_command: Optional[str] = None
    proxy_jump: Optional[str] = None


def login_user(
    entry_user: Optional[str], config_user: Optional[str], local_user: str, command_line: Optional[str] = None
) -> tuple[str, str]:
    """The one rule for whom a host is logged in as, and where that came from. Pure.

    ssh's own: a command-line user (``-l``) first, then the ``user@`` of the destination (the hostfile's
    ``user@host``), then ssh_config's ``User`` for that host, else the local user. Every ssh the
    launcher runs names the hostfile entry as its destination, so ssh applies the same rule."""
    if command_line:
        return command_line, "command line"
    if entry_user:
        return entry_user, "hostfile"
    if config_user:
        return config_user, "ssh config"
    return local_user, "local user"


# ------------------------------------------------------------------------------------------ parsing


@dataclass(frozen=True)
class Line:
    path: str
    number: int
    keyword: str  # lower case
    args: tuple[str, ...]  # ProxyCommand and friends: the rest of the line, whole


_KEYWORD = re.compile(r"[ \t]*([^ \t=]+)(?:[ \t]*=[ \t]*|[ \t]+)?(.*)")


def split_args(text: str) -> list[str]:
    """misc.c's argv_split with comments: words split on blanks, '...' and "..." quoted, backslash
    escapes for quotes, backslash and (unquoted) a blank, an unquoted '#' starting a word ends the line."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] in " \t":
            i += 1
            continue
        if text[i] == "#":
            break
        word, quote = [], ""
        while i < n:
            c = text[i]
            if c == "\\" and i + 1 < n and (text[i + 1] in "'\"\\" or (not quote and text[i + 1] == " ")):
                word.append(text[i + 1])
                i += 2
                continue
            if not quote and c in " \t":
                break
            if not quote and c in "'\"":
                quote = c
            elif quote and c == quote:
                quote = ""
            else:
                word.append(c)
            i += 1
        if quote:
            raise SshConfigError("invalid quotes")
        out.append("".join(word))
    return out


def parse(text: str, path: str = "<config>") -> list[Line]:
    """The lines of one config file that say something. Pure."""
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        m = _KEYWORD.match(line.rstrip(" \t\f\r"))
        if not m or not m.group(1) or m.group(1).startswith("#"):
            continue
        keyword, rest = m.group(1).lower(), m.group(2)
        try:
            args = tuple(split_args(rest)) if keyword not in _RAW else (rest,)
        except SshConfigError as exc:
            raise SshConfigError(f"{path} line {number}: {exc}") from None
        if not args or not rest.strip():
            raise SshConfigError(f'{path} line {number}: no argument after keyword "{m.group(1)}"')
        lines.append(Line(path, number, keyword, args))
    return lines


def match_pattern(s: str, pattern: str) -> bool:
    """match.c's match_pattern: '*' any run, '?' any one character, the rest literal (case counts)."""
    if "*" not in pattern and "?" not in pattern:
        return s == pattern
    return _compiled(pattern).fullmatch(s) is not None


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern), re.DOTALL)


def match_pattern_list(s: str, patterns: str, lower: bool = False) -> int:
    """match.c's match_pattern_list: 1 a pattern of the comma list matches, -1 a negated one does (which
    decides), 0 neither."""
    found = 0
    for sub in patterns.split(","):
        negated = sub.startswith("!")
        sub = sub[1:] if negated else sub
        if match_pattern(s, sub.lower() if lower else sub):
            if negated:
                return -1
            found = 1
    return found


# ------------------------------------------------------------------------------------------ evaluation


class SshConfig:
    """The ssh config files one ssh would read: ``config`` (``-F``; "none": no file), else the user's
    ~/.ssh/config and then the system's. ``home`` and ``system`` are for tests."""

    def __init__(
        self,
        config: Optional[str] = None,
        *,
        home: Optional[str] = None,
        system: str = SYSTEM_CONFIG,
        local_user: Optional[str] = None,
    ):
        self.home = home or os.path.expanduser("~")
        self.local_user = local_user or _local_user()
        self.config = config
        if config is not None:
            self.files = [] if config.lower() == "none" else [(self._tilde(config), True)]
        else:
            self.files = [(os.path.join(self.home, ".ssh", "config"), True), (system, False)]
        self._parsed: dict[str, list[Line]] = {}
        self._globbed: dict[tuple, list[str]] = {}
        self._plain: dict[int, Optional[frozenset]] = {}  # None: not plain names
        self._only: dict[str, Optional[frozenset]] = {}

    def _tilde(self, path: str) -> str:
        if path == "~" or path.startswith("~/"):
            return self.home + path[1:]
        return os.path.expanduser(path)

    def lines_of(self, path: str) -> list[Line]:
        """One file's lines (read once); a missing file is empty (ssh skips it too)."""
        if path not in self._parsed:
            try:  # bounded, non-blocking, a regular file: /dev/zero or a FIFO must not eat memory or hang
                data = read_bounded(path, MAX_INPUT_BYTES)
            except (FileNotFoundError, NotADirectoryError):
                data = b""
            except IsADirectoryError:
                raise SshConfigError(f"{path} is a directory, not an ssh config file") from None
            except OSError as exc:
                raise SshConfigError(f"{path}: {exc.strerror or exc}") from None
            if len(data) > MAX_INPUT_BYTES:
                raise SshConfigError(f"{path} is larger than {MAX_INPUT_BYTES >> 20} MiB, not an ssh config file")
            text = data.decode("utf-8", errors="replace")
            self._parsed[path] = parse(text, path)
        return self._parsed[path]

    def mentions(self, keyword: str) -> bool:
        """Whether any file ssh would read (Includes followed) sets ``keyword`` for any host at all."""
        seen: set = set()

        def walk(path: str, user_file: bool, depth: int) -> bool:
            if depth > MAX_DEPTH or path in seen:
                return False
            seen.add(path)
            for line in self.lines_of(path):
                if line.keyword == keyword:
                    return True
                if line.keyword == "include" and any(
                    walk(p, user_file, depth + 1) for p in self._included(line, user_file)
                ):
                    return True
            return False

        return any(walk(path, user_file, 0) for path, user_file in self.files)

    def lookup(
        self,
        entry: str,
        *,
        port: Optional[int] = None,
        identity: Optional[str] = None,
        user: Optional[str] = None,
    ) -> HostConfig:
        """How ssh would reach hostfile entry ``entry`` ('host' or 'user@host') with the launcher's
        command-line ``port`` (-p), ``identity`` (-i) and ``user`` (-l). Raises NeedsOpenSSH where
        only ssh can tell, SshConfigError for a line ssh itself refuses."""
        entry_user, name = split_user(entry)
        found: dict[str, tuple[str, ...]] = {}
        if port:
            found["port"] = (str(port),)
        if user or entry_user:
            found["user"] = ((user or entry_user) or "",)
        identities = [identity] if identity else []
        for path, user_file in self.files:
            active = [True]
            self._read(path, user_file, name, found, identities, active, depth=0)
        if found.get("canonicalizehostname", ("no",))[0].lower() not in ("no", "false"):
            raise NeedsOpenSSH("CanonicalizeHostname is on (ssh resolves the name and reads the config again)")
        hostname = _percent_h(found.get("hostname", (name,))[0], name)
        hostname = hostname if ":" in hostname else hostname.lower()  # ssh lowercases names, not addresses
        config_user = found.get("user", (None,))[0] if not (user or entry_user) else None
        login, source = login_user(entry_user, config_user, self.local_user, user)
        try:
            port_value = int(found.get("port", ("22",))[0])
        except ValueError:
            raise SshConfigError(f"bad Port {found['port'][0]!r} for {name} in the ssh config") from None
        tokens = {"h": hostname, "n": name, "p": str(port_value), "r": login, "u": self.local_user, "d": self.home}
        strict = found.get("stricthostkeychecking", (None,))[0]
        proxy = found.get("proxycommand", (None,))[0]
        jump = found.get("proxyjump", (None,))[0]
        return HostConfig(
            name=name,
            hostname=hostname,
            user=login,
            user_from=source,
            port=port_value,
            identity_files=tuple(self._expand(p, tokens) for p in identities),
            identities_only=found.get("identitiesonly", ("no",))[0].lower() in ("yes", "true"),
            strict_host_keys=strict_value(strict),
            known_hosts=tuple(self._expand(p, tokens) for p in found.get("userknownhostsfile", DEFAULT_KNOWN_HOSTS)),
            global_known_hosts=tuple(
                self._expand(p, tokens) for p in found.get("globalknownhostsfile", DEFAULT_GLOBAL_KNOWN_HOSTS)
            ),
            proxy_command=None if not proxy or proxy.strip().lower() == "none" else proxy.strip(),
            proxy_jump=None if not jump or jump.lower() == "none" else jump,
        )

    def _read(self, path, user_file, name, found, identities, active, *, depth) -> None:
        """One file's lines in order (readconf.c's read_config_file_depth), ``active`` the block state.
        An Include is followed only from an active block: from an inactive one nothing it holds can
        apply (readconf.c reads it with SSHCONF_NEVERMATCH), so it is not read at all."""
        if depth > MAX_DEPTH:
            raise SshConfigError(f"{path}: too many nested Include lines (more than {MAX_DEPTH})")
        only = self._only_for(path)
        if only is not None and name not in only:
            return  # plain Host blocks, none naming this host: nothing here applies (a 1,000-host file)
        for line in self.lines_of(path):
            kw = line.keyword
            if kw == "host":
                active[0] = self._host_matches(name, line)
            elif kw == "match":
                active[0] = self._match(line, name, found)
            elif kw == "include":
                if not active[0]:
                    continue
                for included in self._included(line, user_file):
                    self._read(included, user_file, name, found, identities, active, depth=depth + 1)
                    active[0] = True  # the including block's state again: a Match in there ends with its file
            elif not active[0]:
                continue
            elif kw in ("identityfile", "identityfile2"):
                identities.append(line.args[0])
            elif kw in _MULTI:
                continue
            elif kw not in found:
                found[kw] = line.args

    def _only_for(self, path: str) -> Optional[frozenset]:
        """The names a file's options can apply to, when it is only Host blocks of plain names (no
        pattern, negation, Match or Include, nothing before its first Host line); else None."""
        if path not in self._only:
            lines = self.lines_of(path)
            plain = bool(lines) and lines[0].keyword == "host"
            names: set = set()
            for line in lines:
                if line.keyword in ("match", "include"):
                    plain = False
                elif line.keyword == "host":
                    plain = plain and all(p[:1] != "!" and "*" not in p and "?" not in p for p in line.args)
                    names.update(line.args)
                if not plain:
                    break
            self._only[path] = frozenset(names) if plain else None
        return self._only[path]

    def _host_matches(self, name: str, line: Line) -> bool:
        """A Host line: one of its patterns matches and no negated one does. A line of plain names (the
        usual host-by-host config) is one set lookup, built once."""
        key = id(line)  # lines live as long as this reader: ids stay theirs
        if key not in self._plain:
            literal = all(not p.startswith("!") and "*" not in p and "?" not in p for p in line.args)
            self._plain[key] = frozenset(line.args) if literal else None
        plain = self._plain[key]
        if plain is not None:
            return name in plain
        hit = False
        for pattern in line.args:
            negated = pattern.startswith("!")
            if match_pattern(name, pattern[1:] if negated else pattern):
                if negated:
                    return False
                hit = True
        return hit

    def _match(self, line: Line, name: str, found: dict) -> bool:
        """readconf.c's match_cfg_line for the criteria in _MATCH_OWN (all must hold)."""
        hostname = _percent_h(found["hostname"][0], name) if "hostname" in found else name
        user = found.get("user", (self.local_user,))[0]
        words = list(line.args)
        result = True
        while words:
            attrib = words.pop(0)
            negate = attrib.startswith("!")
            bare = attrib[1:] if negate else attrib
            criterion, eq, value = bare.partition("=")
            criterion = criterion.lower()
            if criterion not in _MATCH_OWN:
                raise NeedsOpenSSH(f"{line.path} line {line.number}: Match {criterion} (only ssh can evaluate it)")
            if criterion == "all":
                if words or not result:
                    raise SshConfigError(f"{line.path} line {line.number}: 'all' cannot be combined with others")
                return not negate
            if not eq:
                if not words:
                    raise SshConfigError(f"{line.path} line {line.number}: missing argument for Match {criterion}")
                value = words.pop(0)
            if criterion == "host":
                hit = match_pattern_list(hostname.lower(), value, lower=True) == 1
            elif criterion == "originalhost":
                hit = match_pattern_list(name.lower(), value, lower=True) == 1
            elif criterion == "user":
                hit = match_pattern_list(user, value) == 1
            else:
                hit = match_pattern_list(self.local_user, value) == 1
            if hit == negate:
                result = False
        return result

    def _included(self, line: Line, user_file: bool) -> list[str]:
        """The files one Include line names, in glob order (sorted, as glob(3) sorts); globbed once."""
        key = (line.path, line.number, user_file)
        if key not in self._globbed:
            self._globbed[key] = self._glob(line, user_file)
        return self._globbed[key]

    def _glob(self, line: Line, user_file: bool) -> list[str]:
        out = []
        for arg in line.args:
            if "%" in arg:
                raise NeedsOpenSSH(f"{line.path} line {line.number}: Include with %-tokens")
            arg = re.sub(r"\$\{(\w+)\}", lambda m: os.environ.get(m.group(1), ""), arg)
            if arg.startswith("~"):
                if not user_file:
                    raise SshConfigError(f"{line.path} line {line.number}: bad include path {arg}")
                arg = self._tilde(arg)
            elif not os.path.isabs(arg):
                arg = os.path.join(os.path.join(self.home, ".ssh") if user_file else "/etc/ssh", arg)
            out += sorted(glob.glob(arg))
        return out

    def _expand(self, path: str, tokens: dict[str, str]) -> str:
        """~ and the %-tokens ssh expands in file names (%d %h %n %p %r %u %%; others left as they are)."""
        path = re.sub(r"%([%dhnpru])", lambda m: "%" if m.group(1) == "%" else tokens[m.group(1)], path)
        return self._tilde(path)


_STRICT = {
    "yes": "yes",
    "true": "yes",
    "no": "no",
    "false": "no",
    "off": "no",
    "ask": "ask",
    "accept-new": "accept-new",
}


def strict_value(value: Optional[str]) -> Optional[str]:
    """StrictHostKeyChecking in one spelling (yes, no, ask, accept-new; ssh -G says true/false). Pure."""
    return _STRICT.get(value.lower(), value.lower()) if value else None


def _percent_h(hostname: str, name: str) -> str:
    """HostName's tokens: %h is the name as given, %% a percent sign."""
    return re.sub(r"%([%h])", lambda m: name if m.group(1) == "h" else "%", hostname)


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def host_key_policy(config: SshConfig, hosts) -> Optional[str]:
    """StrictHostKeyChecking as the ssh config sets it for the first of ``hosts`` that has it, "unknown"
    when some host's value only ssh can evaluate, None when set for none of them. A file that never
    mentions the option answers None without a lookup per host (a 1,000-host dry run)."""
    try:
        if not config.mentions("stricthostkeychecking"):
            return None
    except NeedsOpenSSH:
        return "unknown"
    for host in hosts:
        try:
            value = config.lookup(host).strict_host_keys
        except NeedsOpenSSH:
            return "unknown"
        if value:
            return value
    return None
