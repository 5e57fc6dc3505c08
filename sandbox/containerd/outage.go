package containerd

import (
	"context"
	"log/slog"
	"time"

	"github.com/containerd/containerd"
	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A sandbox is not containerd's process: its shim and everything in it
// live on when containerd dies, and a containerd started again on the same
// state dir finds them. Only the task's exit, which comes through
// containerd, waits for it to answer again (sandbox/outage.go says what a
// run does meanwhile).

// Unreachable reports whether err is containerd not answering (its
// connection lost or refused) rather than an answer of its.
func Unreachable(err error) bool {
	return err != nil && (errdefs.IsUnavailable(err) || status.Code(err) == codes.Unavailable)
}

// rewaitPause spaces out waits made again on a task while containerd does
// not answer (each blocks until the connection is ready; this only bounds
// a loop on an error that comes at once).
const rewaitPause = 200 * time.Millisecond

// WaitExit is Task.Wait whose channel delivers the task's exit only: a wait
// cut off because containerd went away is made again once it answers, until
// the runtime is closed; a task containerd no longer knows by then ended
// meanwhile (an unknown exit status, no error). The channel receives one
// status, then is closed. ctx must outlive the task (the caller's is
// detached).
func (b *Backend) WaitExit(ctx context.Context, t containerd.Task) (<-chan containerd.ExitStatus, error) {
	first, err := t.Wait(ctx)
	if err != nil {
		return nil, err
	}
	out := make(chan containerd.ExitStatus, 1)
	go func() {
		defer close(out)
		st := <-first
		for Unreachable(st.Error()) && b.Life.Err() == nil {
			pause := time.NewTimer(rewaitPause)
			select {
			case <-pause.C:
			case <-b.Life.Done():
			}
			pause.Stop()
			st = b.WaitAgain(ctx, t.ID())
			if errdefs.IsNotFound(st.Error()) {
				// containerd, started again, found the task's processes
				// gone and removed it: the task ended while containerd was
				// away, and its exit status (kiln-init's own, never
				// judged) went with it. Its init's report stands.
				b.Log.InfoContext(ctx, "sandbox: the task ended while containerd was away", slog.String("container_id", t.ID()))
				st = *containerd.NewExitStatus(containerd.UnknownExitStatus, time.Time{}, nil)
			}
		}
		out <- st
	}()
	return out, nil
}

// WaitAgain waits, through containerd's task service, for the exit of task
// id: once containerd answers again, or until Life ends.
func (b *Backend) WaitAgain(ctx context.Context, id string) containerd.ExitStatus {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(b.Life, cancel)
	defer stop()
	resp, err := b.Client.TaskService().Wait(ctx, &tasks.WaitRequest{ContainerID: id}, grpc.WaitForReady(true))
	if err != nil {
		return *containerd.NewExitStatus(containerd.UnknownExitStatus, time.Time{}, errdefs.FromGRPC(err))
	}
	return *containerd.NewExitStatus(resp.GetExitStatus(), resp.GetExitedAt().AsTime(), nil)
}
