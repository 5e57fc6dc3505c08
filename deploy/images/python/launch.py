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


def main():
    ready_fd = os.environ.pop("KILN_READY_FD", None)
    modules = os.environ.pop("KILN_PRELOAD", "")
    ctl = os.environ.pop("KILN_BOX", "")
    if ctl:
        # A box: this process becomes the zygote that forks every job into
        # a fresh inner sandbox (box.py, beside this file).
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import box

        del sys.path[0]
        box.launch = sys.modules[__name__]
        sock = box.enter(ctl)
    if modules:
        preload(modules)
        if not ctl:
            # The worker hands this sandbox a job only after this line (a
            # box's zygote says so on its control socket).
            os.write(1, PRELOADED)
    if ctl:
        box.serve(sock, ready_fd)
        return
    n = read_header(0)
    code, args, env, files, _ = decode_job(read_exact(0, n))
    run_job(code, args, env, files, lambda: signal_ready(ready_fd), fast=bool(modules))


if __name__ == "__main__":
    main()
