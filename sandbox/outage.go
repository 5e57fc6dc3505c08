package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
)

// Surviving a containerd outage. A sandbox is not containerd's process: its
// shim and everything in it live on when containerd dies, and a containerd
// started again on the same state dir finds them. So a job running when
// containerd goes away runs on to its end (a box reports over its control
// socket, a container's output comes over its FIFOs and its init's report
// over a host file); only the task's exit, which comes through containerd,
// waits for it to answer again. The worker pulls no job meanwhile (Healthy).

// killWaitMax bounds the wait for the exit of a task the worker could not
// kill because containerd did not answer. The job's own init ends it at its
// wall clock meanwhile (kiln-init's limit); its exit comes once containerd
// is back.
const killWaitMax = 5 * time.Minute

// outagePoll is how often a kill or a stdin close that containerd did not
// answer is made again.
const outagePoll = time.Second

// killAndWait kills every process of a sandbox's task and waits for its
// exit: at most cleanupTimeout once containerd took the kill; while
// containerd does not answer, the kill is made again every outagePoll,
// until the exit comes, for at most killWaitMax.
func (c *lifecycle) killAndWait(ctx context.Context, sb *sandbox) (containerd.ExitStatus, error) {
	ctx = context.WithoutCancel(ctx)
	giveUp := time.NewTimer(killWaitMax)
	defer giveUp.Stop()
	for {
		kctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
		err := sb.task.Kill(kctx, syscall.SIGKILL, containerd.WithKillAll)
		if !ctrd.Unreachable(err) {
			st, err := c.exitAfterKill(kctx, sb, err)
			cancel()
			return st, err
		}
		cancel()
		again := time.NewTimer(outagePoll)
		select {
		case st := <-sb.exitCh:
			again.Stop()
			return st, nil
		case <-again.C:
		case <-giveUp.C:
			again.Stop()
			return containerd.ExitStatus{}, fmt.Errorf("sandbox: kill task %s: containerd did not answer within %s: %w", sb.id, killWaitMax, err)
		case <-c.life.Done():
			again.Stop()
			return containerd.ExitStatus{}, fmt.Errorf("sandbox: kill task %s: the runtime closed while containerd did not answer: %w", sb.id, err)
		}
	}
}

// exitAfterKill waits for the exit of a task containerd answered a kill of
// (with killErr) until ctx ends.
func (c *lifecycle) exitAfterKill(ctx context.Context, sb *sandbox, killErr error) (containerd.ExitStatus, error) {
	if killErr != nil && !errdefs.IsNotFound(killErr) {
		c.log.WarnContext(ctx, "kill sandbox", slog.String("container_id", sb.id), slog.Any("error", killErr))
	}
	select {
	case st := <-sb.exitCh:
		return st, nil
	case <-ctx.Done():
		return containerd.ExitStatus{}, fmt.Errorf("sandbox: task %s did not exit within %s of SIGKILL", sb.id, cleanupTimeout)
	}
}

// closeStdinLater closes a task's stdin once containerd answers, in the
// background, until the runtime is closed.
func (c *lifecycle) closeStdinLater(ctx context.Context, sb *sandbox) {
	ctx = context.WithoutCancel(ctx)
	go func() {
		t := time.NewTicker(outagePoll)
		defer t.Stop()
		for {
			select {
			case <-t.C:
			case <-c.life.Done():
				return
			}
			cctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
			err := sb.task.CloseIO(cctx, containerd.WithStdinCloser)
			cancel()
			if !ctrd.Unreachable(err) {
				return // closed, or the task is gone
			}
		}
	}()
}

// initReported reports whether a container's init has written its report:
// the job has ended, every process of it gone (cmd/kiln-init).
func initReported(sb *sandbox) bool {
	if sb.statusPath == "" {
		return false
	}
	_, err := readStatus(sb.statusPath, sb.nonce)
	return err == nil
}
