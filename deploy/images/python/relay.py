"""Kiln's session relay: a session whose calls run in another interpreter than
this one (node's, in the node image, whose box supervisor is this package's).

session.py makes the session's inner sandbox as for a python session; its
interpreter process C, once it has the session's identity (uid, user
namespace, no capabilities, no_new_privs, the job seccomp filter), calls
serve() instead of serving calls itself. serve() forks the interpreter,
which inherits all of that, and relays each call to it:

    the interpreter: the worker's argv (KILN_SESSION_INTERPRETER: node's
        launcher, with the heap bound of the session's memory), started
        with KILN_SESSION_FD=3 and KILN_OUTPUT_FD=4: descriptor 3 is a
        socket to this process, 4 a pipe for display outputs and
        exceptions, 1 and 2 pipes for stdout and stderr, 0 /dev/null (a
        call's stdin is not read). It runs for the session's life.
    a session command (its code a call of commands.py, COMMAND_CALL): run
        in this interpreter, as a python session runs it.
    each call: this process receives the call's descriptors from the
        zygote (as session.serve_calls does), reads the frame, writes the
        input files into /work, sends the zygote {"token", "ready": true},
        then the interpreter one line {"code", "args", "env", "n"}, and
        copies the interpreter's stdout, stderr and output pipes to the
        call's descriptors until the interpreter answers {"exit_code"};
        then takes what is left in the pipes (the interpreter writes its
        streams synchronously, so its answer comes after its output), puts
        the call's descriptors away and answers the zygote with the token.
    between calls: what the interpreter writes (a timer still running) is
        read and dropped, so it never blocks on a full pipe.
    an interrupt: the zygote sends SIGINT to every process of the inner
        sandbox; this process ignores it, the interpreter interrupts its
        call and answers.
    the interpreter ending (its heap, a crash, process.reallyExit): this
        process ends the same way, so the session's report says how, and
        the next call starts a fresh interpreter.

Nothing here is a boundary: this process runs as the session's own uid,
under the same sandbox as the interpreter, and a program that disturbs it
disturbs only its own session.
"""

import errno
import fcntl
import json
import os
import select
import signal
import socket

import kilnproto

CHUNK = 65536


def start(argv, null):
    """Forks the interpreter; returns (pid, control socket, {pipe read end:
    name})."""
    ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    chan_r, chan_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            for fd, want in ((null, 0), (out_w, 1), (err_w, 2), (theirs.fileno(), 3), (chan_w, 4)):
                os.dup2(fd, want)
            os.closerange(5, 1 << 16)
            for sig in (signal.SIGINT, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            env = dict(os.environ, KILN_SESSION_FD="3", KILN_OUTPUT_FD="4")
            os.execvpe(argv[0], argv, env)
        except OSError as e:
            os.write(2, ("kiln-launcher: the session's interpreter %s: %s\n" % (argv[0], e)).encode("utf-8", "replace"))
        os._exit(kilnproto.LAUNCH_ERROR)
    theirs.close()
    for fd in (out_w, err_w, chan_w):
        os.close(fd)
    pipes = {out_r: "stdout", err_r: "stderr", chan_r: "output"}
    for fd in pipes:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    return pid, ctl, pipes


def end_like(pid):
    """Ends this process as the interpreter ended (its exit code, or its
    signal), once it has."""
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def write_all(fd, data):
    """Writes data to a call's descriptor; False once it is gone (the worker
    stopped reading: its output limit)."""
    while data:
        try:
            n = os.write(fd, data)
        except InterruptedError:
            continue
        except OSError:
            return False
        data = data[n:]
    return True


# A session command's call (worker/session_commands.go commandCode): code
# for this interpreter's commands module, run here rather than relayed.
COMMAND_CALL = '__import__("sys").modules["_kiln_commands"].call('


def serve(sock, null, argv, write_files, run_here):
    """Serves the session's calls in the interpreter argv until the zygote
    closes sock; never returns."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the interpreter's to handle
    pid, ctl, pipes = start(argv, null)
    buf = b""
    n = 0
    while True:
        call = None
        # Between calls: wait for the next, dropping what the interpreter
        # writes meanwhile.
        while call is None:
            try:
                ready, _, _ = select.select([sock, ctl, *pipes], [], [])
            except InterruptedError:
                continue
            for fd in ready:
                if fd is sock:
                    call = kilnproto.recv_session_call(sock)
                elif fd is ctl:
                    b = ctl.recv(CHUNK)
                    if not b:
                        end_like(pid)
                    buf += b  # a line for no call: dropped below
                    buf = buf[buf.rfind(b"\n") + 1 :] if b"\n" in buf else buf[-CHUNK:]
                else:
                    drain_or_drop(pipes, fd, None)
        token, fds = call
        n += 1
        status = run(sock, ctl, pid, pipes, fds, n, token, write_files, lambda *a: run_here(*a, null))
        sock.sendall(json.dumps({"token": token, "exit_code": status}).encode() + b"\n")


def drain(fd, dst):
    """Reads what is in pipe fd now, to dst (None: dropped). False when the
    pipe reached its end."""
    while True:
        try:
            b = os.read(fd, CHUNK)
        except BlockingIOError:
            return True
        except InterruptedError:
            continue
        if not b:
            return False
        if dst is not None and not write_all(dst, b):
            dst = None


def drain_or_drop(pipes, fd, dst):
    """drain, and once the pipe has ended (the interpreter closed its end)
    it is read no more."""
    if not drain(fd, dst):
        del pipes[fd]
        os.close(fd)


def run(sock, ctl, pid, pipes, fds, n, token, write_files, run_here):
    """Relays one call (or runs a session command here); returns its exit
    code."""
    code, args, env, files = kilnproto.read_frame(fds[3])
    if code.startswith(COMMAND_CALL):
        # An interrupt is this call's here, as in a python session (the
        # interpreter, between calls, lets it pass).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return run_here(fds, code, args, env, files, n, sock, token)
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.close(fds[0])  # the call's stdin: not read
    out, err = fds[1], fds[2]
    chan = fds[4] if len(fds) == 5 else None
    dst = {}
    for fd, name in pipes.items():
        dst[fd] = {"stdout": out, "stderr": err, "output": chan}[name]
    try:
        failed = write_files(files)
        if failed:
            write_all(err, failed.encode("utf-8", "replace"))
            return kilnproto.LAUNCH_ERROR
        sock.sendall(json.dumps({"token": token, "ready": True}).encode() + b"\n")
        try:
            ctl.sendall(json.dumps({"code": code, "args": args, "env": env, "n": n}).encode() + b"\n")
        except OSError:
            end_like(pid)
        buf = b""
        while True:
            try:
                ready, _, _ = select.select([ctl, *pipes], [], [])
            except InterruptedError:
                continue
            for fd in ready:
                if fd is not ctl:
                    drain_or_drop(pipes, fd, dst[fd])
                    continue
                b = ctl.recv(CHUNK)
                if not b:
                    for p in list(pipes):
                        drain(p, dst[p])
                    end_like(pid)
                buf += b
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    try:
                        answer = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(answer, dict) and answer.get("n") == n and isinstance(answer.get("exit_code"), int):
                        for p in list(pipes):
                            drain_or_drop(pipes, p, dst[p])
                        return answer["exit_code"] & 0xFF
    finally:
        for fd in (out, err, chan):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError as e:
                    if e.errno != errno.EBADF:
                        raise
