package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/worker"
)

// Issue 36, acceptance 2: a worker holding ten sessions is killed; a call
// sent to each right after (its worker's lease in the store still live) is
// answered within 15 s without another call being sent: it runs on the
// session's next incarnation on another worker, with its files and a note
// that says the worker was lost. A call that was running when the worker
// died is answered internal_error within 15 s, never run again.
func TestSessionCallsAfterTheirWorkerDiedAreAnswered(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	img := pythonImage(t)
	victim := e.workerProc(t, "e2e-sess-died", "KILN_E2E_IMAGE_PYTHON="+img, "KILN_E2E_SESSIONS_MEMORY_MB=8192")
	const n = 10
	ids := make([]string, n)
	for i := range ids {
		ids[i] = a.create(keyOf(i), map[string]any{}).ID
		wantOut(t, a.exec(keyOf(i), ids[i], fmt.Sprintf("x = %d\nopen('log.txt', 'a').write('1\\n')\nprint(x)", i)), fmt.Sprint(i))
	}
	// One more session whose call is running when the worker dies.
	busy := a.create("k-b", map[string]any{}).ID
	running := make(chan int64, 1)
	go func() {
		_, body := a.do("k-b", "POST", "/v1/sessions/"+busy+"/exec?wait=0s", map[string]any{"code": "import time\ntime.sleep(60)"})
		var p job.CallPending
		_ = json.Unmarshal(body, &p)
		running <- p.Seq
	}()
	busySeq := <-running
	e.startWorker(t, "e2e-sess-rescuer", 4, withImages(map[string]string{"python": img}), withSessionMemory(8<<30))
	// The busy call is running before the kill.
	waitCallState(t, a, "k-b", busy, busySeq, "running")

	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = victim.Process.Wait()
	killed := time.Now()

	var wg sync.WaitGroup
	results := make([]job.CallResult, n)
	took := make([]time.Duration, n)
	for i, id := range ids {
		wg.Go(func() {
			start := time.Now()
			results[i] = a.exec(keyOf(i), id, "open('log.txt', 'a').write('2\\n')\nprint(open('log.txt').read().count('\\n'), 'x' in globals())")
			took[i] = time.Since(start)
		})
	}
	var busyRes job.CallResult
	wg.Go(func() {
		code, body := a.do("k-b", "GET", fmt.Sprintf("/v1/sessions/%s/calls/%d?wait=60s", busy, busySeq), nil)
		if code != http.StatusOK {
			t.Errorf("the busy call: %d %s", code, body)
			return
		}
		_ = json.Unmarshal(body, &busyRes)
	})
	wg.Wait()
	for i, r := range results {
		wantOut(t, r, "2 False")
		if took[i] > 15*time.Second || r.StateRestored || r.Incarnation != 2 || r.Worker != "e2e-sess-rescuer" || !strings.Contains(r.SessionNote, "worker was lost") {
			t.Errorf("session %d: answered after %v; state_restored %v incarnation %d worker %q note %q", i, took[i], r.StateRestored, r.Incarnation, r.Worker, r.SessionNote)
		}
	}
	if busyRes.Status != job.StatusInternalError || busyRes.Error == nil || !strings.Contains(busyRes.Error.Message, "not run again") ||
		time.Since(killed) > 20*time.Second {
		t.Errorf("the call running when its worker died: %s %+v, answered %v after the kill", busyRes.Status, busyRes.Error, time.Since(killed))
	}
	t.Logf("%d calls sent after the kill answered in at most %v; the running one answered %s", n, maxOf(took), busyRes.Status)
}

// Issue 36, acceptance 1: Redis is killed for 10 s while twenty sessions
// make calls. No interpreter is lost (every session's next call finds its
// variables: the same incarnation), no call is left pending, and every call
// accepted is answered once with its real result once the store is back.
func TestSessionsRideOutAStoreOutage(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	img := pythonImage(t)
	e.startWorker(t, "e2e-sess-outage", 4, withImages(map[string]string{"python": img}), withSessionMemory(16<<30))
	const n = 20
	ids := make([]string, n)
	for i := range ids {
		ids[i] = a.create(keyOf(i), map[string]any{}).ID
		wantOut(t, a.exec(keyOf(i), ids[i], "n = 0\nprint(n)"), "0")
	}
	// Each session's call in flight as Redis dies: accepted, then running
	// across the outage.
	seqs := make([]int64, n)
	for i, id := range ids {
		code, body := a.do(keyOf(i), "POST", "/v1/sessions/"+id+"/exec?wait=0s", map[string]any{"code": "import time\ntime.sleep(3)\nn += 1\nopen('calls.txt', 'a').write('1\\n')\nprint(n)"})
		var p job.CallPending
		if code != http.StatusAccepted || json.Unmarshal(body, &p) != nil {
			t.Fatalf("session %d's call: %d %s", i, code, body)
		}
		seqs[i] = p.Seq
	}
	e.redis.Stop()
	outage := time.Now()
	// Calls sent while the store is down are refused, retryably, and are
	// not the ones this test counts.
	if code, body := a.do(keyOf(0), "POST", "/v1/sessions/"+ids[0]+"/exec?wait=0s", map[string]any{"code": "print(1)"}); code != http.StatusServiceUnavailable {
		t.Errorf("a call during the outage: %d %s; want 503", code, body)
	}
	<-time.After(10*time.Second - time.Since(outage)) // the fault under test: an outage of 10 s
	e.redis.Start()
	for i, id := range ids {
		// As a client does: a 503 while the API's store connections come
		// back is retried.
		var code int
		var body []byte
		testkit.Poll(30*time.Second, func() bool {
			code, body = a.do(keyOf(i), "GET", fmt.Sprintf("/v1/sessions/%s/calls/%d?wait=60s", id, seqs[i]), nil)
			return code != http.StatusServiceUnavailable
		})
		var r job.CallResult
		if code != http.StatusOK || json.Unmarshal(body, &r) != nil {
			t.Fatalf("session %d's call across the outage: %d %s", i, code, body)
		}
		wantOut(t, r, "1")
		next := a.exec(keyOf(i), id, "print(n, open('calls.txt').read().count('\\n'))")
		wantOut(t, next, "1 1")
		if !next.StateRestored || next.Incarnation != 1 || next.SessionNote != "" {
			t.Errorf("session %d after the outage: state_restored %v incarnation %d note %q: its interpreter was lost", i, next.StateRestored, next.Incarnation, next.SessionNote)
		}
	}
}

// keyOf spreads sessions over the two tenants of the sessions API (each
// holds at most ten).
func keyOf(i int) string { return []string{"k-a", "k-b"}[i%2] }

// waitCallState waits until call seq of key's session id is in state.
func waitCallState(t *testing.T, a *sessAPI, key, id string, seq int64, state string) {
	t.Helper()
	var code int
	var body []byte
	if !testkit.Poll(time.Minute, func() bool {
		code, body = a.do(key, "GET", fmt.Sprintf("/v1/sessions/%s/calls/%d", id, seq), nil)
		var p job.CallPending
		return code == http.StatusAccepted && json.Unmarshal(body, &p) == nil && string(p.Status) == state
	}) {
		t.Fatalf("call %d of session %s not %s within a minute: %d %s", seq, id, state, code, body)
	}
}

func maxOf(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

// withSessionMemory lets a worker's sessions use bytes together (each
// tenant half of it).
func withSessionMemory(bytes int64) option {
	return func(c *telemetry) { c.worker = func(w *worker.Config) { w.Sessions.MemoryBytes = bytes } }
}

// Issue 36, acceptance 6: a paused session holds no box (checked in
// containerd) and does not count among the key's live sessions; it resumes
// on another worker with its files, and says what came back:
// files+variables (a python session: its variables as its pause kept them,
// shared references shared, its own functions and classes too; what could
// not be kept named in the next call's note), or, with restore "replay",
// files+replay (its variables rebuilt). (A node session's, files alone:
// TestNodeSessionPauseAndResume.) A call to a paused session resumes it.
func TestSessionsPauseAndResume(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	imgs := map[string]string{"python": pythonImage(t)}
	stopFirst := e.startWorker(t, "e2e-sess-pause-1", 2, withImages(imgs), withSessionMemory(16<<30))
	vars := a.create("k-a", map[string]any{})
	partial := a.create("k-a", map[string]any{})
	replay := a.create("k-a", map[string]any{"restore": "replay"})
	wantOut(t, a.exec("k-a", vars.ID, `import pandas as pd
from sklearn.linear_model import LinearRegression
df = pd.DataFrame({"a": [1, 2, 3]})
same = df
k = 7
def times_k(v):
    return v * k
class Box:
    def __init__(self, v):
        self.v = v
    def twice(self):
        return self.v * 2
b = Box(21)
model = LinearRegression().fit([[0], [1], [2]], [0, 2, 4])
open("data.txt", "w").write("kept")
print(df.a.sum())`), "6")
	wantOut(t, a.exec("k-a", partial.ID, "x = 41\nrows = (i for i in range(3))\nprint(x)"), "41")
	wantOut(t, a.exec("k-a", replay.ID, "y = 6 * 7\nprint(y)"), "42")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client, err := containerd.New(e.containerd)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	nctx := namespaces.WithNamespace(ctx, testenv.ContainerdNamespace())
	for _, s := range []job.Session{vars, partial, replay} {
		code, body := a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/pause?wait=60s", nil)
		var v job.Session
		if code != http.StatusOK || json.Unmarshal(body, &v) != nil || v.Status != job.SessionPaused || v.PausedAt == nil {
			t.Fatalf("pause %s: %d %s", s.ID, code, body)
		}
		waitNoBox(t, nctx, client, s.ID)
	}
	// Paused sessions leave the key's live sessions: ten more can open.
	// The variables' pickle is not one of the session's files.
	if code, body := a.do("k-a", "GET", "/v1/sessions/"+vars.ID+"/files", nil); code != http.StatusOK || !strings.Contains(string(body), "data.txt") ||
		strings.Contains(string(body), job.SessionVariablesFile) {
		t.Fatalf("a paused session's files: %d %s; want data.txt and no %s", code, body, job.SessionVariablesFile)
	}
	var more []string
	for range 10 {
		more = append(more, a.create("k-a", map[string]any{}).ID)
	}
	if code, body := a.do("k-a", "POST", "/v1/sessions/"+vars.ID+"/resume", nil); code != http.StatusTooManyRequests {
		t.Fatalf("resume at the key's bound of live sessions: %d %s; want 429", code, body)
	}
	for _, id := range more {
		if code, body := a.do("k-a", "DELETE", "/v1/sessions/"+id, nil); code != http.StatusOK {
			t.Fatalf("delete: %d %s", code, body)
		}
	}

	// Another worker: the first one goes.
	stopFirst()
	e.startWorker(t, "e2e-sess-pause-2", 2, withImages(imgs))
	resume := func(s job.Session, want string) {
		t.Helper()
		code, body := a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/resume", nil)
		var v job.Session
		if code != http.StatusOK || json.Unmarshal(body, &v) != nil || v.Status != job.SessionReady || v.Restored != want {
			t.Fatalf("resume %s: %d %s; want ready, restored %s", s.Runtime, code, body, want)
		}
	}
	resume(vars, job.RestoredFilesVariables)
	r := a.exec("k-a", vars.ID, `print(open("data.txt").read(), same is df, df.a.sum(), times_k(3), b.twice(), isinstance(b, Box), round(model.predict([[3]])[0]), pd.__name__)`)
	wantOut(t, r, "kept True 6 21 42 True 6 pandas")
	if !r.StateRestored || r.Worker != "e2e-sess-pause-2" || !strings.Contains(r.SessionNote, "variables came back") {
		t.Fatalf("after the resume with its variables: state_restored %v worker %q note %q", r.StateRestored, r.Worker, r.SessionNote)
	}
	// The resumed interpreter removed the pickle once it had loaded it.
	wantOut(t, a.exec("k-a", vars.ID, "import os\nprint(os.path.exists('"+job.SessionVariablesFile+"'))"), "False")

	resume(partial, job.RestoredFilesVariables)
	r = a.exec("k-a", partial.ID, "print(x, 'rows' in globals())")
	wantOut(t, r, "41 False")
	if r.StateRestored || !strings.Contains(r.SessionNote, "rows (TypeError") {
		t.Fatalf("after the resume of a session with a generator: state_restored %v note %q; want false, rows named", r.StateRestored, r.SessionNote)
	}

	// A call resumes a paused session by itself.
	r = a.exec("k-a", replay.ID, "print(y)")
	wantOut(t, r, "42")
	if !r.StateRestored || !strings.Contains(r.SessionNote, "replay") {
		t.Fatalf("a call to a paused replay session: state_restored %v note %q", r.StateRestored, r.SessionNote)
	}
	var v job.Session
	code, body := a.do("k-a", "GET", "/v1/sessions/"+replay.ID, nil)
	if code != http.StatusOK || json.Unmarshal(body, &v) != nil || v.Restored != job.RestoredFilesReplay {
		t.Fatalf("the replay session after its resume: %d %s; want restored files+replay", code, body)
	}
}
