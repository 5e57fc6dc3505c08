package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// backendState is the sandbox backend's health as the worker last saw it.
// While it is down the worker pulls no job, and a job whose sandbox could
// not be created because of it is held (not handed back), so an outage of
// containerd never spends a job's deliveries.
type backendState struct {
	rt    Sandboxes
	log   *slog.Logger
	every time.Duration // SandboxProbe
	// noHealth: the backend has no health check (Sandboxes.Healthy is
	// unsupported): nothing to probe or report.
	noHealth atomic.Bool

	mu   sync.Mutex
	err  error         // nil: up
	back chan struct{} // closed when the backend answers again; nil while up
	// up ends when the backend stops answering; nil until first asked for
	// (whileUp) and after it ended.
	up     context.Context
	upStop context.CancelFunc
}

func newBackendState(rt Sandboxes, log *slog.Logger, every time.Duration) *backendState {
	return &backendState{rt: rt, log: log, every: every}
}

// set records the result of a health check; it reports whether the state
// changed.
func (b *backendState) set(err error) (changed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	wasDown := b.err != nil
	b.err = err
	switch {
	case err != nil && !wasDown:
		b.back = make(chan struct{})
		if b.upStop != nil {
			b.upStop()
			b.up, b.upStop = nil, nil
		}
		return true
	case err == nil && wasDown:
		close(b.back)
		b.back = nil
		return true
	}
	return false
}

// whileUp returns ctx, cancelled as well when the backend stops answering
// (at once if it is down now), and its cancel function: a pull waiting for
// a job stops waiting when the backend goes away.
func (b *backendState) whileUp(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		cancel()
		return ctx, cancel
	}
	if b.up == nil {
		b.up, b.upStop = context.WithCancel(context.Background())
	}
	stop := context.AfterFunc(b.up, cancel)
	return ctx, func() { stop(); cancel() }
}

// state is the last error (nil: up) and, while down, a channel closed once
// the backend is back.
func (b *backendState) state() (error, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err, b.back
}

// check asks the runtime whether its backend answers and records the
// answer; it returns the error (nil: up, or no way to tell: a backend
// without a health check, noted in noHealth).
func (b *backendState) check(ctx context.Context) error {
	err := b.rt.Healthy(ctx)
	if unsupported(err) {
		b.noHealth.Store(true)
		return nil
	}
	if err != nil && ctx.Err() != nil {
		return nil // stopping: not the backend's doing
	}
	if b.set(err) {
		if err != nil {
			b.log.WarnContext(ctx, "sandbox backend unavailable; pulling no job until it answers", slog.Any("error", err))
		} else {
			b.log.InfoContext(ctx, "sandbox backend answers again; resuming pulls")
		}
	}
	return err
}

// probe checks the backend every SandboxProbe until ctx ends (Run made
// the first check).
func (b *backendState) probe(ctx context.Context) {
	onTicks(ctx, b.every, func() { _ = b.check(ctx) })
}

// wait returns once the backend is up (true) or ctx ends (false).
func (b *backendState) wait(ctx context.Context) bool {
	err, back := b.state()
	if err == nil {
		return true
	}
	select {
	case <-back:
		return true
	case <-ctx.Done():
		return false
	}
}

// holdForBackend decides, after a run failed with err, whether the failure
// was the backend's: a sandbox that could not be created while the backend
// does not answer. The job's code never started, so the delivery waits
// (its heartbeat keeps the message) for the backend and runs the job again
// itself: true means run again. Any other failure is the caller's to judge.
func (d *delivery) holdForBackend(ctx context.Context, err error) bool {
	cf := createFailure(nil)
	if !errors.As(err, &cf) || !cf.SandboxCreateFailed() {
		return false
	}
	if d.w.backend.check(ctx) == nil {
		return false
	}
	d.log.WarnContext(ctx, "the sandbox backend is down; holding the job until it answers", slog.Any("error", err))
	return d.w.backend.wait(ctx)
}
