package containerd

import (
	"context"
	"slices"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Socket families a sandbox may create. Everything else falls through to the
// Profile's default action (EPERM). AF_NETLINK is allowed for NETLINK_ROUTE
// only (what getifaddrs and `ip addr` use), so the kobject-uevent socket that
// streams the host's device events, audit, netfilter and the others stay shut.
var allowedSocketFamilies = []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6}

// deniedENOSYS are syscalls answered ENOSYS rather than EPERM, so programs and
// libraries that probe for them (liburing, Node's libuv) fall back to plain
// syscalls instead of failing.
var deniedENOSYS = []string{"io_uring_setup", "io_uring_enter", "io_uring_register"}

// deniedENOSYSAlways are refused with ENOSYS on every runtime: sending a
// signal through a pidfd names no pid the Profile could check (a pidfd can
// be /proc/1 opened as a directory), and callers fall back to kill() when
// it is missing (Go's os package and libraries probe for it).
var deniedENOSYSAlways = []string{"pidfd_send_signal"}

// pidTargeting are syscalls that act on another process named by the pid in
// argument pidArg: signals, and prlimit64, which a process may use on any
// process of its own uid (lowering kiln-init's RLIMIT_FSIZE or RLIMIT_CPU
// would stop it from reporting how the job ended). The Profile answers them
// ESRCH, as if there were no such process, when that pid is 1, the
// sandbox's init: Linux ignores the signals a namespace's init has no
// handler for, but gVisor delivers them, and nothing else stops prlimit64.
// The job itself is never pid 1.
var pidTargeting = []struct {
	name   string
	pidArg uint
}{
	{"kill", 0},
	{"tkill", 0},
	{"tgkill", 0},
	{"rt_sigqueueinfo", 0},
	{"rt_tgsigqueueinfo", 0},
	{"prlimit64", 0},
}

// filteredSyscalls are dropped from every rule of the default Profile before
// Kiln's own rules are added. socketcall multiplexes socket() on some 32-bit
// ABIs and would bypass the family filter.
var filteredSyscalls = func() []string {
	names := append([]string{"socket", "socketpair", "socketcall"}, deniedENOSYS...)
	names = append(names, deniedENOSYSAlways...)
	for _, c := range pidTargeting {
		names = append(names, c.name)
	}
	return names
}()

// withKilnSeccomp narrows containerd's default seccomp Profile (applied
// before it): io_uring is refused with ENOSYS, because its ring executes
// operations (IORING_OP_SOCKET, OPENAT, …) without passing through seccomp
// at all, so any syscall rule would be void while it is reachable; socket()
// and socketpair() are filtered by address family.
//
// Each allow rule compares one argument per index: runc splits repeated
// conditions on one index into separate rules (an OR), and libseccomp can
// make an errno rule unreachable next to a broad allow of the same syscall,
// so the refusals are the default action, not explicit rules.
//
// protectInit refuses pidTargeting aimed at pid 1, the sandbox's init, in
// the job's view; without it (a job in a pid namespace of its own, whose
// pid 1 is its own launcher: Profile.JobPidNS) they are allowed as the
// default Profile allows them.
func withKilnSeccomp(protectInit bool) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		return kilnSeccomp(s, protectInit)
	}
}

func kilnSeccomp(s *oci.Spec, protectInit bool) error {
	if s.Linux == nil || s.Linux.Seccomp == nil {
		return nil
	}
	sc := s.Linux.Seccomp
	kept := sc.Syscalls[:0]
	for _, rule := range sc.Syscalls {
		rule.Names = slices.DeleteFunc(slices.Clone(rule.Names), func(n string) bool { return slices.Contains(filteredSyscalls, n) })
		if len(rule.Names) > 0 {
			kept = append(kept, rule)
		}
	}
	sc.Syscalls = kept
	for _, fam := range allowedSocketFamilies {
		sc.Syscalls = append(sc.Syscalls, specs.LinuxSyscall{
			Names:  []string{"socket"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 0, Value: fam, Op: specs.OpEqualTo}},
		})
	}
	sc.Syscalls = append(sc.Syscalls,
		specs.LinuxSyscall{
			Names:  []string{"socket"},
			Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{
				{Index: 0, Value: unix.AF_NETLINK, Op: specs.OpEqualTo},
				{Index: 2, Value: unix.NETLINK_ROUTE, Op: specs.OpEqualTo},
			},
		},
		// socketpair exists only for AF_UNIX among the allowed families.
		specs.LinuxSyscall{
			Names:  []string{"socketpair"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 0, Value: unix.AF_UNIX, Op: specs.OpEqualTo}},
		},
	)
	// A pid is a 32-bit int, but seccomp sees the whole 64-bit register and
	// the kernel uses its low half: the refusal compares the low 32 bits
	// only, so 0x1_00000001 is pid 1 to both. The errno must differ from the
	// Profile's default (EPERM): libseccomp drops a rule whose action is the
	// default's, and the allow rule would then take pid 1 too. The allow
	// rule's condition (>= 0, unsigned) is always true but is a condition on
	// the same argument: an unconditional allow, or one on another argument,
	// is evaluated first and makes the refusal unreachable. libseccomp
	// places the masked comparison first; TestHostileKillInit holds it to
	// that, on runc and on gVisor (which compiles the Profile itself).
	srch := uint(unix.ESRCH)
	for _, c := range pidTargeting {
		if !protectInit {
			sc.Syscalls = append(sc.Syscalls, specs.LinuxSyscall{Names: []string{c.name}, Action: specs.ActAllow})
			continue
		}
		sc.Syscalls = append(sc.Syscalls,
			specs.LinuxSyscall{
				Names: []string{c.name}, Action: specs.ActErrno, ErrnoRet: &srch,
				Args: []specs.LinuxSeccompArg{{Index: c.pidArg, Value: 0xffff_ffff, ValueTwo: 1, Op: specs.OpMaskedEqual}},
			},
			specs.LinuxSyscall{
				Names: []string{c.name}, Action: specs.ActAllow,
				Args: []specs.LinuxSeccompArg{{Index: c.pidArg, Value: 0, Op: specs.OpGreaterEqual}},
			},
		)
	}
	nosys := uint(unix.ENOSYS)
	sc.Syscalls = append(sc.Syscalls,
		specs.LinuxSyscall{Names: deniedENOSYS, Action: specs.ActErrno, ErrnoRet: &nosys},
		specs.LinuxSyscall{Names: deniedENOSYSAlways, Action: specs.ActErrno, ErrnoRet: &nosys},
	)
	return nil
}
