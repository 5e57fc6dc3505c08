"""Runs a job's program in this interpreter, as the interpreter would run
main.py: the input files and the program written to /work (never
following a link), the program compiled from its bytes and run as a fresh
__main__ module, its display outputs and its exception on the output
channel, and the process ended the way interpreter shutdown ends a
program. Used by launch.py (a container of its own), box.py (each job a
zygote forks) and session.py (each call of a session).

Display outputs and exceptions (the Kiln output channel): when a
descriptor is given (KILN_OUTPUT_FD in a container; a box's zygote hands
one to each job), one JSON line is written to it per display output -- the
value of the program's last expression (IPython's displayhook rule: not
None, not an assignment, not ended by ";"), every display(obj) call, every
matplotlib figure shown with plt.show() or still open at the end (unless
the program saved it with savefig: then it comes back as that file) -- as
{"type": "execute_result"|"display_data", "data": {mime: value}}, then
{"exception": {...}} for an uncaught exception or a syntax error, then
{"dropped": n} when outputs past MAX_OUTPUTS were not written. The channel
is never stdout: nothing a program prints becomes an output.

Readiness (sandbox/initproto): ready() is called once the input files are
written, before any of the job's code runs. Until then a failure is the
platform's; after it, every ending is the program's.
"""

# Only what every job needs is imported up front: each import is start-up
# time paid by every job; the rest is imported on the path that needs it.
import binascii
import builtins
import os
import sys

from kilnproto import fail

WORKDIR = "/work"
MAIN = "main.py"


def create_file(root_fd, name, data):
    """Creates root/name without ever following a symlink: every directory is
    opened relative to its parent with O_NOFOLLOW, and the file itself is
    created with O_EXCL, so a pre-existing entry is an error, not a target."""
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise OSError(22, "file name %r is not a safe relative path" % name)
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
            try:
                png = tight_png(fig, dpi)
            except Exception:  # noqa: BLE001 -- savefig then draws it, or says why not
                png = None
            if png is None:
                buf = io.BytesIO()
                fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
                png = buf.getvalue()
            put(data, "image/png", png)
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


def tight_png(fig, dpi):
    """The PNG savefig(format="png", dpi=dpi, bbox_inches="tight") writes
    (what Jupyter's inline backend shows), from one drawing of the figure:
    savefig draws a figure twice for a tight box (once to measure it, once
    to render it at its offset). Here the figure is drawn once on its own
    Agg canvas, its tight box is measured on that drawing and padded by
    savefig.pad_inches, and the pixels inside it are encoded by
    matplotlib's own PNG writer; padding that reaches past the canvas is
    the figure's background, as savefig's enlarged canvas draws it. The
    same image within a pixel's offset. None when that drawing would not
    be what savefig draws, and the caller uses savefig: a dpi other than
    the figure's, a canvas that is not plain Agg, savefig's own colours or
    transparency in rcParams, an artist outside the canvas (which only an
    enlarged canvas shows), or padding past the canvas on a background
    that is not one opaque colour."""
    import math

    import matplotlib as mpl
    from matplotlib import image as mimage
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rc = mpl.rcParams
    pad = rc["savefig.pad_inches"]
    if (
        dpi != fig.dpi
        or type(fig.canvas) is not FigureCanvasAgg
        or rc["savefig.transparent"]
        or not isinstance(pad, (int, float))
        or any(not (isinstance(rc[k], str) and rc[k] == "auto") for k in ("savefig.facecolor", "savefig.edgecolor"))
    ):
        return None
    canvas = fig.canvas
    canvas.draw()
    tight = fig.get_tightbbox(canvas.get_renderer())
    width, height = canvas.get_width_height()
    eps = 1e-6
    if tight.x0 < -eps or tight.y0 < -eps or tight.x1 * dpi > width + eps or tight.y1 * dpi > height + eps:
        return None
    box = tight.padded(pad)
    # savefig's canvas for the box: its size in pixels, truncated as Agg
    # truncates a figure's, and the figure drawn on it from its bottom left
    # corner; the crop starts at the nearest pixel.
    w, h = int(box.width * dpi), int(box.height * dpi)
    left = math.floor(box.x0 * dpi + 0.5)
    top = math.floor(height - box.y0 * dpi - h + 0.5)
    if w <= 0 or h <= 0:
        return None
    import io

    import numpy as np

    drawn = np.asarray(canvas.buffer_rgba())
    if left >= 0 and top >= 0 and left + w <= width and top + h <= height:
        pixels = np.ascontiguousarray(drawn[top : top + h, left : left + w])
    else:
        patch = fig.patch
        face = patch.get_facecolor()
        if face[3] != 1 or (patch.get_linewidth() and patch.get_edgecolor()[3]):
            return None
        pixels = np.empty((h, w, 4), dtype=np.uint8)
        pixels[:] = [int(c * 255 + 0.5) for c in face]
        x0, y0 = max(left, 0), max(top, 0)
        x1, y1 = min(left + w, width), min(top + h, height)
        if x0 < x1 and y0 < y1:
            pixels[y0 - top : y1 - top, x0 - left : x1 - left] = drawn[y0:y1, x0:x1]
    buf = io.BytesIO()
    mimage.imsave(buf, memoryview(pixels), format="png", origin="upper", dpi=dpi)
    return buf.getvalue()


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


LAUNCHER_DIR = os.path.dirname(os.path.abspath(__file__))
# The launcher's own modules, beside this one (a test checks the list is
# every one of them).
LAUNCHER_MODULES = ("launch", "kilnproto", "runner", "box", "session", "jail", "zygote", "preloader", "commands", "relay")


def forget_launcher():
    """Takes the launcher's own modules (this one, kilnproto, box, ...)
    out of sys.modules and their directory off sys.path: a program's own
    file named like one of them (an input file runner.py) imports as the
    program's. What the launcher runs keeps its references. By name, not
    by a walk of sys.modules: a preloaded interpreter holds hundreds."""
    for name in LAUNCHER_MODULES:
        mod = sys.modules.get(name)
        if mod is not None and os.path.dirname(getattr(mod, "__file__", None) or "") == LAUNCHER_DIR:
            del sys.modules[name]
    while LAUNCHER_DIR in sys.path:
        sys.path.remove(LAUNCHER_DIR)


def signal_ready(fd):
    if fd is None:
        return
    try:
        os.write(int(fd), b"R")
        os.close(int(fd))
    except (OSError, ValueError) as e:
        fail("readiness descriptor %r: %s" % (fd, e))


# matplotlib's settings a job may change in its env: by default figures are
# drawn by Agg (into the PNG outputs) and its config dir is the job's /tmp.
# Defaults the launcher sets, not the profile's fixed env, so a job's own
# value stands (preloader.fresh reads it again for a preloaded matplotlib).
MPL_DEFAULTS = (("MPLBACKEND", "Agg"), ("MPLCONFIGDIR", "/tmp"))
MPL_PACKAGE = "/usr/lib/python3/dist-packages/matplotlib"


def matplotlib_defaults():
    """Sets MPL_DEFAULTS where the image has matplotlib (one stat)."""
    if os.path.isdir(MPL_PACKAGE):
        for k, v in MPL_DEFAULTS:
            os.environ.setdefault(k, v)


# Backends that draw into a file or a buffer: a job may choose one with
# MPLBACKEND. Any other (an interactive one: there is no display) is Agg.
FILE_BACKENDS = ("agg", "cairo", "pdf", "pgf", "ps", "svg", "template")


def file_backend(name):
    """The matplotlib backend a job gets for MPLBACKEND=name."""
    v = (name or "").strip()
    if v.lower() in FILE_BACKENDS or v.startswith("module://"):
        return v
    return "Agg"


# Written to stdout once preloading is done: the worker waits for it before
# a pooled sandbox may take a job, and discards it with everything else the
# launcher wrote before the job (sandbox/pool.go, preloadedMarker).
PRELOADED = b"\0kiln-preloaded\n"


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
        # Figures are rendered to PNG, never to a display: a backend the
        # job names is kept only if it draws into a file.
        os.environ["MPLBACKEND"] = file_backend(env.get("MPLBACKEND"))
    preloaded = sys.modules.get("preloader")
    if preloaded is not None:
        # What preloaded modules read from the environment at import, read
        # again where the job changed it.
        preloaded.fresh(env)
    if chan is not None:
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
    forget_launcher()
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
