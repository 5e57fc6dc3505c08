package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/sandbox/host"
)

// Under gVisor, kiln-init and its status file reach the sandbox another way.
// runsc's gofer creates every bind mount's mount point in the image's root
// file system as the host sees it, which is read-only, before gVisor's own
// tmpfs at /run exists; the two file bind mounts under /run/kiln (withInit)
// therefore fail the sandbox's start ("mkdir /run/kiln: read-only file
// system"). Instead, one host directory per sandbox is bind-mounted at /run
// (a directory every image has): root-owned and 0755, holding kiln/init (a
// copy of kiln-init, root-owned, read and execute only) and kiln/status (the
// status file, the sandbox user's). The job sees the same paths and can
// change neither the directory nor the init; like the tmpfs, it cannot create
// files in /run.

// gvisorPidsAllowance is added to a gVisor sandbox's cgroup pids limit. The
// sentry (gVisor's kernel, a Go program) and the gofer run in the job's
// cgroup, and the sentry's runtime threads count against pids.max: with the
// job's limit alone, the sentry failed to start threads in several tests and
// died ("fatal error: newosproc"). With the ptrace platform the job's address
// spaces are host stub processes in the cgroup too, so the job stays bounded
// by its limit plus this allowance (a fork bomb still exhausts it and takes
// the sentry down: README, "gVisor").
const gvisorPidsAllowance = 64

// runDirSuffix names a sandbox's /run directory next to its status files.
const runDirSuffix = ".run"

// createRunDir makes sandbox id's /run directory under stateDir, with a copy
// of the init binary and an empty status file owned by uid. It returns the
// directory and the status file's host path; removeRunDir undoes it.
func createRunDir(stateDir, id, initBinary string, uid int) (dir, status, outputs string, err error) {
	dir = filepath.Join(stateDir, id+runDirSuffix)
	kiln := filepath.Join(dir, "kiln")
	if err := os.MkdirAll(stateDir, 0o711); err != nil {
		return "", "", "", fmt.Errorf("create %s: %w", stateDir, err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", "", "", fmt.Errorf("create run dir: %w", err)
	}
	// kiln/ is a tmpfs just big enough for the init, its report and the
	// output channel: what anything ever wrote into those files
	// lands there, never on the host's disk.
	fi, err := os.Stat(initBinary)
	if err != nil {
		return dir, "", "", fmt.Errorf("create run dir: %w", err)
	}
	if err := host.MountSmallFS(kiln, fi.Size()+initFSBytes, 0); err != nil {
		return dir, "", "", fmt.Errorf("create run dir: %w", err)
	}
	if err := os.Chmod(kiln, 0o755); err != nil {
		return dir, "", "", fmt.Errorf("create run dir: %w", err)
	}
	if err := copyFile(initBinary, filepath.Join(kiln, "init"), 0o555); err != nil {
		return dir, "", "", fmt.Errorf("copy kiln-init into the run dir: %w", err)
	}
	status, outputs = filepath.Join(kiln, "status"), filepath.Join(kiln, "outputs")
	for _, p := range []string{status, outputs} {
		if err := host.CreateOwnedFile(p, uid, uid); err != nil {
			return dir, status, outputs, fmt.Errorf("create run dir: %w", err)
		}
	}
	return dir, status, outputs, nil
}

// removeRunDir is cleanup's; "" and a missing directory are fine.
func removeRunDir(dir string) error {
	if dir == "" {
		return nil
	}
	if err := host.UnmountSmallFS(filepath.Join(dir, "kiln")); err != nil && !errors.Is(err, unix.ENOTEMPTY) {
		return fmt.Errorf("remove run dir: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove run dir: %w", err)
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// extraPids is profile.ExtraPids for an isolation.
func extraPids(iso Isolation) int64 {
	if iso == IsolationGVisor {
		return gvisorPidsAllowance
	}
	return 0
}
