package containerd

import (
	"context"
	"fmt"
	"math"
	goruntime "runtime"
	"slices"
	"strings"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/contrib/seccomp"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/initproto"
)

// The sandbox's fixed identity and layout.
const (
	sandboxHostname = "kiln"
	WorkDir         = "/work"
	tmpDir          = "/tmp"
	OpenFilesLimit  = 256
	OOMScoreAdj     = 1000 // the host's OOM killer takes a sandbox before anything else
	cfsPeriod       = 100_000
)

// BaseEnv is the environment of every sandbox (job.ReservedEnv); the
// runtime Profile's env follows it (and may not set its names:
// runtimes.Rules.BaseEnv), and a job's own variables arrive through
// the frame and are set by the launcher.
var BaseEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=" + tmpDir,
	"LANG=C.UTF-8",
	"TMPDIR=" + tmpDir,
	"HOSTNAME=" + sandboxHostname,
}

// threadsVar names the variable that sizes a sandbox's thread pools:
// OpenMP's, and the BLAS libraries' that read it when their own is unset.
const threadsVar = "OMP_NUM_THREADS"

// threadsEnv is threadsVar for a sandbox of cpus cores of CPU quota,
// rounded up: a pool sized to the host's cores in a sandbox that may use
// one spins its extra threads against the quota, where they slow the
// job's own and its neighbours' (scikit-learn's KMeans at saturation: half
// the throughput). Unlike BaseEnv it is a default: a job's own env sets
// it as it likes, and a runtime profile's env may set it instead (then
// none here, and it is that runtime's, as the rest of its env). None
// without a quota (cpus 0).
func threadsEnv(cpus float64, profileEnv []string) []string {
	if cpus <= 0 {
		return nil
	}
	for _, kv := range profileEnv {
		if k, _, _ := strings.Cut(kv, "="); k == threadsVar {
			return nil
		}
	}
	return []string{fmt.Sprintf("%s=%d", threadsVar, max(1, int(math.Ceil(cpus))))}
}

// Profile holds what the OCI spec of one sandbox depends on.
type Profile struct {
	Args      []string // the image's entrypoint + cmd: the launcher
	Env       []string // the runtime Profile's env, after BaseEnv
	Limits    job.Limits
	CPUs      float64
	SwapLimit bool // the host accounts memory+swap (cgroup v1 without memsw cannot)
	UID       int  // the sandbox's own host uid and gid (host.UIDPool)
	// SupervisorUID is the uid kiln-init runs as (supervisorUID); when it
	// differs from UID, kiln-init holds the capabilities to start the
	// launcher as UID and to end it, and the launcher's exec drops them.
	SupervisorUID int
	// JobPidNS has kiln-init, as a supervisor of another uid, start the
	// launcher in a pid namespace of the job's own (initproto.EnvJobPidNS;
	// gVisor), for which it holds CAP_SYS_ADMIN too.
	JobPidNS bool
	// BoxBase is the host uid a box's root maps to (box_spec.go); 0: not
	// a box.
	BoxBase int
	// ExtraPids is added to the job's pids limit for the cgroup: the
	// threads of gVisor's sentry and gofer share the job's cgroup
	// (gvisorPidsAllowance); 0 under runc.
	ExtraPids int64
}

// SpecOpts is the sandbox Profile (DESIGN.md "Sandbox Profile") on top of
// containerd's default spec, which already brings the default masked and
// read-only paths, /proc, /dev, /sys (ro) and the pid, ipc, uts, mount and
// network namespaces. A new network namespace from runc holds only loopback.
func SpecOpts(p Profile) []oci.SpecOpts {
	uid := p.UID
	return []oci.SpecOpts{
		oci.WithProcessArgs(p.Args...),
		oci.WithProcessCwd(WorkDir),
		withExactEnv(slices.Concat(BaseEnv, threadsEnv(p.CPUs, p.Env), p.Env)),
		oci.WithHostname(sandboxHostname),
		withUsers(uid, p.SupervisorUID, p.JobPidNS),
		oci.WithNoNewPrivileges,
		oci.WithRootFSReadonly(),
		withTmpfs(p.Limits.DiskMB, uid),
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.CgroupNamespace}),
		withResources(p),
		withRlimits(p.Limits),
		withOOMScoreAdj(OOMScoreAdj),
		withSocketBufferSysctls,
		withReadOnlyProc,
		// After the capabilities are gone: the default Profile only allows
		// the syscalls a capability would need when that capability is held.
		seccomp.WithDefaultProfile(),
		withNativeSeccompOnly,
		withKilnSeccomp(!p.JobPidNS),
		withBoxSeccomp(p.BoxBase != 0),
	}
}

// withNativeSeccompOnly narrows containerd's default seccomp Profile to the
// host's native syscall ABI. The default also admits the compat ABIs (x86 and
// x32 on amd64), which makes libseccomp emit the whole rule set once per ABI:
// a filter three times as long, compiled by runc at every container start and
// run on every syscall. A Python sandbox has no use for 32-bit syscalls, and
// refusing them is stricter than the default, not looser.
func withNativeSeccompOnly(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Linux == nil || s.Linux.Seccomp == nil {
		return nil
	}
	if native, ok := nativeArch[goruntime.GOARCH]; ok {
		s.Linux.Seccomp.Architectures = []specs.Arch{native}
	}
	return nil
}

var nativeArch = map[string]specs.Arch{
	"amd64":   specs.ArchX86_64,
	"arm64":   specs.ArchAARCH64,
	"ppc64le": specs.ArchPPC64LE,
	"s390x":   specs.ArchS390X,
	"riscv64": specs.ArchRISCV64,
}

func withExactEnv(env []string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.Env = append([]string(nil), env...)
		return nil
	}
}

// withUsers makes the container's process run as supervisor with the
// capabilities a supervisor of another uid needs (supervisorCapabilities),
// and kiln-init start the launcher as uid (initproto.EnvRunAs), in a pid
// namespace of the job's own when jobPidNS; when both
// are one uid (a box), the process runs as it with no capability at all.
func withUsers(uid, supervisor int, jobPidNS bool) oci.SpecOpts {
	return func(ctx context.Context, c oci.Client, ctr *containers.Container, s *oci.Spec) error {
		if supervisor == 0 || supervisor == uid {
			if err := oci.WithUIDGID(uint32(uid), uint32(uid))(ctx, c, ctr, s); err != nil {
				return err
			}
			return withNoCapabilities(ctx, c, ctr, s)
		}
		if err := oci.WithUIDGID(uint32(supervisor), uint32(supervisor))(ctx, c, ctr, s); err != nil {
			return err
		}
		caps := slices.Clone(supervisorCapabilities)
		if jobPidNS {
			// To make the job's namespaces and mount its /proc; the
			// default seccomp Profile then admits unshare and mount,
			// which the job's own filter (jobfilter) refuses again.
			caps = append(caps, "CAP_SYS_ADMIN")
			s.Process.Env = append(s.Process.Env, initproto.EnvJobPidNS+"=1")
		}
		// Inheritable and ambient too, or the runtime's exec of kiln-init
		// as a uid other than root would drop them; kiln-init empties
		// both before it starts the launcher.
		s.Process.Capabilities = &specs.LinuxCapabilities{
			Bounding: caps, Effective: caps, Permitted: caps, Inheritable: slices.Clone(caps), Ambient: slices.Clone(caps),
		}
		s.Process.Env = append(s.Process.Env, fmt.Sprintf("%s=%d:%d", initproto.EnvRunAs, uid, uid))
		return nil
	}
}

// supervisorCapabilities are kiln-init's, when it runs as a uid of its own:
// to start the launcher as the job's uid (SETUID, SETGID) and to signal
// the job's processes, which are another uid's (KILL), and to empty the
// bounding set it hands on (SETPCAP). kiln-init empties its bounding,
// ambient and inheritable sets first, so the launcher's exec as a uid
// other than root, with no file capabilities and no_new_privs, leaves the
// job no capability in any set.
var supervisorCapabilities = []string{"CAP_KILL", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID"}

// withNoCapabilities empties all five capability sets (containerd's default
// spec grants the classic Docker set).
func withNoCapabilities(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	s.Process.Capabilities = &specs.LinuxCapabilities{
		Bounding: []string{}, Effective: []string{}, Permitted: []string{}, Inheritable: []string{}, Ambient: []string{},
	}
	return nil
}

// withTmpfs mounts the writable places: /tmp and the work dir, each capped at
// diskMB and owned by the sandbox user; /dev/shm is capped the same way
// instead of containerd's 64 MiB.
func withTmpfs(diskMB int64, uid int) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		size := fmt.Sprintf("size=%dm", diskMB)
		owner := []string{fmt.Sprintf("uid=%d", uid), fmt.Sprintf("gid=%d", uid)}
		kept := s.Mounts[:0]
		for _, m := range s.Mounts {
			switch m.Destination {
			case tmpDir, WorkDir:
				continue
			case "/dev/shm":
				m.Options = []string{"nosuid", "noexec", "nodev", "mode=1777", size}
			}
			kept = append(kept, m)
		}
		s.Mounts = append(kept,
			specs.Mount{Destination: tmpDir, Type: "tmpfs", Source: "tmpfs", Options: append([]string{"nosuid", "nodev", "mode=1777", size}, owner...)},
			specs.Mount{Destination: WorkDir, Type: "tmpfs", Source: "tmpfs", Options: append([]string{"nosuid", "nodev", "mode=0755", size}, owner...)},
		)
		return nil
	}
}

func withResources(p Profile) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux.Resources == nil {
			s.Linux.Resources = &specs.LinuxResources{}
		}
		r := s.Linux.Resources
		mem := p.Limits.MemoryMB << 20
		r.Memory = &specs.LinuxMemory{Limit: &mem}
		if p.SwapLimit {
			// memory+swap equal to memory: the job cannot swap its way past the limit.
			swap := mem
			r.Memory.Swap = &swap
		}
		pids := p.Limits.Pids + p.ExtraPids
		r.Pids = &specs.LinuxPids{Limit: pids}
		quota := int64(math.Ceil(p.CPUs * cfsPeriod))
		period := uint64(cfsPeriod)
		r.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
		return nil
	}
}

// withRlimits sets per-process limits. RLIMIT_CPU's soft limit sends SIGXCPU
// at the job's CPU budget (rounded up to whole seconds); the hard limit a
// second later makes it SIGKILL for a program that catches SIGXCPU.
func withRlimits(l job.Limits) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		cpu := CPULimitSeconds(l)
		disk := uint64(l.DiskMB) << 20
		s.Process.Rlimits = []specs.POSIXRlimit{
			{Type: "RLIMIT_CPU", Soft: cpu, Hard: cpu + 1},
			{Type: "RLIMIT_FSIZE", Soft: disk, Hard: disk},
			{Type: "RLIMIT_NOFILE", Soft: OpenFilesLimit, Hard: OpenFilesLimit},
			{Type: "RLIMIT_CORE", Soft: 0, Hard: 0},
		}
		return nil
	}
}

func withOOMScoreAdj(v int) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.OOMScoreAdj = &v
		return nil
	}
}

// CPULimitSeconds is RLIMIT_CPU's soft limit: the job's CPU budget rounded up
// to whole seconds.
func CPULimitSeconds(l job.Limits) uint64 { return uint64((l.CPUMS + 999) / 1000) }

// CaptureCgroupsPath records the cgroup path containerd's default spec chose.
func CaptureCgroupsPath(dst *string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux != nil {
			*dst = s.Linux.CgroupsPath
		}
		return nil
	}
}
