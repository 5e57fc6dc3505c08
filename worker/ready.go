package worker

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/queue"
)

// Readiness checks, by name.
const (
	checkStore = "redis"
	checkNATS  = "nats"
	checkQueue = "queue"
	// checkSandbox is the sandbox backend (containerd), unless its health
	// check is unsupported (Sandboxes.Healthy).
	checkSandbox = "sandbox"
	// checkWrites is JetStream's store taking writes (writeprobe.go).
	checkWrites = "jetstream_store"
	// checkObjectStore is the object store's stream taking writes
	// (writeprobe.go).
	checkObjectStore = "object_store"
	okCheck          = "ok"
)

// readiness holds the start-up checks' latest state.
type readiness struct {
	mu     sync.Mutex
	checks map[string]string
}

func (r *readiness) set(name, state string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.checks == nil {
		r.checks = map[string]string{}
	}
	r.checks[name] = state
}

func (r *readiness) snapshot() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := maps.Clone(r.checks)
	if out == nil {
		out = map[string]string{}
	}
	return out
}

// Readiness reports whether the worker can take jobs, with a state per
// dependency ("ok" or what is wrong): the store answers (and the worker id is
// held), NATS is connected, and the stream and consumers are set up (a
// consumer the server rejected shows the server's error here).
func (w *Worker) Readiness(ctx context.Context) (bool, map[string]string) {
	checks := w.ready.snapshot()
	for _, name := range []string{checkStore, checkQueue} {
		if checks[name] == "" {
			checks[name] = "waiting: not started"
		}
	}
	if checks[checkStore] == okCheck {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		if err := w.cfg.Store.Ping(pctx); err != nil {
			checks[checkStore] = "unavailable: " + err.Error()
		} else if !w.storeWatch.up() {
			checks[checkStore] = "recovering: pulls paused until the store answers"
		}
		cancel()
	}
	if !w.backend.noHealth.Load() {
		checks[checkSandbox] = okCheck
		if err, _ := w.backend.state(); err != nil {
			checks[checkSandbox] = "unavailable: " + err.Error() + " (pulling no job until it answers)"
		}
	}
	checks[checkNATS] = okCheck
	if !w.cfg.NATS.IsConnected() {
		checks[checkNATS] = "unavailable: connection is " + w.cfg.NATS.Status().String()
	}
	ready := true
	for _, v := range checks {
		ready = ready && v == okCheck
	}
	return ready, checks
}

// setUpQueue verifies the job stream and sets up the ready stream and each
// runtime's consumers of it (one per shard), retrying with back-off until it
// works or ctx ends.
func (w *Worker) setUpQueue(ctx context.Context) (map[string][]jetstream.Consumer, error) {
	delay := 200 * time.Millisecond
	for {
		consumers, err := w.trySetUpQueue(ctx)
		if err == nil {
			w.ready.set(checkQueue, okCheck)
			return consumers, nil
		}
		w.ready.set(checkQueue, "unavailable: "+err.Error())
		w.log.WarnContext(ctx, "set up the job queue; retrying", slog.Any("error", err), slog.Duration("retry_in", delay))
		if !sleep(ctx, delay) {
			return nil, fmt.Errorf("worker: set up the job queue: %w", err)
		}
		delay = min(delay*2, 5*time.Second)
	}
}

func (w *Worker) trySetUpQueue(ctx context.Context) (map[string][]jetstream.Consumer, error) {
	if err := queue.CheckServerVersion(w.cfg.NATS); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := queue.VerifyStream(cctx, w.js, w.cfg.Queue, w.log); err != nil {
		return nil, err
	}
	out := map[string][]jetstream.Consumer{}
	for _, rt := range w.cfg.Runtime.Runtimes() {
		cons, err := queue.EnsureReadyOwned(cctx, w.js, w.cfg.Queue, rt, w.cfg.QueueOwner, w.log)
		if err != nil {
			return nil, err
		}
		out[rt] = cons
	}
	return out, nil
}
