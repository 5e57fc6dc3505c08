// Command kiln-init is pid 1 of every Kiln container, a box or a sandbox of
// its own: it starts the runtime's launcher as pid 2, so the job's program is
// never its pid namespace's init (which would ignore every signal it has no
// handler for: a self-SIGKILL, alarm() or abort() would do nothing), reaps
// orphans, enforces a wall-clock limit of its own (so a sandbox never
// outlives its job when the worker dies), and reports how the launcher
// really ended over a channel the job cannot forge.
//
// The protocol with the worker and with launchers is documented in
// github.com/kilnrun/kiln/sandbox/initproto. In short, for a launcher:
//
//   - the environment variable KILN_READY_FD names an open descriptor (3);
//   - after reading the job and writing its input files, and before any of
//     the job's code runs, write one byte to it and close it; remove
//     KILN_READY_FD from the environment the job sees;
//   - a failure before that point is reported as the platform's
//     (internal_error, retried); after it, every ending is the program's.
//
// Under gVisor (initproto.EnvJobPidNS) the launcher is pid 1 of a pid and
// mount namespace of the job's own, with a /proc of its own and the job
// filter a box's jobs run under (jobns.go): gVisor's kernel lets a few
// calls through across uids, so there no task of kiln-init's may be in the
// job's view at all; and it delivers the signals a namespace's init has no
// handler for as to any process, so the program being pid 1 there costs
// nothing of the above.
//
// Seam: the worker starts it as each container's process, with the
// launcher's command line as its arguments; the protocol's constants and
// the Status type are initproto's.
//
// Invariants: it imports nothing of Kiln but initproto and jobfilter (a
// leaf); it is not dumpable,
// so the job can neither read its environment nor trace it; it writes the
// status only after every other process of the sandbox is dead.
//
// Build it static and reproducible (the worker bind-mounts the host's copy
// read-only into each sandbox at /run/kiln/init):
//
//	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w -buildid=' ./cmd/kiln-init
package main
