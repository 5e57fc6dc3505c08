package e2e

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
	"github.com/kilnrun/kiln/worker"
)

// Acceptance 1 (issue 8), with real sandboxes: Redis restarted without its
// data (a fresh redis-server on the same port) while clients submit jobs
// through the API. Every submission after the restart is accepted (none
// refused for want of a registered runtime) and succeeds with its output;
// the worker pulls again within seconds; no accepted job is left
// non-terminal, and none runs twice (a job running when the data went gets
// its result recorded on a restored record). Jobs that had finished before
// the restart lose their records with the data; that is the only loss.
// (worker.TestRedisRestartedEmptyUnderLoad checks the worker's logic fast,
// with a scripted runtime.)
func TestRedisRestartedEmptyUnderRealLoad(t *testing.T) {
	e := setup(t)
	// When each job's result was written tells a job that finished before
	// the restart (its record went with Redis's data, so the API rightly
	// answers 404) from one that was dropped. (Not when its done notice
	// came: the worker fills the result cache in Redis before it sends the
	// notice, so a result written just before the restart could have its
	// notice after it, and the job was taken for dropped.)
	var doneMu sync.Mutex
	doneAt := map[string]time.Time{}
	recorded := func(ev worker.Event) {
		doneMu.Lock()
		defer doneMu.Unlock()
		if _, ok := doneAt[ev.JobID]; !ok {
			doneAt[ev.JobID] = time.Now()
		}
	}
	e.startWorker(t, "e2e-empty-redis", 2, func(c *telemetry) {
		c.worker = func(w *worker.Config) { w.Hooks.Recorded = recorded }
	})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// A steady load near what two sandbox slots run on this host, across
	// the restart: 12 submissions before it, 24 after.
	const before, after = 12, 24
	type submission struct {
		i     int
		id    string
		after bool // begun after the restart had completed
		err   error
	}
	var restarted atomic.Bool
	subs := make([]submission, 0, before+after)
	var subsMu sync.Mutex
	startLoad := make(chan struct{})
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		tick := time.NewTicker(400 * time.Millisecond)
		defer tick.Stop()
		for i := range before + after {
			if i == before {
				<-startLoad // the restart happens here
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			s := submission{i: i, after: restarted.Load()}
			s.id, _, s.err = testenv.SubmitRetrying(ctx, e.api, py("print(%d)", i))
			subsMu.Lock()
			subs = append(subs, s)
			subsMu.Unlock()
		}
	}()

	// Restart once the load is under way: jobs queued, running and finished.
	testkit.Eventually(t, time.Minute, fmt.Sprintf("the %d submissions before the restart", before), func() bool {
		subsMu.Lock()
		defer subsMu.Unlock()
		return len(subs) == before
	})
	runsAtRestart := e.runs.total.Load()
	e.redis.RestartEmpty()
	restartedAt := time.Now()
	restarted.Store(true)
	close(startLoad)

	// The worker resumes: a sandbox run begins after the restart.
	testkit.Eventually(t, 30*time.Second, "a job to run after Redis came back empty (else the worker stalled)", func() bool {
		return e.runs.total.Load() != runsAtRestart
	})
	resumed := time.Since(restartedAt)
	t.Logf("first sandbox run after the empty restart began %v after it", resumed.Round(time.Millisecond))
	if resumed > 5*time.Second {
		t.Errorf("the worker resumed %v after Redis came back empty, want within 5s", resumed)
	}

	<-loadDone
	subsMu.Lock()
	defer subsMu.Unlock()
	if len(subs) != before+after {
		t.Fatalf("%d submissions made, want %d", len(subs), before+after)
	}
	var firstAfter time.Duration
	lostBefore, twice := 0, 0
	for _, s := range subs {
		if s.err != nil {
			t.Errorf("submission %d (after the restart: %v) was refused: %v", s.i, s.after, s.err)
			continue
		}
		doneMu.Lock()
		at, ok := doneAt[s.id]
		doneMu.Unlock()
		if !s.after && ok && at.Before(restartedAt) {
			// Finished before the restart: its record went with the data,
			// unless a redelivery restored it.
			if _, err := e.api.Get(ctx, s.id, 0); errors.Is(err, client.ErrNotFound) {
				lostBefore++
				continue
			}
		}
		v, err := e.waitJob(ctx, s.id, 60*time.Second)
		if err != nil {
			t.Errorf("job %d (%s, after the restart: %v): %v", s.i, s.id, s.after, err)
			continue
		}
		if v.Status != job.StatusSucceeded || v.Stdout != strconv.Itoa(s.i)+"\n" {
			t.Errorf("job %d (after the restart: %v): %s %q %+v", s.i, s.after, v.Status, v.Stdout, v.Error)
		}
		if s.after && firstAfter == 0 && v.FinishedAt != nil {
			firstAfter = v.FinishedAt.Sub(restartedAt)
		}
		if n := e.runs.of(s.id); n > 1 {
			twice++
		}
	}
	t.Logf("%d jobs (%d before the restart, %d after): every accepted job succeeded but %d that had finished before the restart (records lost with the data); the first job submitted after it finished %v after the restart",
		len(subs), before, after, lostBefore, firstAfter.Round(time.Millisecond))
	if twice > 0 {
		t.Errorf("%d jobs ran twice: a job running when the data went must get its result recorded, not run again", twice)
	}
}

// waitJob polls the job through the API until it is terminal. A 404 is
// polled on until within passes: a job queued before Redis lost its data
// has no record until a worker takes its message and restores it.
func (e *env) waitJob(ctx context.Context, id string, within time.Duration) (client.JobView, error) {
	var v client.JobView
	var err error
	var fatal bool
	if testkit.Poll(within, func() bool {
		v, err = e.api.Get(ctx, id, 5*time.Second)
		fatal = err != nil && !errors.Is(err, client.ErrNotFound)
		return fatal || (err == nil && v.Terminal())
	}) || err != nil {
		return v, err
	}
	return v, fmt.Errorf("job %s not terminal within %v: status %q", id, within, v.Status)
}
