package sandbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/host"
	"github.com/kilnrun/kiln/sandbox/initproto"
)

// Where kiln-init and its status file appear inside a sandbox: on a small
// root-owned tmpfs at /run, so the job can neither create files there nor
// replace the two bind mounts.
const (
	initDir        = ctrd.InitDir
	initPath       = initDir + "/init"
	initStatusPath = initDir + "/status"
	// outputsPath is where the output channel's file appears (package
	// artifacts reads it from the host).
	outputsPath = initDir + "/outputs"
	// initGrace is how long after the worker's own wall-clock limit
	// kiln-init's limit fires: it acts only when the worker did not.
	initGrace = 2 * time.Second
	// initIdleLimit bounds a prepared sandbox's wait for its job: a worker
	// that dies between prepare and deliver leaves nothing running longer.
	initIdleLimit = 5 * time.Minute
)

// initSetup is what one sandbox's init needs from the host.
type initSetup struct {
	Binary  string // host path of kiln-init, bind-mounted read-only
	Status  string // host path of this sandbox's status file
	Nonce   string
	Timeout time.Duration // the job's wall-clock limit
	// RunDir, when set, is a host directory mounted at /run in place of the
	// tmpfs and the two file bind mounts: it already holds kiln/init and
	// kiln/status (createRunDir; used under gVisor).
	RunDir string
	// Outputs, when set, is the host path of the output channel's file
	// (a container of its own; under gVisor it is RunDir's kiln/outputs).
	Outputs string
}

// withInit makes kiln-init the container's process in front of the
// launcher's command line, passes it its secrets and limits, and mounts its
// binary and status file.
func withInit(in initSetup) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.Args = append([]string{initPath}, s.Process.Args...)
		s.Process.Env = append(s.Process.Env,
			initproto.EnvNonce+"="+in.Nonce,
			initproto.EnvStatus+"="+initStatusPath,
			initproto.EnvIdleMS+"="+strconv.FormatInt(initIdleLimit.Milliseconds(), 10),
			initproto.EnvTimeoutMS+"="+strconv.FormatInt((in.Timeout+initGrace).Milliseconds(), 10),
		)
		if in.Outputs != "" {
			s.Process.Env = append(s.Process.Env, initproto.EnvOutputs+"="+outputsPath)
		}
		if in.RunDir != "" {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/run", Type: "bind", Source: in.RunDir, Options: []string{"rbind", "rw", "nosuid", "nodev"}})
			return nil
		}
		s.Mounts = append(s.Mounts,
			specs.Mount{Destination: "/run", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "noexec", "mode=0755", "size=64k", "uid=0", "gid=0"}},
			specs.Mount{Destination: initPath, Type: "bind", Source: in.Binary, Options: []string{"bind", "ro", "nosuid", "nodev"}},
			specs.Mount{Destination: initStatusPath, Type: "bind", Source: in.Status, Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}},
		)
		if in.Outputs != "" {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: outputsPath, Type: "bind", Source: in.Outputs, Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}})
		}
		return nil
	}
}

// statusFSBytes bounds the status file: kiln-init's report is at most
// initproto.MaxStatusBytes; the file is the supervisor uid's, and bounded
// in case a job ever could write it.
const statusFSBytes = 16 << 10

// initFSBytes is the size of the tmpfs a sandbox's status file and output
// channel file live on, alone: what the job writes into the channel (its
// code runs in the launcher's process, which holds the descriptor) lands
// there, a page at a time charged to the job's own cgroup, never on the
// host's disk. The channel is read up
// to job.MaxOutputsBytes; a page more tells a longer one.
const initFSBytes = statusFSBytes + job.MaxOutputsBytes + 4096

// createInitFiles makes, in dir (the sandbox's own directory), a tmpfs of
// initFSBytes holding the empty status file and output channel file, owned
// by kiln-init's uid (supervisorUID) so it can open them and the job cannot. It returns their host
// paths; removeInitFiles undoes it.
func createInitFiles(dir string, uid, gid int) (status, outputs string, err error) {
	fs := filepath.Join(dir, host.StatusFSDir)
	if err := host.MountSmallFS(fs, initFSBytes, unix.MS_NOEXEC); err != nil {
		return "", "", fmt.Errorf("status file: %w", err)
	}
	status, outputs = filepath.Join(fs, "status"), filepath.Join(fs, "outputs")
	for _, p := range []string{status, outputs} {
		if err := host.CreateOwnedFile(p, uid, gid); err != nil {
			return status, outputs, err
		}
	}
	return status, outputs, nil
}

// readStatus reads and checks the init's report. The file's content is the
// supervisor's, but read as a job could have written it: bounded and
// trusted only with the sandbox's nonce.
func readStatus(path, nonce string) (initproto.Status, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return initproto.Status{}, fmt.Errorf("open status file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, initproto.MaxStatusBytes))
	if err != nil {
		return initproto.Status{}, fmt.Errorf("read status file: %w", err)
	}
	return initproto.Parse(b, nonce)
}

// removeInitFiles is cleanup's: it unmounts the tmpfs of the status and
// output channel files (createInitFiles). "" is fine.
func removeInitFiles(status string) error {
	if status == "" {
		return nil
	}
	if err := host.UnmountSmallFS(filepath.Dir(status)); err != nil {
		return fmt.Errorf("remove status file: %w", err)
	}
	return nil
}
