"""Kiln's box supervisor for Python: a long-lived zygote that gives every job a
fresh inner sandbox (sandbox/box.go is the other side).

The box is a container that runs as an unprivileged host uid; this process
makes the box's user namespace (owned by that uid, so every per-user kernel
count of its jobs is charged to it), the worker maps its users, and this
process is then root inside it, with capabilities that count only there. It preloads modules once,
connects to the worker's control socket, and then serves jobs one at a time:

    worker -> zygote: a HEADER_SIZE-byte header "KILN/1 <n>" (space padded,
        newline last) carrying four or five descriptors (SCM_RIGHTS): the
        job's stdin (read end), stdout and stderr (write ends), the frame
        (read end), and the output channel (write end; launch.py's
        KILN_OUTPUT_FD);
        then n bytes of JSON with what the sandbox is made of -- never the
        job's code or data: {"uid": int, "work": str, "cpu_s": int,
        "fsize": int, "nofile": int, "tmp_mb": int, "rmem": str, "wmem": str,
        "egress_port": int (a job with a network only)}. A job with a network
        comes with a sixth descriptor: a unix socket on which the job's
        proxy listener goes back to the worker.
    zygote: unshares a pid namespace for its children, spawns B there
        (exec'd, not forked: Debian's catatonit, a static reaper that is
        pid 1 of the namespace and reaps what the job orphans), forks C into
        the same namespace (pid 2), and goes back to its own pid namespace
        (the zygote is pid 1 of a pid namespace of the box's, made at its
        start, so it may return to it). One copy of the preloaded
        interpreter per job: a fork copies the page tables of every
        preloaded module, and its exit frees them.
        C unshares mount, uts, ipc and net namespaces (and, for a job with a
        network, listens on 127.0.0.1:egress_port in the new network
        namespace and sends that listener to the worker, which serves the
        job's egress proxy on it), makes the mounts private, mounts a fresh
        /proc (hidepid=2: the job sees its own processes only), /tmp,
        /dev/shm and /dev/mqueue, binds the job's own work dir (made by the
        worker) on /work, brings loopback up; then drops to the job's uid
        (no capabilities left), sets no_new_privs, installs the job seccomp
        filter, sets its rlimits, reseeds every random generator the
        preload seeded, and only then reads the frame from its descriptor
        and runs the job. The zygote never reads the frame: nothing of a job
        is ever in its memory. A setup error is written on a pipe C closes
        before it becomes the job.
    The zygote waits for C on a pidfd, reaps it, and kills B: the kernel
        then kills every process left in the pid namespace. Nothing of the
        job survives it: its namespaces, mounts and tmpfs are gone with it.
    worker -> zygote while the job runs: b"h" every heartbeat (the worker's
        lease); b"k" to end the job now. A lapsed lease (no heartbeat for
        LEASE_S) or a closed socket ends the job at once, so no run outlives
        its worker's claim on it.
    zygote -> worker: one JSON line {"ready", "exit_code", "signal", "clean",
        "error", "lease_lapsed"}.

A sandbox may be made ahead of its job: params with "prepare": true make it
as above, up to C waiting for its frame, while the box is idle; then the
worker's b"g" starts the job (the worker writes its frame and stdin, and the
lease begins), or b"x" discards it (its limits do not fit the job that
came), answered by one line {"discarded": true}. The prepared sandbox has
never seen a job: it is as fresh as one made at delivery.

No process of a job can reach this one or B: this one is in another pid
namespace, B is invisible in the job's /proc; both have another uid, and the
job has no capabilities.

A session's box (params carry "session": true) keeps one inner sandbox and its
interpreter between calls instead: session.py, beside this file.
"""

import ctypes
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time

import session

launch = None  # the launcher module (launch.py), set by launch.main
BOX_PIDS = -1  # the zygote's own pid namespace (enter_box_pids)

HEADER_SIZE = 32
LEASE_S = 1.0

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
SECCOMP_MODE_FILTER = 2

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

CAP_LAST = 63
JOB_FILTER = "/run/kiln/box/job.bpf"
# pid 1 of each job's pid namespace: a static reaper (Debian's catatonit),
# exec'd rather than forked from this preloaded interpreter.
REAPER = "/usr/bin/catatonit"
JOBS = "/run/kiln/jobs"

# The paths of /proc runc masks and makes read-only, as the worker names
# them (KILN_BOX_MASK, KILN_BOX_RO; set by serve).
MASKED = []
READ_ONLY = []


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


libc = ctypes.CDLL(None, use_errno=True)


def check(ret, what):
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def mount(src, target, fstype, flags, data=None):
    check(
        libc.mount(
            src.encode() if src else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        "mount %s" % target,
    )


def loopback_up():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        import fcntl

        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
    finally:
        s.close()


def write_sysctl(name, value):
    with open("/proc/sys/" + name.replace(".", "/"), "w") as f:
        f.write(value)


def make_sandbox(p):
    """In C, in its fresh namespaces and still root of the box's user
    namespace: the job's fresh mounts and network."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    # hidepid=2: the job sees only its own processes (its uid's), not B,
    # the reaper that is pid 1 of its namespace.
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    # The worker lowered the zygote's oom_score_adj; the job, and B, its
    # namespace's reaper, are the first the kernel ends at the box's memory
    # limit, as in a container. (Dumpable for the write only: a
    # non-dumpable process's /proc files belong to the host's root. No
    # process of the job exists yet.)
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    try:
        for pid in ("self", "1"):
            with open("/proc/%s/oom_score_adj" % pid, "w") as f:
                f.write("1000")
    finally:
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    # The job's network namespace bounds TCP buffers as a container's does.
    write_sysctl("net.ipv4.tcp_rmem", p["rmem"])
    write_sysctl("net.ipv4.tcp_wmem", p["wmem"])
    # What runc masks and makes read-only in a container's /proc, in this
    # job's fresh one (the box's own /proc is left whole so this mount is
    # allowed at all).
    for path in MASKED:
        if not os.path.exists(path):
            continue
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0")
        else:
            mount("/dev/null", path, None, MS_BIND)
    for path in READ_ONLY:
        if not os.path.exists(path):
            continue
        mount(path, path, None, MS_BIND | MS_REC)
        mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # Read-only as a container's: no process of the job writes its own
    # oom_score_adj, mem, attr or the other per-process knobs.
    mount(None, "/proc", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    size = "size=%dm" % p["tmp_mb"]
    inodes = "nr_inodes=%d" % max(16384, p["tmp_mb"] * 256)
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,%s,%s" % (size, inodes))
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,%s" % size)
    if os.path.isdir("/dev/mqueue"):
        mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    work = os.path.join(JOBS, p["work"])
    if not os.path.isdir(work) or not os.path.isdir("/work"):
        raise OSError(2, "the job's work dir %s (%s) or /work (%s) is missing" % (work, os.path.isdir(work), os.path.isdir("/work")))
    mount(work, "/work", None, MS_BIND)
    mount(None, "/work", None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV)
    # Nothing of the box's own (kiln-init, its status file, the control
    # socket, the other jobs' dirs) is in the job's view.
    mount("tmpfs", "/run/kiln", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555")
    loopback_up()
    check(libc.sethostname(b"kiln", 4), "sethostname")


def become_job(p, job_filter):
    """In C: the job's own identity, with nothing of the supervisor's."""
    for cap in range(CAP_LAST + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last: fine
    uid = p["uid"]
    if uid <= 0:
        raise OSError(0, "a job never runs as root of the box")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    # Changing every uid from 0 clears the capability sets, unless a
    # securebit says otherwise: clear them explicitly, and check.
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    hdr = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    check(libc.capset(hdr, data), "capset")
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("CapInh:", "CapPrm:", "CapEff:", "CapAmb:")) and int(line.split()[1], 16):
                raise OSError(0, "the job still holds capabilities: " + line.strip())
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if job_filter:
        prog = SockFprog(len(job_filter) // 8, job_filter)
        check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")
    # The job owns its /proc/self (setuid made it non-dumpable).
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    if p["cpu_s"] > 0:
        resource.setrlimit(resource.RLIMIT_CPU, (p["cpu_s"], p["cpu_s"] + 1))
    if p["fsize"] > 0:
        resource.setrlimit(resource.RLIMIT_FSIZE, (p["fsize"], p["fsize"]))
    if p["nofile"] > 0:
        resource.setrlimit(resource.RLIMIT_NOFILE, (p["nofile"], p["nofile"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.chdir("/work")
    reseed()


def reseed():
    """Every generator the preload may have seeded starts anew in each job:
    forked jobs must not draw the same numbers."""
    import random

    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed()
        except Exception:  # noqa: BLE001
            pass


def run_c(p, fds, ready_w, job_filter):
    try:
        for i, fd in enumerate(fds[:3]):
            os.dup2(fd, i)
        frame = os.dup(fds[3])
        out = os.dup(fds[4]) if len(fds) > 4 else None  # close-on-exec
        keep = {0, 1, 2, frame, ready_w, out}
        for fd in os.listdir("/proc/self/fd"):
            if int(fd) not in keep:
                try:
                    os.close(int(fd))
                except OSError:
                    pass
        os.setsid()
        become_job(p, job_filter)
        n = launch.read_header(frame)
        code, args, env, files, _ = launch.decode_job(launch.read_exact(frame, n))
        os.close(frame)
        launch.run_job(code, args, env, files, lambda: launch.signal_ready(ready_w), fast=True, out_fd=out)
    finally:
        os._exit(launch.LAUNCH_ERROR)


def start_job(p, fds, job_filter, ctl_fd):
    """Makes the job's sandbox: B, the reaper, spawned as pid 1 of a fresh
    pid namespace, and C, the job's process, forked into it. Returns C's
    pid, a pidfd of C, and the read ends of its readiness and report
    pipes."""
    ready_r, ready_w = os.pipe()
    report_r, report_w = os.pipe()
    # B holds nothing of the job's: it is exec'd, and these are inherited
    # only by the fork.
    for fd in fds:
        os.set_inheritable(fd, False)
    # The zygote's next child, B, is pid 1 of a fresh pid namespace; C is
    # the next, pid 2. The zygote itself stays in its own, and returns to it
    # once both are made.
    check(libc.unshare(CLONE_NEWPID), "unshare the job's pid namespace")
    try:
        spawn_reaper()
        c = os.fork()
    except BaseException:
        back_to_box_pids()
        kill_job()
        reap_all()
        for fd in (ready_r, ready_w, report_r, report_w):
            os.close(fd)
        raise
    if c == 0:
        try:
            # Nothing of the job may hold the control socket (it could talk
            # to the worker as this zygote) or the box's pid namespace.
            os.close(ctl_fd)
            os.close(BOX_PIDS)
            os.close(ready_r)
            os.close(report_r)
            check(libc.unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET), "unshare")
            if p.get("egress_port"):
                hand_over_listener(p["egress_port"], fds[5])
            make_sandbox(p)
            os.close(report_w)  # the job never holds its report pipe
        except BaseException as e:  # noqa: BLE001
            try:
                os.write(report_w, json.dumps({"setup_error": str(e)}).encode())
            finally:
                os._exit(1)
        run_c(p, fds, ready_w, job_filter)
    back_to_box_pids()
    pidfd = os.pidfd_open(c)
    for fd in fds:
        os.close(fd)
    os.close(ready_w)
    os.close(report_w)
    return c, pidfd, ready_r, report_r


def spawn_reaper():
    """Spawns B and returns once B runs in an image of its own. posix_spawn
    returns when B releases the zygote's memory, a moment before B's task
    points at its new one: in that moment B's /proc is the zygote's
    (non-dumpable, of the host's user namespace), hidden from C (hidepid)
    and not C's to write, and on a slow machine (the cgroup v2 guest) C's
    write of B's oom_score_adj met it. B's exec closes its copy of a
    close-on-exec pipe after it has switched to its own memory; the end of
    that pipe is the signal. No process of a job exists while its sandbox is
    made."""
    r, w = os.pipe()  # both close-on-exec: B's copies close in its exec
    try:
        try:
            os.posix_spawn(REAPER, [REAPER, "-P"], {})
        finally:
            os.close(w)
        read_all(r)
    finally:
        os.close(r)


def job_ending(c, report_r):
    """Reaps C, which has ended, and returns its report: how it ended, or
    the setup error it wrote before it could become the job."""
    _, status = os.waitpid(c, 0)
    raw = read_all(report_r)
    if raw:
        return json.loads(raw)
    rep = {"exit_code": 0, "signal": 0}
    if os.WIFSIGNALED(status):
        rep["signal"] = os.WTERMSIG(status)
    else:
        rep["exit_code"] = os.WEXITSTATUS(status)
    return rep


def back_to_box_pids():
    """Makes the zygote's next children members of its own pid namespace
    again (after start_job made one for B)."""
    check(libc.setns(BOX_PIDS, CLONE_NEWPID), "return to the box's pid namespace")


def hand_over_listener(port, chan_fd):
    """In C, in the job's new network namespace: the job's proxy address,
    listened on here and served by the worker (the job only connects)."""
    loopback_up()
    ln = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        ln.bind(("127.0.0.1", port))
        ln.listen(128)
        chan = socket.socket(fileno=os.dup(chan_fd))
        try:
            socket.send_fds(chan, [b"L"], [ln.fileno()])
        finally:
            chan.close()
    finally:
        ln.close()


def read_all(fd):
    chunks = []
    while True:
        b = os.read(fd, 65536)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def kill_job():
    """Kills B, the job's pid namespace init (and so the namespace), and C
    if it is still there. reap_all then reaps both."""
    try:
        os.kill(-1, signal.SIGKILL)  # every process of the zygote's pid namespace but itself: B, C and the job's
    except ProcessLookupError:
        pass


def reap_all():
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def enter(ctl):
    """Connects to the worker and makes the box's user namespace. Called
    before preloading: a process that started threads (OpenBLAS does, at
    import) cannot make a user namespace."""
    global MASKED, READ_ONLY
    MASKED = [p for p in os.environ.pop("KILN_BOX_MASK", "").split(":") if p]
    READ_ONLY = [p for p in os.environ.pop("KILN_BOX_RO", "").split(":") if p]
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        launch.fail("cannot make the zygote non-dumpable")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(ctl)
    except OSError as e:
        launch.fail("control socket %s: %s" % (ctl, e))
    # The box's user namespace, made by this process (so it is owned by
    # the box's own host uid): the worker maps its users, then this process
    # is its root, with capabilities that count only inside it.
    try:
        check(libc.unshare(CLONE_NEWUSER), "unshare the user namespace")
    except OSError as e:
        launch.fail(str(e))
    sock.sendall(b"U")
    if launch_recv_exact(sock, 1) != b"M":
        launch.fail("control socket: no user maps from the worker")
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    enter_box_pids(sock)
    return sock


def enter_box_pids(sock):
    """Makes the zygote pid 1 of a pid namespace of the box's own (owned by
    its user namespace): the zygote makes each job's pid namespace for its
    next child and must then return to its own (start_job), which it may
    only do for a namespace its user namespace owns. This process, kiln-
    init's child, stays as the zygote's parent, and ends as the zygote
    does: kiln-init sees its launcher end when the zygote ends."""
    global BOX_PIDS
    try:
        check(libc.unshare(CLONE_NEWPID), "unshare the box's pid namespace")
        zygote = os.fork()
    except OSError as e:
        launch.fail(str(e))
    if zygote == 0:
        BOX_PIDS = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        return
    # Nothing but the wait: the control socket and every other descriptor
    # are the zygote's alone (the worker sees the box end when it closes).
    sock.close()
    os.closerange(3, 1 << 16)
    while True:
        try:
            _, status = os.waitpid(zygote, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)  # as the zygote ended (an OOM kill reads as one)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def serve(sock, ready_fd):
    """Serves jobs, once preloading is done, until the worker closes the
    socket."""
    try:
        with open(JOB_FILTER, "rb") as f:
            job_filter = f.read()
    except OSError as e:
        launch.fail("job seccomp filter: %s" % e)
    if len(job_filter) % 8 or not job_filter:
        launch.fail("job seccomp filter has a bad length")
    sock.sendall(b"R")  # preloaded: jobs may come
    launch.signal_ready(ready_fd)
    while True:
        head, fds = next_header(sock)
        rest = launch_recv_exact(sock, HEADER_SIZE - len(head))
        if rest is None or len(fds) not in (4, 5, 6):
            launch.fail("control socket: a short job header")
        head += rest
        if not head.startswith(launch.MAGIC):
            launch.fail("control socket: job header does not start with KILN/1")
        body = launch_recv_exact(sock, int(head[len(launch.MAGIC) :].strip()))
        if body is None:
            launch.fail("control socket: closed within a job header")
        p = json.loads(body)
        if p.get("session"):
            # A session's call: its interpreter is kept between calls
            # (session.py).
            out, gone = session.call(p, fds, job_filter, sock)
            if gone:
                os._exit(0)
            try:
                sock.sendall(json.dumps(out).encode() + b"\n")
            except OSError:
                os._exit(0)
            continue
        c, pidfd, ready_r, report_r = start_job(p, fds, job_filter, sock.fileno())
        if p.get("prepare"):
            # Made ahead of its job: the job's process waits for its frame
            # until the worker says go, or the worker discards it.
            cmd = await_go(sock)
            if cmd != b"g":
                kill_job()
                reap_all()
                for fd in (pidfd, ready_r, report_r):
                    os.close(fd)
                if cmd is None:
                    os._exit(0)
                try:
                    sock.sendall(json.dumps({"discarded": True}).encode() + b"\n")
                except OSError:
                    os._exit(0)
                continue
        rep, lapsed, gone = watch(sock, c, pidfd, report_r)
        # B, and with it whatever of the job is left; C too, if the job
        # was ended before it.
        kill_job()
        reap_all()
        ready = os.read(ready_r, 1) == b"R"
        for fd in (pidfd, ready_r, report_r):
            os.close(fd)
        out = {"ready": ready, "exit_code": 0, "signal": 0, "clean": True, "error": "", "lease_lapsed": lapsed}
        if rep is not None and "setup_error" in rep:
            out["clean"], out["error"] = False, "sandbox setup: " + rep["setup_error"]
            out["ready"] = False
        elif rep is not None:
            out["exit_code"], out["signal"] = rep.get("exit_code", 0), rep.get("signal", 0)
        else:
            out["error"] = "the job was ended by the worker" if not lapsed else "the worker's lease lapsed"
            out["killed"] = True
        if gone:
            os._exit(0)
        try:
            sock.sendall(json.dumps(out).encode() + b"\n")
        except OSError:
            os._exit(0)


def watch(sock, c, pidfd, report_r):
    """Waits for C to end while the worker holds its lease. Returns (report
    or None when the job was ended, lease lapsed, worker gone)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(sock.fileno(), select.POLLIN)
    last = time.monotonic()
    while True:
        wait = max(0.0, LEASE_S - (time.monotonic() - last))
        events = poller.poll(int(wait * 1000) + 1)
        for fd, _ in events:
            if fd == pidfd:
                return job_ending(c, report_r), False, False
            b = sock.recv(64)
            if not b:
                return None, False, True
            if b"k" in b:
                return None, False, False
            last = time.monotonic()
        if time.monotonic() - last > LEASE_S:
            return None, True, False


def await_go(sock):
    """Waits, while a prepared sandbox holds its job's place, for the
    worker's word: b"g" (the job's frame is coming: run it), b"x" (discard
    it), or None when the worker closed the socket."""
    while True:
        try:
            b = sock.recv(1)
        except OSError:
            return None
        if not b:
            return None
        if b in (b"g", b"x"):
            return b
        # b"h" or b"k" left over from the last job: not for this one.


def next_header(sock):
    """Reads the first byte of the next job header with its descriptors,
    skipping heartbeat and kill bytes the worker sent as the last job ended."""
    while True:
        try:
            b, fds, _, _ = socket.recv_fds(sock, 1, 6)
        except OSError:
            os._exit(0)
        if not b:
            os._exit(0)  # the worker closed the socket: retired
        if b in (b"h", b"k"):
            for fd in fds:
                os.close(fd)
            continue
        return b, fds


def launch_recv_exact(sock, n):
    chunks = []
    while n > 0:
        b = sock.recv(min(n, 1 << 20))
        if not b:
            return None
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)
