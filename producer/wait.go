package producer

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// waits are the long-polls: a request waiting for a job's done notice
// (kiln.done.<id>) up to ?wait=, never polling the store.
type waits struct {
	cfg   *Config // MaxWait
	store Store
	nc    *nats.Conn
	js    jetstream.JetStream // a submission's publishes, on nc or not (doneWaiter)
	log   *slog.Logger
	// done ends every long-poll at once (stop, the Server's StopLongPolls),
	// so a graceful HTTP shutdown does not wait out MaxWait.
	done context.Context
	stop context.CancelFunc
}

func newWaits(cfg *Config, nc *nats.Conn, js jetstream.JetStream) *waits {
	w := &waits{cfg: cfg, store: cfg.Store, nc: nc, js: js, log: cfg.Logger}
	w.done, w.stop = context.WithCancel(context.Background())
	return w
}

// doneSub is a subscription to one job's done notice.
type doneSub struct {
	sub    *nats.Subscription
	notice chan *nats.Msg
}

// Unsubscribe ends the subscription.
func (d *doneSub) Unsubscribe() error { return d.sub.Unsubscribe() }

// doneWaiter is the subscription to a job's done notice that a waiting
// submission makes just before it publishes the job. The subscription and
// the publish go out on one NATS connection, which the server reads in
// order, so the notice cannot come before it: the wait needs neither
// await's flush nor its read of the record before waiting.
type doneWaiter struct {
	id  string
	sub *doneSub
}

// subscribe subscribes w to job id's done notice. A nil w, a publish on
// another connection than the subscription's, or a failure leave w without
// a subscription: awaitSubmitted then waits as await does.
func (w *doneWaiter) subscribe(ws *waits, id string) {
	if w == nil || w.sub != nil || ws.js.Conn() != ws.nc || ws.done.Err() != nil {
		return
	}
	sub, err := ws.subscribeDone(id)
	if err != nil {
		return
	}
	w.id, w.sub = id, sub
}

// close ends w's subscription, if it has one.
func (w *doneWaiter) close() {
	if w != nil && w.sub != nil {
		_ = w.sub.Unsubscribe()
		w.sub = nil
	}
}

// parseWait reads ?wait=: a Go duration ("30s", "1m") or whole seconds
// ("30"), shortened to MaxWait. Absent means 0 (answer at once).
func (w *waits) parseWait(r *http.Request) (time.Duration, *problem) {
	v := r.URL.Query().Get("wait")
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		n, nerr := strconv.Atoi(strings.TrimSpace(v))
		if nerr != nil {
			return 0, badParam("wait", "wait="+strconv.Quote(v)+" is not a duration: use e.g. wait=30s or wait=30 (seconds)")
		}
		d = time.Duration(n) * time.Second
	}
	if d < 0 {
		return 0, badParam("wait", "wait must not be negative")
	}
	return min(d, w.cfg.MaxWait), nil
}

// await returns the job's record once it is terminal or wait has passed.
// It subscribes to the job's completion notice before reading the record, so
// a job finishing in between cannot be missed, and it never polls Redis: it
// reads the record once before and once after the notice (or the timeout).
//
// Only tenant's jobs are found: any other job is cache.ErrNotFound.
func (w *waits) await(ctx context.Context, tenant, id string, wait time.Duration) (cache.Record, error) {
	if wait <= 0 || w.done.Err() != nil {
		return tenantJob(ctx, w.store, tenant, id)
	}
	sub, err := w.subscribeDone(id)
	if err != nil {
		w.log.WarnContext(ctx, "subscribe to completion notice; answering without waiting", slog.String("job_id", id), slog.Any("error", err))
		return tenantJob(ctx, w.store, tenant, id)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The flush makes the server know the subscription before the record is
	// read; without it a notice published right after the read could pass by.
	fctx, cancel := context.WithTimeout(ctx, time.Second)
	ferr := w.nc.FlushWithContext(fctx)
	cancel()
	rec, err := tenantJob(ctx, w.store, tenant, id)
	if err != nil || rec.Status.Terminal() {
		return rec, err
	}
	if ferr != nil {
		w.log.WarnContext(ctx, "NATS flush failed; answering without waiting", slog.String("job_id", id), slog.Any("error", ferr))
		return rec, nil
	}
	return w.awaitNotice(ctx, sub, tenant, id, wait)
}

// subscribeDone subscribes to job id's done notice, which the worker
// publishes once the job's record is terminal. The notice lands in a
// channel of four: a synchronous subscription's own channel holds 65,536
// messages (512 KiB made and cleared for each waiting request), and one
// notice is all a wait reads.
func (w *waits) subscribeDone(id string) (*doneSub, error) {
	d := &doneSub{notice: make(chan *nats.Msg, 4)}
	var err error
	if d.sub, err = w.nc.ChanSubscribe(job.DoneSubject(id), d.notice); err != nil {
		return nil, err
	}
	return d, nil
}

// awaitNotice waits on sub, a subscription to job id's done notice, until
// the notice, wait, or the request's end; then reads the record.
func (w *waits) awaitNotice(ctx context.Context, sub *doneSub, tenant, id string, wait time.Duration) (cache.Record, error) {
	t := time.NewTimer(wait)
	select {
	case <-sub.notice:
	case <-t.C:
	case <-ctx.Done():
	case <-w.done.Done():
	}
	t.Stop()
	// The request may have ended (client gone, server shutting down): still
	// read the state once more so a shutdown answers with the latest status.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer rcancel()
	return tenantJob(rctx, w.store, tenant, id)
}

// awaitSubmitted is await for job id, which this request submitted with dw:
// when the submission published the job itself, subscribed, the record is
// read once, after the notice or the timeout. Any other job (a retry
// answered with an earlier one, a coalesced leader) is await's.
func (w *waits) awaitSubmitted(ctx context.Context, dw *doneWaiter, tenant, id string, wait time.Duration) (cache.Record, error) {
	if dw == nil || dw.sub == nil || dw.id != id || wait <= 0 || w.done.Err() != nil {
		return w.await(ctx, tenant, id, wait)
	}
	return w.awaitNotice(ctx, dw.sub, tenant, id, wait)
}
