"""What a rank tells the launcher on its stderr, besides its own output (written by worker.py and
relay.py, read by supervise.py and relay.py): one place, so both ends agree.

- An error record: ``ERROR_MARKER`` + one JSON object (rank, host, exit code, exception, traceback)
  on one line, written by the rank bootstrap when the script fails.
- ``TORN_DOWN``: the rank was stopped by the job's teardown, not failing on its own (relay.py).
- ``STARTED`` + the rank and its host: the rank bootstrap runs (the start-up deadline, --start-timeout, counts
  these; process/placement.py checks the hosts).

And one thing the launcher tells the rank bootstrap, on its command line: ``NO_PYTHON_FLAG`` first
means the program is an executable (--no_python), run as the bootstrap's child.
"""

from __future__ import annotations

import json
from typing import Optional

ERROR_MARKER = "@@gaudi-launch-error-record@@ "
TORN_DOWN = "@@gaudi-launch-torn-down@@"
STARTED = "@@gaudi-launch-started@@ "
NO_PYTHON_FLAG = "--gaudi-launch-no-python"


def record_line(record: dict) -> str:
    return ERROR_MARKER + json.dumps(record) + "\n"


def parse_record(text: str) -> Optional[dict]:
    """The record after the marker, or None when it is not a JSON object (a truncated line)."""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
