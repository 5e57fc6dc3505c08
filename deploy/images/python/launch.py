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

Readiness (the kiln-init protocol, sandbox/initproto): when KILN_READY_FD
names a descriptor, the launcher writes one byte to it and closes it once the
frame is parsed and the input files are written, before any of the job's code
runs. Until then a failure is the platform's; after it, every ending is the
program's. The variable is removed so the job never sees it.

Display outputs and exceptions (the Kiln output channel): when KILN_OUTPUT_FD
names a descriptor (kiln-init passes one on the container-per-job paths; a
box's zygote hands one to each job), the launcher writes one JSON line to it
per display output -- the value of the program's last expression (IPython's
displayhook rule: not None, not an assignment, not ended by ";"), every
display(obj) call, every matplotlib figure shown with plt.show() or still
open at the end (unless the program saved it with savefig: then it comes
back as that file) -- as {"type": "execute_result"|"display_data", "data":
{mime: value}}, then {"exception": {...}} for an uncaught exception or a
syntax error, then {"dropped": n} when outputs past MAX_OUTPUTS were not
written. The channel is never stdout: nothing a program prints becomes an
output. The descriptor is close-on-exec and the variable is removed.

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


MAX_OUTPUTS = 64  # job.MaxOutputs: a figure bomb is not rendered past it
MAX_TEXT = 1 << 20  # the longest text value written (the worker bounds again)
MAX_FIGURE_PIXELS = 4_000_000  # a larger figure is rendered at a lower dpi
FIGURE_BUDGET = 32_000_000  # pixels rendered per job; past it, figures are text only


class Channel:
    """The output channel: display outputs and the exception as JSON lines
    on their own descriptor (see the module's docstring)."""

    def __init__(self, fd):
        self.fd = fd
        self.count = 0
        self.dropped = 0
        self.pixels = 0

    def write(self, rec):
        if self.fd is None:
            return
        import json

        try:
            line = json.dumps(rec, separators=(",", ":")).encode("ascii") + b"\n"
        except (TypeError, ValueError):
            return
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError:
            # The file limit, or a worker that stopped reading: nothing
            # more goes out, and the program carries on.
            self.fd = None

    def emit(self, kind, data):
        if self.count >= MAX_OUTPUTS:
            self.dropped += 1
            return
        self.count += 1
        self.write({"type": kind, "data": data})

    def full(self):
        return self.count >= MAX_OUTPUTS

    def display(self, *objs, **_):
        """display(obj, ...): each object becomes a display output."""
        for obj in objs:
            if self.full():
                self.dropped += 1
                continue
            data = self.bundle(obj)
            if data is not None:
                self.emit("display_data", data)

    def result(self, value):
        if value is None:
            return
        if self.full():
            self.dropped += 1
            return
        data = self.bundle(value)
        if data is not None:
            self.emit("execute_result", data)

    def bundle(self, obj):
        """The MIME bundle of obj, as IPython's formatters make it."""
        if is_figure(obj):
            data = self.figure(obj)
            close_figure(obj)
            return data
        data = {}
        cls = type(obj)
        mb = getattr(cls, "_repr_mimebundle_", None)
        if callable(mb):
            try:
                got = obj._repr_mimebundle_()
                if isinstance(got, tuple):
                    got = got[0]
                if isinstance(got, dict):
                    for k, v in got.items():
                        put(data, k, v)
            except Exception:  # noqa: BLE001 -- a broken formatter is skipped, as IPython does
                pass
        for name, mime in REPR_METHODS:
            if mime in data:
                continue
            m = getattr(cls, name, None)
            if not callable(m):
                continue
            try:
                v = getattr(obj, name)()
            except Exception:  # noqa: BLE001
                continue
            if isinstance(v, tuple):
                v = v[0] if v else None
            put(data, mime, v)
        if "text/plain" not in data:
            try:
                text = repr(obj)
            except Exception as e:  # noqa: BLE001
                text = "<unprintable %s object: %s>" % (cls.__name__, e)
            data["text/plain"] = text[:MAX_TEXT]
        if "application/json" not in data and cls in (dict, list) and len(data["text/plain"]) < 65536:
            import json

            try:
                data["application/json"] = json.loads(json.dumps(obj, allow_nan=False))
            except (TypeError, ValueError, RecursionError):
                pass
        return data

    def figure(self, fig):
        data = {"text/plain": safe_repr(fig)}
        try:
            import io

            w, h = fig.get_size_inches()
            dpi = fig.dpi
            pixels = w * h * dpi * dpi
            if pixels > MAX_FIGURE_PIXELS:
                dpi = dpi * (MAX_FIGURE_PIXELS / pixels) ** 0.5
                pixels = MAX_FIGURE_PIXELS
            if self.pixels + pixels > FIGURE_BUDGET:
                data["text/plain"] += " (not rendered: the job's figures are over %d pixels)" % FIGURE_BUDGET
                return data
            self.pixels += pixels
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
            put(data, "image/png", buf.getvalue())
        except Exception as e:  # noqa: BLE001 -- the figure is reported, not rendered
            data["text/plain"] += " (not rendered: %s: %s)" % (type(e).__name__, e)
        return data

    def flush_figures(self, at_end=False):
        """Every figure pyplot holds becomes an output, then is closed. At
        the end, a figure the program saved with savefig (and never showed)
        is left out: it comes back as the file it was saved to."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        try:
            nums = plt.get_fignums()
        except Exception:  # noqa: BLE001
            return
        for num in nums:
            try:
                fig = plt.figure(num)
            except Exception:  # noqa: BLE001
                continue
            if at_end and getattr(fig, "_kiln_saved", False):
                continue
            if self.full():
                self.dropped += 1
            else:
                self.emit("display_data", self.figure(fig))
            try:
                plt.close(fig)
            except Exception:  # noqa: BLE001
                pass

    def patch_pyplot(self, plt):
        flush = self.flush_figures

        def show(*args, **kwargs):
            """plt.show(): the open figures become outputs (the Agg
            backend shows nothing)."""
            flush()

        # A function, not a bound method: pyplot sets __signature__ on it.
        plt.show = show
        try:
            figure_cls = sys.modules["matplotlib.figure"].Figure
            savefig = figure_cls.savefig

            def saved(fig, *args, **kwargs):
                fig._kiln_saved = True
                return savefig(fig, *args, **kwargs)

            saved.__wrapped__ = savefig
            figure_cls.savefig = saved
        except (KeyError, AttributeError):
            pass

    def find_spec(self, name, path, target=None):
        """A meta path finder for matplotlib.pyplot only: pyplot's show is
        replaced right after pyplot is imported, so the program's own
        plt.show() returns its figures."""
        if name != "matplotlib.pyplot":
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            fs = getattr(finder, "find_spec", None)
            spec = fs(name, path, target) if fs is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec
        chan = self

        def exec_module(module):
            run(module)
            chan.patch_pyplot(module)

        loader.exec_module = exec_module
        return spec

    def exception(self, e, syntax):
        try:
            rec = exception_record(e, syntax)
        except Exception:  # noqa: BLE001
            rec = {"type": type(e).__name__, "message": safe_str(e)}
        self.write({"exception": rec})

    def close(self):
        if self.dropped:
            self.write({"dropped": self.dropped})
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_json_", "application/json"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_latex_", "text/latex"),
)


def put(data, mime, v):
    """Adds value v of type mime: bytes as base64, text bounded, JSON as is."""
    if v is None or not isinstance(mime, str):
        return
    if mime == "application/json" or mime.endswith("+json"):
        data[mime] = v
    elif isinstance(v, (bytes, bytearray)):
        data[mime] = binascii.b2a_base64(bytes(v), newline=False).decode("ascii")
    elif isinstance(v, str):
        data[mime] = v[:MAX_TEXT]


def is_figure(obj):
    for c in type(obj).__mro__:
        if c.__module__ == "matplotlib.figure" and c.__name__ in ("Figure", "SubFigure"):
            return True
    return False


def close_figure(fig):
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        try:
            plt.close(fig)
        except Exception:  # noqa: BLE001
            pass


def safe_repr(obj):
    try:
        return repr(obj)[:MAX_TEXT]
    except Exception:  # noqa: BLE001
        return "<%s>" % type(obj).__name__


def safe_str(obj):
    try:
        return str(obj)[:MAX_TEXT]
    except Exception:  # noqa: BLE001
        return ""


def exception_record(e, syntax):
    """The exception as job.Exception: its type, message, where in the
    program it happened, and the frames of the program's own files."""
    rec = {"type": type(e).__name__, "message": safe_str(e)}
    if isinstance(e, SyntaxError):
        rec["message"] = safe_str(e.msg)
        if (e.filename or "").startswith(WORKDIR + "/") or syntax:
            rec["line"] = e.lineno or 0
            rec["column"] = e.offset or 0
            rec["source_line"] = (e.text or "").strip()
    if syntax:
        return rec
    import traceback

    frames = []
    for fs in traceback.extract_tb(e.__traceback__):
        if fs.filename.startswith(WORKDIR + "/"):
            frames.append({"file": fs.filename, "line": fs.lineno or 0, "function": fs.name})
    rec["frames"] = frames[-32:]
    if frames and "line" not in rec:
        rec["line"] = frames[-1]["line"]
        src = traceback.extract_tb(e.__traceback__)
        for fs in reversed(src):
            if fs.filename.startswith(WORKDIR + "/"):
                rec["source_line"] = (fs.line or "").strip()
                break
    return rec


def plain_display(*objs, **_):
    """display() when no output channel was given: the text form, printed."""
    for obj in objs:
        print(safe_repr(obj))


def split_last_expression(source, path):
    """Compiles the program, with its last statement apart when it is an
    expression (IPython's rule), as (body code, last expression code or
    None). _ast is built in: no import cost."""
    import _ast

    tree = compile(source, path, "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
    last = None
    if tree.body and type(tree.body[-1]) is _ast.Expr and not ends_with_semicolon(source, tree.body[-1]):
        last = tree.body.pop()
    body = compile(tree, path, "exec", dont_inherit=True)
    if last is None:
        return body, None
    return body, compile(_ast.Expression(last.value), path, "eval", dont_inherit=True)


def ends_with_semicolon(source, node):
    """A last expression followed by ";" shows nothing, as in IPython."""
    end = getattr(node, "end_lineno", None)
    if end is None:
        return False
    lines = source.splitlines()
    if end > len(lines):
        return False
    line = lines[end - 1]
    if isinstance(line, bytes):
        rest = line[node.end_col_offset :].lstrip()
        return rest.startswith(b";")
    return line[node.end_col_offset :].lstrip().startswith(";")


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
# launcher wrote before the job (sandbox/pool.go, preloadedMarker).
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


def run_job(code, args, env, files, ready, fast, out_fd=None):
    """Writes the input files, applies env, signals readiness and runs the
    program as __main__, its display outputs and exception going to out_fd
    (the output channel) when given. With fast, the process ends through
    finish() (a sandbox whose interpreter preloaded modules); without it, a
    program that ends normally returns and the interpreter exits as usual."""
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
    chan = Channel(out_fd) if out_fd is not None else None
    if chan is not None:
        # Figures are rendered to PNG, never to a display.
        os.environ["MPLBACKEND"] = "Agg"
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is not None:
            chan.patch_pyplot(plt)
        else:
            sys.meta_path.insert(0, chan)
        builtins.display = chan.display
    else:
        builtins.display = plain_display
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
        compiled, last = split_last_expression(source, path)
    except (SyntaxError, ValueError) as e:
        # Same text CPython prints for a script that does not compile: no
        # "Traceback" header, just the location, the caret and the message.
        import traceback

        traceback.print_exception(type(e), e, None)
        sys.stderr.flush()
        if chan is not None:
            chan.exception(e, syntax=True)
            chan.close()
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
    exiting = None
    try:
        exec(compiled, mod.__dict__)
        if last is not None:
            value = eval(last, mod.__dict__)
            if chan is not None:
                chan.result(value)
    except SystemExit as e:
        status = exit_code(e)
        exiting = e
    except BaseException as e:
        e.__traceback__ = user_traceback(e.__traceback__)
        sys.excepthook(type(e), e, e.__traceback__)
        status = 130 if isinstance(e, KeyboardInterrupt) else 1
        if chan is not None:
            chan.exception(e, syntax=False)
    if chan is not None:
        chan.flush_figures(at_end=True)
        chan.close()
    if fast:
        finish(status, mod.__dict__)
    if exiting is not None:
        raise exiting
    if status:
        sys.exit(status)


def output_fd(value):
    """The output channel's descriptor named by KILN_OUTPUT_FD, or None."""
    if not value:
        return None
    try:
        fd = int(value)
        os.set_inheritable(fd, False)
    except (ValueError, OSError):
        return None
    return fd


def main():
    ready_fd = os.environ.pop("KILN_READY_FD", None)
    modules = os.environ.pop("KILN_PRELOAD", "")
    ctl = os.environ.pop("KILN_BOX", "")
    out_fd = output_fd(os.environ.pop("KILN_OUTPUT_FD", ""))
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
    run_job(code, args, env, files, lambda: signal_ready(ready_fd), fast=bool(modules), out_fd=out_fd)


if __name__ == "__main__":
    main()
