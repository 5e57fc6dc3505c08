package producer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// Whether a session's worker still holds it. The API brings a session back
// on another worker (ensureHeld) only on a sign that its worker process is
// gone, never on the want of an answer: a store outage lapses the leases of
// workers that are alive, and a loaded host delays their answers, and
// taking a live worker's session ends its interpreter and its running call.

// holderAnswerTimeout bounds the question to a session's worker whether it
// holds the session.
const holderAnswerTimeout = time.Second

// workerLapses remembers, per worker id, since when the API has found the
// worker's lease missing while the worker did not answer, every time it
// looked. An entry not looked at for long is dropped, so dead workers' ids
// do not pile up.
type workerLapses struct {
	mu    sync.Mutex
	since map[string]lapse
}

type lapse struct{ first, last time.Time }

// missing records that worker's lease is missing now and reports whether
// it has been for at least d (counted from the first of an unbroken run of
// looks, each within d of the one before).
func (l *workerLapses) missing(worker string, now time.Time, d time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.since == nil {
		l.since = map[string]lapse{}
	}
	for w, e := range l.since {
		if now.Sub(e.last) > d {
			delete(l.since, w)
		}
	}
	e, ok := l.since[worker]
	if !ok {
		e.first = now
	}
	e.last = now
	l.since[worker] = e
	return now.Sub(e.first) >= d
}

// forget ends worker's run of missing leases: it answered, its lease is
// there, or the store could not say.
func (l *workerLapses) forget(worker string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.since, worker)
}

// holds reports whether the worker process the record names holds the
// session. It asks the worker over NATS: its answer decides, and no
// responder on its subject means the process is gone. When the worker does
// not answer in time it reads the worker's lease: another process holding
// the worker id means this one is gone; a lease that is missing means so
// only once it has stayed missing, with the store answering, for
// Config.SessionWorkerLapse (workerLapses), since a live worker re-takes
// the lease it lost to a store outage soon after the store is back.
func (ss *sessions) holds(ctx context.Context, st SessionStore, rec cache.SessionRecord) (bool, error) {
	if rec.Worker == "" || rec.Status == job.SessionStarting {
		return false, nil
	}
	actx, cancel := context.WithTimeout(ctx, holderAnswerTimeout)
	msg, err := ss.nc.RequestWithContext(actx, job.SessionWorkerPrefix+rec.Worker, []byte(rec.ID))
	cancel()
	switch {
	case err == nil:
		ss.lapses.forget(rec.Worker)
		return string(msg.Data) == job.SessionHeld, nil
	case errors.Is(err, nats.ErrNoResponders):
		return false, nil // the worker process is gone
	}
	inst, err := st.WorkerInstance(ctx, rec.Worker)
	switch {
	case err != nil:
		// The store is away: so it is for the worker, whose lease may
		// lapse meanwhile. The wait for the lease starts again.
		ss.lapses.forget(rec.Worker)
		return false, err
	case inst == rec.Instance:
		ss.lapses.forget(rec.Worker)
		return true, nil
	case inst != "":
		return false, nil // another process holds the worker id now
	}
	return !ss.lapses.missing(rec.Worker, ss.cfg.Now(), ss.cfg.SessionWorkerLapse), nil
}
