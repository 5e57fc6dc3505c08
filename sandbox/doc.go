// Package sandbox runs one job in a fresh, locked-down sandbox on containerd.
//
// Containerd implements worker.Sandboxes, the one interface the worker
// calls its backend through, with the containerd client and runc (or
// gVisor's runsc). It owns the
// three ways a job meets a sandbox, chosen per job in Containerd.Run:
//
//   - A box (box.go, box_io.go, box_run.go, its spec in package
//     containerd's box_spec.go; the default for
//     runtimes whose profile says "box", under runc): a long-lived container,
//     hardened like every sandbox, that runs as a host uid of its own and
//     serves one tenant. Its launcher is a zygote
//     (deploy/images/python/box.py) that makes the box's user namespace (the
//     worker writes its uid map: a range of host uids no other box holds),
//     preloads modules, and forks every job; the forked process makes its
//     own inner sandbox by calling the jail library (package jail, bound
//     read-only into every box from Config.Jail, containerd's box_spec.go): fresh pid,
//     mount, ipc, uts and network namespaces with a fresh /proc, /tmp,
//     /dev/shm and work dir, a random uid (never the previous job's) in a
//     user namespace of its own that maps that uid alone, no capabilities,
//     no_new_privs and the job seccomp filter (package jobfilter); the next
//     job's sandbox is made while the box is idle, and a job with other
//     limits or a network discards it (box_prepared.go). The worker arms the job's limits on the
//     box's cgroup (arm.go), reads its figures from it, enforces its CPU time
//     over all its processes and holds a lease on it over the control
//     socket: a job whose worker is gone ends. The messages on that socket
//     and the job frame are package initproto's, versioned: a launcher of
//     another major version refuses them, and its last "kiln-launcher:" line
//     is the job's internal error (box_run.go). Which box a job gets, and
//     when boxes are made and retired (the neutral boxes per class, the
//     bound, age, the back-off after a failure), is the box source's
//     (package box, generic over the box). The worker's side of its boxes
//     is boxClient (box.go: it holds the box source, whose boxMaker makes
//     and ends boxes through it, and runs jobs in them).
//     Boxes' configuration and figures are in box_config.go, their uid
//     ranges in box_uid.go.
//   - A container per job (lifecycle.go, acquire.go, cleanup.go), the
//     fallback: prepared for the job (fresh) or ahead of it (the warm pool,
//     pool.go, a layer over a poolBackend, containerPool on containerd in
//     pool_backend.go; its
//     configuration, classes and preloading launchers in pool_config.go,
//     pool_class.go, pool_launcher.go), serving exactly one
//     job, then removed. Runtimes without boxes, gVisor, boxes
//     turned off, a job that does not fit a box.
//
// Every sandbox shares one profile, its OCI spec options one file per
// concern (package containerd's spec.go, seccomp.go, kernelmem.go,
// box_spec.go; init.go and workdir.go here):
// containerd's default spec narrowed to the host's native ABI, no
// capabilities, read-only root, size-capped tmpfs, cgroup limits, rlimits,
// oom_score_adj 1000, loopback-only networking. In a container of its own,
// kiln-init (cmd/kiln-init, protocol in initproto, init.go) is pid 1 and
// reports how the launcher ended over a channel the job cannot forge; in a
// box, the zygote reaps the job's process itself. Package outcome is the one place that turns
// how a job ended and what it used into a status, category and message;
// outcome.go here gathers a job's ending and builds its result.
//
// Host concerns are package host's: cgroup v1 and v2 files, host uids (one
// per container, a range per box, taken at random among free ones), the
// tmpfs mounts of work dirs and status files. This package decides when a
// sandbox takes and gives them back (box_uid.go, workdir.go, cleanup.go),
// and reaps what a dead worker left (reap.go, over package containerd's
// reaping). A job's
// artifacts are package artifacts': collected from its work dir without
// following a link the job made, once the job has ended (workdir.go says
// when). Images and the shared read-only root views of their layers
// are in images.go and package containerd (rootfs.go); the runtime profile and package list an
// image carries in its labels are package runtimes' (read and checked
// there, under the environment and isolations fixed here).
//
// One sandbox (sandbox.go) is what every path has (its container, task,
// streams, host files), the limits armed on it (armedState) and, for a
// box, the box's own state (boxState). Each sandbox carries an undo stack
// (cleanup.go): every resource prepare takes (its uid, init files, work
// dir, shim group, container, task; a box's control socket) pushes the
// step that gives it back as it is taken, and cleanup runs them once, last
// first, so a prepare that failed half way undoes exactly what it took.
//
// A containerd outage (outage.go) ends no job: a sandbox outlives
// containerd, so a job running when it dies goes on to its end; a task's
// exit is waited for again once containerd answers (package containerd's
// WaitExit), and a run takes the image entry last resolved while
// containerd does not answer.
//
// What this package asks of containerd beyond one sandbox's container and
// task is package containerd's (a containerd.Backend, held by lifecycle and
// imageCache): the labels every container and snapshot carries, the images'
// shared root views, waits across an outage, the reaping of what a worker
// left, and shim groups. This package stays the facade the worker calls (Run,
// OpenSession, Reap*, Image, RuntimeInfo, Healthy); its subpackages never
// import it (internal/archcheck counts that).
//
// Containerd, the facade, holds the parts that own the backend's concerns,
// each with its state, and wires them up (containerd.go's wire):
// hostSide (host_side.go: uids and uid ranges, work dirs and the
// artifacts collected from them, the job filter; box_uid.go, workdir.go,
// box_filter.go, and their undo steps in cleanup.go) over liveSet (what
// the runtime owns), imageCache (images.go), lifecycle (one sandbox's
// container and task, its init files and cgroup figures: lifecycle.go,
// cleanup.go, outage.go, retire and the sweep in acquire.go, cgroupUsage
// and the CPU meter in box_io.go), executor (the one path every run takes:
// execute.go, arm.go, outcome.go, hasModule in runtime_info.go), boxClient
// (box.go, box_io.go, box_run.go, box_prepared.go, session_spare.go,
// removeSessionBox in session.go) and containerPool (the pool's backend,
// pool_backend.go, pool_class.go).
//
// A session (session.go, session_spare.go) is a box of its own whose inner
// sandbox and interpreter are kept between calls
// (deploy/images/python/session.py).
//
// Display outputs and the exception come from the launcher on an output
// channel of their own, never from stdout: a fifth pipe handed to a box's
// zygote with each job (read as it fills, box_io.go), or, in a container of
// its own, a host file kiln-init opens as the launcher's descriptor 4 (read
// once the job has ended, lifecycle.go). Package artifacts parses the
// channel and places its outputs, bounded (job.MaxOutputs,
// job.MaxOutputsBytes), long values stored as artifacts.
//
// Seam: callers see Containerd (the worker sees it as worker.Sandboxes) and
// pass an explicit Request (internal/sandboxapi):
// the run's id and spec, its tenant, its live output sink, its artifact
// store and its Network, nothing in the context. A job asking for a network
// is refused unless the request's Network is enabled (NoNetwork is not) and
// the isolation is runc. Sessions are sandboxapi.Session values. The pool
// and the box source are layers over the backend (poolBackend; package
// box's Maker, boxMaker here), each with its own clock and logger, so their
// decisions are unit-tested with a fake backend (pool_backend_test.go,
// package box's tests) while the suites run them on containerd.
//
// Invariants: a job never runs where another tenant's job ran; no job sees
// anything a previous job left (processes, files, IPC, sockets, memory of
// its inputs); the host never follows a path the sandbox controls; nothing
// a program prints or exits with makes a job internal_error or retryable;
// a sandbox's containerd labels are its own life's, never a job's; the
// package knows nothing of queues or HTTP.
package sandbox
