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

Standalone, the standard library only (run as `python -S -I rshagent.py ...`), and of that only what
the interpreter has loaded already and _socket (not socket, json: they would double its start, 8 ms of
CPU per host here). Its request: "HOST\0COMMAND\n"; the answer: "fallback\n", or "RC OUTLEN ERRLEN\n"
and the output's bytes, then the error output's.

    rshagent.py SOCKET N SSH_OPTION... (N words) HOST COMMAND_WORD...
"""

import os
import sys

try:
    import _socket as socket_module
except ImportError:  # not CPython
    import socket as socket_module  # type: ignore[no-redef]


def split(argv):
    """(socket path, ssh options, host, command words) from our argv (without argv[0]). Pure."""
    if len(argv) < 4:
        raise ValueError("usage: rshagent.py SOCKET N SSH_OPTION... HOST COMMAND...")
    path, n = argv[0], int(argv[1])
    if n < 0 or len(argv) < 2 + n + 2:
        raise ValueError("fewer arguments than the ssh options announced")
    return path, argv[2 : 2 + n], argv[2 + n], argv[3 + n :]


def ssh(options, host, words):
    """Become the ssh mpirun would have run."""
    argv = ["ssh", "-x", *options, host, *words]
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        sys.stderr.write(f"gaudi-launch rsh agent: cannot run ssh: {e}\n")
        sys.exit(255)


def parse_answer(data):
    """(rc, out, err) from the launcher's answer, "fallback" for its fallback, None when it is not
    one (an answer cut short). Pure."""
    head, sep, rest = data.partition(b"\n")
    if not sep:
        return None
    if head == b"fallback":
        return "fallback"
    try:
        rc, n_out, n_err = (int(x) for x in head.split())
    except ValueError:
        return None
    if n_out < 0 or n_err < 0 or len(rest) != n_out + n_err:
        return None
    return rc, rest[:n_out], rest[n_out:]


def main(argv):
    try:
        path, options, host, words = split(argv)
    except ValueError as e:
        sys.stderr.write(f"gaudi-launch rsh agent: {e}\n")
        return 255
    sock = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        ssh(options, host, words)  # no launcher to ask: nothing was run
    try:
        sock.sendall(f"{host}\0{' '.join(words)}\n".encode())
        sock.shutdown(socket_module.SHUT_WR)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError:
        chunks = []
    finally:
        sock.close()
    answer = parse_answer(b"".join(chunks))
    if answer is None:
        sys.stderr.write(f"gaudi-launch rsh agent: no answer from the launcher for {host}\n")
        return 255  # asked, so it may have run: never a second start
    if answer == "fallback":
        ssh(options, host, words)
    rc, out, err = answer
    for fd, data in ((1, out), (2, err)):
        while data:
            data = data[os.write(fd, data) :]
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
