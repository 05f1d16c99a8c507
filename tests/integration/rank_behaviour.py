"""A rank for supervisor tests. Every rank records its PID and a grandchild's in --pid-dir, waits
until all ranks have done so, then the --fail-rank misbehaves (--how) while the others sleep."""

import argparse
import os
import signal
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--pid-dir", required=True)
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--how", default="exit:3")  # exit:N, raise, kill9, ok
p.add_argument("--ignore-term", action="store_true")
p.add_argument("--sleep", type=float, default=900)
p.add_argument("--output_dir")  # where a script says its results go (the end-of-job summary repeats it)
p.add_argument("--hold-gil", action="store_true")  # wait as a hung collective can: in C, GIL held
a = p.parse_args()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if a.ignore_term and rank != a.fail_rank:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)"])
tmp = os.path.join(a.pid_dir, f"{rank}.tmp")
with open(tmp, "w") as f:
    f.write(f"{os.getpid()}\n{child.pid}\n")
os.replace(tmp, os.path.join(a.pid_dir, f"{rank}.pid"))
print(f"rank {rank} started", flush=True)
while len([n for n in os.listdir(a.pid_dir) if n.endswith(".pid")]) < world:
    time.sleep(0.02)
if rank == a.fail_rank:
    print(f"rank {rank} about to fail ({a.how})", flush=True)
    if a.how.startswith("exit:"):
        sys.exit(int(a.how.split(":")[1]))
    if a.how == "raise":
        raise ValueError(f"boom from rank {rank}")
    if a.how == "kill9":
        os.kill(os.getpid(), signal.SIGKILL)
if a.how == "ok":
    child.terminate()
    child.wait()
    sys.exit(0)
if a.hold_gil:
    # A glibc mutex locked twice by its owner waits forever in futex(), as a rank stuck in a C++
    # collective does; PyDLL keeps the GIL for the call and no signal ends the wait, so neither
    # a Python signal handler nor a Python thread of this process runs again.
    import ctypes

    libc, mutex = ctypes.PyDLL(None), ctypes.create_string_buffer(64)  # zeroed = PTHREAD_MUTEX_INITIALIZER
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)
time.sleep(a.sleep)
