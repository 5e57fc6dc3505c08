package containerd

import (
	"context"
	"slices"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
)

// Per-socket buffer ceilings inside a sandbox's network namespace (these
// sysctls are per namespace): 1 MiB each way instead of the host's 4-32 MiB.
// They bound one socket; the cgroup bound below bounds them all.
const SocketBufferMax = "1048576"

// withSocketBufferSysctls caps TCP's buffer autotuning in the sandbox's own
// network namespace. net.core.rmem_max and wmem_max (the SO_RCVBUF/SO_SNDBUF
// ceilings) are read-only outside the host's namespace, and tcp_mem is
// host-wide: neither can be set per sandbox.
func withSocketBufferSysctls(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Linux.Sysctl == nil {
		s.Linux.Sysctl = map[string]string{}
	}
	s.Linux.Sysctl["net.ipv4.tcp_rmem"] = "4096 131072 " + SocketBufferMax
	s.Linux.Sysctl["net.ipv4.tcp_wmem"] = "4096 16384 " + SocketBufferMax
	return nil
}

// withReadOnlyProc mounts the sandbox's /proc read-only. The job can then
// write none of its processes' files there: not oom_score_adj (which an
// unprivileged process may lower: measured on this 6.18 kernel, even below a
// value root set), nor /proc/self/mem, attr, comm, timerslack_ns or the
// other per-process knobs. Reading is unchanged; /proc/sys was read-only
// already, and runc still masks its usual paths on top.
func withReadOnlyProc(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	for i, m := range s.Mounts {
		if m.Destination == "/proc" && m.Type == "proc" && !slices.Contains(m.Options, "ro") {
			s.Mounts[i].Options = append(slices.Clone(m.Options), "ro")
		}
	}
	return nil
}
