"""The job's processes: the supervisor (launcher side), the rank bootstrap (worker, rank side), and what
passes between them: output relay, hang dumps, restarts (the names both sides share are gaudi_launch/wire.py's)."""
