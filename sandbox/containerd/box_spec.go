package containerd

import (
	"context"
	"slices"
	"strings"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// A box runs as an unprivileged host uid with no capabilities, like any
// sandbox. Its zygote then makes a user namespace of its own (so the box's
// user namespace is owned by the box's own host uid, and every per-user
// kernel count of its jobs is charged to that uid, not to root's), and the
// worker writes its uid and gid maps: the box's root is its host uid, and
// uid n inside is host uid + n (boxUIDRange uids, a range no other box
// holds). Inside it the zygote holds every capability and makes each job's
// namespaces and mounts; the job drops them all.

// InitDir is where a sandbox finds what the worker binds into it (kiln-init,
// its status and outputs files; a box's control socket, job filter and
// jail library).
const InitDir = "/run/kiln"

// Where a box's zygote finds the worker's control socket, the job seccomp
// filter, the jail library (deploy/images/python/jail.py's PATH) and the
// host directory that holds each job's work dir.
const (
	BoxSocketPath = InitDir + "/ctl.sock"
	BoxFilterPath = InitDir + "/box/job.bpf"
	BoxJailPath   = InitDir + "/box/jail.so"
	BoxJobsPath   = InitDir + "/jobs"
)

// boxSyscalls are what the zygote needs beyond containerd's default Profile
// for a process without capabilities: they succeed only inside the user
// namespace it makes, where it holds capabilities (setns: back into the
// box's own pid namespace after making a job's, box.py's start_job; a
// namespace the host's user namespace owns stays out of reach). Each job's
// own filter (jobfilter) refuses them again.
var boxSyscalls = []string{"unshare", "setns", "mount", "umount2", "sethostname"}

// withBoxSeccomp admits boxSyscalls in a box's Profile; a no-op elsewhere.
func withBoxSeccomp(box bool) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if !box || s.Linux == nil || s.Linux.Seccomp == nil {
			return nil
		}
		s.Linux.Seccomp.Syscalls = append(s.Linux.Seccomp.Syscalls, specs.LinuxSyscall{Names: boxSyscalls, Action: specs.ActAllow})
		return nil
	}
}

// WithBoxMounts binds a box's control socket at BoxSocketPath and names it
// to the launcher (KILN_BOX), binds the job filter and the jail library
// read-only (the library without noexec: the zygote maps it), and moves the
// host-side work dir tmpfs to BoxJobsPath: each job's own dir on it is bound
// at /work by the zygote. A no-op for any other sandbox (sock "").
func WithBoxMounts(sock, filter, jail string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if sock == "" {
			return nil
		}
		// Last, after whatever is mounted at initDir (runc mounts in order).
		var jobs []specs.Mount
		s.Mounts = slices.DeleteFunc(s.Mounts, func(m specs.Mount) bool {
			if m.Destination == WorkDir && m.Type == "bind" {
				m.Destination = BoxJobsPath
				jobs = append(jobs, m)
				return true
			}
			return false
		})
		// The box's own network namespace serves no job (each has its
		// own, whose TCP buffers the zygote bounds), and runc cannot write
		// sysctls in a user namespace of its own.
		s.Linux.Sysctl = nil
		// Each job mounts a /proc of its own, which the kernel allows in a
		// user namespace only when the box's /proc is fully visible: the
		// paths runc would mask or make read-only in the box's /proc are
		// masked and made read-only by the zygote in every job's /proc
		// instead (KILN_BOX_MASK, KILN_BOX_RO).
		s.Process.Env = append(s.Process.Env, "KILN_BOX="+BoxSocketPath,
			"KILN_BOX_MASK="+strings.Join(s.Linux.MaskedPaths, ":"), "KILN_BOX_RO="+strings.Join(s.Linux.ReadonlyPaths, ":"))
		s.Linux.MaskedPaths, s.Linux.ReadonlyPaths = []string{}, []string{}
		// Likewise read-only: a locked read-only /proc would allow only
		// read-only ones, and the zygote writes the job's network sysctls
		// before it makes the job's /proc read-only.
		for i, m := range s.Mounts {
			if m.Destination == "/proc" && m.Type == "proc" {
				s.Mounts[i].Options = slices.DeleteFunc(slices.Clone(m.Options), func(o string) bool { return o == "ro" })
			}
		}
		s.Mounts = append(s.Mounts,
			specs.Mount{Destination: BoxSocketPath, Type: "bind", Source: sock, Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}},
			specs.Mount{Destination: BoxFilterPath, Type: "bind", Source: filter, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}},
			specs.Mount{Destination: BoxJailPath, Type: "bind", Source: jail, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		)
		s.Mounts = append(s.Mounts, jobs...)
		return nil
	}
}
