"""The container's authorized_keys: the leader's public key appended once, keys already there kept.

Called by docker/entrypoint.sh before it starts sshd (`python -m gaudi_launch.remote.authkeys REQUIRED
[EXTRA_PUBKEY_FILE]`), with its settings in the environment: AUTHORIZED_KEY (the key text),
AUTHORIZED_KEYS_FILE (a mounted file), SSHD_AUTHORIZED_KEYS (the file sshd reads), SSH_KEYGEN.
Keys are compared by their base64 blob, not by line, so a key with another comment or options is
not added twice; the file is only ever appended to. Exit 2 with the reason on bad input.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from typing import Optional

KEY_TYPE_PREFIXES = ("ssh-", "ecdsa-", "sk-")


class BadKey(Exception):
    """Bad key input: printed as the entrypoint's error, exit 2."""


def key_blob(line: str) -> Optional[str]:
    """The base64 part of a public key line ('[options] type blob [comment]'), or None. Pure."""
    fields = line.split()
    for i, field in enumerate(fields[:-1]):
        if field.startswith(KEY_TYPE_PREFIXES):
            return fields[i + 1]
    return None


def key_lines(text: str) -> list[str]:
    """The non-comment, non-empty lines (CRLF tolerated). Pure."""
    lines = (line.rstrip("\r") for line in text.splitlines())
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def to_append(existing: str, offered: Iterable[str]) -> tuple[str, int, int]:
    """(text to append to ``existing``, keys added, keys already present). Pure.

    A file whose last line has no newline gets one first, so the old last key is not glued to ours.
    """
    present_blobs = {key_blob(line) for line in key_lines(existing)} - {None}
    out, added, present = [], 0, 0
    for line in offered:
        blob = key_blob(line)
        if blob in present_blobs:
            present += 1
            continue
        present_blobs.add(blob)
        out.append(line + "\n")
        added += 1
    if out and existing and not existing.endswith("\n"):
        out.insert(0, "\n")
    return "".join(out), added, present


def check_public_key(line: str, what: str, keygen: str) -> None:
    """ssh-keygen decides what a public key is (the sshd that reads the file is OpenSSH)."""
    with tempfile.NamedTemporaryFile("w", suffix=".pub") as f:
        f.write(line + "\n")
        f.flush()
        ok = (
            subprocess.run(
                [keygen, "-l", "-f", f.name],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
            ).returncode
            == 0
        )
    if not ok:
        raise BadKey(f"{what} is not an SSH public key: '{line[:60]}' (expected 'ssh-ed25519 AAAA... comment')")


def add_keys(what: str, text: str, target: str, keygen: str) -> str:
    """Append the keys of ``text`` to ``target``; return the log line."""
    if "PRIVATE KEY" in text:
        raise BadKey(f"{what} holds a PRIVATE key: give the PUBLIC key (the .pub file, 'ssh-ed25519 AAAA... comment')")
    lines = key_lines(text)
    for line in lines:
        check_public_key(line, what, keygen)
    if not lines:
        raise BadKey(f"{what} holds no public key")
    with open(target) as f:
        existing = f.read()
    extra, added, present = to_append(existing, lines)
    if extra:
        with open(target, "a") as f:
            f.write(extra)
    return f"authorized keys from {what}: {added} added, {present} already in {target}"


def setup(required: bool, extra: Optional[str], environ=os.environ) -> list[str]:
    """The whole step for a worker (required) or the leader (its own key as ``extra``); log lines."""
    target = environ.get("SSHD_AUTHORIZED_KEYS") or os.path.expanduser("~/.ssh/authorized_keys")
    keygen = environ.get("SSH_KEYGEN", "ssh-keygen")
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700)
    if not os.path.exists(target):
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o600))
    log, given = [], False
    path = environ.get("AUTHORIZED_KEYS_FILE")
    if path:
        given = True
        if not os.path.isfile(path):
            raise BadKey(f"AUTHORIZED_KEYS_FILE={path} does not exist (mount the leader's public key there)")
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            raise BadKey(f"AUTHORIZED_KEYS_FILE={path} is not readable") from None
        log.append(add_keys(f"AUTHORIZED_KEYS_FILE ({path})", text, target, keygen))
    if "AUTHORIZED_KEY" in environ:
        given = True
        if not environ["AUTHORIZED_KEY"]:
            raise BadKey(
                "AUTHORIZED_KEY is set but empty (did the command that should print the leader's public key fail?)"
            )
        log.append(add_keys("AUTHORIZED_KEY", environ["AUTHORIZED_KEY"], target, keygen))
    if extra:
        with open(extra) as f:
            log.append(add_keys(f"the leader's own key ({extra})", f.read(), target, keygen))
    if required and not given:
        with open(target) as f:
            if not any(key_blob(line) for line in key_lines(f.read())):
                raise BadKey(
                    "no authorized key: nobody could log in to this worker. Give the leader's public "
                    'key with -e AUTHORIZED_KEY="$(cat leader_key.pub)" or mount it and set '
                    "AUTHORIZED_KEYS_FILE=/path/in/container (sshd not started)"
                )
        log.append(f"no AUTHORIZED_KEY / AUTHORIZED_KEYS_FILE given: using the keys already in {target}")
    return log


def main(argv: list[str]) -> int:
    tag = os.environ.get("ENTRYPOINT_LOG_TAG", "gaudi-launch-entrypoint")
    try:
        for line in setup(argv[0] == "1", argv[1] if len(argv) > 1 else None):
            print(f"{tag}: {line}", file=sys.stderr)
    except (BadKey, OSError) as exc:
        print(f"{tag}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
