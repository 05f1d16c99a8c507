"""A rank for the Slurm tests: prints its layout and values, then fails or waits as told."""

import json
import os
import socket
import subprocess
import sys
import time

rank = int(os.environ["RANK"])
keys = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GAUDI_LAUNCH_JOB_ID",
    "VALUE_A",
    "VALUE_B",
    "HABANA_VISIBLE_MODULES",
    "CUDA_VISIBLE_DEVICES",
)
print(
    "LAYOUT "
    + json.dumps({"host": socket.gethostname(), "argv": sys.argv[1:], **{k: os.environ.get(k) for k in keys}}),
    flush=True,
)
how = sys.argv[1] if len(sys.argv) > 1 else "ok"
if how.startswith("fail:"):
    _, who, code = how.split(":")
    if rank == int(who):
        time.sleep(1)  # the others are running by now
        if code == "raise":
            raise RuntimeError(f"rank {rank} crashed on purpose")
        os._exit(int(code))  # no error record: the code must come from srun's report
    time.sleep(120)
elif how.startswith("daemon:"):
    # A daemon (setsid, double fork) with the job's id: it leaves Slurm's process tracking.
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)  # as daemons do (srun waits for open output)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            with open(os.path.join(how.split(":", 1)[1], f"{rank}.pid"), "w") as f:
                f.write(str(os.getpid()))
            time.sleep(300)
        os._exit(0)
    os.wait()
    print("waiting", flush=True)
    time.sleep(300)
elif how == "wait":
    # A child in the rank's group: it must go with the rank.
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    print("waiting", flush=True)
    time.sleep(300)
