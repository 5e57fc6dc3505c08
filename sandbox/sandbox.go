package sandbox

import (
	"bufio"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd"
)

// sandbox is one prepared container: created, started, its launcher waiting
// on stdin for the job frame. A pooled one is prepared before its job exists
// (jobID empty until arm). What every sandbox has is here; the limits armed
// on it are armedState's, and a box's own state is boxState's (nil for a
// container per job).
type sandbox struct {
	id        string
	jobID     string
	container containerd.Container
	task      containerd.Task
	exitCh    <-chan containerd.ExitStatus
	stdinR    *io.PipeReader
	stdinW    *io.PipeWriter
	stdout    *cappedBuffer
	stderr    *cappedBuffer
	// undo gives back what the sandbox took, last taken first (cleanup).
	undo    undoStack
	retired bool // handed to retire (which owns it from then on)
	// exited is set once the task's init process was seen to exit. Its pid
	// namespace dies with it (the kernel kills and reaps every process left
	// in it before init's exit is reported), so nothing is left to kill.
	exited bool
	// cgroupsPath is the container's cgroup as the spec names it, for
	// figures the shim's metrics lack (memory.peak on cgroup v2) and the
	// limits armed on a pooled sandbox.
	cgroupsPath string
	// statusPath is the host file kiln-init reports in; nonce is the
	// secret its report must carry.
	statusPath string
	nonce      string
	// runDir is the host directory mounted at /run under gVisor
	// (createRunDir); "" under runc.
	runDir string
	// outputsPath is the host file of the output channel of a container
	// of its own (display outputs); "" for a box.
	outputsPath string
	// uid is the sandbox's host uid (a box's: the base of its range); 0
	// when none was taken.
	uid int
	// workHost is the host dir holding the work dir tmpfs ("" until mounted).
	workHost string
	hooks    runHooks // the run's callbacks, set at arm
	// tap receives the output as it arrives (Request.Output), set at arm.
	tap atomic.Pointer[func(string, []byte)]
	// shimGroup is the runc-v2 shim group the sandbox joined (nil: a shim
	// of its own); joined is set once its joining is over.
	shimGroup *ctrd.ShimGroup
	joined    bool
	// labelled is closed once arm's labels are written (nil: none pending).
	labelled chan struct{}

	// What a sandbox made ahead of its job (pooled, or a box) was made
	// for, and when.
	pooled   bool
	class    poolClass
	img      *imageEntry
	prepared time.Time

	armedState

	// box is a box's own state (box.go); nil for a container per job.
	box *boxState
}

// armedState is what arm set on a sandbox made ahead of its job: the
// limits in force and the baselines its job's figures are read against.
type armedState struct {
	// cpuLimit is RLIMIT_CPU's soft limit as armed (on a pooled sandbox it
	// counts the launcher's CPU time before the job too).
	cpuLimit time.Duration
	// Baselines taken at arm on a pooled sandbox: the job's figures are
	// what the cgroup counted after them.
	cpuBase time.Duration
	// cpuBudget is the job's CPU limit over all its processes (armed).
	cpuBudget time.Duration
	oomBase   uint64
	// The limits in force on a pooled sandbox or box (as created, then
	// as the last arm set them): arm writes only what a job changes.
	memLimit, pidsLimit int64
	cpuSoft             uint64
	peakFile            *os.File // cgroup v2 memory.peak reset at arm; nil: not resettable
	// baseline is the memory a box's or pooled sandbox's cgroup was
	// charged once it had preloaded, before any job (preloadBaseline): a
	// job's memory limit is armed on top of it and its peak read without
	// it. Zero for a sandbox that preloads nothing.
	baseline int64
}

// boxState is a box's: its tenant, the zygote's control connection (ctlMu
// orders writes on it), the jobs it served and when it last served one,
// whether its current job has ended (its processes are gone while the box
// lives on), its uid range, and the current job's work dir.
type boxState struct {
	tenant string
	// session: the box is a session's, whose memory is the session's
	// across its calls (arm sets the same limit for each).
	session   bool
	ctl       *net.UnixConn
	ctlMu     sync.Mutex
	ctlReader *bufio.Reader
	jobs      int
	lastUsed  time.Time
	jobEnded  bool
	// base is the host uid the box's root maps to; uidRange is the range
	// taken for it (index+1; 0: none).
	base     int
	uidRange int
	jobDir   string
	// lastUID is the uid drawn for the box's last inner sandbox: the next
	// is drawn among the others (newJobWork).
	lastUID int
	// supervisors are the processes the box held when its zygote became
	// ready, sorted: after a job, it must hold these and no other.
	supervisors []int
	// beatsPaused stops the heartbeats of the box's running job (tests: a
	// stopped worker).
	beatsPaused atomic.Bool
	// next is the inner sandbox made ahead of the box's next job
	// (box_prepared.go); nil when none waits.
	next *preparedJob
}

// What the box source (package box) asks of a box.

// Prepared is when the box's supervisor became ready.
func (sb *sandbox) Prepared() time.Time { return sb.prepared }

// ExitedIdle reports whether the box's task ended while it sat idle.
func (sb *sandbox) ExitedIdle() bool { return exitedIdle(sb) }

// LastUsed is when the box last served a job.
func (sb *sandbox) LastUsed() time.Time { return sb.box.lastUsed }

// Claim makes a neutral box tenant's.
func (sb *sandbox) Claim(tenant string) { sb.box.tenant = tenant }
