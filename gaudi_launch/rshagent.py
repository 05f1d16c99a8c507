"""mpirun's rsh agent while the job holds a session on every host (sshmux): start a daemon through it.

OpenMPI 4 runs its rsh agent once per remote host to start that host's daemon (`orted --daemonize ...`,
which returns once the daemon is up). An ssh there would open a session on the host, and so start the
user's login shell there a second time in the job (the pre-flight's session started the first). This
agent instead asks the launcher (over the unix socket in the job's private directory) to run the
daemon's command line through the pre-flight's session, which is still open on that host
(sshmux.SESSION_AGENT: the user's shell with -c, from the home directory, as sshd runs a command),
and exits with its exit status, having written its output. When the launcher has no session for the
host, or cannot be reached before anything was asked, it becomes the ssh that mpirun would have run
(with mpirun's -x), over the job's master connection (its options are mpirun's plm_rsh_args).

Standalone, the standard library only (run as `python -S -I rshagent.py ...`: a few milliseconds):

    rshagent.py SOCKET N SSH_OPTION... (N words) HOST COMMAND_WORD...
"""
import json
import os
import socket
import sys


def split(argv):
    """(socket path, ssh options, host, command words) from our argv (without argv[0]). Pure."""
    if len(argv) < 4:
        raise ValueError("usage: rshagent.py SOCKET N SSH_OPTION... HOST COMMAND...")
    path, n = argv[0], int(argv[1])
    if n < 0 or len(argv) < 2 + n + 2:
        raise ValueError("fewer arguments than the ssh options announced")
    return path, argv[2:2 + n], argv[2 + n], argv[3 + n:]


def ssh(options, host, words):
    """Become the ssh mpirun would have run."""
    argv = ["ssh", "-x", *options, host, *words]
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        sys.stderr.write(f"gaudi-launch rsh agent: cannot run ssh: {e}\n")
        sys.exit(255)


def main(argv):
    try:
        path, options, host, words = split(argv)
    except ValueError as e:
        sys.stderr.write(f"gaudi-launch rsh agent: {e}\n")
        return 255
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        ssh(options, host, words)  # no launcher to ask: nothing was run
    with sock:
        sock.sendall((json.dumps({"host": host, "command": " ".join(words)}) + "\n").encode())
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    try:
        answer = json.loads(data.decode())
    except ValueError:
        sys.stderr.write(f"gaudi-launch rsh agent: no answer from the launcher for {host}\n")
        return 255  # asked, so it may have run: never a second start
    if answer.get("fallback"):
        ssh(options, host, words)
    for fd, key in ((1, "out"), (2, "err")):
        data = (answer.get(key) or "").encode("latin-1")
        while data:
            data = data[os.write(fd, data):]
    return int(answer.get("rc", 255))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
