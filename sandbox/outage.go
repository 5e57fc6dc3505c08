package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Surviving a containerd outage. A sandbox is not containerd's process: its
// shim and everything in it live on when containerd dies, and a containerd
// started again on the same state dir finds them. So a job running when
// containerd goes away runs on to its end (a box reports over its control
// socket, a container's output comes over its FIFOs and its init's report
// over a host file); only the task's exit, which comes through containerd,
// waits for it to answer again. The worker pulls no job meanwhile (Healthy).

// unreachable reports whether err is containerd not answering (its
// connection lost or refused) rather than an answer of its.
func unreachable(err error) bool {
	return err != nil && (errdefs.IsUnavailable(err) || status.Code(err) == codes.Unavailable)
}

// rewaitPause spaces out waits made again on a task while containerd does
// not answer (each blocks until the connection is ready; this only bounds
// a loop on an error that comes at once).
const rewaitPause = 200 * time.Millisecond

// waitExit is Task.Wait whose channel delivers the task's exit only: a wait
// cut off because containerd went away is made again once it answers, until
// the runtime is closed; a task containerd no longer knows by then ended
// meanwhile (an unknown exit status, no error). The channel receives one
// status, then is closed. ctx must outlive the task (the caller's is
// detached).
func (r *Containerd) waitExit(ctx context.Context, t containerd.Task) (<-chan containerd.ExitStatus, error) {
	first, err := t.Wait(ctx)
	if err != nil {
		return nil, err
	}
	out := make(chan containerd.ExitStatus, 1)
	go func() {
		defer close(out)
		st := <-first
		for unreachable(st.Error()) && r.life.Err() == nil {
			pause := time.NewTimer(rewaitPause)
			select {
			case <-pause.C:
			case <-r.life.Done():
			}
			pause.Stop()
			st = r.waitAgain(ctx, t.ID())
			if errdefs.IsNotFound(st.Error()) {
				// containerd, started again, found the task's processes
				// gone and removed it: the task ended while containerd was
				// away, and its exit status (kiln-init's own, never
				// judged) went with it. Its init's report stands.
				r.log.InfoContext(ctx, "sandbox: the task ended while containerd was away", slog.String("container_id", t.ID()))
				st = *containerd.NewExitStatus(containerd.UnknownExitStatus, time.Time{}, nil)
			}
		}
		out <- st
	}()
	return out, nil
}

// waitAgain waits, through containerd's task service, for the exit of task
// id: once containerd answers again, or until the runtime is closed.
func (r *Containerd) waitAgain(ctx context.Context, id string) containerd.ExitStatus {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(r.life, cancel)
	defer stop()
	resp, err := r.client.TaskService().Wait(ctx, &tasks.WaitRequest{ContainerID: id}, grpc.WaitForReady(true))
	if err != nil {
		return *containerd.NewExitStatus(containerd.UnknownExitStatus, time.Time{}, errdefs.FromGRPC(err))
	}
	return *containerd.NewExitStatus(resp.GetExitStatus(), resp.GetExitedAt().AsTime(), nil)
}

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
func (r *Containerd) killAndWait(ctx context.Context, sb *sandbox) (containerd.ExitStatus, error) {
	ctx = context.WithoutCancel(ctx)
	giveUp := time.NewTimer(killWaitMax)
	defer giveUp.Stop()
	for {
		kctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
		err := sb.task.Kill(kctx, syscall.SIGKILL, containerd.WithKillAll)
		if !unreachable(err) {
			st, err := r.exitAfterKill(kctx, sb, err)
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
		case <-r.life.Done():
			again.Stop()
			return containerd.ExitStatus{}, fmt.Errorf("sandbox: kill task %s: the runtime closed while containerd did not answer: %w", sb.id, err)
		}
	}
}

// exitAfterKill waits for the exit of a task containerd answered a kill of
// (with killErr) until ctx ends.
func (r *Containerd) exitAfterKill(ctx context.Context, sb *sandbox, killErr error) (containerd.ExitStatus, error) {
	if killErr != nil && !errdefs.IsNotFound(killErr) {
		r.log.WarnContext(ctx, "kill sandbox", slog.String("container_id", sb.id), slog.Any("error", killErr))
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
func (r *Containerd) closeStdinLater(ctx context.Context, sb *sandbox) {
	ctx = context.WithoutCancel(ctx)
	go func() {
		t := time.NewTicker(outagePoll)
		defer t.Stop()
		for {
			select {
			case <-t.C:
			case <-r.life.Done():
				return
			}
			cctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
			err := sb.task.CloseIO(cctx, containerd.WithStdinCloser)
			cancel()
			if !unreachable(err) {
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

// cachedImage is the image entry runtime's last resolve found for ref, or
// nil: what a run uses while containerd does not answer (no image can have
// changed that it would see).
func (r *Containerd) cachedImage(runtime, ref string) *imageEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.images[imageKey(runtime, ref)]
}
