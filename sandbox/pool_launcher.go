package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"

	"github.com/kilnrun/kiln/sandbox/host"
)

// awaitLauncher waits until the sandbox's cgroup holds the launcher beside
// kiln-init and, when it preloads modules, until the launcher has said on
// stdout that it is done (preloadedMarker; arm discards it with the rest of
// the output before the job's). A job armed earlier would share its memory
// limit, CPU budget and wall clock with the preloading: a low memory limit
// would kill the import and be reported as the job's. Bounded: a launcher
// that never gets there is a broken sandbox.
func awaitLauncher(ctx context.Context, sb *sandbox, preloads bool) error {
	cg, err := host.NewCgroupDir(host.CgroupRoot, host.CgroupV2(), sb.cgroupsPath)
	if err != nil {
		return err
	}
	start := time.Now()
	running := false
	for {
		var err error
		if !running {
			var pids []int
			pids, err = cg.Procs()
			running = err == nil && len(pids) >= 2
		}
		if running && !preloads {
			return nil
		}
		if running && sb.stdout.contains(preloadedMarker) {
			// What the preload holds: the job's memory limit is armed on
			// top of it (arm).
			sb.baseline, err = cg.MemoryUsage()
			return err
		}
		switch {
		case !running && time.Since(start) > launcherStartTimeout:
			return fmt.Errorf("sandbox %s: no launcher process %s after start (%v)", sb.id, launcherStartTimeout, err)
		case time.Since(start) > preloadTimeout:
			return fmt.Errorf("sandbox %s: the launcher did not finish preloading within %s", sb.id, preloadTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

const (
	// launcherStartTimeout bounds the wait for the launcher process.
	launcherStartTimeout = 10 * time.Second
	// preloadTimeout bounds the wait for its preloading (pandas takes about
	// half a second of CPU on an idle host; a loaded one takes longer).
	preloadTimeout = time.Minute
)

// withPreload names the modules the launcher imports before reading its job
// (KILN_PRELOAD, which the launcher removes from its environment).
func withPreload(modules []string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if len(modules) > 0 {
			s.Process.Env = append(s.Process.Env, EnvPreload+"="+strings.Join(modules, ","))
		}
		return nil
	}
}

// withSessionInterpreter tells a session launcher what its sessions run
// calls in (EnvSessionInterpreter, a JSON array of words); none: nothing.
func withSessionInterpreter(argv []string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if len(argv) > 0 {
			b, err := json.Marshal(argv)
			if err != nil {
				return err
			}
			s.Process.Env = append(s.Process.Env, EnvSessionInterpreter+"="+string(b))
		}
		return nil
	}
}

// EnvSessionInterpreter is the session launcher's variable naming, as a
// JSON array, the process a session's calls run in (session.py).
const EnvSessionInterpreter = "KILN_SESSION_INTERPRETER"

// EnvPreload is the launcher's variable naming the modules to preload.
const EnvPreload = "KILN_PRELOAD"
