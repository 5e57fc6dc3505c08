"""Shell commands in a session (POST /v1/sessions/{id}/commands).

A command is a call of the session: the worker (worker/session_commands.go)
makes its code a call of call() here with the command's parameters, so the
session's interpreter runs it like any call, in the session's sandbox and
under its limits, and the zygote sees nothing new (session.py).

    run, foreground: /bin/sh -c CMD in /work, on the call's stdin (none),
        stdout and stderr, so its output is the call's, streamed live; the
        call's exit code is the command's (128+n for signal n). The call's
        timeout interrupts it (the zygote's SIGINT): its process group is
        killed and the call ends timed out.
    run, background: the same, its output in files under the session's
        /tmp, its SIGINT ignored (a later call's interrupt is not its own);
        the interpreter keeps it by id (the seq of the call that started it).
        With stdin, its stdin is a pipe whose other end the interpreter
        keeps for input; else it is empty.
    wait: waits at most wait_ms for a background command, then writes what
        it wrote so far to the call's stdout and stderr.
    kill: kills a background command's process group, then as wait.
    input: writes input (base64) to a background command's stdin, then
        closes it with close_stdin; says whether its stdin is still open.
    list: says where each background command stands, oldest first.

Where the command stands goes to the worker as one display output of type
MIME, which the worker takes out of the call's result.
"""

import base64
import builtins
import json
import os
import signal
import subprocess
import sys

import runner

MIME = "application/vnd.kiln.command+json"
OUT_DIR = "/tmp/.kiln-commands"

# Background commands of this interpreter, by id, in the order they
# started; each Popen also holds its command line (kiln_cmd) and the
# interpreter's end of its stdin (kiln_stdin, None when it has none open).
procs = {}


class _State:
    def __init__(self, d):
        self.d = d

    def _repr_mimebundle_(self):
        return {MIME: self.d}

    def __repr__(self):
        return json.dumps(self.d)


def _say(**d):
    show = getattr(builtins, "display", None)
    if show is not None:
        show(_State(d))


def _status(rc):
    return 128 - rc if rc < 0 else rc


def _kill(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    p.wait()
    _close_stdin(p)


def _close_stdin(p):
    fd, p.kiln_stdin = getattr(p, "kiln_stdin", None), None
    if fd is not None:
        os.close(fd)


def _where(cid, p):
    """Where background command cid stands, as the worker reads it."""
    rc = p.poll()
    if rc is not None:
        _close_stdin(p)
    d = {"id": cid, "background": True, "running": rc is None}
    if rc is not None:
        d["exit_code"] = _status(rc)
    if getattr(p, "kiln_stdin", None) is not None:
        d["stdin"] = True
    return d


def _background():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def call(raw):
    p = json.loads(raw)
    op, env = p.get("op") or "", dict(os.environ)
    env.update(p.get("env") or {})
    if op == "":
        if p.get("background"):
            start(p["id"], p["cmd"], env, bool(p.get("stdin")))
        else:
            run(p["cmd"], env)
    elif op in ("wait", "kill"):
        settle(op, p["id"], (p.get("wait_ms") or 0) / 1000.0)
    elif op == "input":
        feed(p["id"], base64.b64decode(p.get("input") or ""), bool(p.get("close_stdin")))
    elif op == "list":
        listing = []
        for cid, proc in procs.items():
            d = _where(cid, proc)
            d["cmd"] = proc.kiln_cmd
            listing.append(d)
        _say(commands=listing)
    else:
        raise ValueError("command op %r" % op)


def run(cmd, env):
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:  # noqa: BLE001
            pass
    proc = subprocess.Popen(["/bin/sh", "-c", cmd], cwd=runner.WORKDIR, env=env, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        rc = proc.wait()
    except BaseException:
        _kill(proc)  # the call's timeout (KeyboardInterrupt): the command ends with it
        raise
    code = _status(rc)
    _say(running=False, exit_code=code)
    raise SystemExit(code)


def start(cid, cmd, env, with_stdin):
    os.makedirs(OUT_DIR, mode=0o700, exist_ok=True)
    r = w = None
    if with_stdin:
        r, w = os.pipe2(os.O_CLOEXEC)
    try:
        with open(os.path.join(OUT_DIR, cid + ".out"), "wb") as out, open(os.path.join(OUT_DIR, cid + ".err"), "wb") as err:
            proc = subprocess.Popen(["/bin/sh", "-c", cmd], cwd=runner.WORKDIR, env=env,
                                    stdin=subprocess.DEVNULL if r is None else r,
                                    stdout=out, stderr=err, start_new_session=True, preexec_fn=_background)
    except BaseException:
        if w is not None:
            os.close(w)
        raise
    finally:
        if r is not None:
            os.close(r)
    proc.kiln_cmd, proc.kiln_stdin = cmd, w
    procs[cid] = proc
    # Started: a wait or the list says whether it has ended since.
    d = {"id": cid, "background": True, "running": True}
    if w is not None:
        d["stdin"] = True
    _say(**d)


def feed(cid, data, close):
    """Writes data to background command cid's stdin (blocking while the
    command does not read: the call's timeout ends the wait), then closes
    it when close. A command whose stdin is not open takes nothing."""
    proc = procs.get(cid)
    if proc is None:
        _say(id=cid, background=True, running=False, missing=True)
        return
    fd, closed = getattr(proc, "kiln_stdin", None), False
    if fd is None:
        closed = True
    else:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except BrokenPipeError:
            closed = close = True  # no reader left: nothing more goes in
        if close:
            _close_stdin(proc)
    d = _where(cid, proc)
    if closed:
        d["stdin_closed"] = True
    _say(**d)


def settle(op, cid, wait_s):
    proc = procs.get(cid)
    if proc is None:
        _say(id=cid, background=True, running=False, missing=True)
        return
    killed = False
    if op == "kill":
        if proc.poll() is None:
            _kill(proc)
            killed = True
    elif wait_s > 0:
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass
    for name, fd in (("out", 1), ("err", 2)):
        try:
            with open(os.path.join(OUT_DIR, cid + "." + name), "rb") as f:
                while True:
                    b = f.read(65536)
                    if not b:
                        break
                    os.write(fd, b)
        except FileNotFoundError:
            pass
    d = _where(cid, proc)
    if killed:
        d["killed"] = True
    _say(**d)


# The worker's code reaches this module by this name: the launcher's own
# names are taken out of sys.modules before a call runs (runner.forget_launcher).
sys.modules["_kiln_commands"] = sys.modules[__name__]
