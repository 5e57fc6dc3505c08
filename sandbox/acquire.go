package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"

	"github.com/kilnrun/kiln/job"
)

// acquire returns a sandbox armed for job id: an idle one from the pool when
// one of the job's class is there and can serve its limits, else one created
// for this job alone (the cold path). A sandbox acquire returns must be
// retired; on error it has already been.
func (r *Containerd) acquire(ctx context.Context, req Request, img *imageEntry, lim job.Limits) (*sandbox, error) {
	id, runtime := req.ID, req.Spec.Runtime
	if sb := r.pool.take(ctx, runtime, img, classOf(runtime, img, lim)); sb != nil {
		err := r.exec.arm(ctx, sb, req, lim)
		if err == nil {
			markPooled(ctx, true)
			return sb, nil
		}
		r.ct.retire(ctx, sb)
		if errors.Is(err, errUnfit) {
			r.pool.unfit(runtime)
		} else {
			r.log.WarnContext(ctx, "sandbox pool: arm a pooled sandbox; running the job cold", slog.String("container_id", sb.id), slog.Any("error", err))
		}
	}
	markPooled(ctx, false)
	sb, err := r.ct.prepare(ctx, img, prepOpts{jobID: id, lim: lim})
	if err == nil {
		err = r.exec.arm(ctx, sb, req, lim)
	}
	if err != nil {
		r.ct.retire(ctx, sb)
		return nil, err
	}
	return sb, nil
}

// retire removes a sandbox: in the background, so a job's result does not
// wait for its container's removal (Config.CleanupBeforeReply restores the
// wait). Close waits for every removal under way.
func (c *lifecycle) retire(ctx context.Context, sb *sandbox) {
	if sb == nil || sb.retired {
		return
	}
	sb.retired = true
	if sb.task != nil && !sb.exited {
		// An error path or a cancellation left the job's processes
		// running: they end now, before the caller hears of the job.
		c.stopTask(ctx, sb)
	}
	if c.cfg.CleanupBeforeReply {
		cleanup(ctx, sb)
		return
	}
	c.cleaning.Add(1)
	go func() {
		defer c.cleaning.Done()
		cleanup(context.WithoutCancel(ctx), sb)
	}()
}

// stopTask kills every process of a sandbox's task and waits (at most
// cleanupTimeout) for its exit.
func (c *lifecycle) stopTask(ctx context.Context, sb *sandbox) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := sb.task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll); err != nil {
		if !errdefs.IsNotFound(err) && !errdefs.IsFailedPrecondition(err) {
			c.log.WarnContext(ctx, "kill sandbox", slog.String("container_id", sb.id), slog.Any("error", err))
		}
		return
	}
	if sb.exitCh == nil {
		return
	}
	select {
	case <-sb.exitCh:
		sb.exited = true
	case <-ctx.Done():
	}
}

// Start starts the warm pool (Config.Pool), which fills in the background
// until Close. Without a pool it does nothing. Calling it twice is an error.
func (r *Containerd) Start(ctx context.Context) error {
	r.lifeMu.Lock()
	defer r.lifeMu.Unlock()
	if r.started {
		return errors.New("sandbox: runtime already started")
	}
	r.started = true
	ctx, cancel := context.WithCancel(namespaces.WithNamespace(context.WithoutCancel(ctx), r.cfg.Namespace))
	r.stop = cancel
	if !r.box.boxCfg.Off {
		// Neutral boxes ahead of the first jobs.
		r.bg.Add(1)
		go func() {
			defer r.bg.Done()
			r.box.seedBoxes(ctx)
		}()
	}
	if !r.pool.enabled() {
		return nil
	}
	r.bg.Add(2)
	go func() {
		defer r.bg.Done()
		r.pool.run(ctx)
	}()
	go func() {
		defer r.bg.Done()
		r.ct.sweepLoop(ctx)
	}()
	return nil
}

// Close stops the pool, removes its idle sandboxes, waits (at most
// cleanupTimeout) for every removal under way, and closes the connection.
// Jobs still running are not waited for. Idempotent.
func (r *Containerd) Close() error {
	r.lifeMu.Lock()
	if r.closed {
		r.lifeMu.Unlock()
		return nil
	}
	r.closed = true
	if r.stop != nil {
		r.stop()
	}
	r.lifeMu.Unlock()
	r.bg.Wait()
	r.ct.shims.SealAll()
	ctx := namespaces.WithNamespace(context.Background(), r.cfg.Namespace)
	r.box.boxes.Stop(ctx)
	r.box.stopSpares(ctx)
	if r.pool != nil {
		for _, sb := range r.pool.drain() {
			r.ct.retire(ctx, sb)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
	defer cancel()
	if err := r.Settle(wctx); err != nil {
		r.log.Warn("sandbox: close: removals still under way", slog.Duration("waited", cleanupTimeout))
	}
	r.endLife()
	return r.client.Close()
}

// Settle waits until every sandbox removal started so far has finished, or
// ctx ends. The result of a job comes before its sandbox is gone; tests and
// tools that count containers call this first.
func (r *Containerd) Settle(ctx context.Context) error {
	// A box being made is ended (a removal) when it fails or comes after
	// Close: its creation is waited for first.
	if err := r.box.boxes.Settle(ctx); err != nil {
		return fmt.Errorf("sandbox: settle: %w", err)
	}
	done := make(chan struct{})
	go func() {
		r.ct.cleaning.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sandbox: settle: %w", context.Cause(ctx))
	}
}

// PoolStats returns each pooled runtime's figures (none without a pool).
func (r *Containerd) PoolStats() []PoolStats { return r.pool.Stats() }

// sweepInterval is how often a pooled runtime looks for containers of its
// worker that it no longer owns (a removal that failed while containerd was
// restarting).
const sweepInterval = 10 * time.Second

func (c *lifecycle) sweepLoop(ctx context.Context) {
	t := time.NewTicker(sweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := c.sweep(ctx); err != nil {
				c.log.WarnContext(ctx, "sandbox sweep", slog.Any("error", err))
			}
		}
	}
}

// sweep removes the containers labelled with this worker's id that this
// runtime does not own (neither idle in the pool, nor running a job, nor
// being removed). It returns how many it removed.
func (c *lifecycle) sweep(ctx context.Context) (int, error) {
	return c.be.RemoveUnowned(ctx, ctrd.WorkerFilter(c.cfg.WorkerID), "swept a sandbox this worker no longer owns")
}
