"""Kiln's sandbox launcher: the image entrypoint that waits for one job and runs it.

The container can be started (prepared) before any job exists; this process then
blocks on stdin. The runtime delivers exactly one job over that pipe:

    KILN/1 <n>\\n
    <n bytes of JSON: {"code": str, "args": [str], "env": {str: str},
                       "files": [{"name": str, "data": base64}]}>
    <the job's own stdin bytes, until EOF>

The launcher writes the input files and /work/main.py, then runs the code as a
fresh __main__ module in this same interpreter, so a job costs one interpreter
start. The job's stdin continues on the same file descriptor: the frame is read
with os.read on fd 0, byte-exact, so nothing of the job's stdin is swallowed by a
read-ahead buffer.

Readiness (the kiln-init protocol, worker/sandbox/initproto): when KILN_READY_FD
names a descriptor, the launcher writes one byte to it and closes it once the
frame is parsed and the input files are written, before any of the job's code
runs. Until then a failure is the platform's; after it, every ending is the
program's. The variable is removed so the job never sees it.

Exit codes: whatever the program exits with; 1 for an uncaught exception or a
syntax error (as CPython); LAUNCH_ERROR for a broken frame, which is the
platform's fault, not the program's, and is flagged on stderr with the
"kiln-launcher:" prefix.
"""

# Only what every job needs is imported up front: each import is start-up
# time paid by every job; the rest is imported on the path that needs it.
import binascii
import builtins
import os
import sys

WORKDIR = "/work"
MAIN = "main.py"
MAGIC = b"KILN/1 "
MAX_HEADER = 64
MAX_FRAME = 64 << 20
LAUNCH_ERROR = 125


def fail(msg):
    os.write(2, ("kiln-launcher: " + msg + "\n").encode("utf-8", "replace"))
    os._exit(LAUNCH_ERROR)


def read_exact(fd, n):
    chunks = []
    while n > 0:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            fail("stdin closed before the job frame was complete")
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def read_header(fd):
    # Byte by byte: the header is a few bytes, and reading further would eat
    # the start of the job's stdin.
    line = bytearray()
    while True:
        b = os.read(fd, 1)
        if not b:
            fail("stdin closed before a job header arrived")
        if b == b"\n":
            break
        line += b
        if len(line) > MAX_HEADER:
            fail("job header is too long")
    if not line.startswith(MAGIC):
        fail("job header does not start with KILN/1")
    try:
        n = int(line[len(MAGIC):].decode("ascii"))
    except ValueError:
        fail("job header has no valid length")
    if n < 0 or n > MAX_FRAME:
        fail("job frame length %d is out of range" % n)
    return n


class _JSONContext:
    """What the C JSON scanner reads from json.JSONDecoder. Using _json
    directly skips importing json.decoder, which compiles regular
    expressions at import: ~8 ms of every job's start for one parse."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name):
        raise ValueError("JSON constant %s is not allowed" % name)


def parse_json(raw):
    text = raw.decode("utf-8")
    try:
        import _json

        scan = _json.make_scanner(_JSONContext)
    except (ImportError, AttributeError):
        import json

        return json.loads(text)
    try:
        obj, end = scan(text, 0)
    except StopIteration:
        raise ValueError("not a JSON document") from None
    except Exception as e:  # the C scanner's own decode errors
        raise ValueError("JSON: %s" % e) from None
    if text[end:].strip(" \t\n\r"):
        raise ValueError("trailing data after the JSON document")
    return obj


def create_file(root_fd, name, data):
    """Creates root/name without ever following a symlink: every directory is
    opened relative to its parent with O_NOFOLLOW, and the file itself is
    created with O_EXCL, so a pre-existing entry is an error, not a target."""
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        fail("file name %r is not a safe relative path" % name)
    dir_fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o755, dir_fd=dir_fd)
            except FileExistsError:
                pass
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = nxt
        fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def user_traceback(tb):
    # Drop this file's frames so the program sees the traceback CPython would
    # have printed had it run main.py directly.
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def signal_ready(fd):
    if fd is None:
        return
    try:
        os.write(int(fd), b"R")
        os.close(int(fd))
    except (OSError, ValueError) as e:
        fail("readiness descriptor %r: %s" % (fd, e))


# Written to stdout once preloading is done: the worker waits for it before
# a pooled sandbox may take a job, and discards it with everything else the
# launcher wrote before the job (worker/sandbox/pool.go, preloadedMarker).
PRELOADED = b"\0kiln-preloaded\n"


def preload(names):
    """Imports the modules a pooled sandbox is asked to preload (KILN_PRELOAD,
    comma-separated) while it waits for its job, so the job's own import of
    them is a dictionary lookup. A module that fails to import is skipped:
    the job then imports it itself and sees the error as usual. Nothing is
    printed: whatever this writes before the job arrives is discarded."""
    for name in names.split(","):
        name = name.strip()
        if not name:
            continue
        try:
            __import__(name)
        except BaseException:  # noqa: BLE001 -- a broken module must not end the launcher
            pass
    # What is loaded now lives as long as the process: keep the collector
    # from walking it again in every collection (and in finish()).
    import gc

    gc.freeze()


def decode_job(raw):
    """The job frame's JSON as (code, args, env, files, cpu_s); fails as the
    platform's fault when it is not what the worker sends."""
    try:
        job = parse_json(raw)
        if not isinstance(job, dict):
            raise ValueError("the frame is not a JSON object")
        code = job["code"]
        args = [str(a) for a in job.get("args") or []]
        env = {str(k): str(v) for k, v in (job.get("env") or {}).items()}
        files = [(f["name"], binascii.a2b_base64((f.get("data") or "").encode("ascii"), strict_mode=True)) for f in job.get("files") or []]
        cpu_s = int(job.get("cpu_s") or 0)
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as e:
        fail("job frame is not valid: %s" % e)
    if not isinstance(code, str):
        fail("job frame: code is not a string")
    return code, args, env, files, cpu_s


def exit_code(e):
    """The exit status CPython gives a SystemExit that ends the program."""
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):
        return c & 0xFF
    try:
        sys.stderr.write(str(c) + "\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def finish(code, main_dict):
    """Ends the process the way interpreter shutdown ends a program, for the
    program's own objects, without tearing down the preloaded modules (which
    takes longer than the job: ~65 ms for pandas). Non-daemon threads are
    joined, atexit handlers run, the program's __main__ globals are released
    so their finalizers run (files flushed, archives closed), cycles are
    collected, and the standard streams flushed."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
    except BaseException:  # noqa: BLE001
        pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        pass
    try:
        for k in list(main_dict):
            main_dict[k] = None
        import gc

        gc.collect()
    except BaseException:  # noqa: BLE001
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            code = code or 120  # CPython's status when stdout cannot be flushed
    os._exit(code)


def run_job(code, args, env, files, ready, fast):
    """Writes the input files, applies env, signals readiness and runs the
    program as __main__. With fast, the process ends through finish() (a
    sandbox whose interpreter preloaded modules); without it, a program that
    ends normally returns and the interpreter exits as usual."""
    try:
        root_fd = os.open(WORKDIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        for name, data in files:
            create_file(root_fd, name, data)
        source = code.encode("utf-8", "surrogateescape")
        create_file(root_fd, MAIN, source)
        os.close(root_fd)
    except OSError as e:
        fail("writing input files: %s" % e)

    os.environ.update(env)
    ready()
    path = os.path.join(WORKDIR, MAIN)
    sys.argv = [MAIN, *args]
    # -P leaves the script's directory off sys.path; a program expects its own
    # directory first, so modules shipped as input files import.
    sys.path.insert(0, WORKDIR)

    try:
        # The bytes, not the decoded string: a UTF-8 BOM or a coding cookie
        # ("# -*- coding: latin-1 -*-") then means what it means when
        # python3 runs main.py.
        compiled = compile(source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        # Same text CPython prints for a script that does not compile: no
        # "Traceback" header, just the location, the caret and the message.
        import traceback

        traceback.print_exception(type(e), e, None)
        sys.stderr.flush()
        if fast:
            finish(1, {})
        sys.exit(1)

    mod = type(sys)("__main__")
    mod.__file__ = path
    mod.__builtins__ = builtins
    mod.__cached__ = None
    mod.__spec__ = None
    sys.modules["__main__"] = mod
    status = 0
    try:
        exec(compiled, mod.__dict__)
    except SystemExit as e:
        if not fast:
            raise
        status = exit_code(e)
    except BaseException as e:
        e.__traceback__ = user_traceback(e.__traceback__)
        sys.excepthook(type(e), e, e.__traceback__)
        status = 130 if isinstance(e, KeyboardInterrupt) else 1
        if not fast:
            sys.exit(status)
    if fast:
        finish(status, mod.__dict__)


# --- Recycled sandboxes (KILN_RECYCLE): one container, many jobs of one tenant.
#
# The launcher becomes a zygote: it preloads, connects to the worker's control
# socket (a host socket bind-mounted into the sandbox; the worker accepts this
# one connection and no other), makes itself non-dumpable (no process of a job
# can ptrace it or read its memory or descriptors), signals readiness to
# kiln-init, then serves jobs one at a time:
#
#   worker -> zygote: a HEADER_SIZE-byte header "KILN/1 <n>" (space padded,
#       newline last) carrying three descriptors (SCM_RIGHTS): the job's stdin
#       (read end), stdout and stderr (write ends); then n bytes of the job
#       frame's JSON, with "cpu_s", the job's RLIMIT_CPU in seconds.
#   zygote: forks the job; the child takes the three descriptors as 0, 1, 2,
#       sets its CPU limit, and runs the job as the cold path does. The
#       zygote waits for it, kills every other process of the sandbox
#       (kill(-1): all but itself and kiln-init), waits until none is left,
#       and wipes what a job can leave behind: /tmp, /dev/shm, POSIX message
#       queues and System V IPC objects. (/work is wiped by the worker, after
#       it collected the output dir.)
#   zygote -> worker: one JSON line {"exit_code", "signal", "cpu_us", "ready",
#       "clean", "error"}. The child cannot forge it: the zygote learns its
#       ending from wait4, and the child holds no descriptor of the socket.
#
# A failed wipe or a surviving process is reported as clean=false, and the
# worker retires the container.

HEADER_SIZE = 32
IPC_RMID = 0
PR_SET_DUMPABLE = 4


def recv_exact(sock, n):
    chunks = []
    while n > 0:
        b = sock.recv(min(n, 1 << 20))
        if not b:
            return None
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def alone():
    """Reports whether no process but pid 1 and this one is alive (zombies
    waiting for kiln-init to reap them are dead already)."""
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (1, me):
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                st = f.read()
        except OSError:
            continue  # gone meanwhile
        state = st[st.rfind(b")") + 2 : st.rfind(b")") + 3]
        if state not in (b"Z", b"X"):
            return False
    return True


def remove_entries(path):
    """Removes everything in directory path. Never follows a symlink: an
    entry that is not a directory is unlinked."""
    for entry in os.scandir(path):
        p = os.path.join(path, entry.name)
        if entry.is_dir(follow_symlinks=False):
            # A job may have locked it (chmod 000): its owner can unlock it.
            os.chmod(p, 0o700)
            remove_entries(p)
            os.rmdir(p)
        else:
            os.unlink(p)


def empty_dir(path):
    """Removes everything in path (not path itself); reports success."""
    if not os.path.isdir(path):
        return True
    remove_entries(path)
    return not os.listdir(path)


def remove_sysv(libc):
    """Removes every System V shared memory segment, semaphore set and
    message queue of the sandbox's IPC namespace."""
    import ctypes

    ok = True
    for kind, rm in (
        ("shm", lambda i: libc.shmctl(i, IPC_RMID, None)),
        ("sem", lambda i: libc.semctl(i, 0, IPC_RMID)),
        ("msg", lambda i: libc.msgctl(i, IPC_RMID, None)),
    ):
        try:
            with open("/proc/sysvipc/" + kind) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            ident = int(row.split()[1])
            if rm(ctypes.c_int(ident)) != 0:
                ok = False
        with open("/proc/sysvipc/" + kind) as f:
            if f.read().splitlines()[1:]:
                ok = False
    return ok


def wipe(libc):
    errors = []
    for path in ("/tmp", "/dev/shm", "/dev/mqueue"):
        try:
            if not empty_dir(path):
                errors.append(path + " is not empty")
        except (OSError, RecursionError) as e:
            errors.append("%s: %s" % (path, e))
    try:
        if not remove_sysv(libc):
            errors.append("System V IPC objects remain")
    except (OSError, ValueError) as e:
        errors.append("System V IPC: %s" % e)
    return errors


def serve(ctl, ready_fd):
    import ctypes
    import json
    import resource
    import signal
    import socket
    import time

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        fail("cannot make the zygote non-dumpable")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(ctl)
    except OSError as e:
        fail("control socket %s: %s" % (ctl, e))
    signal_ready(ready_fd)
    while True:
        try:
            head, fds, _, _ = socket.recv_fds(sock, HEADER_SIZE, 3)
        except OSError:
            os._exit(0)
        if not head:
            os._exit(0)  # the worker closed the socket: retired
        rest = recv_exact(sock, HEADER_SIZE - len(head))
        if rest is None or len(fds) != 3:
            fail("control socket: a short job header")
        head += rest
        if not head.startswith(MAGIC):
            fail("control socket: job header does not start with KILN/1")
        body = recv_exact(sock, int(head[len(MAGIC) :].strip()))
        if body is None:
            fail("control socket: closed within a job frame")
        code, args, env, files, cpu_s = decode_job(body)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                os.close(ready_r)
                for i, fd in enumerate(fds):
                    os.dup2(fd, i)
                for fd in fds:
                    if fd > 2:
                        os.close(fd)
                # The job's process is like a cold job's: a session of its
                # own (kill(0) from the job's group cannot reach the zygote),
                # dumpable, default signal dispositions, its own CPU limit
                # from zero.
                os.setsid()
                libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
                if cpu_s > 0:
                    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
                run_job(code, args, env, files, lambda: signal_ready(ready_w), fast=True)
            finally:
                os._exit(LAUNCH_ERROR)
        for fd in fds:
            os.close(fd)
        os.close(ready_w)
        _, status, ru = os.wait4(pid, 0)
        ready = os.read(ready_r, 1) == b"R"
        os.close(ready_r)
        report = {"ready": ready, "cpu_us": int((ru.ru_utime + ru.ru_stime) * 1e6), "exit_code": 0, "signal": 0}
        if os.WIFSIGNALED(status):
            report["signal"] = os.WTERMSIG(status)
        else:
            report["exit_code"] = os.WEXITSTATUS(status)
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        errors = []
        for _ in range(200):
            if alone():
                break
            time.sleep(0.005)
        else:
            errors.append("a process of the job outlived SIGKILL")
        try:
            errors += wipe(libc)
        except Exception as e:  # noqa: BLE001 -- reported: the worker retires the container
            errors.append("wipe: %r" % e)
        report["clean"] = not errors
        report["error"] = "; ".join(errors)
        sock.sendall(json.dumps(report).encode() + b"\n")


def main():
    ready_fd = os.environ.pop("KILN_READY_FD", None)
    modules = os.environ.pop("KILN_PRELOAD", "")
    ctl = os.environ.pop("KILN_RECYCLE", "")
    if modules:
        preload(modules)
        if not ctl:
            # The worker hands this sandbox a job only after this line (a
            # recycled zygote says so by connecting to its control socket).
            os.write(1, PRELOADED)
    if ctl:
        serve(ctl, ready_fd)
        return
    n = read_header(0)
    code, args, env, files, _ = decode_job(read_exact(0, n))
    run_job(code, args, env, files, lambda: signal_ready(ready_fd), fast=bool(modules))


if __name__ == "__main__":
    main()
