// Package jobfilter builds the seccomp filter every job of a box runs under,
// on top of the box's own profile.
//
// A box's supervisor holds capabilities inside the box's user namespace so it
// can make each job's fresh namespaces and mounts; the box's profile must
// therefore allow unshare, mount and their kin. The job gets none of that:
// this filter, installed by the supervisor in the job's process after it
// dropped to the job's uid and set no_new_privs, refuses every call that
// makes or joins a namespace, mounts, reaches the kernel keyrings, io_uring,
// BPF, perf events or userfaultfd, and every syscall of a foreign ABI (x32,
// or another architecture).
//
// Seam: the output is the raw array of struct sock_filter, in host byte
// order, as prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER) takes it; the worker
// binds it read-only into each box, and the zygote installs it in each job.
//
// Invariants: filters stack, so the box's profile still applies; a leaf
// with no dependency on Kiln; what it refuses and allows is tested by
// running the filter, not by reading it.
package jobfilter
