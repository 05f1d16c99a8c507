"""The one-pass tree's gate messages (remote/onepass.py, the launcher's side; process/gate.py, the rank's): one
JSON line each, authenticated with the job's key (HMAC-SHA256). Pure; standard library only.

A rank's hello carries a fresh nonce and a MAC over its whole body; the launcher's verdict (go with variables, or
stop) a MAC over that nonce and its body, so neither another process on the network nor a verdict replayed to
another rank or job is taken; a rank's "swept" at its end is bound to its nonce the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Optional

STOP_EXIT = 3  # a rank told stop (exitcodes.ExitCode.PREFLIGHT, the launcher's own pre-flight failure)
MAX_LINE = 4 * 1024 * 1024  # a probe's output is a few KB; a verdict's variables well under 1 MB


def mac(key: bytes, *parts: bytes) -> str:
    """HMAC-SHA256 over the parts, each length-prefixed (no two splits give one MAC). Pure."""
    import hashlib
    import hmac  # here, as compare_digest below: every rank imports this module, only one-pass ranks sign

    h = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        h.update(len(p).to_bytes(8, "big"))
        h.update(p)
    return h.hexdigest()


def _same(a: str, b: str) -> bool:
    import hmac

    return hmac.compare_digest(a, b)


def hello(key: bytes, rank: str, host: str, probe: Optional[str], nonce: str) -> bytes:
    """The rank's one message to the launcher, as a line. Pure."""
    body = json.dumps({"rank": rank, "host": host, "probe": probe, "nonce": nonce}, sort_keys=True)
    return (json.dumps({"body": body, "mac": mac(key, b"hello", body.encode())}) + "\n").encode()


def read_hello(key: bytes, line: bytes) -> Optional[dict]:
    """The hello's body when its MAC is right, else None. Pure."""
    try:
        msg = json.loads(line)
        body = msg["body"]
        if not _same(str(msg["mac"]), mac(key, b"hello", body.encode())):
            return None
        out = json.loads(body)
        return out if isinstance(out, dict) and isinstance(out.get("nonce"), str) else None
    except (ValueError, KeyError, TypeError):
        return None


def verdict(key: bytes, nonce: str, go: bool, env: Mapping[str, str]) -> bytes:
    """The launcher's answer to one rank (its nonce), as a line. Pure."""
    body = json.dumps({"go": go, "env": dict(env)}, sort_keys=True)
    return (json.dumps({"body": body, "mac": mac(key, b"verdict", nonce.encode(), body.encode())}) + "\n").encode()


def read_verdict(key: bytes, nonce: str, line: bytes) -> Optional[dict]:
    """The verdict's body when its MAC over our nonce is right, else None. Pure."""
    try:
        msg = json.loads(line)
        body = msg["body"]
        if not _same(str(msg["mac"]), mac(key, b"verdict", nonce.encode(), body.encode())):
            return None
        out = json.loads(body)
        if not isinstance(out, dict) or not isinstance(out.get("env"), dict):
            return None
        return out
    except (ValueError, KeyError, TypeError):
        return None


def swept_line(key: bytes, nonce: str, host: str, hit: int) -> bytes:
    body = json.dumps({"swept": host, "hit": hit}, sort_keys=True)
    return (json.dumps({"body": body, "mac": mac(key, b"swept", nonce.encode(), body.encode())}) + "\n").encode()


def read_swept(key: bytes, nonce: str, line: bytes) -> Optional[dict]:
    try:
        msg = json.loads(line)
        body = msg["body"]
        if not _same(str(msg["mac"]), mac(key, b"swept", nonce.encode(), body.encode())):
            return None
        out = json.loads(body)
        return out if isinstance(out, dict) and isinstance(out.get("swept"), str) else None
    except (ValueError, KeyError, TypeError):
        return None
