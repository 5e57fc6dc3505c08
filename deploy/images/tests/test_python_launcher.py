"""Tests of the Python launchers' protocol side (deploy/images/python) against
the shared vectors in sandbox/initproto/testdata, which the worker's tests
read too. Run by sandbox/initproto's Go tests (make test):

    python3 -m unittest discover -s deploy/images/tests -p 'test_*.py'
"""

import base64
import json
import os
import socket
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(HERE, "..", "python")
VECTORS = os.path.join(HERE, "..", "..", "..", "sandbox", "initproto", "testdata")
sys.path.insert(0, LAUNCHER)

import box  # noqa: E402
import kilnproto  # noqa: E402
import preloader  # noqa: E402
import zygote  # noqa: E402


def vectors(name):
    with open(os.path.join(VECTORS, name), encoding="utf-8") as f:
        return json.load(f)


def through_pipe(data):
    """A read end from which data (less than a pipe's buffer) can be read,
    then EOF."""
    r, w = os.pipe()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(w, view) :]
    finally:
        os.close(w)
    return r


class Frames(unittest.TestCase):
    def test_valid(self):
        vs = vectors("frames.json")["valid"]
        self.assertGreaterEqual(len(vs), 3)
        for v in vs:
            with self.subTest(v["name"]):
                stdin = b"the job's own stdin"
                fd = through_pipe(v["frame"].encode("utf-8") + stdin)
                try:
                    n = kilnproto.read_header(fd)
                    code, args, env, files, cpu_s = kilnproto.decode_job(kilnproto.read_exact(fd, n))
                    rest = os.read(fd, 4096)
                finally:
                    os.close(fd)
                want = v["want"]
                self.assertEqual(code, want["code"])
                self.assertEqual(args, want["args"])
                self.assertEqual(env, want["env"])
                self.assertEqual(files, [(f["name"], base64.b64decode(f["data"])) for f in want["files"]])
                self.assertEqual(cpu_s, want.get("cpu_s", 0))
                self.assertEqual(rest, stdin, "the frame was read past its end")

    def test_invalid_parsed(self):
        for v in vectors("frames.json")["invalid"]:
            with self.subTest(v["name"]):
                fd = through_pipe(v["frame"].encode("utf-8"))
                try:
                    with self.assertRaises(kilnproto.ProtocolError) as cm:
                        n = kilnproto.read_header(fd)
                        kilnproto.decode_job(kilnproto.read_exact(fd, n))
                finally:
                    os.close(fd)
                self.assertIn(v["error"], str(cm.exception))

    def test_invalid_refused_by_the_launcher(self):
        """The launcher itself (a container's entrypoint) ends with
        LAUNCH_ERROR and a kiln-launcher: line, before touching /work."""
        for v in vectors("frames.json")["invalid"]:
            with self.subTest(v["name"]):
                p = subprocess.run(
                    [sys.executable, "-s", "-P", "-B", os.path.join(LAUNCHER, "launch.py")],
                    input=v["frame"].encode("utf-8"),
                    capture_output=True,
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
                    timeout=60,
                )
                self.assertEqual(p.returncode, kilnproto.LAUNCH_ERROR, p.stderr)
                line = p.stderr.decode().strip().splitlines()[-1]
                self.assertTrue(line.startswith("kiln-launcher: "), line)
                self.assertIn(v["error"], line)


class BoxHeaders(unittest.TestCase):
    def test_valid(self):
        for v in vectors("box_headers.json")["valid"]:
            with self.subTest(v["name"]):
                self.assertEqual(kilnproto.parse_box_header(v["header"].encode()), v["n"])

    def test_invalid(self):
        for v in vectors("box_headers.json")["invalid"]:
            with self.subTest(v["name"]):
                with self.assertRaises(kilnproto.ProtocolError) as cm:
                    kilnproto.parse_box_header(v["header"].encode())
                self.assertIn(v["error"], str(cm.exception))

    def test_read_from_the_control_socket(self):
        """The zygote reads a header with its descriptors and the
        parameters after it, and refuses another major version before
        reading any parameters."""
        params = vectors("box_params.json")["valid"][0]["params"].encode()
        for v in vectors("box_headers.json")["valid"] + vectors("box_headers.json")["invalid"]:
            head = v["header"].encode()
            if len(head) != kilnproto.HEADER_SIZE:
                continue
            with self.subTest(v["name"]):
                ours, theirs = socket.socketpair()
                r, w = os.pipe()
                try:
                    socket.send_fds(ours, [head[:1]], [r, w, w, r])
                    ours.sendall(head[1:] + params)
                    ours.shutdown(socket.SHUT_WR)
                    if "error" in v:
                        with self.assertRaises(kilnproto.ProtocolError) as cm:
                            box.read_job(theirs)
                        self.assertIn(v["error"], str(cm.exception))
                        continue
                    if v["n"] != len(params):
                        continue
                    p, fds = box.read_job(theirs)
                    self.assertEqual(len(fds), 4)
                    self.assertEqual(p, json.loads(params))
                    for fd in fds:
                        os.close(fd)
                finally:
                    for s in (ours, theirs):
                        s.close()
                    os.close(r)
                    os.close(w)


class BoxParams(unittest.TestCase):
    def test_valid(self):
        for v in vectors("box_params.json")["valid"]:
            with self.subTest(v["name"]):
                self.assertEqual(kilnproto.decode_box_params(v["params"].encode()), v["want"])

    def test_invalid(self):
        vs = vectors("box_params.json")["invalid"]
        self.assertGreaterEqual(len(vs), 8)
        for v in vs:
            with self.subTest(v["name"]):
                with self.assertRaises(kilnproto.ProtocolError) as cm:
                    kilnproto.decode_box_params(v["params"].encode())
                self.assertIn(v["error"], str(cm.exception))


class Reports(unittest.TestCase):
    def test_reports(self):
        vs = vectors("reports.json")["reports"]
        self.assertGreaterEqual(len(vs), 5)
        for v in vs:
            with self.subTest(v["name"]):
                e = v["ending"]
                got = zygote.report(e["ready"], e["rep"], e.get("lapsed", False), e.get("killed_error"), e.get("session"))
                self.assertEqual(got, v["report"])
                self.assertEqual(json.loads(json.dumps(got)), v["report"])


class ImportVariables(unittest.TestCase):
    """preloader.forget_packages: a job that sets a variable a preloaded
    package reads only at import imports that package (and the preloaded
    packages built on it) afresh; nothing else is dropped."""

    NAMES = ("mpmath", "mpmath.libmp", "sympy", "sympy.core.cache", "sympyish", "openpyxl", "numpy")

    def setUp(self):
        import types

        self.saved = {n: sys.modules.get(n) for n in self.NAMES}
        for n in self.NAMES:
            sys.modules[n] = types.ModuleType(n)

    def tearDown(self):
        for n, m in self.saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m

    def left(self, env):
        preloader.forget_packages(env)
        return sorted(n for n in self.NAMES if n in sys.modules)

    def test_sympys_variable_drops_sympy_only(self):
        self.assertEqual(self.left({"SYMPY_USE_CACHE": "no"}), ["mpmath", "mpmath.libmp", "numpy", "openpyxl", "sympyish"])

    def test_mpmaths_variable_drops_sympy_too(self):
        self.assertEqual(self.left({"MPMATH_NOGMPY": "1"}), ["numpy", "openpyxl", "sympyish"])

    def test_openpyxls_variable(self):
        self.assertEqual(self.left({"OPENPYXL_LXML": "False"}), ["mpmath", "mpmath.libmp", "numpy", "sympy", "sympy.core.cache", "sympyish"])

    def test_other_variables_drop_nothing(self):
        self.assertEqual(self.left({"SYMPYX": "1", "PATH": "/bin", "OMP_NUM_THREADS": "1"}), sorted(self.NAMES))


class OlderJailLibrary(unittest.TestCase):
    """A jail library older than the binding (the image is newer than the
    host's install) has no kj_py_arenas: py_arenas says so with ENOSYS,
    which box.enter passes over (the arenas then lie where CPython puts
    them); the rest of the binding loads."""

    def test_no_py_arenas(self):
        import ctypes
        import errno

        import jail

        class Fn:
            def __call__(self, *args):
                return 0

        class Lib:
            pass

        lib = Lib()
        for name in ("kj_enter", "kj_unshare", "kj_mount", "kj_become", "kj_box_userns", "kj_box_root", "kj_job_pidns", "kj_box_pidns"):
            setattr(lib, name, Fn())
        cdll = ctypes.CDLL
        ctypes.CDLL = lambda *a, **k: lib
        try:
            j = jail.Jail("/nonexistent/jail.so", b"\0" * 8, [], [])
        finally:
            ctypes.CDLL = cdll
        with self.assertRaises(OSError) as e:
            j.py_arenas(box.ARENA_RESERVE)
        self.assertEqual(e.exception.errno, errno.ENOSYS)
        j.box_userns()  # the rest of the binding works


class Modules(unittest.TestCase):
    def test_no_import_circle_and_no_patching(self):
        """Each launcher module imports on its own, in a fresh
        interpreter, in any order: no module needs another to have set it
        up first."""
        for name in ("kilnproto", "runner", "jail", "zygote", "session", "box", "launch"):
            with self.subTest(name):
                p = subprocess.run(
                    [sys.executable, "-s", "-P", "-B", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import %s" % name, LAUNCHER],
                    capture_output=True,
                    timeout=60,
                )
                self.assertEqual(p.returncode, 0, p.stderr)

    def test_every_launcher_module_is_forgotten(self):
        """runner.forget_launcher names every module of the launcher
        (list_packages.py is a command of its own, never imported)."""
        import runner

        mods = {f[:-3] for f in os.listdir(LAUNCHER) if f.endswith(".py") and f != "list_packages.py"}
        self.assertEqual(set(runner.LAUNCHER_MODULES), mods)

    def test_the_program_does_not_see_the_launcher(self):
        """A program's own runner.py (or box.py, ...) is the program's: the
        launcher's modules and directory are gone once it runs."""
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]); import runner, box, session, kilnproto; "
            "runner.forget_launcher(); "
            "print(sorted(n for n in ('runner', 'box', 'session', 'kilnproto', 'jail', 'zygote') if n in sys.modules), sys.argv[1] in sys.path)"
        )
        p = subprocess.run([sys.executable, "-s", "-P", "-B", "-c", code, os.path.abspath(LAUNCHER)], capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.decode().strip(), "[] False")


if __name__ == "__main__":
    unittest.main()


class Commands(unittest.TestCase):
    """commands.py, the interpreter's side of a session's shell commands, in
    a process of its own (its output is its file descriptors')."""

    def run_calls(self, calls):
        import tempfile

        with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as tmp:
            prog = r"""
import builtins, json, sys
sys.path.insert(0, sys.argv[1])
import commands, runner
runner.WORKDIR, commands.OUT_DIR = sys.argv[2], sys.argv[3]
said = []
builtins.display = lambda obj: said.append(obj._repr_mimebundle_()[commands.MIME])
for raw in json.loads(sys.argv[4]):
    code = None
    try:
        sys.modules["_kiln_commands"].call(json.dumps(raw))
    except SystemExit as e:
        code = e.code
    sys.stdout.flush()
    print("\n@" + json.dumps({"exit": code, "said": said[-1] if said else None}), flush=True)
"""
            p = subprocess.run([sys.executable, "-c", prog, LAUNCHER, work, tmp, json.dumps(calls)],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            out, answers = [], []
            text = ""
            for line in p.stdout.splitlines(keepends=True):
                if line.startswith("@"):
                    out.append(text[:-1] if text.endswith("\n") else text)
                    answers.append(json.loads(line[1:]))
                    text = ""
                else:
                    text += line
            return out, answers, p.stderr

    def test_foreground_background_wait_kill(self):
        out, answers, err = self.run_calls([
            {"cmd": "pwd; echo $A; echo oops >&2; exit 3", "env": {"A": "from env"}},
            {"cmd": "echo bg; exit 4", "background": True, "id": "7"},
            {"op": "wait", "id": "7", "wait_ms": 10000},
            {"cmd": "exec sleep 60", "background": True, "id": "8"},
            {"op": "wait", "id": "8", "wait_ms": 100},
            {"op": "kill", "id": "8"},
            {"op": "wait", "id": "9"},
        ])
        self.assertTrue(out[0].endswith("from env\n"), out[0])
        self.assertIn("oops", err)
        self.assertEqual(answers[0], {"exit": 3, "said": {"running": False, "exit_code": 3}})
        self.assertEqual(answers[1]["said"], {"id": "7", "background": True, "running": True})
        self.assertEqual((out[2], answers[2]["said"]), ("bg\n", {"id": "7", "background": True, "running": False, "exit_code": 4}))
        self.assertTrue(answers[4]["said"]["running"])
        self.assertEqual(answers[5]["said"], {"id": "8", "background": True, "running": False, "exit_code": 137, "killed": True})
        self.assertEqual(answers[6]["said"], {"id": "9", "background": True, "running": False, "missing": True})

    def test_stdin_and_list(self):
        """A background command started with a stdin reads what input
        writes, to its end once closed; a write after that is refused;
        the list says where each command stands, with its line."""
        b64 = lambda t: base64.b64encode(t.encode()).decode()
        out, answers, err = self.run_calls([
            {"cmd": "cat", "background": True, "id": "3", "stdin": True},
            {"op": "input", "id": "3", "input": b64("one\n")},
            {"op": "input", "id": "3", "input": b64("two\n"), "close_stdin": True},
            {"op": "wait", "id": "3", "wait_ms": 10000},
            {"op": "input", "id": "3", "input": b64("late")},
            {"cmd": "true", "background": True, "id": "5"},
            {"op": "input", "id": "5", "close_stdin": True},
            {"op": "wait", "id": "5", "wait_ms": 10000},
            {"op": "list"},
        ])
        self.assertEqual(answers[0]["said"], {"id": "3", "background": True, "running": True, "stdin": True})
        self.assertEqual(answers[1]["said"], {"id": "3", "background": True, "running": True, "stdin": True})
        self.assertNotIn("stdin", answers[2]["said"])
        self.assertNotIn("stdin_closed", answers[2]["said"])
        self.assertEqual((out[3], answers[3]["said"]), ("one\ntwo\n", {"id": "3", "background": True, "running": False, "exit_code": 0}))
        self.assertTrue(answers[4]["said"].get("stdin_closed"), answers[4])
        self.assertTrue(answers[6]["said"].get("stdin_closed"), answers[6])
        self.assertEqual(answers[8]["said"], {"commands": [
            {"id": "3", "background": True, "running": False, "exit_code": 0, "cmd": "cat"},
            {"id": "5", "background": True, "running": False, "exit_code": 0, "cmd": "true"},
        ]})


class Interrupts(unittest.TestCase):
    """session.py: the zygote's SIGINT is the running call's code's
    (KeyboardInterrupt, the call ends 130); one that comes while no call's
    code runs never ends the interpreter: it stops the next call's code
    before it starts."""

    def test_an_interrupt_outside_a_calls_code_never_ends_the_interpreter(self):
        code = r"""
import json, os, signal, socket, sys, time
sys.path.insert(0, sys.argv[1])
import session
signal.signal(signal.SIGINT, session.on_interrupt)
mod = type(sys)("__main__")
ours, theirs = socket.socketpair()
def run(code):
    return session._run_call(code, [], {}, [], mod, 2, ours, "t", None)
out = {}
# Between calls (the call being set up): nothing is raised here.
os.kill(os.getpid(), signal.SIGINT)
out["between"] = "survived"
# The next call's code stops before it starts.
out["early"] = run("ran = True")
out["early_ran"] = "ran" in mod.__dict__
# An interrupt during a call's code ends that call alone.
start = time.monotonic()
out["during"] = run("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\nlate = True")
out["during_s"] = time.monotonic() - start < 10
out["during_late"] = "late" in mod.__dict__
# The call after it runs; its code may interrupt itself as often as any
# program may.
out["after"] = run("x = 41\nfor _ in range(2):\n    try:\n        os.kill(os.getpid(), signal.SIGINT)\n        time.sleep(30)\n    except KeyboardInterrupt:\n        x += 1")
out["after_x"] = mod.__dict__.get("x")
print(json.dumps(out))
"""
        p = subprocess.run([sys.executable, "-s", "-P", "-B", "-c", code, os.path.abspath(LAUNCHER)], capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = json.loads(p.stdout.decode().strip().splitlines()[-1])
        self.assertEqual(
            got,
            {"between": "survived", "early": 130, "early_ran": False, "during": 130, "during_s": True, "during_late": False, "after": 0, "after_x": 43},
        )
