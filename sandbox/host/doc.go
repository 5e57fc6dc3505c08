// Package host owns what the worker reads and writes on the host for a
// sandbox, outside containerd: cgroup v1 and v2 files (cgroup.go), host
// processes' CPU time and rlimits (proc.go), sandbox uids and uid ranges
// (uid.go), and the host-side tmpfs mounts a sandbox's work dir and status
// files live on, and those files, made for the sandbox's uid (workdir.go).
//
// Seam: plain functions and small types over paths the caller names (the
// cgroup root, a sandbox's cgroupsPath, its directory); package sandbox
// decides when to call them. Nothing here knows containerd, a job or a
// tenant, so the unit tests run against fake cgroup trees in a temporary
// directory.
//
// Invariants: the host never follows a path the sandbox controls: the
// cgroup file system is the kernel's, and a sandbox's directories are made
// and removed by the worker alone (Remove, never RemoveAll, across a mount
// that failed to come off). A uid (or uid range) is held by one live
// sandbox on the host at a time, through an flock other workers on the
// host respect, and is handed out at random among the free ones.
package host
