"""What the user gives and what this host is: the options (JobSpec), hostfile and selectors, env files,
the job file, devices, ports, a Slurm allocation. Parsing and validation; errors name the file and line."""
