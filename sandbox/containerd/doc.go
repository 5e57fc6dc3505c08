// Package containerd is the sandbox's containerd backend, what the facade
// (package sandbox) asks of containerd beyond one sandbox's container and
// task: the labels every container and snapshot carries (labels.go, one
// place), the images' shared read-only root views (rootfs.go: made once per
// layer chain, pruned once no image has the chain), waits on a task's exit
// that survive a containerd outage (outage.go), the reaping of what a
// worker left (reap.go: a dead worker's orphans, a redelivered job's
// sandboxes, sandboxes past their deadline or whose worker's lease lapsed),
// runc-v2 shim groups (shimgroup.go), the daemon's version check, and
// every sandbox's OCI spec as options, one file per concern (spec.go:
// the profile, capabilities, tmpfs, resources, rlimits; seccomp.go;
// kernelmem.go: socket buffers, a read-only /proc; box_spec.go: a box's
// syscalls and binds).
//
// Another shim (Kata, gVisor's runsc) is a runtime name in the container's
// options, not code here.
//
// Seam: Backend holds the containerd client, the snapshotter, the lease
// scope, the logger, the runtime's life (Life: waits across an outage end
// with it) and Owns (which containers the runtime holds, left by the
// reaping); every method takes a ctx that already names the containerd
// namespace. It knows nothing of jobs, boxes or the pool, and never
// imports package sandbox.
//
// Invariants: a shared root view is never removed while a container mounts
// it or an image has its chain; a container the runtime owns is never
// reaped as an orphan; a shim group's members are deleted only once it is
// sealed and every member finished joining.
package containerd
