"""Environment files (DeepSpeed's ``.deepspeed_env``), ``-x KEY=VALUE`` options and secret masking.

DeepSpeed reads ``~/.deepspeed_env`` and ``./.deepspeed_env`` (the file name can be changed with
``DS_ENV_FILE``), splits each line on the first ``=`` and hands the pair to a remote shell. Here the
same files are read with strict dotenv rules instead, so a value arrives byte-exact on every node:

* blank lines and whole-line ``#`` comments are skipped; an optional leading ``export`` is allowed;
* ``NAME=VALUE`` is split on the first ``=``; NAME must match ``[A-Za-z_][A-Za-z0-9_]*``;
* an unquoted value is stripped and ends at whitespace followed by ``#`` (a trailing comment);
* ``'single quoted'`` values are literal; ``"double quoted"`` values understand ``\\\\ \\" \\n \\t \\$``
  and keep everything else as written; nothing is ever expanded (``$HOME``, ``$(cmd)``, backticks);
* after a closing quote only whitespace and an optional ``# comment`` may follow.

Any problem is a :class:`UserError` naming ``file:line``.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import re
import shlex
import stat
from collections.abc import Iterable, Mapping
from typing import Optional

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.readfile import read_regular

__all__ = [
    "DEFAULT_NAME",
    "parse_env_text",
    "load_env_files",
    "parse_assignments",
    "is_secret",
    "secrets_in",
    "url_passwords",
    "value_secrets",
    "straddling",
    "mask_env",
    "mask_text",
]

DEFAULT_NAME = ".deepspeed_env"

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Whitespace that is stripped around names and unquoted values. Deliberately ASCII only, so that
# unusual characters in a value (NBSP, U+2028, ...) are kept byte-exact.
_WS = " \t\r\f\v"
_EXPORT_RE = re.compile(r"export[ \t]+")
_COMMENT_RE = re.compile(r"[ \t\f\v\r]#")
_DQ_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "$": "$"}

_NAME_HINT = "a variable name starts with a letter or '_' and contains only letters, digits and '_'"
_QUOTE_HINT = "values cannot span lines; close the quote on the same line (inside double quotes write a newline as \\n)"


def _check_name(name: str) -> bool:
    return _NAME_RE.fullmatch(name) is not None


def _parse_double_quoted(body: str) -> Optional[tuple[str, str]]:
    """``body`` is the text after the opening ``"``; return (value, rest after the closing quote)."""
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        ch = body[i]
        if ch == '"':
            return "".join(out), body[i + 1 :]
        if ch == "\\" and i + 1 < n:
            nxt = body[i + 1]
            if nxt in _DQ_ESCAPES:
                out.append(_DQ_ESCAPES[nxt])
            else:  # unknown escape: keep both characters as written
                out.append(ch)
                out.append(nxt)
            i += 2
            continue
        out.append(ch)
        i += 1
    return None


def _parse_value(raw: str, where: str) -> str:
    """Parse the part of a line after the first ``=``."""
    stripped = raw.lstrip(_WS)
    if stripped[:1] in ("'", '"'):
        quote = stripped[0]
        if quote == "'":
            end = stripped.find("'", 1)
            if end < 0:
                raise UserError("unterminated single quote", where=where, hint=_QUOTE_HINT)
            value, rest = stripped[1:end], stripped[end + 1 :]
        else:
            parsed = _parse_double_quoted(stripped[1:])
            if parsed is None:
                raise UserError("unterminated double quote", where=where, hint=_QUOTE_HINT)
            value, rest = parsed
        rest = rest.strip(_WS)
        if rest and not rest.startswith("#"):
            raise UserError(
                f"unexpected text after the closing quote: {rest!r}",
                where=where,
                hint="quote the whole value, e.g. NAME='a b c'; only a '# comment' may follow it",
            )
        return value
    match = _COMMENT_RE.search(raw)
    if match is not None:
        raw = raw[: match.start()]
    return raw.strip(_WS)


def parse_env_text(text: str, source: str) -> dict[str, str]:
    """Parse the text of an env file; ``source`` (usually its path) is used in error messages."""
    if text.startswith("\ufeff"):
        text = text[1:]
    env: dict[str, str] = {}
    for lineno, line in enumerate(text.split("\n"), start=1):
        where = f"{source}:{lineno}"
        line = line.strip(_WS)  # also drops the \r of CRLF line endings
        if not line or line.startswith("#"):
            continue
        export = _EXPORT_RE.match(line)
        body = line[export.end() :] if export is not None else line
        name, sep, raw = body.partition("=")
        if not sep:
            raise UserError(
                f"expected NAME=VALUE, got {line!r}",
                where=where,
                hint="write NAME=VALUE (or comment the line out with '#')",
            )
        name = name.strip(_WS)
        if not name:
            raise UserError("missing variable name before '='", where=where, hint=_NAME_HINT)
        if not _check_name(name):
            raise UserError(f"invalid variable name {name!r}", where=where, hint=_NAME_HINT)
        value = _parse_value(raw, where)
        if "\0" in value:
            raise UserError(
                f"the value of {name} contains a NUL character",
                where=where,
                hint="environment variables cannot hold NUL characters; remove it",
            )
        env[name] = value  # a later duplicate overrides the earlier one
    return env


MAX_ENV_FILE_BYTES = 1 << 20
# Variables that choose what code a rank's process loads or runs before the script: from a file that was
# only found (./.deepspeed_env in a shared working directory, $DS_ENV_FILE), they would run its writer's code
# as this user on every host. Such a file may set them only when named with --env-file.
LOADER_VARIABLES = frozenset(
    {
        "LD_PRELOAD",
        "LD_AUDIT",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "PYTHONUSERBASE",
        "PYTHONEXECUTABLE",
        "PYTHONINSPECT",
        "BASH_ENV",
        "ENV",
    }
)


def owner_problem(st: os.stat_result, uid: int) -> Optional[str]:
    """Why an env file that was found, not named, with status ``st`` may not be used by user ``uid``, or
    None: ssh's StrictModes rule, owned by the user (or root) and writable by nobody else. Pure."""
    if st.st_uid not in (uid, 0):
        return f"belongs to {_user_name(st.st_uid)}"
    if st.st_mode & 0o022:
        return f"is writable by {'others' if st.st_mode & 0o002 else 'its group'} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _user_name(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, OverflowError):
        return f"uid {uid}"


def _read_env_file(path: str, found: bool = False) -> dict[str, str]:
    """Read and parse an env file. ``found``: the file was looked up (not named with --env-file): it must
    be this user's (or root's) and writable by nobody else, and may not set :data:`LOADER_VARIABLES`."""
    try:
        data, st = read_regular(path, MAX_ENV_FILE_BYTES)
    except IsADirectoryError:
        raise UserError(
            "is a directory, not an env file", where=path, hint="point at a file of NAME=VALUE lines"
        ) from None
    except PermissionError:
        raise UserError(
            "permission denied while reading the env file",
            where=path,
            hint="make the file readable by this user (e.g. chmod u+r)",
        ) from None
    except OSError as exc:
        raise UserError(
            f"cannot read the env file: {exc.strerror or exc}",
            where=path,
            hint="check that the path is a readable file",
        ) from None
    if len(data) > MAX_ENV_FILE_BYTES:
        raise UserError(
            f"the env file is larger than {MAX_ENV_FILE_BYTES >> 20} MiB",
            where=path,
            hint="an env file holds NAME=VALUE lines",
        )
    problem = owner_problem(st, os.geteuid()) if found else None
    if problem:
        raise UserError(
            f"the env file {problem}: another user could set the job's variables (PYTHONPATH runs their code "
            "as you on every rank), so it is not read",
            where=path,
            hint=f"if the file is yours to trust: chown $USER {path}; chmod go-w {path}, or name it with "
            "--env-file; otherwise remove it",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UserError(
            "the env file is not valid UTF-8", where=f"{path}:{line}", hint="save the file as UTF-8"
        ) from None
    env = parse_env_text(text, path)
    loaders = [name for name in env if name in LOADER_VARIABLES] if found else []
    if loaders:
        line = _line_of(text, loaders[0])
        raise UserError(
            f"{loaders[0]} in an env file that was found, not named: it decides what code every rank loads",
            where=f"{path}:{line}",
            hint=f"name the file with --env-file {path} to use it, or export {loaders[0]} and pass -x {loaders[0]}",
        )
    return env


def _line_of(text: str, name: str) -> int:
    """The line of ``text`` that sets ``name`` last (the one that took effect). Pure."""
    found = 1
    pattern = re.compile(rf"[{_WS}]*(?:export[ \t]+)?{re.escape(name)}[{_WS}]*=")
    for lineno, line in enumerate(text.split("\n"), start=1):
        if pattern.match(line.lstrip("\ufeff")):
            found = lineno
    return found


def _expand_home(path: str, home: str) -> str:
    if path == "~":
        return home
    if path.startswith("~/"):
        return os.path.join(home, path[2:])
    return path


def _require_file(path: str, where: str, what: str) -> None:
    if os.path.isfile(path):
        return
    if os.path.isdir(path):
        raise UserError(
            f"{what} {path} is a directory, not a file", where=where, hint="point at a file of NAME=VALUE lines"
        )
    if os.path.lexists(path):
        if os.path.islink(path):
            raise UserError(f"{what} {path} is a broken symbolic link", where=where, hint="fix or remove the link")
        raise UserError(f"{what} {path} is not a regular file", where=where, hint="point at a file of NAME=VALUE lines")
    raise UserError(
        f"{what} {path} does not exist",
        where=where,
        hint="check the path, or leave the option out to use ~/.deepspeed_env and ./.deepspeed_env",
    )


def load_env_files(
    *,
    explicit: Optional[str] = None,
    name: Optional[str] = None,
    cwd: Optional[str] = None,
    home: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> tuple[dict[str, str], list[str]]:
    """Read the env files the way DeepSpeed finds them; return (merged values, paths read in order).

    ``explicit`` (``--env-file PATH``) is the only file read when given, and it must exist.
    Otherwise the file name is ``name``, else ``$DS_ENV_FILE``, else :data:`DEFAULT_NAME`; a
    relative name is looked up in ``home`` and then ``cwd`` (the latter wins key by key), an
    absolute one is read on its own and must exist. A file found so (not named with --env-file) is
    used only if it is this user's or root's and nobody else can write it, and it may not set
    :data:`LOADER_VARIABLES` (exit 2 naming the file and its owner, or the line).
    """
    if environ is None:
        environ = os.environ
    if home is None:
        home = os.path.expanduser("~")
    if cwd is None:
        cwd = os.getcwd()

    if explicit is not None:
        path = _expand_home(explicit, home)
        if path and not os.path.isabs(path):
            path = os.path.join(cwd, path)
        _require_file(path, "--env-file", "env file")
        return _read_env_file(path), [path]

    if name:
        fname, where = name, None
    elif environ.get("DS_ENV_FILE"):
        fname, where = environ["DS_ENV_FILE"], "DS_ENV_FILE"
    else:
        fname, where = DEFAULT_NAME, None
    fname = _expand_home(fname, home)

    if os.path.isabs(fname):
        _require_file(fname, where or fname, "env file")
        return _read_env_file(fname, found=True), [fname]

    merged: dict[str, str] = {}
    read: list[str] = []
    for base in (home, cwd):
        path = os.path.join(base, fname)
        if not os.path.lexists(path):
            continue
        _require_file(path, path, "env file")
        if any(_same_file(path, earlier) for earlier in read):
            continue
        merged.update(_read_env_file(path, found=True))
        read.append(path)
    return merged, read


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def parse_assignments(
    items: Iterable[str], option: str = "-x", environ: Optional[Mapping[str, str]] = None
) -> dict[str, str]:
    """Parse ``KEY=VALUE`` items from the command line (values byte-exact, later wins).

    With ``environ``, a bare ``KEY`` passes that variable's value from it, as mpirun's ``-x KEY``
    does: ``-x KEY="$KEY"`` would put the value in gaudi-launch's own argv, which ``ps`` shows.
    """
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep and environ is not None and _check_name(name):
            if name not in environ:
                hint = (  # a secret's value on the command line is in ps for every user of the host
                    f"export {name} in this shell first, or put {name}=... in an env file of yours (chmod 600) "
                    "and pass --env-file FILE"
                    if is_secret(name)
                    else f"export {name} first, or write {option} {name}=VALUE"
                )
                raise UserError(f"{name} is not set in this environment", where=option, hint=hint)
            value = environ[name]
        elif not sep:
            raise UserError(
                f"expected KEY=VALUE, got {item!r}",
                where=option,
                hint=f"write {option} NAME=VALUE",
            )
        if not _check_name(name):
            shown = f"{name}=..." if value else f"{name}="
            raise UserError(f"invalid variable name {name!r} in {shown!r}", where=option, hint=_NAME_HINT)
        if "\0" in value:
            raise UserError(
                f"the value of {name} contains a NUL character",
                where=option,
                hint="environment variables cannot hold NUL characters",
            )
        env[name] = value
    return env


_SECRET_PARTS = frozenset(
    {
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "PASS",
        "PWD",  # MYSQL_PWD, DB_PWD; not PWD itself, the shell's working directory (_NOT_SECRET)
        "PASSPHRASE",
        "PAT",  # a personal access token: GITHUB_PAT, AZURE_DEVOPS_EXT_PAT
        "KEY",
        "APIKEY",
        "CREDENTIAL",
        "CREDENTIALS",
        "PRIVATE",
        "AUTH",  # NPM_AUTH, BASIC_AUTH; not SSH_AUTH_SOCK (_NOT_SECRET)
        "JWT",
        "DSN",  # SENTRY_DSN: a URL with its key
        "WEBHOOK",  # SLACK_WEBHOOK_URL: whoever has it may post
        "COOKIE",
    }
)
# SESSION holds a secret as the name's last word or before ID (FLASK_SESSION, SESSION_ID; SESSION_SECRET and
# SESSION_KEY by their own words), not in the middle of a setting's name (TEST_SESSION_DEADLINE_S, CI's own).
_SECRET_SUBSTRINGS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "APIKEY", "CONNECTIONSTRING")
# Names with a secret-looking part that hold none: the shell's working directories, and what a desktop or
# login session exports (masking XDG_SESSION_CLASS=user would hide every "user" in the job's output).
_NOT_SECRET = frozenset(
    {
        "PWD",
        "OLDPWD",
        "SSH_AUTH_SOCK",  # a socket path, new at each login: a replayed plan would see a "changed secret"
        "DESKTOP_SESSION",
        "SESSION_MANAGER",
        "GDMSESSION",
        "DBUS_SESSION_BUS_ADDRESS",
        "XAUTHORITY",
    }
)
_NOT_SECRET_PREFIXES = ("XDG_SESSION_",)
# Values that are credentials whatever their variable's name: a bearer token, a JWT, and the key fields of
# a connection string (Azure's AccountKey=, SharedAccessKey=, SharedAccessSignature=; ADO.NET's Password=).
_VALUE_SECRETS = re.compile(
    r"\bBearer\s+(?P<bearer>[A-Za-z0-9._~+/=-]{8,})"
    r"|(?P<jwt>\beyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*)"
    r"|(?:^|;)\s*(?:AccountKey|SharedAccessKey|SharedAccessSignature|Password|Pwd)\s*=\s*(?P<field>[^;]+)",
    re.IGNORECASE,
)
MASK = "***"
# The password of a URL's userinfo, scheme://user:PASSWORD@host (the user may be empty: redis://:pw@h).
# It ends at the host's last "@" (an unencoded "@" in a password) and never crosses "/", "?" or "#".
_URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*:([^\s/?#]+)@")


def _name_parts(name: str) -> list[str]:
    """HF_TOKEN -> HF, TOKEN; githubPat -> GITHUB, PAT (camel case splits too)."""
    return re.split(r"[^A-Z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).upper())


def url_passwords(value: str) -> list[str]:
    """The userinfo passwords of the URLs in ``value`` (DATABASE_URL=postgres://u:PW@h/db). Pure."""
    return [m.group(1) for m in _URL_PASSWORD.finditer(value)] if "://" in value else []


def value_secrets(value: str) -> list[str]:
    """The credentials in ``value`` whatever its name: URL passwords, a ``Bearer`` token, a JWT, a
    connection string's AccountKey=/SharedAccessKey=/SharedAccessSignature=/Password=. Pure."""
    found = url_passwords(value)
    for m in _VALUE_SECRETS.finditer(value):
        found.append(next(g for g in m.groups() if g).strip())
    return found


def is_secret(name: str, value: str = "") -> bool:
    """True when the variable looks like it holds a credential: by its name (HF_TOKEN, DB_PASSWORD,
    GITHUB_PAT, wandbKey, SENTRY_DSN, ...) or, whatever its name, when ``value`` holds a URL with a
    password, a bearer token, a JWT or a connection string's key (value_secrets)."""
    upper = name.upper()
    if upper not in _NOT_SECRET and not upper.startswith(_NOT_SECRET_PREFIXES):
        parts = _name_parts(name)
        if any(part in _SECRET_PARTS for part in parts):
            return True
        if parts[-1] == "SESSION" or any(a == "SESSION" and b in ("ID", "SID") for a, b in zip(parts, parts[1:])):
            return True
        squeezed = upper.replace("TOKENIZER", "").replace("_", "")  # TOKENIZERS_PARALLELISM holds no token
        if any(word in squeezed for word in _SECRET_SUBSTRINGS):
            return True
    return bool(value) and bool(value_secrets(value))


def secrets_in(environ: Mapping[str, str]) -> dict[str, str]:
    """The secret-looking variables of an environment with a value. Pure."""
    return {k: v for k, v in environ.items() if v and is_secret(k, v)}


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with the values of secret-looking variables replaced by ``***``."""
    return {k: (MASK if v and is_secret(k, v) else v) for k, v in env.items()}


# Switch words: no credential, and masking one in output would hide every "true" a rank prints.
_SWITCHES = frozenset({"true", "false", "yes", "no", "on", "off", "none", "null"})
_SHORT = 4  # values shorter than this are masked only where they stand as a whole word
# A one-character value is never masked: hiding every standalone "1" would garble rank numbers and
# exit codes in every summary, and hides nothing a guess would not find.
_TOO_SHORT = 1


def _forms(value: str) -> set[str]:
    """How a value may show up in text: as is, shell-quoted, escaped inside a Python repr or a JSON
    string (a quote or backslash in it is written escaped there), line by line (output is masked a
    line at a time, so a multi-line secret arrives in pieces), and a URL's password on its own,
    as written and percent-decoded."""
    from urllib.parse import quote, unquote  # here: every rank's relay imports this module (start-up, issue 34)

    forms = {value, shlex.quote(value), repr(value)[1:-1], json.dumps(value)[1:-1]}
    forms.add(json.dumps(value, ensure_ascii=False)[1:-1])
    if not value.isascii():  # escaped non-ASCII: ascii()'s \xe4, bytes' \xc3\xa4, a URL's %C3%A4
        forms.update((ascii(value)[1:-1], repr(value.encode("utf-8", "surrogatepass"))[2:-1], quote(value, safe="")))
        forms.add(value.encode("unicode_escape").decode("ascii"))
    if "\n" in value or "\r" in value:
        forms.update(re.split(r"\r?\n|\r", value))
    for part in value_secrets(value):
        forms.update((part, unquote(part)))
    return {f for f in forms if len(f.strip()) > _TOO_SHORT}


def straddling(data: bytes, env: Mapping[str, str]) -> int:
    """How many bytes at the end of ``data`` could be the start of a secret's form cut off by a line split
    (the supervisor and the relay cut lines longer than 1 MiB): they are held back for the next piece, so
    the secret is masked whole, never printed as two clear halves. Pure."""
    secrets = frozenset((k, v) for k, v in env.items() if v and is_secret(k, v))
    starts = _form_starts(secrets)
    if not starts:
        return 0
    longest = max(len(f) for f in starts)
    tail = data[-longest:]
    for n in range(min(longest, len(data)), 0, -1):  # the longest suffix that begins some form
        if any(len(form) > n and form.startswith(tail[-n:]) for form in starts):  # a proper start: cut
            return n
    return 0


@functools.lru_cache(maxsize=64)
def _form_starts(secrets: frozenset) -> tuple[bytes, ...]:
    return tuple(
        f.encode("utf-8", "surrogatepass")
        for _, value in secrets
        if value.strip().lower() not in _SWITCHES
        for f in _forms(value)
    )


def mask_text(text: str, env: Mapping[str, str]) -> str:
    """Replace every occurrence of a secret value in ``text`` with ``***``.

    Also its shell-quoted, repr and JSON forms, a URL's password and, for a multi-line value, each
    of its lines. A value (or line) shorter than 4 characters is masked where it stands as a whole
    word, not inside other words; one of a single character is not masked.
    """
    if not text:
        return text
    pattern = _mask_pattern(frozenset((k, v) for k, v in env.items() if v and is_secret(k, v)))
    return pattern.sub(MASK, text) if pattern is not None else text


@functools.lru_cache(maxsize=64)
def _mask_pattern(secrets: frozenset) -> Optional[re.Pattern]:
    """One pattern for a set of secrets (output is masked line by line: built once, not per line)."""
    long_forms: set[str] = set()
    short_forms: set[str] = set()
    for _, value in secrets:
        if value.strip().lower() in _SWITCHES:
            continue
        for form in _forms(value):
            (long_forms if len(form) >= _SHORT else short_forms).add(form)
    if not (long_forms or short_forms):
        return None
    # one pass, longest first, so a secret that contains another is masked as a whole
    parts = [re.escape(s) for s in sorted(long_forms, key=len, reverse=True)]
    parts += [rf"(?<!\w){re.escape(s)}(?!\w)" for s in sorted(short_forms, key=len, reverse=True)]
    return re.compile("|".join(parts))
