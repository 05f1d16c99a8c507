"""The JobSpec of one attempt of a job: what planning needs from restarts.py and hangs.py, without them.

Pure spec transforms, so that a dry run plans an attempt without importing the supervision that only a
job that starts needs (issue 37: the dry run's start-up budget).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from gaudi_launch.wire import HEARTBEAT_DIR, MAX_RESTARTS_VAR, RESTART_COUNT, path_for


def attempt_spec(spec, attempt: int, lost_hosts: Sequence[str] = ()):
    """The JobSpec of attempt ``attempt`` (0 = the first run): the restart count in the ranks'
    environment, the hosts lost so far left out. Unchanged without --max-restarts, so plans stay as
    they were. Pure."""
    if not spec.max_restarts:
        return spec
    env = {**spec.env, RESTART_COUNT: str(attempt), MAX_RESTARTS_VAR: str(spec.max_restarts)}
    return dataclasses.replace(spec, env=env, lost_hosts=list(lost_hosts))


def with_heartbeats(spec):
    """The spec with the ranks' heartbeat directory in their environment (--hang-timeout); the
    directory itself is made when the job starts (hangs.HangWatch.create)."""
    if not spec.hang_timeout or HEARTBEAT_DIR in spec.env:
        return spec
    # os.urandom is what secrets.token_hex reads; secrets would load OpenSSL (hmac) for nothing here
    return dataclasses.replace(spec, env={**spec.env, HEARTBEAT_DIR: path_for(os.urandom(8).hex())})


def first_attempt(spec):
    """The spec of the first attempt: restart count, heartbeat directory. Idempotent."""
    return with_heartbeats(attempt_spec(spec, 0))
