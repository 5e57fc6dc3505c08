package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/sandbox/jobfilter"
)

// A pid namespace of the job's own (initproto.EnvJobPidNS): kiln-init
// starts the launcher through argJob as pid 1 of a pid and mount namespace
// of its own (jobCloneFlags); before its exec it mounts a /proc of that pid
// namespace, so no task of kiln-init's is in the job's view or its /proc
// and the job cannot name one, whatever a kernel lets one task do to
// another (gVisor's lets setpriority, sched_setaffinity and reading
// /proc/<pid>/environ through across uids). kiln-init stays the launcher's
// parent, so it alone learns how it ended.
//
// Only under gVisor: its kernel delivers the signals a namespace's init has
// no handler for as to any process (Linux ignores them), so the job's
// program as pid 1 still ends on its own SIGKILL, alarm() or abort().
const argJob = "--job" // kiln-init --job UID:GID LAUNCHER ARGS...: becomes the launcher

// jobCloneFlags make the launcher's pid and mount namespaces.
const jobCloneFlags = unix.CLONE_NEWPID | unix.CLONE_NEWNS

// subcommand runs kiln-init's argJob role; ok is false for pid 1's own.
func subcommand(args []string) (code int, ok bool) {
	if len(args) < 2 || args[1] != argJob {
		return 0, false
	}
	if len(args) < 4 {
		return fail("usage: kiln-init %s UID:GID LAUNCHER [ARGS...]", argJob), true
	}
	return becomeJob(args[2], args[3], args[3:]), true
}

// becomeJob is the launcher's process before its exec, pid 1 of the job's
// namespaces: it mounts their /proc, empties the capability sets it hands on, becomes the job's uid, installs the job
// filter (jobfilter, as in a box) and execs the launcher, which then has
// no capability in any set.
func becomeJob(runAs, path string, args []string) int {
	runtime.LockOSThread() // the filter is this thread's; the exec is too
	cred, err := credential(runAs)
	if err != nil {
		return fail("%s: %v", argJob, err)
	}
	if os.Getpid() != 1 {
		return fail("%s must be pid 1 of the job's pid namespace", argJob)
	}
	// A kernel without shared subtrees (gVisor's of 2022) answers EINVAL:
	// its mounts never propagate.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil && !errors.Is(err, unix.EINVAL) {
		return fail("make the job's mounts private: %v", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_RDONLY, ""); err != nil {
		return fail("mount the job's /proc: %v", err)
	}
	if err := keepCapabilitiesToItself(); err != nil {
		return fail("drop inheritable capabilities: %v", err)
	}
	if err := becomeUser(cred); err != nil {
		return fail("%s: %v", argJob, err)
	}
	filter, err := jobfilter.Build()
	if err != nil {
		return fail("%s: %v", argJob, err)
	}
	if err := installFilter(filter); err != nil {
		return fail("%s: %v", argJob, err)
	}
	err = syscall.Exec(path, args, os.Environ())
	return fail("exec launcher %s: %v", path, err)
}

// becomeUser sets the process's uid and gid (every thread's) to cred's,
// with no supplementary groups.
func becomeUser(cred *syscall.Credential) error {
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(int(cred.Gid), int(cred.Gid), int(cred.Gid)); err != nil {
		return fmt.Errorf("setresgid: %w", err)
	}
	if err := syscall.Setresuid(int(cred.Uid), int(cred.Uid), int(cred.Uid)); err != nil {
		return fmt.Errorf("setresuid: %w", err)
	}
	return nil
}

// installFilter installs filter (struct sock_filter array, host order) as
// the calling thread's seccomp filter; no_new_privs is the container's.
func installFilter(filter []byte) error {
	if len(filter) == 0 || len(filter)%8 != 0 {
		return fmt.Errorf("job filter of %d bytes", len(filter))
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	prog := unix.SockFprog{Len: uint16(len(filter) / 8), Filter: (*unix.SockFilter)(unsafe.Pointer(&filter[0]))}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog)), 0, 0); err != nil {
		return fmt.Errorf("install the job filter: %w", err)
	}
	runtime.KeepAlive(filter)
	return nil
}
