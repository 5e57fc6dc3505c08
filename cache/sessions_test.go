package cache

import (
	"errors"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

func newSession(t *testing.T, s *Store, tenant string, now time.Time) SessionRecord {
	t.Helper()
	rec := SessionRecord{ID: job.NewID(), Tenant: tenant, Runtime: "python", Created: now, Expires: now.Add(time.Hour),
		IdleTimeout: 10 * time.Minute, MemoryMB: 256, Restore: job.RestoreFiles}
	if err := s.CreateSession(t.Context(), rec, 2); err != nil {
		t.Fatal(err)
	}
	return rec
}

// A session is held by one worker process and incarnation at a time: a
// second claim of the same incarnation loses, and the holder that lost it
// can change nothing.
func TestSessionClaimFences(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx, now := t.Context(), time.Now()
	rec := newSession(t, s, "acme", now)
	inc, err := s.ClaimSession(ctx, rec.ID, "w1", "i1", 0)
	if err != nil || inc != 1 {
		t.Fatalf("first claim: %d %v", inc, err)
	}
	if _, err := s.ClaimSession(ctx, rec.ID, "w2", "i2", 0); !errors.Is(err, ErrSessionFenced) {
		t.Fatalf("a second claim of incarnation 0: %v", err)
	}
	h1 := SessionHolder{Worker: "w1", Instance: "i1", Inc: 1}
	if err := s.ReadySession(ctx, rec.ID, h1, job.Image{Name: "img"}, now.Add(time.Minute), false, "", ""); err != nil {
		t.Fatal(err)
	}
	// The worker is lost: another claims the next incarnation.
	if inc, err := s.ClaimSession(ctx, rec.ID, "w2", "i2", 1); err != nil || inc != 2 {
		t.Fatalf("claim after the loss: %d %v", inc, err)
	}
	if _, _, _, err := s.NextCall(ctx, rec.ID, h1, now); !errors.Is(err, ErrSessionFenced) {
		t.Fatalf("the old holder took a call: %v", err)
	}
	if err := s.FinishCall(ctx, rec.ID, h1, 1, job.CallResult{}, now, nil, false, ""); !errors.Is(err, ErrSessionFenced) {
		t.Fatalf("the old holder recorded a result: %v", err)
	}
}

// Calls are taken in order, each once; one found running by a later
// holder is reported interrupted, never run again; an Idempotency-Key
// answers its first call; the queue is bounded; another tenant finds no
// session; an ended session takes no call and says why.
func TestSessionCalls(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx, now := t.Context(), time.Now()
	rec := newSession(t, s, "acme", now)
	inc, _ := s.ClaimSession(ctx, rec.ID, "w1", "i1", 0)
	h := SessionHolder{Worker: "w1", Instance: "i1", Inc: inc}
	if _, _, err := s.EnqueueCall(ctx, "globex", rec.ID, job.SessionCall{Code: "1"}, "", 4, now); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another tenant's call: %v", err)
	}
	var seqs []int64
	for i, key := range []string{"a", "b", "a"} {
		seq, dup, err := s.EnqueueCall(ctx, "acme", rec.ID, job.SessionCall{Code: key}, key, 2, now)
		if err != nil || dup != (i == 2) {
			t.Fatalf("enqueue %d: %d %v %v", i, seq, dup, err)
		}
		seqs = append(seqs, seq)
	}
	if seqs[0] != 1 || seqs[1] != 2 || seqs[2] != 1 {
		t.Fatalf("seqs %v", seqs)
	}
	if _, _, err := s.EnqueueCall(ctx, "acme", rec.ID, job.SessionCall{Code: "other"}, "a", 2, now); !errors.Is(err, ErrSessionKeyReused) {
		t.Fatalf("a key reused for another call: %v", err)
	}
	if _, _, err := s.EnqueueCall(ctx, "acme", rec.ID, job.SessionCall{Code: "c"}, "", 2, now); !errors.Is(err, ErrSessionQueueFull) {
		t.Fatalf("past the bound: %v", err)
	}
	state, seq, spec, err := s.NextCall(ctx, rec.ID, h, now)
	if err != nil || state != CallRun || seq != 1 || string(spec) != `{"code":"a"}` {
		t.Fatalf("next: %d %d %s %v", state, seq, spec, err)
	}
	// The holder dies with call 1 running; the next holder finds it so.
	inc, _ = s.ClaimSession(ctx, rec.ID, "w2", "i2", h.Inc)
	h2 := SessionHolder{Worker: "w2", Instance: "i2", Inc: inc}
	if state, seq, _, err := s.NextCall(ctx, rec.ID, h2, now); err != nil || state != CallInterrupted || seq != 1 {
		t.Fatalf("after the loss: %d %d %v", state, seq, err)
	}
	if err := s.FinishCall(ctx, rec.ID, h2, 1, job.CallResult{Seq: 1, Result: job.Result{Status: job.StatusInternalError}}, now.Add(time.Minute), []job.SessionFileEntry{{Name: "f", SHA256: "00", Size: 1}}, true, "lost"); err != nil {
		t.Fatal(err)
	}
	if state, seq, _, err := s.NextCall(ctx, rec.ID, h2, now); err != nil || state != CallRun || seq != 2 {
		t.Fatalf("the call after: %d %d %v", state, seq, err)
	}
	got, err := s.Session(ctx, rec.ID)
	if err != nil || got.Done != 1 || len(got.Files) != 1 || !got.Fresh || got.Note != "lost" || got.Inc != 2 {
		t.Fatalf("record: %+v %v", got, err)
	}
	c, err := s.SessionCall(ctx, rec.ID, 1)
	if err != nil || c.State != "done" || c.Result == nil || c.Result.Status != job.StatusInternalError {
		t.Fatalf("call 1: %+v %v", c, err)
	}
	if ok, err := s.EndSession(ctx, rec.ID, "acme", job.SessionEndDeleted); !ok || err != nil {
		t.Fatalf("end: %v %v", ok, err)
	}
	var ended *SessionEndedError
	if _, _, err := s.EnqueueCall(ctx, "acme", rec.ID, job.SessionCall{Code: "d"}, "", 4, now); !errors.As(err, &ended) || ended.Reason != job.SessionEndDeleted {
		t.Fatalf("a call to an ended session: %v", err)
	}
	if _, _, _, err := s.NextCall(ctx, rec.ID, h2, now); !errors.Is(err, ErrSessionEnded) {
		t.Fatalf("the holder of an ended session: %v", err)
	}
}

// A queued call withdrawn is the holder's to answer, not to run; a call
// that started, or was withdrawn before, is not withdrawn.
func TestSessionCallWithdrawn(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx, now := t.Context(), time.Now()
	rec := newSession(t, s, "acme", now)
	inc, _ := s.ClaimSession(ctx, rec.ID, "w1", "i1", 0)
	h := SessionHolder{Worker: "w1", Instance: "i1", Inc: inc}
	for _, code := range []string{"a", "b"} {
		if _, _, err := s.EnqueueCall(ctx, "acme", rec.ID, job.SessionCall{Code: code}, "", 4, now); err != nil {
			t.Fatal(err)
		}
	}
	if state, seq, _, err := s.NextCall(ctx, rec.ID, h, now); err != nil || state != CallRun || seq != 1 {
		t.Fatalf("next: %d %d %v", state, seq, err)
	}
	if ok, err := s.WithdrawCall(ctx, rec.ID, 1); ok || err != nil {
		t.Fatalf("withdraw a running call: %v %v", ok, err)
	}
	if ok, err := s.WithdrawCall(ctx, rec.ID, 2); !ok || err != nil {
		t.Fatalf("withdraw a queued call: %v %v", ok, err)
	}
	if ok, err := s.WithdrawCall(ctx, rec.ID, 2); ok || err != nil {
		t.Fatalf("withdraw it again: %v %v", ok, err)
	}
	if c, err := s.SessionCall(ctx, rec.ID, 2); err != nil || c.State != "withdrawn" || c.Result != nil {
		t.Fatalf("the withdrawn call: %+v %v", c, err)
	}
	if err := s.FinishCall(ctx, rec.ID, h, 1, job.CallResult{Seq: 1}, now, nil, false, ""); err != nil {
		t.Fatal(err)
	}
	if state, seq, _, err := s.NextCall(ctx, rec.ID, h, now); err != nil || state != CallWithdrawn || seq != 2 {
		t.Fatalf("next after the withdrawal: %d %d %v", state, seq, err)
	}
}

// A tenant holds at most its bound of live sessions; an ended one frees
// its place, and so does one past its lifetime.
func TestSessionQuota(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx, now := t.Context(), time.Now()
	a := newSession(t, s, "acme", now)
	newSession(t, s, "acme", now)
	extra := SessionRecord{ID: job.NewID(), Tenant: "acme", Runtime: "python", Created: now, Expires: now.Add(time.Hour)}
	if err := s.CreateSession(ctx, extra, 2); !errors.Is(err, ErrSessionQuota) {
		t.Fatalf("a third session: %v", err)
	}
	newSession(t, s, "globex", now) // another tenant's bound is its own
	if _, err := s.EndSession(ctx, a.ID, "acme", job.SessionEndDeleted); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSession(ctx, extra, 2); err != nil {
		t.Fatalf("after one ended: %v", err)
	}
	list, err := s.TenantSessions(ctx, "acme", now)
	if err != nil || len(list) != 2 {
		t.Fatalf("acme's sessions: %d %v", len(list), err)
	}
	later := now.Add(2 * time.Hour)
	if err := s.CreateSession(ctx, SessionRecord{ID: job.NewID(), Tenant: "acme", Runtime: "python", Created: later, Expires: later.Add(time.Hour)}, 2); err != nil {
		t.Fatalf("once the others are past their lifetime: %v", err)
	}
}

// The variables a pause kept travel in the checkpoint's files, but the
// record holds them apart: never among the session's files.
func TestSessionVariablesAreNotFiles(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx, now := t.Context(), time.Now()
	rec := newSession(t, s, "acme", now)
	if _, err := s.ClaimSession(ctx, rec.ID, "w1", "i1", 0); err != nil {
		t.Fatal(err)
	}
	h := SessionHolder{Worker: "w1", Instance: "i1", Inc: 1}
	data := job.SessionFileEntry{Name: "data.txt", Type: job.FileTypeFile, Size: 4, SHA256: "aa"}
	vars := job.SessionFileEntry{Name: job.SessionVariablesFile, Type: job.FileTypeFile, Size: 9, SHA256: "bb"}
	if err := s.SetSessionFiles(ctx, rec.ID, h, []job.SessionFileEntry{data, vars}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Session(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Files) != 1 || got.Files[0].Name != "data.txt" || got.Variables == nil || got.Variables.SHA256 != "bb" {
		t.Fatalf("files %+v variables %+v; want data.txt alone and the variables apart", got.Files, got.Variables)
	}
	if err := s.SetSessionFiles(ctx, rec.ID, h, []job.SessionFileEntry{data}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Session(ctx, rec.ID); err != nil || got.Variables != nil {
		t.Fatalf("after a checkpoint without them: variables %+v (%v); want none", got.Variables, err)
	}
}
