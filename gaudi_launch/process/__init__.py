"""The job's processes: the supervisor (launcher side), the rank bootstrap (worker, rank side), and what
passes between them: the wire protocol, output relay, heartbeats and hang dumps, restarts."""
