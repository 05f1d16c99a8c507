"""JobSpec -> LaunchPlan: what runs where with which environment, decided by pure functions of the
inputs and the pre-flight's findings (the one I/O step the planner calls). Also plan replay and sbatch."""
