"""Other hosts: the job's ssh sessions, the pre-flight and its probe, the per-host fan-out, the job
directory shipped to hosts, job-scoped teardown, the host watch, and mpirun's rsh agent."""
