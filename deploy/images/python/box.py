"""Kiln's box supervisor for Python: a long-lived zygote that gives every job a
fresh inner sandbox (sandbox/box.go is the other side). It preloads, speaks
the protocol, and forks; the sandbox itself is the jail library's
(sandbox/jail, through jail.py), which the process forked for each job
calls to become it.

The box is a container that runs as an unprivileged host uid; this process
makes the box's user namespace (owned by that uid, so every per-user kernel
count of its jobs is charged to it), the worker maps its users, and this
process is then root inside it, with capabilities that count only there. It
preloads modules once, then serves jobs one at a time on the worker's
control socket:

    worker -> zygote: a HEADER_SIZE-byte header "KILN/<version> <n>" (space
        padded, newline last; kilnproto.py) carrying four or five
        descriptors (SCM_RIGHTS): the job's stdin (read end), stdout and
        stderr (write ends), the frame (read end), and the output channel
        (write end); then n bytes of JSON with what the sandbox is made of
        -- never the job's code or data: {"v": version, "uid": int,
        "work": str, "cpu_s": int, "fsize": int, "nofile": int,
        "tmp_mb": int, "rmem": str, "wmem": str, "egress_port": int (a job
        with a network only)}. A job with a network comes with a sixth
        descriptor: a unix socket on which the job's proxy listener goes
        back to the worker. A header or parameters of another major
        version end the zygote with LAUNCH_ERROR and a "kiln-launcher:"
        line naming both versions.
    zygote: makes a pid namespace for its next children, spawns B there
        (exec'd, not forked: Debian's catatonit, a static reaper that is
        pid 1 of the namespace and reaps what the job orphans), forks C into
        the same namespace (pid 2), and returns to its own pid namespace
        (the zygote is pid 1 of a pid namespace of the box's, made at its
        start, so it may return to it). One copy of the preloaded
        interpreter per job: a fork copies the page tables of every
        preloaded module (one entry per 2 MiB where huge_pages() could
        collapse the zygote's memory), and its exit frees them.
        C calls the jail (kj_enter): fresh mount, uts, ipc and net
        namespaces (and, for a job with a network, its proxy listener on
        127.0.0.1:egress_port, sent to the worker); a fresh /proc
        (hidepid=2), /tmp, /dev/shm, /dev/mqueue, the job's work dir on
        /work, loopback up; then the job's uid, a user namespace of its own
        nested in the box's that maps that uid alone, no capabilities,
        no_new_privs, the job seccomp filter, its rlimits. Then C reseeds
        every random generator the preload seeded (preloader.py), and only then reads the
        frame from its descriptor and runs the job. The zygote never reads
        the frame: nothing of a job is ever in its memory. A set-up error is
        written on a pipe C closes before it becomes the job.
    The zygote waits for C on a pidfd, reaps it, and kills B: the kernel
        then kills every process left in the pid namespace. Nothing of the
        job survives it: its namespaces, mounts and tmpfs are gone with it.
    worker -> zygote while the job runs: b"h" every heartbeat (the worker's
        lease); b"k" to end the job now. A lapsed lease (no heartbeat for
        LEASE_S) or a closed socket ends the job at once, so no run outlives
        its worker's claim on it.
    zygote -> worker: one JSON line {"ready", "exit_code", "signal", "clean",
        "error", "lease_lapsed"} (zygote.report).

A sandbox may be made ahead of its job: params with "prepare": true make it
as above, up to C waiting for its frame, while the box is idle; then the
worker's b"g" starts the job (the worker writes its frame and stdin, and the
lease begins), or b"x" discards it (its limits do not fit the job that
came), answered by one line {"discarded": true}. The prepared sandbox has
never seen a job: it is as fresh as one made at delivery.

No process of a job can reach this one or B: this one is in another pid
namespace, B is invisible in the job's /proc; both are uid 0 of the box,
which the job's user namespace does not map, and the job has no
capabilities.

A session's box (params carry "session": true) keeps one inner sandbox and
its interpreter between calls instead: session.py.
"""

import gc
import json
import os
import select
import socket
import sys
import time

import jail
import kilnproto
import preloader
import runner
import session
import zygote

JOB_FILTER = "/run/kiln/box/job.bpf"
# pid 1 of each job's pid namespace: a static reaper (Debian's catatonit),
# exec'd rather than forked from this preloaded interpreter.
REAPER = "/usr/bin/catatonit"


def fail(msg):
    kilnproto.fail(msg)


def enter(ctl, preloads=False):
    """Loads the jail, connects to the worker and makes the box's user
    namespace; returns the Zygote. Called before preloading: a process that
    started threads (OpenBLAS does, at import) cannot make a user
    namespace. preloads: the zygote will preload modules."""
    masked = [p for p in os.environ.pop("KILN_BOX_MASK", "").split(":") if p]
    readonly = [p for p in os.environ.pop("KILN_BOX_RO", "").split(":") if p]
    try:
        with open(JOB_FILTER, "rb") as f:
            job_filter = f.read()
    except OSError as e:
        fail("job seccomp filter: %s" % e)
    if len(job_filter) % 8 or not job_filter:
        fail("job seccomp filter has a bad length")
    try:
        lib = jail.Jail(jail.PATH, job_filter, masked, readonly)
    except OSError as e:
        fail("the jail library %s: %s" % (jail.PATH, e))
    if preloads:
        # What the zygote preloads lies in one range huge pages can back
        # (huge_pages), not in arenas mapped one by one between the shared
        # libraries. A lean zygote holds little more than the launcher's
        # objects, made before this: its arenas stay as CPython maps them,
        # as do all where the library cannot (an older one).
        try:
            lib.py_arenas(ARENA_RESERVE)
        except OSError:
            pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(ctl)
    except OSError as e:
        fail("control socket %s: %s" % (ctl, e))
    # The box's user namespace, made by this process (so it is owned by
    # the box's own host uid): the worker maps its users, then this process
    # is its root, with capabilities that count only inside it.
    try:
        lib.box_userns()
    except OSError as e:
        fail(str(e))
    sock.sendall(b"U")
    if recv_exact(sock, 1) != b"M":
        fail("control socket: no user maps from the worker")
    try:
        lib.box_root()
    except OSError as e:
        fail(str(e))
    box_pids = fork_zygote(sock)
    return Zygote(lib, sock, box_pids)


def fork_zygote(sock):
    """Makes the zygote pid 1 of a pid namespace of the box's own (owned by
    its user namespace; kj_box_root made it for this process's next
    child): the zygote makes each job's pid namespace for its next child
    and must then return to its own, which it may only do for a namespace
    its user namespace owns. This process, kiln-init's child, stays as the
    zygote's parent, and ends as the zygote does: kiln-init sees its
    launcher end when the zygote ends. Returns, in the zygote, a descriptor
    of its pid namespace."""
    try:
        pid = os.fork()
    except OSError as e:
        fail(str(e))
    if pid == 0:
        return os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    # Nothing but the wait: the control socket and every other descriptor
    # are the zygote's alone (the worker sees the box end when it closes).
    sock.close()
    os.closerange(3, 1 << 16)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        import signal

        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)  # as the zygote ended (an OOM kill reads as one)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


# madvise(2) advice: back a range with huge pages now (Linux 6.1+).
MADV_COLLAPSE = 25
HUGE_PAGE = 2 << 20
# The range the zygote's Python object arenas are taken from (jail.py
# py_arenas): reserved address space, committed only as arenas are used
# (~100 MiB for the python image's preload list); arenas past it are
# mapped one by one, as CPython maps them.
ARENA_RESERVE = 1 << 30


def huge_pages():
    """Backs the zygote's anonymous memory (its heap, its Python objects'
    arena range, the preloaded modules' allocations) with huge pages where
    the kernel can (MADV_COLLAPSE): each job's fork then copies one
    page-table entry for every 2 MiB of the preloaded interpreter instead
    of 512, and the job's exit frees as few. A page the job writes is still
    copied alone (the kernel splits the huge mapping in the job's copy).
    Only the pages already there are collapsed: nothing marks the ranges
    for huge pages, so what a job allocates later is in small pages as
    before. Where the kernel cannot (older, THP off, gVisor), nothing
    changes."""
    try:
        import ctypes

        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        with open("/proc/self/maps") as f:
            maps = f.read().splitlines()
    except (OSError, AttributeError):
        return
    for line in maps:
        # "start-end perms offset dev inode [path]": private, writable and
        # anonymous (no path, or the brk heap).
        f = line.split()
        if len(f) < 5 or f[1][:2] != "rw" or f[1][3:4] != "p" or (len(f) > 5 and f[5:] != ["[heap]"]):
            continue
        try:
            start, end = (int(x, 16) for x in f[0].split("-"))
        except ValueError:
            continue
        start = (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
        end &= ~(HUGE_PAGE - 1)
        if end > start:
            madvise(start, end - start, MADV_COLLAPSE)


class Zygote:
    """The box's zygote: the jail, the control socket, its pid namespace."""

    def __init__(self, lib, sock, box_pids):
        self.jail = lib
        self.sock = sock
        self.box_pids = box_pids
        self.sessions = session.Sessions(lib, sock)

    def serve(self, ready_fd):
        """Serves jobs, once preloading is done, until the worker closes
        the socket."""
        # Every object the zygote holds now (the launcher's own, and what
        # it preloaded) is out of the collector's reach in its jobs: a
        # job's collections, and the full one as it ends (runner.finish),
        # walk the job's objects only. Walking the zygote's would write
        # each one's header, and so copy every page of them into the job
        # (2.4 ms a job for the launcher's ~10,000 objects alone).
        gc.collect()
        gc.freeze()
        huge_pages()
        self.sock.sendall(b"R")  # preloaded: jobs may come
        runner.signal_ready(ready_fd)
        while True:
            try:
                p, fds = read_job(self.sock)
            except kilnproto.ProtocolError as e:
                fail(str(e))
            if p.get("session"):
                # A session's call: its interpreter is kept between calls.
                out, gone = self.sessions.call(p, fds)
                if gone or not zygote.send_report(self.sock, out):
                    os._exit(0)
                continue
            self.run_job(p, fds)

    def run_job(self, p, fds):
        c, pidfd, ready_r, report_r = self.start_job(p, fds)
        if p.get("prepare"):
            # Made ahead of its job: the job's process waits for its frame
            # until the worker says go, or the worker discards it.
            cmd = await_go(self.sock)
            if cmd != b"g":
                zygote.kill_all()
                zygote.reap_all()
                for fd in (pidfd, ready_r, report_r):
                    os.close(fd)
                if cmd is None or not zygote.send_report(self.sock, {"discarded": True}):
                    os._exit(0)
                return
        rep, lapsed, gone = watch(self.sock, c, pidfd, report_r)
        # B, and with it whatever of the job is left; C too, if the job
        # was ended before it.
        zygote.kill_all()
        zygote.reap_all()
        ready = os.read(ready_r, 1) == b"R"
        for fd in (pidfd, ready_r, report_r):
            os.close(fd)
        killed = None
        if rep is None:
            killed = "the job was ended by the worker" if not lapsed else "the worker's lease lapsed"
        out = zygote.report(ready, rep, lapsed, killed)
        if gone or not zygote.send_report(self.sock, out):
            os._exit(0)

    def start_job(self, p, fds):
        """Makes the job's sandbox: B, the reaper, spawned as pid 1 of a
        fresh pid namespace, and C, the job's process, forked into it.
        Returns C's pid, a pidfd of C, and the read ends of its readiness
        and report pipes."""
        ready_r, ready_w = os.pipe()
        report_r, report_w = os.pipe()
        # B holds nothing of the job's: it is exec'd, and these are
        # inherited only by the fork.
        for fd in fds:
            os.set_inheritable(fd, False)
        # The zygote's next child, B, is pid 1 of a fresh pid namespace; C
        # is the next, pid 2. The zygote itself stays in its own, and
        # returns to it once both are made.
        self.jail.job_pidns()
        try:
            spawn_reaper()
            c = os.fork()
        except BaseException:
            self.jail.box_pidns(self.box_pids)
            zygote.kill_all()
            zygote.reap_all()
            for fd in (ready_r, ready_w, report_r, report_w):
                os.close(fd)
            raise
        if c == 0:
            run_c(self.jail, p, fds, ready_w, report_w)
        self.jail.box_pidns(self.box_pids)
        pidfd = os.pidfd_open(c)
        for fd in fds:
            os.close(fd)
        os.close(ready_w)
        os.close(report_w)
        return c, pidfd, ready_r, report_r


def run_c(lib, p, fds, ready_w, report_w):
    """C: becomes the job's sandbox (the jail), then reads its frame and
    runs it. Never returns."""
    try:
        try:
            for i, fd in enumerate(fds[:3]):
                os.dup2(fd, i)
            frame = fds[3]
            out = fds[4] if len(fds) > 4 else None
            egress = fds[5] if len(fds) > 5 else -1
            # Every other descriptor (the control socket, the zygote's pid
            # namespace, the egress channel once used) is closed by the jail.
            job = lib.job(p, keep=(frame, out, ready_w, report_w), egress_fd=egress)
            lib.enter(job)
            os.close(report_w)  # the job never holds its report pipe
        except BaseException as e:  # noqa: BLE001
            try:
                os.write(report_w, json.dumps({"setup_error": str(e)}).encode())
            finally:
                os._exit(1)
        preloader.reseed()
        n = kilnproto.read_header(frame)
        code, args, env, files, _ = kilnproto.decode_job(kilnproto.read_exact(frame, n))
        os.close(frame)
        runner.run_job(code, args, env, files, lambda: runner.signal_ready(ready_w), fast=True, out_fd=out)
    except kilnproto.ProtocolError as e:
        fail(str(e))
    finally:
        os._exit(kilnproto.LAUNCH_ERROR)


def spawn_reaper():
    """Spawns B and returns once B runs in an image of its own. posix_spawn
    returns when B releases the zygote's memory, a moment before B's task
    points at its new one: in that moment B's /proc is the zygote's
    (non-dumpable, of the host's user namespace), hidden from C (hidepid)
    and not C's to write, and on a slow machine (the cgroup v2 guest) C's
    write of B's oom_score_adj met it. B's exec closes its copy of a
    close-on-exec pipe after it has switched to its own memory; the end of
    that pipe is the signal. The kernel makes that memory dumpable a moment
    later, in the same system call; C's write waits that moment out
    (rlimits_oom_order in sandbox/jail). No process of a job exists while
    its sandbox is made."""
    r, w = os.pipe()  # both close-on-exec: B's copies close in its exec
    try:
        try:
            os.posix_spawn(REAPER, [REAPER, "-P"], {})
        finally:
            os.close(w)
        zygote.read_all(r)
    finally:
        os.close(r)


def job_ending(c, report_r):
    """Reaps C, which has ended, and returns its report: how it ended, or
    the set-up error it wrote before it could become the job."""
    _, status = os.waitpid(c, 0)
    raw = zygote.read_all(report_r)
    if raw:
        return json.loads(raw)
    return zygote.ending(status)


def watch(sock, c, pidfd, report_r):
    """Waits for C to end while the worker holds its lease. Returns (report
    or None when the job was ended, lease lapsed, worker gone)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(sock.fileno(), select.POLLIN)
    last = time.monotonic()
    while True:
        wait = max(0.0, zygote.LEASE_S - (time.monotonic() - last))
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
        if time.monotonic() - last > zygote.LEASE_S:
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


def read_job(sock):
    """Reads the next job header with its descriptors and its box
    parameters; ends the zygote (exit 0) when the worker closed the
    socket. Raises kilnproto.ProtocolError for a header or parameters this
    zygote does not read."""
    head, fds = next_header(sock)
    rest = recv_exact(sock, kilnproto.HEADER_SIZE - len(head))
    if rest is None:
        raise kilnproto.ProtocolError("control socket: closed within a job header")
    if len(fds) not in (4, 5, 6):
        raise kilnproto.ProtocolError("control socket: a job header with %d descriptors" % len(fds))
    n = kilnproto.parse_box_header(head + rest)
    body = recv_exact(sock, n)
    if body is None:
        raise kilnproto.ProtocolError("control socket: closed within the box parameters")
    return kilnproto.decode_box_params(body), fds


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


def recv_exact(sock, n):
    chunks = []
    while n > 0:
        b = sock.recv(min(n, 1 << 20))
        if not b:
            return None
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)
