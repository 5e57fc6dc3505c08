"""The jail library (sandbox/jail, libkilnjail.so) as the zygote calls it:
its C API (sandbox/jail/csrc/jail.h) through ctypes. The worker binds the
library read-only into every box at PATH; the zygote loads it once, and
the process it forks for a job calls it to become the job's sandbox.
Nothing here makes a system call of the sandbox itself.
"""

import ctypes
import errno
import os

# Where the worker binds the library in a box (sandbox/box_spec.go).
PATH = "/run/kiln/box/jail.so"
# struct kj_job's layout (KJ_ABI).
ABI = 1
KEEP = 4


class Error(Exception):
    """A step of the job's sandbox failed: its message says which."""


class Job(ctypes.Structure):
    """struct kj_job: what a job's sandbox is made of."""

    _fields_ = [
        ("abi", ctypes.c_int32),
        ("uid", ctypes.c_int32),
        ("new_pid", ctypes.c_int32),
        ("egress_port", ctypes.c_int32),
        ("egress_fd", ctypes.c_int32),
        ("proc_fd", ctypes.c_int32),
        ("keep", ctypes.c_int32 * KEEP),
        ("cpu_s", ctypes.c_int64),
        ("fsize", ctypes.c_int64),
        ("nofile", ctypes.c_int64),
        ("tmp_mb", ctypes.c_int64),
        ("work", ctypes.c_char_p),
        ("rmem", ctypes.c_char_p),
        ("wmem", ctypes.c_char_p),
        ("masked", ctypes.c_char_p),
        ("readonly", ctypes.c_char_p),
        # A c_char_p, not a c_void_p: ctypes then holds the bytes the
        # pointer points into for as long as the structure lives.
        ("filter", ctypes.c_char_p),
        ("filter_len", ctypes.c_int64),
        ("err", ctypes.c_char * 256),
    ]


class Jail:
    """The loaded library and what every job of the box shares: the job
    seccomp filter and the /proc paths to mask and make read-only."""

    def __init__(self, path, job_filter, masked, readonly):
        lib = ctypes.CDLL(path, use_errno=True)
        for step in ("kj_enter", "kj_unshare", "kj_mount", "kj_become"):
            fn = getattr(lib, step)
            fn.argtypes = [ctypes.POINTER(Job)]
            fn.restype = ctypes.c_char_p
        for call in ("kj_box_userns", "kj_box_root", "kj_job_pidns"):
            getattr(lib, call).argtypes = []
        lib.kj_box_pidns.argtypes = [ctypes.c_int]
        # A library older than the binding has no kj_py_arenas.
        self.py_arenas_fn = getattr(lib, "kj_py_arenas", None)
        if self.py_arenas_fn is not None:
            self.py_arenas_fn.argtypes = [ctypes.c_size_t]
            self.py_arenas_fn.restype = ctypes.c_int
        self.lib = lib
        self.job_filter = job_filter
        self.masked = ":".join(masked).encode()
        self.readonly = ":".join(readonly).encode()

    def job(self, p, keep=(), egress_fd=-1, new_pid=False):
        """The job for box parameters p (kilnproto.decode_box_params);
        keep: the descriptors the job holds besides 0, 1 and 2."""
        keep = list(keep)[:KEEP]
        j = Job(
            abi=ABI,
            uid=p["uid"],
            new_pid=1 if new_pid else 0,
            egress_port=p.get("egress_port") or 0,
            egress_fd=egress_fd,
            proc_fd=-1,
            cpu_s=p.get("cpu_s") or 0,
            fsize=p.get("fsize") or 0,
            nofile=p.get("nofile") or 0,
            tmp_mb=p["tmp_mb"],
            work=p["work"].encode(),
            rmem=(p.get("rmem") or "").encode(),
            wmem=(p.get("wmem") or "").encode(),
            masked=self.masked,
            readonly=self.readonly,
            filter=self.job_filter,
            filter_len=len(self.job_filter),
        )
        for i in range(KEEP):
            j.keep[i] = keep[i] if i < len(keep) and keep[i] is not None else -1
        return j

    def _step(self, fn, job):
        err = fn(ctypes.byref(job))
        if err is not None:
            raise Error(err.decode("utf-8", "replace"))

    def enter(self, job):
        """All three steps: a box job's forked process."""
        self._step(self.lib.kj_enter, job)

    def unshare(self, job):
        self._step(self.lib.kj_unshare, job)

    def mount(self, job):
        self._step(self.lib.kj_mount, job)

    def become(self, job):
        self._step(self.lib.kj_become, job)

    def _call(self, fn, what, *args):
        if fn(*args) != 0:
            e = ctypes.get_errno()
            raise OSError(e, "%s: %s" % (what, os.strerror(e)))

    def box_userns(self):
        self._call(self.lib.kj_box_userns, "make the box's user namespace")

    def box_root(self):
        self._call(self.lib.kj_box_root, "become the box's root")

    def job_pidns(self):
        self._call(self.lib.kj_job_pidns, "make the job's pid namespace")

    def box_pidns(self, fd):
        self._call(self.lib.kj_box_pidns, "return to the box's pid namespace", fd)

    def py_arenas(self, reserve):
        """This interpreter's object arenas from one range of reserve bytes
        that huge pages can back (arena.c); before preloading."""
        if self.py_arenas_fn is None:
            raise OSError(errno.ENOSYS, "the jail library has no kj_py_arenas")
        self._call(self.py_arenas_fn, "reserve the object arenas' range", reserve)
