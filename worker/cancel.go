package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// cancels is what runs on this worker now, by id, so that a cancel by
// request (job.CancelSubject) reaches it: the jobs, by job id, and the
// session calls, by call id (their events id), which a cancel interrupts
// alone; and the cancels that found nothing running here, for a call that
// registers a moment after its cancel was sent.
type cancels struct {
	clock Clock
	log   *slog.Logger

	mu    sync.Mutex
	jobs  map[string]*runningJob
	calls map[string]context.CancelCauseFunc
	early earlyCancels
}

// runningJob is a job running here: how to end it, and whether a cancel by
// request did.
type runningJob struct {
	cancel     context.CancelCauseFunc
	userCancel atomic.Bool
}

func newCancels(clock Clock, log *slog.Logger) *cancels {
	return &cancels{clock: clock, log: log, jobs: map[string]*runningJob{}, calls: map[string]context.CancelCauseFunc{}}
}

// startJob notes that job id runs here until endJob, ended by cancel.
func (c *cancels) startJob(id string, cancel context.CancelCauseFunc) *runningJob {
	rj := &runningJob{cancel: cancel}
	c.mu.Lock()
	c.jobs[id] = rj
	c.mu.Unlock()
	return rj
}

func (c *cancels) endJob(id string) {
	c.mu.Lock()
	delete(c.jobs, id)
	c.mu.Unlock()
}

// runs reports whether job id runs here now.
func (c *cancels) runs(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.jobs[id] != nil
}

// startCall notes that session call id runs here until endCall, ended by
// cancel. early: a cancel sent after the call started in the store but
// before it got here; the call is not to run.
func (c *cancels) startCall(id string, cancel context.CancelCauseFunc) (early bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[id] = cancel
	return c.early.take(id, c.clock.Now())
}

func (c *cancels) endCall(id string) {
	c.mu.Lock()
	delete(c.calls, id)
	c.mu.Unlock()
}

// errCanceledByRequest is the cancel cause of a run canceled by request.
var errCanceledByRequest = errors.New("canceled by request")

// onCancel ends the job, or the session call, that the message names, if
// it runs here.
func (c *cancels) onCancel(m *nats.Msg) {
	id := string(m.Data)
	c.mu.Lock()
	rj, call := c.jobs[id], c.calls[id]
	if rj == nil && call == nil {
		c.early.note(id, c.clock.Now())
	}
	c.mu.Unlock()
	if rj != nil {
		rj.userCancel.Store(true)
		rj.cancel(errCanceledByRequest)
		c.log.Info("job canceled by request", slog.String("job_id", id))
	}
	if call != nil {
		call(errCanceledByRequest)
		c.log.Info("session call interrupted by request", slog.String("call_id", id))
	}
}
