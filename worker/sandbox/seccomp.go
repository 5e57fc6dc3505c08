package sandbox

import (
	"context"
	"slices"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Socket families a sandbox may create. Everything else falls through to the
// profile's default action (EPERM). AF_NETLINK is allowed for NETLINK_ROUTE
// only (what getifaddrs and `ip addr` use), so the kobject-uevent socket that
// streams the host's device events, audit, netfilter and the others stay shut.
var allowedSocketFamilies = []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6}

// deniedENOSYS are syscalls answered ENOSYS rather than EPERM, so programs and
// libraries that probe for them (liburing, Node's libuv) fall back to plain
// syscalls instead of failing.
var deniedENOSYS = []string{"io_uring_setup", "io_uring_enter", "io_uring_register"}

// filteredSyscalls are dropped from every rule of the default profile before
// Kiln's own rules are added. socketcall multiplexes socket() on some 32-bit
// ABIs and would bypass the family filter.
var filteredSyscalls = append([]string{"socket", "socketpair", "socketcall"}, deniedENOSYS...)

// withKilnSeccomp narrows containerd's default seccomp profile (applied
// before it): io_uring is refused with ENOSYS, because its ring executes
// operations (IORING_OP_SOCKET, OPENAT, …) without passing through seccomp
// at all, so any syscall rule would be void while it is reachable; socket()
// and socketpair() are filtered by address family.
//
// Each allow rule compares one argument per index: runc splits repeated
// conditions on one index into separate rules (an OR), and libseccomp can
// make an errno rule unreachable next to a broad allow of the same syscall,
// so the refusals are the default action, not explicit rules.
func withKilnSeccomp(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
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
	nosys := uint(unix.ENOSYS)
	sc.Syscalls = append(sc.Syscalls, specs.LinuxSyscall{Names: deniedENOSYS, Action: specs.ActErrno, ErrnoRet: &nosys})
	return nil
}
