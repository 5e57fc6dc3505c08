"""What a box's zygote shares between its two ways of serving: a job per
inner sandbox (box.py) and a session's calls in one kept sandbox
(session.py): the worker's lease, ending and reaping a sandbox's
processes, and the report line the worker reads (initproto.ZygoteReport).
"""

import json
import os
import signal

# A job whose worker sent no heartbeat for this long is ended.
LEASE_S = 1.0


def read_all(fd):
    chunks = []
    while True:
        b = os.read(fd, 65536)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def kill_all():
    """Kills every process of the zygote's pid namespace but itself: a
    job's reaper (and with it the job's pid namespace) and whatever of the
    job is left. reap_all then reaps them."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass


def reap_all():
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def ending(status):
    """How a process ended, from its wait status."""
    if os.WIFSIGNALED(status):
        return {"exit_code": 0, "signal": os.WTERMSIG(status)}
    return {"exit_code": os.WEXITSTATUS(status), "signal": 0}


def report(ready, rep, lapsed=False, killed_error=None, session=None):
    """The report line of one job or call (initproto.ZygoteReport): rep is
    how it ended ({"exit_code", "signal"}), a set-up error
    ({"setup_error"}: the box is retired), or None when the worker ended
    it (killed_error says why). session, for a session's call, is
    {"fresh": bool, "ended": bool}."""
    out = {"ready": ready, "exit_code": 0, "signal": 0, "clean": True, "error": "", "lease_lapsed": lapsed}
    if rep is not None and "setup_error" in rep:
        out["clean"], out["ready"] = False, False
        out["error"] = "sandbox setup: " + rep["setup_error"]
    elif rep is not None:
        out["exit_code"], out["signal"] = rep.get("exit_code", 0), rep.get("signal", 0)
    if killed_error is not None:
        out["killed"] = True
        if not out["error"]:
            out["error"] = killed_error
    if session is not None:
        out["fresh"], out["ended"] = session["fresh"], session["ended"]
    return out


def send_report(sock, out):
    """Sends a report line; False when the worker is gone."""
    try:
        sock.sendall(json.dumps(out).encode() + b"\n")
        return True
    except OSError:
        return False
