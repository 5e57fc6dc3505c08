// Package sandbox runs one job in a fresh, locked-down container.
//
// Runtime is the interface the worker uses; Containerd implements it with the
// containerd client and runc. Each job gets its own container, whose root is
// the runtime image's one shared read-only view (nothing is written there, so
// one view serves every job and none is made per job), its own namespaces (pid, ipc,
// uts, mount, cgroup, and a network namespace holding only loopback), cgroup
// limits, rlimits, containerd's default seccomp profile, no capabilities and
// no_new_privs, running as uid/gid 65534 on a read-only root with size-capped
// tmpfs mounts on /tmp and /work.
//
// A run has two halves kept apart on purpose so a warm pool can later move the
// first one off the critical path: prepare (create the container and start
// the image's launcher, which then waits on stdin) and deliver (hand the job
// over stdin as one KILN/1 frame and arm the wall-clock timer). The launcher
// is deploy/images/python/launch.py.
package sandbox
