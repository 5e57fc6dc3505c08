package sandbox

import (
	"context"
	"io"
	"log/slog"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
)

// cleanup removes the task and the container (the root view is shared and
// stays), on a fresh context so it also runs when the job's context is
// cancelled. Idempotent. It reports whether everything was removed.
func (r *Containerd) cleanup(ctx context.Context, sb *sandbox) bool {
	if sb == nil || sb.cleaned {
		return true
	}
	sb.cleaned = true
	defer r.track(sb.id, false)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if sb.peakFile != nil {
		sb.peakFile.Close()
	}
	if sb.labelled != nil {
		<-sb.labelled // bounded by cleanupTimeout
	}
	if sb.exited {
		// Every process is gone with the task's pid namespace: the work
		// dir's memory need not wait for the shim group below.
		r.releaseWorkDir(ctx, sb)
	}
	if sb.shimGroup != nil && !sb.joined {
		r.shims.joined(sb.shimGroup) // a prepare that ended before creating
	}
	// The shim of a group must not empty while a container joins it.
	r.shims.awaitDeletable(ctx, sb.shimGroup)
	gone := true // every process of the sandbox has ended
	removed := true
	if sb.task != nil {
		var opts []containerd.ProcessDeleteOpts
		if !sb.exited {
			// Error paths: the task may still be running; kill every process first.
			opts = append(opts, containerd.WithProcessKill)
		}
		if _, err := sb.task.Delete(ctx, opts...); err != nil && !errdefs.IsNotFound(err) {
			gone, removed = false, false
			r.log.WarnContext(ctx, "delete sandbox task", slog.String("container_id", sb.id), slog.Any("error", err))
		}
	}
	if sb.boxRange != 0 {
		if gone {
			r.boxRanges.Release(sb.boxRange - 1)
		} else {
			r.log.WarnContext(ctx, "box uid range kept out of use", slog.String("container_id", sb.id), slog.Int("uid", sb.boxBase))
		}
	} else if sb.uid != 0 {
		if gone {
			r.uids.Release(sb.uid)
		} else {
			// Its processes may live on: the uid stays taken while this
			// worker runs rather than be shared with another job.
			r.log.WarnContext(ctx, "sandbox uid kept out of use", slog.String("container_id", sb.id), slog.Int("uid", sb.uid))
		}
	}
	if sb.container != nil {
		if err := sb.container.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
			removed = false
			r.log.WarnContext(ctx, "delete sandbox container", slog.String("container_id", sb.id), slog.Any("error", err))
		}
	}
	// Unblocks the stdin writer if the program never read its input.
	sb.stdinR.CloseWithError(io.ErrClosedPipe)
	if sb.runDir == "" {
		if err := removeInitFiles(sb.statusPath); err != nil {
			r.log.WarnContext(ctx, "sandbox status file", slog.String("container_id", sb.id), slog.Any("error", err))
		}
	}
	if err := removeRunDir(sb.runDir); err != nil {
		r.log.WarnContext(ctx, "sandbox run dir", slog.String("container_id", sb.id), slog.Any("error", err))
	}
	r.releaseWorkDir(ctx, sb)
	return removed
}
