"""Kiln's session interpreter for Python: the inner sandbox of a session's box
is kept between calls, so variables, imports, functions, the current directory
and the files in /work persist (sandbox/session.go is the other side).

A session's box is a box like any other (box.py): the worker hands its zygote
each call as it hands it a job, with the header, the four descriptors and the
sandbox's parameters, which carry "session": true. Then:

    first call (or the first after the interpreter ended): the zygote makes the
        inner sandbox as for a job, in three processes (the jail's three
        steps): A unshares the namespaces, a pid namespace too (kj_unshare),
        and hands over the egress listener; B, pid 1 of the fresh pid
        namespace, makes the mounts (kj_mount) and stays the box's root, the
        namespace's reaper; C takes the session's uid in a user namespace of
        its own, no capabilities, no_new_privs, the job seccomp filter
        (kj_become). C keeps one end of a socket pair with the zygote and no
        job's descriptors: C is the session's interpreter.
    every call: the zygote passes the call's stdin, stdout, stderr and frame
        descriptors to C over the socket pair (SCM_RIGHTS) and never reads
        the frame, with a token naming the call. C puts them on 0, 1 and 2,
        reads the frame, writes the call's input files, sends the line
        {"token", "ready": true} (what follows is the program's), runs the
        code in the session's __main__ namespace, flushes, puts /dev/null
        back on 0, 1 and 2 (so the worker sees the streams end) and sends
        {"token", "exit_code": n}. The zygote reads only lines with the
        call's token, so a process the program forked cannot answer for a
        later call; the program itself can write on the socket and so
        decide its own call's exit code, nothing more.
    "k" from the worker (timeout, CPU, output, cancel): the zygote interrupts
        the call (SIGINT to every process of the inner sandbox; B ignores it,
        C raises KeyboardInterrupt in the call), and if C has not answered
        within INTERRUPT_GRACE_S, ends the whole inner sandbox: the session's
        next call starts a fresh interpreter ("fresh": true).
    C or B ending (memory limit, os._exit, a crash): the zygote reports the
        call as ended by B's report, with "ended": true.

The zygote's report line is box.py's plus "fresh" (this call started the
interpreter) and "ended" (the interpreter is gone after this call).
"""

import builtins
import io
import json
import os
import select
import signal
import socket
import sys
import time

import commands  # noqa: F401 -- a session's shell commands (the worker's calls reach it as _kiln_commands)
import jail
import kilnproto
import preloader
import runner
import zygote

INTERRUPT_GRACE_S = 1.0

# The interpreter's SIGINT (the zygote's interrupt of a call) is the
# running call's code's: KeyboardInterrupt there, as in any interpreter.
# One that comes
# while no call's code runs (the call still being set up, its output being
# flushed, between calls) is kept for the call's code, which then stops
# before it starts; it never ends the interpreter. One that comes after a
# call's code ended was that call's, and is dropped with its end.
_calling = False
_interrupted = False


def on_interrupt(signum, frame):
    global _interrupted
    if _calling:
        raise KeyboardInterrupt
    _interrupted = True


# The process a session's calls run in when it is not this interpreter (a
# JSON array of words from the worker: node's launcher in the node image),
# relayed by relay.py; None: calls run here (serve_calls).
INTERPRETER = None


class Sessions:
    """The zygote's side of a session: at most one inner sandbox, kept
    between calls."""

    def __init__(self, lib, ctl):
        global INTERPRETER
        raw = os.environ.pop("KILN_SESSION_INTERPRETER", "")
        if raw:
            argv = json.loads(raw)
            if not isinstance(argv, list) or not argv or not all(isinstance(w, str) and w for w in argv):
                kilnproto.fail("KILN_SESSION_INTERPRETER is not a JSON array of words: %r" % raw)
            INTERPRETER = argv
        self.jail = lib
        self.ctl = ctl
        # None, or {"sock": socket to C, "report_r": B's report pipe,
        # "token": the call's}.
        self.current = None

    def call(self, p, fds):
        """Runs one call of the session, starting its interpreter first
        when there is none. Returns (report, worker gone)."""
        fresh = False
        # A call of a session with a network brings a sixth descriptor:
        # the channel its proxy listener goes back on. Only a call that
        # starts the interpreter (and so the session's network namespace)
        # uses it.
        egress_fd = fds[5] if len(fds) > 5 else None
        fds = fds[:5]
        if self.current is None:
            self.current = self.start(p, fds, egress_fd)
            fresh = True
        if egress_fd is not None:
            os.close(egress_fd)
        s = self.current
        # Every line C sends names the call it is about: a line about
        # another call (a process the program forked, going on after its
        # call) is not this call's.
        s["token"] = os.urandom(8).hex()
        try:
            socket.send_fds(s["sock"], [b"c" + s["token"].encode()], fds)
        except OSError:
            pass  # the interpreter is gone: B's report says how
        for fd in fds:
            os.close(fd)
        ready = {"ready": False}
        rep, ended, lapsed, gone, killed = self.watch(s, ready)
        if ended or gone:
            zygote.kill_all()
            zygote.reap_all()
            s["sock"].close()
            os.close(s["report_r"])
            self.current = None
        killed_error = None
        if killed:
            killed_error = "the call was ended by the worker" if not lapsed else "the worker's lease lapsed"
        out = zygote.report(ready["ready"], rep, lapsed, killed_error, session={"fresh": fresh, "ended": ended or gone})
        return out, gone

    def watch(self, s, ready):
        """Waits for the call's report while the worker holds its lease.
        Returns (report, interpreter ended, lease lapsed, worker gone,
        killed); sets ready["ready"] when the call said it is ready."""
        poller = select.poll()
        poller.register(s["sock"].fileno(), select.POLLIN)
        poller.register(s["report_r"], select.POLLIN)
        poller.register(self.ctl.fileno(), select.POLLIN)
        last = time.monotonic()
        interrupted = None  # when the call was interrupted
        killed = False
        buf = b""
        while True:
            now = time.monotonic()
            waits = [zygote.LEASE_S - (now - last)]
            if interrupted is not None:
                waits.append(INTERRUPT_GRACE_S - (now - interrupted))
            events = poller.poll(int(max(0.0, min(waits)) * 1000) + 1)
            for fd, _ in events:
                if fd == s["sock"].fileno():
                    b = s["sock"].recv(65536)
                    if not b:
                        continue  # C is gone: B's report follows
                    buf += b
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        try:
                            msg = json.loads(line)
                        except ValueError:
                            continue  # not C's: the program wrote on the socket
                        if not isinstance(msg, dict) or msg.get("token") != s["token"]:
                            continue
                        if msg.get("ready"):
                            ready["ready"] = True
                        if "exit_code" in msg:
                            code = int(msg["exit_code"]) if isinstance(msg["exit_code"], int) else 1
                            return {"exit_code": code}, False, False, False, killed
                    if len(buf) > 65536:
                        buf = b""
                elif fd == s["report_r"]:
                    raw = zygote.read_all(s["report_r"])
                    if not raw:
                        return {"setup_error": "the session's init ended without a report"}, True, False, False, killed
                    return json.loads(raw), True, False, False, killed
                else:
                    b = self.ctl.recv(64)
                    if not b:
                        return None, True, False, True, killed
                    if b"k" in b and interrupted is None:
                        killed = True
                        interrupted = time.monotonic()
                        try:
                            os.kill(-1, signal.SIGINT)  # B ignores it; kiln-init and this process are exempt
                        except ProcessLookupError:
                            pass
                    last = time.monotonic()
            now = time.monotonic()
            if interrupted is not None and now - interrupted > INTERRUPT_GRACE_S:
                return None, True, False, False, True
            if now - last > zygote.LEASE_S:
                return None, True, True, False, True

    def start(self, p, call_fds, egress_fd=None):
        """Forks the session's inner sandbox; returns the zygote's view of
        it."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        report_r, report_w = os.pipe()
        job = self.jail.job(p, keep=(child.fileno(),), egress_fd=egress_fd if egress_fd is not None else -1, new_pid=True)
        # No RLIMIT_CPU: it would count every call of the session together;
        # the worker holds each call to its CPU limit from the cgroup.
        job.cpu_s = 0
        a = os.fork()
        if a == 0:
            try:
                os.close(self.ctl.fileno())  # nothing of the session may talk to the worker as the zygote
                for fd in call_fds:
                    os.close(fd)  # the call's streams reach the interpreter over the socket pair only
                os.close(report_r)
                parent.close()
                self.jail.unshare(job)
                if egress_fd is not None:
                    os.close(egress_fd)
                if os.fork() == 0:
                    run_b(self.jail, job, child, report_w)
            except BaseException as e:  # noqa: BLE001
                try:
                    os.write(report_w, json.dumps({"setup_error": str(e)}).encode())
                except OSError:
                    pass
            finally:
                os._exit(0)
        child.close()
        os.close(report_w)
        os.waitpid(a, 0)
        return {"sock": parent, "report_r": report_r}


def run_b(lib, job, child, report_w):
    """pid 1 of the session's namespace: makes its mounts, runs the
    interpreter, reports its ending."""
    try:
        lib.mount(job)
    except (jail.Error, OSError) as e:
        os.write(report_w, json.dumps({"setup_error": str(e)}).encode())
        os._exit(1)
    # The zygote interrupts a call with SIGINT to every process: not this one.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup_r, setup_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(setup_r)
        run_c(lib, job, child, setup_w)
    # B keeps nothing of C's: the writable /proc handle the jail made for
    # C's user namespace maps, C's end of the socket pair.
    os.close(setup_w)
    if job.proc_fd >= 0:
        os.close(job.proc_fd)
    child.close()
    # C says why it could not become the session's interpreter, or closes
    # its end once it has.
    err = zygote.read_all(setup_r)
    os.close(setup_r)
    if err:
        os.write(report_w, json.dumps({"setup_error": err.decode("utf-8", "replace")}).encode())
        os._exit(1)
    while True:
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        if got != pid:
            continue
        os.write(report_w, json.dumps(zygote.ending(status)).encode())
        os._exit(0)


def run_c(lib, job, child, setup_w):
    """The session's interpreter: the job's identity, then calls until the
    zygote closes the socket pair."""
    try:
        signal.signal(signal.SIGINT, on_interrupt)
        null = os.open("/dev/null", os.O_RDWR)
        for i in range(3):
            os.dup2(null, i)
        job.keep[1] = null
        job.keep[2] = setup_w
        try:
            lib.become(job)
        except (jail.Error, OSError) as e:
            os.write(setup_w, str(e).encode("utf-8", "replace"))
            os._exit(1)
        os.close(setup_w)
        if INTERPRETER:
            import relay

            relay.serve(child, null, INTERPRETER, write_files, run_here)
        # Forked from the zygote: its generators are not the session's.
        preloader.reseed()
        serve_calls(child, null)
    finally:
        os._exit(kilnproto.LAUNCH_ERROR)


def serve_calls(sock, null):
    global _interrupted
    mod = type(sys)("__main__")
    mod.__builtins__ = builtins
    mod.__file__ = None
    mod.__spec__ = None
    sys.modules["__main__"] = mod
    runner.forget_launcher()
    sys.path.insert(0, runner.WORKDIR)
    n = 0
    while True:
        token, fds = kilnproto.recv_session_call(sock)
        n += 1
        code, args, env, files = kilnproto.read_frame(fds[3])
        status = call_on(fds, code, args, env, files, mod, n, sock, token, null)
        _interrupted = False  # this call's, come after its code: never the next one's
        sock.sendall(json.dumps({"token": token, "exit_code": status}).encode() + b"\n")


def call_on(fds, code, args, env, files, mod, n, sock, token, null):
    """Runs one call in this interpreter on the call's descriptors (its
    stdin, stdout and stderr on 0, 1 and 2 while it runs, /dev/null after
    it); returns its status."""
    for i in range(3):
        os.dup2(fds[i], i)
        os.close(fds[i])
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    status = run_call(code, args, env, files, mod, n, sock, token, fds[4] if len(fds) == 5 else None)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            status = status or 120
    for i in range(3):
        os.dup2(null, i)
    return status


def run_here(fds, code, args, env, files, n, sock, token, null):
    """Runs one call in this interpreter, in a module of its own: a session
    command (commands.py) in a session whose calls are relayed to another
    interpreter (relay.py). Returns its status."""
    mod = type(sys)("__main__")
    mod.__builtins__ = builtins
    return call_on(fds, code, args, env, files, mod, n, sock, token, null)


def put_file(root_fd, name, data):
    """Writes root/name, replacing a file a previous call left, without ever
    following a symlink (runner.create_file after unlinking the old entry
    relative to its directory, opened with O_NOFOLLOW)."""
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise OSError(22, "file name %r is not a safe relative path" % name)
    dir_fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except FileNotFoundError:
                break
            os.close(dir_fd)
            dir_fd = nxt
        else:
            try:
                os.unlink(parts[-1], dir_fd=dir_fd)
            except FileNotFoundError:
                pass
    finally:
        os.close(dir_fd)
    runner.create_file(root_fd, name, data)


# The session's output channel (runner.Channel): one for the interpreter's
# life, pointed at each call's descriptor in turn, so pyplot is patched once.
channel = None


def call_channel(out_fd):
    """The channel for a call writing to out_fd (None: no channel)."""
    global channel
    if out_fd is None:
        builtins.display = runner.plain_display
        return None
    if channel is None:
        channel = runner.Channel(None)
        os.environ["MPLBACKEND"] = runner.file_backend(os.environ.get("MPLBACKEND"))
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is not None:
            channel.patch_pyplot(plt)
        else:
            sys.meta_path.insert(0, channel)
    channel.fd, channel.count, channel.dropped, channel.pixels = out_fd, 0, 0, 0
    builtins.display = channel.display
    return channel


def run_call(code, args, env, files, mod, n, sock, token, out_fd=None):
    """Runs one call's code in the session's namespace; returns its status.
    Its display outputs (the last expression's value, display(), figures)
    and its exception go to out_fd, as a job's do. A process the code forked
    that comes back here ends instead: only the interpreter serves calls."""
    owner = os.getpid()
    chan = call_channel(out_fd)
    try:
        status = _run_call(code, args, env, files, mod, n, sock, token, chan)
    finally:
        if chan is not None and os.getpid() == owner:
            chan.flush_figures(at_end=True)
            chan.close()
    if os.getpid() != owner:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(status & 0xFF)
    return status


def write_files(files):
    """Writes a call's input files into /work (put_file); the error says
    why one could not be, on the call's stderr."""
    try:
        root_fd = os.open(runner.WORKDIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for name, data in files:
                put_file(root_fd, name, data)
        finally:
            os.close(root_fd)
    except OSError as e:
        return "kiln-launcher: writing input files: %s\n" % e
    return None


def _run_call(code, args, env, files, mod, n, sock, token, chan=None):
    err = write_files(files)
    if err:
        os.write(2, err.encode("utf-8", "replace"))
        return kilnproto.LAUNCH_ERROR
    os.environ.update(env)
    if n == 1:
        # The interpreter's first call is its start: what preloaded
        # modules read from the environment at import, read again where
        # the call's env changed it.
        preloader.fresh(env)
    sock.sendall(json.dumps({"token": token, "ready": True}).encode() + b"\n")
    name = "<call %d>" % n
    sys.argv = [name, *args]
    source = code.encode("utf-8", "surrogateescape")
    try:
        compiled, last = runner.split_last_expression(source, name)
    except (SyntaxError, ValueError) as e:
        import traceback

        traceback.print_exception(type(e), e, None)
        if chan is not None:
            chan.exception(e, syntax=True)
        return 1
    # Tracebacks show the call's own lines.
    import linecache

    lines = code.splitlines(True)
    linecache.cache[name] = (len(code), None, lines, name)
    global _calling, _interrupted
    try:
        _calling = True
        if _interrupted:
            # Interrupted while the call was being set up: its code stops
            # before it starts.
            _calling = _interrupted = False
            raise KeyboardInterrupt
        exec(compiled, mod.__dict__)
        if last is not None:
            value = eval(last, mod.__dict__)
            if chan is not None:
                chan.result(value)
        _calling = False  # in the try: an interrupt until here is the call's
    except SystemExit as e:
        _calling = False
        return runner.exit_code(e)
    except BaseException as e:  # noqa: BLE001
        _calling = False
        e.__traceback__ = runner.user_traceback(e.__traceback__)
        # Frames of this file are the session's, not the program's.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        e.__traceback__ = tb
        sys.excepthook(type(e), e, tb)
        if chan is not None:
            chan.exception(e, syntax=False)
        return 130 if isinstance(e, KeyboardInterrupt) else 1
    return 0
