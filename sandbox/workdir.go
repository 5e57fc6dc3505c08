package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/artifacts"
	"github.com/kilnrun/kiln/sandbox/host"
)

// The work dir lives on a tmpfs the worker mounts on the host, one per
// sandbox, bind-mounted at /work in the container. A tmpfs mounted inside the
// container would vanish with the container's mount namespace when the task
// exits, taking the output dir with it; this one outlives the task, so the
// output dir is read after the program has ended (artifacts.CollectOutputDir), and is
// unmounted in cleanup, or by ReapOrphans after a worker crash.

// workDirOf is the host directory holding the sandbox's work dir mount.
func (h *hostSide) workDirOf(containerID string) string {
	return filepath.Join(h.cfg.StateDir, h.cfg.WorkerID, containerID)
}

// reapWorkDirs unmounts and removes every work dir this worker id left, and
// the box control sockets a worker killed while preparing a box left.
func (h *hostSide) reapWorkDirs() (int, error) {
	base := filepath.Join(h.cfg.StateDir, h.cfg.WorkerID)
	ents, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("sandbox: list work dirs: %w", err)
	}
	n := 0
	var errs []error
	for _, e := range ents {
		if h.live.owns(e.Name()) {
			continue
		}
		if !e.IsDir() {
			if err := os.Remove(filepath.Join(base, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("sandbox: remove %s: %w", e.Name(), err))
				continue
			}
			n++
			continue
		}
		if err := host.UnmountWorkDir(filepath.Join(base, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// withHostWorkDir replaces the container's /work tmpfs with a bind mount of
// the host-side tmpfs at src.
func withHostWorkDir(src string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		m := specs.Mount{Destination: ctrd.WorkDir, Type: "bind", Source: src, Options: []string{"rbind", "rw", "nosuid", "nodev"}}
		for i := range s.Mounts {
			if s.Mounts[i].Destination == ctrd.WorkDir {
				s.Mounts[i] = m
				return nil
			}
		}
		s.Mounts = append(s.Mounts, m)
		return nil
	}
}

// withOutputDirEnv names the output dir in the sandbox's environment.
func withOutputDirEnv(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	s.Process.Env = append(s.Process.Env, job.OutputDirEnv+"="+job.OutputDir)
	return nil
}

// prepareWorkDir mounts the sandbox's host-side work dir and returns the
// spec options that bind it at /work and name the output dir in the env.
func (h *hostSide) prepareWorkDir(sb *sandbox, lim job.Limits) ([]oci.SpecOpts, error) {
	dir := h.workDirOf(sb.id)
	sb.workHost = dir
	sb.undo.push(h.releaseWorkDirStep(sb)) // first: whatever part is made is unmounted
	work, err := host.MountWorkDir(dir, lim.DiskMB, sb.uid, sb.uid)
	if err != nil {
		return nil, createError{err}
	}
	return []oci.SpecOpts{withHostWorkDir(work), withOutputDirEnv}, nil
}

// releaseWorkDir unmounts and removes the sandbox's work dir (cleanup).
func (h *hostSide) releaseWorkDir(ctx context.Context, sb *sandbox) {
	if sb.workHost == "" {
		return
	}
	if err := host.UnmountWorkDir(sb.workHost); err != nil {
		h.log.WarnContext(ctx, "release sandbox work dir", slog.String("container_id", sb.id), slog.Any("error", err))
	}
	sb.workHost = ""
}

// collectTimeout bounds storing one job's artifacts.
const collectTimeout = 2 * time.Minute

// collectArtifacts collects the output dir into res once the task has
// exited (every process of the sandbox is gone, so nothing changes the dir
// while it is read). A failure costs the artifacts, not the run.
func (h *hostSide) collectArtifacts(ctx context.Context, sb *sandbox, res *job.Result) {
	if sb.hooks.Store == nil || sb.workHost == "" || !(sb.exited || sb.box != nil && sb.box.jobEnded) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, collectTimeout)
	defer cancel()
	work := filepath.Join(sb.workHost, "work")
	if sb.box != nil && sb.box.jobDir != "" {
		work = sb.box.jobDir // a box job's own work dir on the box's tmpfs
	}
	err := artifacts.CollectOutputDir(ctx, work, h.cfg.ArtifactCaps, sb.hooks.Store, res)
	if err != nil {
		h.log.WarnContext(ctx, "collect output dir", slog.String("container_id", sb.id), slog.Any("error", err))
	}
}
