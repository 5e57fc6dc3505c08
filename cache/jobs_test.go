package cache

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/redis/go-redis/v9"
)

func TestCreateGetRoundTrip(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{Prefix: "t1:", JobTTL: time.Hour})
	ctx := context.Background()
	msg := newMessage(t)
	if err := s.CreateJob(ctx, msg); err != nil {
		t.Fatal(err)
	}
	rec, err := s.GetJob(ctx, msg.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := Record{Message: msg, Status: job.StatusQueued}
	if !reflect.DeepEqual(rec, want) {
		t.Fatalf("GetJob =\n%+v\nwant\n%+v", rec, want)
	}
	ttl := s.rdb.PTTL(ctx, "t1:job:"+msg.ID).Val()
	if ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("record TTL %v, want about 1h under the configured prefix", ttl)
	}

	// Same message again (a retried call) is fine; another message with the id is not.
	if err := s.CreateJob(ctx, msg); err != nil {
		t.Fatalf("repeated identical create: %v", err)
	}
	other := msg
	other.Spec.Code = "print(2)"
	if err := s.CreateJob(ctx, other); !errors.Is(err, ErrExists) {
		t.Fatalf("create with taken id = %v, want ErrExists", err)
	}
	if rec, _ := s.GetJob(ctx, msg.ID); rec.Message.Spec.Code != "print(1)" {
		t.Fatal("a refused create changed the record")
	}
	if _, err := s.GetJob(ctx, job.NewID()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetJob(missing) = %v, want ErrNotFound", err)
	}
}

// A job created to be published is in the unpublished index, at its
// creation time, from the same step as its record; MarkPublished takes it
// out. A refused create (the id taken) leaves the index entry, which the
// reconciler settles.
func TestCreateUnpublishedJobIndexesIt(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{Prefix: "t-unpub:", JobTTL: time.Hour})
	ctx := context.Background()
	msg := newMessage(t)
	msg.CreatedAt = time.UnixMilli(1_800_000_000_123).UTC()
	if err := s.CreateUnpublishedJob(ctx, msg); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.GetJob(ctx, msg.ID); err != nil || rec.Status != job.StatusQueued || rec.Published {
		t.Fatalf("record %+v %v", rec, err)
	}
	if ids, err := s.Unpublished(ctx, msg.CreatedAt, 10); err != nil || len(ids) != 1 || ids[0] != msg.ID {
		t.Fatalf("unpublished at its creation: %v %v", ids, err)
	}
	if ids, _ := s.Unpublished(ctx, msg.CreatedAt.Add(-time.Millisecond), 10); len(ids) != 0 {
		t.Fatalf("unpublished before its creation: %v", ids)
	}
	if err := s.MarkPublished(ctx, msg.ID); err != nil {
		t.Fatal(err)
	}
	if ids, _ := s.Unpublished(ctx, msg.CreatedAt, 10); len(ids) != 0 {
		t.Fatalf("unpublished once published: %v", ids)
	}
	if rec, _ := s.GetJob(ctx, msg.ID); !rec.Published {
		t.Fatal("record not marked published")
	}
	other := msg
	other.Spec.Code = "print(2)"
	if err := s.CreateUnpublishedJob(ctx, other); !errors.Is(err, ErrExists) {
		t.Fatalf("create with taken id = %v, want ErrExists", err)
	}
	if ids, _ := s.Unpublished(ctx, msg.CreatedAt, 10); len(ids) != 1 {
		t.Fatalf("refused create's index entry: %v", ids)
	}
	// A plain CreateJob (a restored record) is not indexed.
	plain := newMessage(t)
	if err := s.CreateJob(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if ids, _ := s.Unpublished(ctx, msg.CreatedAt.Add(24*365*time.Hour), 10); len(ids) != 1 || ids[0] != msg.ID {
		t.Fatalf("index after a plain create: %v", ids)
	}
}

func TestUpdatesKeepTheRecordTTL(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{JobTTL: time.Hour})
	ctx := context.Background()
	msg := newMessage(t)
	if err := s.CreateJob(ctx, msg); err != nil {
		t.Fatal(err)
	}
	key := s.keys.job(msg.ID)
	// Shorten the TTL so that any update resetting it would show.
	s.rdb.PExpire(ctx, key, 10*time.Minute)
	if _, err := s.MarkRunningLeased(ctx, msg.ID, "w1", 1, time.Now(), Lease{Token: "w1/1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Cancel(ctx, msg.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Finish(ctx, msg.ID, job.Result{Status: job.StatusCanceled}); err != nil {
		t.Fatal(err)
	}
	if ttl := s.rdb.PTTL(ctx, key).Val(); ttl <= 9*time.Minute || ttl > 10*time.Minute {
		t.Fatalf("TTL after updates %v, want the 10m it had", ttl)
	}
}

func TestLateUpdatesDoNotResurrectAnExpiredRecord(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	id := job.NewID()
	if _, err := s.MarkRunningLeased(ctx, id, "w", 1, time.Now(), Lease{Token: "w/1"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("MarkRunning(missing) = %v, want ErrNotFound", err)
	}
	if _, err := s.Finish(ctx, id, job.Result{Status: job.StatusSucceeded}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Finish(missing) = %v, want ErrNotFound", err)
	}
	if _, err := s.Cancel(ctx, id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Cancel(missing) = %v, want ErrNotFound", err)
	}
	if err := s.DeleteJob(ctx, id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("DeleteJob(missing) = %v, want ErrNotFound", err)
	}
	if n := s.rdb.Exists(ctx, s.keys.job(id)).Val(); n != 0 {
		t.Fatal("an update on a missing job created a record")
	}
}

func TestMarkRunning(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()

	t.Run("queued", func(t *testing.T) {
		msg := newMessage(t)
		mustCreate(t, s, msg)
		at := time.Now().UTC().Add(-time.Second)
		st, err := s.MarkRunningLeased(ctx, msg.ID, "worker-a", 1, at, Lease{Token: "worker-a/1"})
		if err != nil || st != job.StatusRunning {
			t.Fatalf("MarkRunning = %q, %v", st, err)
		}
		rec := mustGet(t, s, msg.ID)
		if rec.Status != job.StatusRunning || rec.Worker != "worker-a" || rec.Attempt != 1 || rec.StartedAt == nil || !rec.StartedAt.Equal(at) {
			t.Fatalf("record %+v", rec)
		}
		// A redelivery to another worker takes over.
		at2 := at.Add(time.Second)
		if st, err := s.MarkRunningLeased(ctx, msg.ID, "worker-b", 2, at2, Lease{Token: "worker-b/2"}); err != nil || st != job.StatusRunning {
			t.Fatalf("second MarkRunning = %q, %v", st, err)
		}
		rec = mustGet(t, s, msg.ID)
		if rec.Worker != "worker-b" || rec.Attempt != 2 || !rec.StartedAt.Equal(at2) {
			t.Fatalf("after redelivery %+v", rec)
		}
	})

	t.Run("canceled", func(t *testing.T) {
		msg := newMessage(t)
		mustCreate(t, s, msg)
		if _, err := s.Cancel(ctx, msg.ID); err != nil {
			t.Fatal(err)
		}
		before := mustGet(t, s, msg.ID)
		st, err := s.MarkRunningLeased(ctx, msg.ID, "worker-a", 1, time.Now(), Lease{Token: "worker-a/1"})
		if err != nil || st != job.StatusCanceled {
			t.Fatalf("MarkRunning(canceled) = %q, %v; want canceled", st, err)
		}
		if after := mustGet(t, s, msg.ID); !reflect.DeepEqual(before, after) {
			t.Fatalf("MarkRunning changed a canceled record:\n%+v\n%+v", before, after)
		}
	})

	t.Run("cancel requested while running", func(t *testing.T) {
		msg := newMessage(t)
		mustCreate(t, s, msg)
		mustMarkRunning(t, s, msg.ID)
		if st, err := s.Cancel(ctx, msg.ID); err != nil || st != job.StatusRunning {
			t.Fatalf("Cancel(running) = %q, %v", st, err)
		}
		// The worker died; the redelivery must not run the job.
		st, err := s.MarkRunningLeased(ctx, msg.ID, "worker-b", 2, time.Now(), Lease{Token: "worker-b/2"})
		if err != nil || st != job.StatusCanceled {
			t.Fatalf("MarkRunning after cancel request = %q, %v; want canceled", st, err)
		}
		rec := mustGet(t, s, msg.ID)
		if rec.Status != job.StatusCanceled || rec.Result == nil || rec.Result.Error == nil ||
			rec.Result.Error.Category != job.CategoryCanceled || rec.FinishedAt == nil || rec.Worker != "w" {
			t.Fatalf("record %+v", rec)
		}
	})

	for _, terminal := range job.Statuses {
		if !terminal.Terminal() {
			continue
		}
		t.Run(string(terminal), func(t *testing.T) {
			msg := newMessage(t)
			mustCreate(t, s, msg)
			mustMarkRunning(t, s, msg.ID)
			if won, err := s.Finish(ctx, msg.ID, job.Result{Status: terminal}); err != nil || !won {
				t.Fatalf("Finish = %v, %v", won, err)
			}
			before := mustGet(t, s, msg.ID)
			st, err := s.MarkRunningLeased(ctx, msg.ID, "late", 5, time.Now(), Lease{Token: "late/5"})
			if err != nil || st != terminal {
				t.Fatalf("MarkRunning(%s) = %q, %v", terminal, st, err)
			}
			if after := mustGet(t, s, msg.ID); !reflect.DeepEqual(before, after) {
				t.Fatalf("MarkRunning changed a terminal record")
			}
		})
	}
}

func TestFinishFirstWinsUnderConcurrency(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	msg := newMessage(t)
	mustCreate(t, s, msg)
	mustMarkRunning(t, s, msg.ID)

	const racers = 20
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		mu      sync.Mutex
		winners []string
	)
	statuses := []job.Status{job.StatusSucceeded, job.StatusFailed, job.StatusTimedOut, job.StatusInternalError}
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker := "worker-" + string(rune('a'+i))
			res := job.Result{Status: statuses[i%len(statuses)], Worker: worker, Stdout: worker, ExitCode: job.IntPtr(i)}
			<-start
			won, err := s.Finish(ctx, msg.ID, res)
			if err != nil {
				t.Errorf("Finish: %v", err)
				return
			}
			if won {
				mu.Lock()
				winners = append(winners, worker)
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(winners) != 1 {
		t.Fatalf("%d winners (%v), want exactly 1", len(winners), winners)
	}
	rec := mustGet(t, s, msg.ID)
	if rec.Result == nil || rec.Result.Worker != winners[0] || rec.Result.Stdout != winners[0] || rec.Status != rec.Result.Status {
		t.Fatalf("record holds %+v, winner was %s", rec.Result, winners[0])
	}
	if rec.Result.ID != msg.ID || rec.FinishedAt == nil || !rec.FinishedAt.Equal(*rec.Result.FinishedAt) {
		t.Fatalf("result id %q finished_at %v / %v", rec.Result.ID, rec.FinishedAt, rec.Result.FinishedAt)
	}

	// A late duplicate leaves the record untouched.
	if won, err := s.Finish(ctx, msg.ID, job.Result{Status: job.StatusSucceeded, Worker: "late"}); err != nil || won {
		t.Fatalf("late Finish = %v, %v", won, err)
	}
	if after := mustGet(t, s, msg.ID); !reflect.DeepEqual(rec, after) {
		t.Fatal("late Finish changed the record")
	}
}

func TestFinish(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	msg := newMessage(t)
	mustCreate(t, s, msg)
	if _, err := s.Finish(ctx, msg.ID, job.Result{Status: job.StatusRunning}); err == nil {
		t.Fatal("Finish accepted a non-terminal status")
	}
	// A job whose deliveries ran out can be finished straight from queued.
	fin := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	res := job.Result{Status: job.StatusInternalError, Error: job.NewFailure(job.CategoryInternal, "deliveries exhausted"), FinishedAt: &fin}
	if won, err := s.Finish(ctx, msg.ID, res); err != nil || !won {
		t.Fatalf("Finish(queued) = %v, %v", won, err)
	}
	rec := mustGet(t, s, msg.ID)
	if rec.Status != job.StatusInternalError || !rec.FinishedAt.Equal(fin) || rec.Result.Error.Message != "deliveries exhausted" {
		t.Fatalf("record %+v", rec)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()

	t.Run("queued", func(t *testing.T) {
		msg := newMessage(t)
		mustCreate(t, s, msg)
		mustClaim(t, s, msg)
		st, now, err := s.CancelReport(ctx, msg.ID)
		if err != nil || st != job.StatusCanceled || !now {
			t.Fatalf("CancelReport(queued) = %q, %v, %v; want canceled by this call", st, now, err)
		}
		// A repeated cancel reports the same status but did not cancel it.
		if st, now, err := s.CancelReport(ctx, msg.ID); err != nil || st != job.StatusCanceled || now {
			t.Fatalf("repeated CancelReport = %q, %v, %v; want canceled, not by this call", st, now, err)
		}
		rec := mustGet(t, s, msg.ID)
		if rec.Status != job.StatusCanceled || rec.FinishedAt == nil || rec.Result == nil ||
			rec.Result.Status != job.StatusCanceled || rec.Result.ID != msg.ID ||
			rec.Result.Error == nil || rec.Result.Error.Category != job.CategoryCanceled || rec.Result.Error.Retryable {
			t.Fatalf("record %+v result %+v", rec, rec.Result)
		}
		if _, claimed, _ := s.ClaimInflight(ctx, msg.Key, job.NewID()); !claimed {
			t.Fatal("canceling the queued leader left its in-flight claim")
		}
		// Canceled is terminal: a worker's result for it loses.
		if won, _ := s.Finish(ctx, msg.ID, job.Result{Status: job.StatusSucceeded}); won {
			t.Fatal("Finish won over a cancellation")
		}
	})

	t.Run("running", func(t *testing.T) {
		msg := newMessage(t)
		mustCreate(t, s, msg)
		mustMarkRunning(t, s, msg.ID)
		for range 2 { // asking twice is the same as asking once
			st, now, err := s.CancelReport(ctx, msg.ID)
			if err != nil || st != job.StatusRunning || now {
				t.Fatalf("CancelReport(running) = %q, %v, %v", st, now, err)
			}
		}
		rec := mustGet(t, s, msg.ID)
		if rec.Status != job.StatusRunning || !rec.CancelRequested || rec.Result != nil {
			t.Fatalf("record %+v", rec)
		}
		if won, err := s.Finish(ctx, msg.ID, job.Result{Status: job.StatusCanceled, Error: job.NewFailure(job.CategoryCanceled, "killed")}); !won || err != nil {
			t.Fatalf("worker's Finish(canceled) = %v, %v", won, err)
		}
		if rec := mustGet(t, s, msg.ID); rec.Status != job.StatusCanceled {
			t.Fatalf("status %q", rec.Status)
		}
	})

	t.Run("terminal", func(t *testing.T) {
		msg := newMessage(t)
		mustCreate(t, s, msg)
		if _, err := s.Finish(ctx, msg.ID, job.Result{Status: job.StatusSucceeded}); err != nil {
			t.Fatal(err)
		}
		before := mustGet(t, s, msg.ID)
		st, err := s.Cancel(ctx, msg.ID)
		if err != nil || st != job.StatusSucceeded {
			t.Fatalf("Cancel(succeeded) = %q, %v", st, err)
		}
		if after := mustGet(t, s, msg.ID); !reflect.DeepEqual(before, after) {
			t.Fatal("Cancel changed a terminal record")
		}
	})
}

func TestDeleteJobOnlyWhenQueued(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()

	queued := newMessage(t)
	mustCreate(t, s, queued)
	mustClaim(t, s, queued)
	if err := s.DeleteJob(ctx, queued.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetJob(ctx, queued.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after DeleteJob GetJob = %v, want ErrNotFound", err)
	}
	if _, claimed, _ := s.ClaimInflight(ctx, queued.Key, job.NewID()); !claimed {
		t.Fatal("DeleteJob left the deleted job's in-flight claim")
	}

	running := newMessage(t)
	mustCreate(t, s, running)
	mustMarkRunning(t, s, running.ID)
	if err := s.DeleteJob(ctx, running.ID); err != nil {
		t.Fatalf("DeleteJob(running) = %v", err)
	}
	if rec := mustGet(t, s, running.ID); rec.Status != job.StatusRunning {
		t.Fatalf("running job after DeleteJob: %q", rec.Status)
	}
}

func TestGetJobsIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	a, b := newMessage(t), newMessage(t)
	mustCreate(t, s, a)
	mustCreate(t, s, b)
	mustMarkRunning(t, s, b.ID)

	// Warm the pipeline connection, so that counting sees GetJobs alone and
	// not a new connection's handshake.
	if _, err := s.GetJobs(ctx, []string{a.ID}); err != nil {
		t.Fatal(err)
	}
	calls := &countHook{}
	s.rdb.AddHook(calls)
	recs, err := s.GetJobs(ctx, []string{a.ID, job.NewID(), b.ID})
	if err != nil {
		t.Fatal(err)
	}
	if calls.single != 0 || calls.pipelines != 1 {
		t.Fatalf("GetJobs made %d commands and %d pipelines, want one pipeline", calls.single, calls.pipelines)
	}
	if len(recs) != 3 || recs[0] == nil || recs[1] != nil || recs[2] == nil {
		t.Fatalf("GetJobs = %v", recs)
	}
	if recs[0].Message.ID != a.ID || recs[0].Status != job.StatusQueued || recs[2].Message.ID != b.ID || recs[2].Status != job.StatusRunning {
		t.Fatalf("GetJobs = %+v, %+v", recs[0], recs[2])
	}
	if recs, err := s.GetJobs(ctx, nil); err != nil || len(recs) != 0 {
		t.Fatalf("GetJobs(nil) = %v, %v", recs, err)
	}
}

// countHook counts what a client sends: single commands and pipelines.
type countHook struct {
	mu                sync.Mutex
	single, pipelines int
}

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.single++
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		h.pipelines++
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

func mustCreate(t testing.TB, s *Store, msg job.Message) {
	t.Helper()
	if err := s.CreateJob(context.Background(), msg); err != nil {
		t.Fatalf("CreateJob: %v", err)
	}
}

func mustGet(t testing.TB, s *Store, id string) Record {
	t.Helper()
	rec, err := s.GetJob(context.Background(), id)
	if err != nil {
		t.Fatalf("GetJob: %v", err)
	}
	return rec
}

func mustMarkRunning(t testing.TB, s *Store, id string) {
	t.Helper()
	if st, err := s.MarkRunningLeased(context.Background(), id, "w", 1, time.Now(), Lease{Token: "w/1"}); err != nil || st != job.StatusRunning {
		t.Fatalf("MarkRunning = %q, %v", st, err)
	}
}

func mustClaim(t testing.TB, s *Store, msg job.Message) {
	t.Helper()
	if _, claimed, err := s.ClaimInflight(context.Background(), msg.Key, msg.ID); err != nil || !claimed {
		t.Fatalf("ClaimInflight = %v, %v", claimed, err)
	}
}
