package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// POST /v1/sessions/{id}/calls/{seq}/cancel through the API, a worker and
// the real sandbox: a call queued behind a running one is withdrawn and
// never runs; the running one is interrupted; both are answered canceled
// and the session's interpreter keeps its variables; a call that ended is
// left as it is; another tenant's cancel, an unknown call and a seq that is
// not a number are refused.
func TestSessionCallCancel(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	e.startWorker(t, "e2e-session-cancel", 1, withImages(map[string]string{"python": pythonImage(t)}))
	s := a.create("k-a", map[string]any{})
	calls := "/v1/sessions/" + s.ID + "/calls/"
	wantOut(t, a.exec("k-a", s.ID, "x = 41"), "")

	pending := func(code string) job.CallPending {
		t.Helper()
		st, raw := a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"code": code})
		var p job.CallPending
		if st != http.StatusAccepted || json.Unmarshal(raw, &p) != nil || !p.Pending {
			t.Fatalf("exec %q: %d %s; want 202 pending", code, st, raw)
		}
		return p
	}
	answer := func(key, method, path string, want int) (job.CallResult, job.CallPending) {
		t.Helper()
		st, raw := a.do(key, method, path, nil)
		if st != want {
			t.Fatalf("%s %s: %d %s; want %d", method, path, st, raw, want)
		}
		var r job.CallResult
		var p job.CallPending
		if st == http.StatusOK {
			if err := json.Unmarshal(raw, &r); err != nil {
				t.Fatalf("%s %s: %v: %s", method, path, err, raw)
			}
		} else if st == http.StatusAccepted {
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatalf("%s %s: %v: %s", method, path, err, raw)
			}
		}
		return r, p
	}

	long := pending("import time\nx = 0\ntime.sleep(120)")
	queued := pending("open('ran.txt', 'w').write('ran')\nx = -1")
	if queued.Seq != long.Seq+1 {
		t.Fatalf("seqs %d then %d", long.Seq, queued.Seq)
	}
	// The long call is running: its own signal, the call's state.
	deadline := time.Now().Add(time.Minute)
	for {
		_, p := answer("k-a", "GET", fmt.Sprintf("%s%d?wait=1s", calls, long.Seq), http.StatusAccepted)
		if p.Status == job.CallRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("call %d still %s after a minute", long.Seq, p.Status)
		}
	}

	// Another tenant's cancel is 404, and leaves the call running.
	answer("k-b", "POST", fmt.Sprintf("%s%d/cancel", calls, long.Seq), http.StatusNotFound)
	_, p := answer("k-a", "GET", fmt.Sprintf("%s%d", calls, long.Seq), http.StatusAccepted)
	if p.Status != job.CallRunning {
		t.Fatalf("after another tenant's cancel the call is %s; want running", p.Status)
	}

	// The queued call: withdrawn, answered once the running one is done.
	answer("k-a", "POST", fmt.Sprintf("%s%d/cancel", calls, queued.Seq), http.StatusAccepted)
	started := time.Now()
	r, _ := answer("k-a", "POST", fmt.Sprintf("%s%d/cancel?wait=30s", calls, long.Seq), http.StatusOK)
	if r.Status != job.StatusCanceled {
		t.Fatalf("the running call, canceled: %s %+v", r.Status, r.Error)
	}
	if d := time.Since(started); d > 20*time.Second {
		t.Errorf("the running call took %s to be canceled", d)
	}
	r, _ = answer("k-a", "GET", fmt.Sprintf("%s%d?wait=30s", calls, queued.Seq), http.StatusOK)
	if r.Status != job.StatusCanceled || r.Error == nil || !strings.Contains(r.Error.Message, "withdrawn") {
		t.Fatalf("the queued call, canceled: %s %+v; want canceled, withdrawn before it ran", r.Status, r.Error)
	}

	// The interpreter is the same one: the long call's x = 0 ran before
	// its sleep; the withdrawn call never ran.
	last := a.exec("k-a", s.ID, "import os\nprint(x, os.path.exists('ran.txt'))")
	wantOut(t, last, "0 False")
	if !last.StateRestored {
		t.Errorf("the call after the cancels: state_restored false (%q); want the interpreter kept", last.SessionNote)
	}

	// A call that ended is left as it is.
	r, _ = answer("k-a", "POST", fmt.Sprintf("%s%d/cancel", calls, last.Seq), http.StatusOK)
	if r.Status != job.StatusSucceeded || r.Seq != last.Seq {
		t.Fatalf("cancel of an ended call: %s seq %d; want its result, succeeded", r.Status, r.Seq)
	}
	answer("k-a", "POST", calls+"99/cancel", http.StatusNotFound)
	answer("k-a", "POST", calls+"x/cancel", http.StatusNotFound)

	// The Go client: a running call canceled by its seq, an unknown one
	// ErrNotFound.
	c, err := client.New(a.base, client.WithAPIKey("k-a"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	cs, err := c.OpenSession(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	again := pending("import time\ntime.sleep(120)")
	res, err := cs.CancelCall(ctx, again.Seq)
	if err != nil || res.Status != job.StatusCanceled || res.Seq != again.Seq {
		t.Fatalf("client CancelCall: %s seq %d %v; want canceled", res.Status, res.Seq, err)
	}
	if _, err := cs.CancelCall(ctx, 999); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("client CancelCall of no call: %v; want ErrNotFound", err)
	}
}
