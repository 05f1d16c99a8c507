"""JobSpec -> LaunchPlan: what runs where with which environment, decided by pure functions of the
inputs and the pre-flight's findings. The pre-flight (remote/hostchecks.py) and the backends' planning
halves are handed to the planner by the composition root; plan/ imports neither. Also plan replay and sbatch."""
