// Package jail is the inner sandbox of a box's job, as native code: the C
// library (csrc/, libkilnjail.so) a box's zygote loads once and the process
// it forks for each job calls to become that job's sandbox: fresh mount,
// uts, ipc and network namespaces, a fresh /proc (hidepid, masked,
// read-only), tmpfs and work dir, the job's uid in a user namespace of its
// own nested in the box's that maps that uid alone, no capability,
// no_new_privs, the job seccomp filter (package jobfilter), rlimits. One
// file per concern (csrc/jail.h lists them), each a few hundred lines at
// most, so what makes a job safe reads in an afternoon.
//
// `make init` builds it with the host's gcc (csrc/build.sh) and installs
// it beside kiln-init; the worker binds it read-only into every box
// (sandbox.Config.Jail), and the image's zygote (deploy/images/python/
// jail.py, box.py, session.py) calls it through its C API. The zygote's
// fork of its preloaded interpreter stays the only copy of it a job costs:
// nothing is exec'd. One concern is the zygote's own, not a job's: before
// it preloads, kj_py_arenas (arena.c) has its Python interpreter take its
// object arenas from one range aligned to 2 MiB, so that what it preloads
// can be backed by huge pages and each job's fork copies fewer page-table
// entries.
//
// Seam: the C API in csrc/jail.h (struct kj_job, kj_enter and its three
// steps, the zygote's pid and user namespace calls, kj_py_arenas); Build
// compiles it.
// The C unit tests (csrc/tests, one program per concern, each case in a
// process made as a box's job process is: a user namespace mapped as a
// box's, a pivoted root, a fresh pid namespace) are compiled and run by
// this package's tests, as root.
//
// Invariants: the library links only against libc symbols every glibc has,
// and weakly against CPython's arena allocator hooks (tested); a job's
// steps allocate nothing, start no thread and exec nothing; a step that
// fails returns what failed and leaves the caller to end the process (a
// half-made sandbox never runs a job).
package jail
