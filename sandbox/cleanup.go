package sandbox

import (
	"context"
	"io"
	"log/slog"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
)

// undoStack is a sandbox's teardown: each resource prepare takes adds the
// step that gives it back as soon as it is taken, and cleanup runs the
// steps once, the last taken first. A prepare that failed half way leaves
// the steps of exactly what it took, so no field says what to undo.
type undoStack []func(ctx context.Context, t *teardown)

// teardown is what the steps of one cleanup tell each other.
type teardown struct {
	// gone: every process of the sandbox has ended (its task was deleted,
	// or it never had one), so what they held may be handed out again.
	gone bool
	// removed: every containerd object of the sandbox was removed.
	removed bool
}

// push adds the step that undoes what was just taken.
func (u *undoStack) push(step func(ctx context.Context, t *teardown)) {
	*u = append(*u, step)
}

// run runs every step, last pushed first, and empties the stack: a second
// run does nothing.
func (u *undoStack) run(ctx context.Context) teardown {
	t := teardown{gone: true, removed: true}
	steps := *u
	*u = nil
	for i := len(steps) - 1; i >= 0; i-- {
		steps[i](ctx, &t)
	}
	return t
}

// cleanup runs the sandbox's undo stack on a fresh context, so it also runs
// when the job's context is cancelled: the task and the container go (the
// root view is shared and stays), then its work dir, init files, uid and
// stdin. Idempotent. It reports whether every containerd object was removed.
func cleanup(ctx context.Context, sb *sandbox) bool {
	if sb == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return sb.undo.run(ctx).removed
}

// The steps prepare pushes, in the order it takes what they give back.

// untrackStep: the sandbox is no longer this runtime's (track).
func (c *lifecycle) untrackStep(sb *sandbox) func(context.Context, *teardown) {
	return func(context.Context, *teardown) { c.live.track(sb.id, false) }
}

// closeStdinStep unblocks the stdin writer if the program never read its
// input.
func closeStdinStep(sb *sandbox) func(context.Context, *teardown) {
	return func(context.Context, *teardown) { sb.stdinR.CloseWithError(io.ErrClosedPipe) }
}

// releaseUIDStep gives back the sandbox's host uid, or its box's uid range,
// once every process that ran as it has ended. While one may live on, it
// stays taken for as long as this worker runs rather than be shared with
// another job.
func (h *hostSide) releaseUIDStep(sb *sandbox) func(context.Context, *teardown) {
	return func(ctx context.Context, t *teardown) {
		box := sb.box != nil && sb.box.uidRange != 0
		switch {
		case !t.gone && box:
			h.log.WarnContext(ctx, "box uid range kept out of use", slog.String("container_id", sb.id), slog.Int("uid", sb.box.base))
		case !t.gone:
			h.log.WarnContext(ctx, "sandbox uid kept out of use", slog.String("container_id", sb.id), slog.Int("uid", sb.uid))
		case box:
			h.boxRanges.Release(sb.box.uidRange - 1)
		default:
			h.uids.Release(sb.uid)
		}
	}
}

// removeInitFilesStep unmounts the status and output channel files
// (createInitFiles), or a gVisor sandbox's run dir (createRunDir).
func (c *lifecycle) removeInitFilesStep(sb *sandbox) func(context.Context, *teardown) {
	return func(ctx context.Context, _ *teardown) {
		var err error
		if sb.runDir != "" {
			err = removeRunDir(sb.runDir)
		} else {
			err = removeInitFiles(sb.statusPath)
		}
		if err != nil {
			c.log.WarnContext(ctx, "sandbox init files", slog.String("container_id", sb.id), slog.Any("error", err))
		}
	}
}

// releaseWorkDirStep unmounts and removes the work dir (whatever part of
// it was made).
func (h *hostSide) releaseWorkDirStep(sb *sandbox) func(context.Context, *teardown) {
	return func(ctx context.Context, _ *teardown) { h.releaseWorkDir(ctx, sb) }
}

// leaveShimGroupStep ends a join that no task creation ended (shimGroups).
func (c *lifecycle) leaveShimGroupStep(sb *sandbox) func(context.Context, *teardown) {
	return func(context.Context, *teardown) {
		if !sb.joined {
			sb.joined = true
			c.shims.Joined(sb.shimGroup)
		}
	}
}

// deleteContainerStep removes the container.
func (c *lifecycle) deleteContainerStep(sb *sandbox) func(context.Context, *teardown) {
	return func(ctx context.Context, t *teardown) {
		if err := sb.container.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
			t.removed = false
			c.log.WarnContext(ctx, "delete sandbox container", slog.String("container_id", sb.id), slog.Any("error", err))
		}
	}
}

// deleteTaskStep kills whatever still runs in the task (error paths) and
// deletes it; until it is deleted, the sandbox's processes may live on.
func (c *lifecycle) deleteTaskStep(sb *sandbox) func(context.Context, *teardown) {
	return func(ctx context.Context, t *teardown) {
		if sb.exited {
			// Every process is gone with the task's pid namespace: the
			// work dir's memory need not wait for the shim group below.
			c.hostSide.releaseWorkDir(ctx, sb)
		}
		// The shim of a group must not empty while a container joins it.
		c.shims.AwaitDeletable(ctx, sb.shimGroup)
		var opts []containerd.ProcessDeleteOpts
		if !sb.exited {
			opts = append(opts, containerd.WithProcessKill)
		}
		if _, err := sb.task.Delete(ctx, opts...); err != nil && !errdefs.IsNotFound(err) {
			t.gone, t.removed = false, false
			c.log.WarnContext(ctx, "delete sandbox task", slog.String("container_id", sb.id), slog.Any("error", err))
		}
	}
}

// releaseJobStateStep gives back what the sandbox's last job held on the
// host: the memory.peak file arm opened, and the labels it is writing
// (bounded by cleanupTimeout).
func releaseJobStateStep(sb *sandbox) func(context.Context, *teardown) {
	return func(context.Context, *teardown) {
		if sb.peakFile != nil {
			sb.peakFile.Close()
		}
		if sb.labelled != nil {
			<-sb.labelled
		}
	}
}
