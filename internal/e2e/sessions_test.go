package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	sandboxctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
)

// pythonImage is the python image this checkout's recipe builds
// (kiln.local/python:<recipe hash>, made by `make image`), so a build of
// another checkout retagging :latest does not change what is tested.
func pythonImage(t *testing.T) string {
	t.Helper()
	return recipeImage(t, "python")
}

// recipeImage is the image this tree's recipe deploy/images/name builds
// (kiln.local/name:<recipe hash>, made by `make image`).
func recipeImage(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join("..", "..", "deploy", "images", name)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if st, err := os.Stat(filepath.Join(dir, e.Name())); err == nil && st.Mode().IsRegular() {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	h := sha256.New()
	io.WriteString(h, "kiln-image-recipe-v2\n")
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		fmt.Fprintf(h, "%s\x00%s\n", n, hex.EncodeToString(sum[:]))
	}
	return "kiln.local/" + name + ":" + hex.EncodeToString(h.Sum(nil))[:12]
}

// sessAPI is an API with two tenants' keys over e's stores.
type sessAPI struct {
	t    *testing.T
	base string
}

func (e *env) sessionsAPI(t *testing.T) *sessAPI {
	t.Helper()
	srv, err := producer.New(context.Background(), producer.Config{Store: e.store, NATS: e.nc, Queue: testQueue,
		APIKeys: map[string]string{"k-a": "acme", "k-b": "globex"}, RuntimeCacheTTL: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	hs := serveAPI(t, srv.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(srv.StopLongPolls)
	t.Cleanup(srv.Close)
	return &sessAPI{t: t, base: hs.URL}
}

// do sends a request with key's bearer and returns the status and body.
func (a *sessAPI) do(key, method, path string, body any, hdr ...string) (int, []byte) {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, _ := json.Marshal(b)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, a.base+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func (a *sessAPI) create(key string, spec map[string]any) job.Session {
	a.t.Helper()
	code, body := a.do(key, "POST", "/v1/sessions", spec)
	if code != http.StatusCreated {
		a.t.Fatalf("create session: %d %s", code, body)
	}
	var s job.Session
	if err := json.Unmarshal(body, &s); err != nil {
		a.t.Fatal(err)
	}
	return s
}

// exec runs code as the session's next call and returns its result.
func (a *sessAPI) exec(key, id, code string, hdr ...string) job.CallResult {
	a.t.Helper()
	st, body := a.do(key, "POST", "/v1/sessions/"+id+"/exec?wait=60s", map[string]any{"code": code}, hdr...)
	if st != http.StatusOK {
		a.t.Fatalf("exec %q: %d %s", code, st, body)
	}
	var r job.CallResult
	if err := json.Unmarshal(body, &r); err != nil {
		a.t.Fatal(err)
	}
	return r
}

// call reads call seq of session id, once it has ended.
func (a *sessAPI) call(key, id string, seq int64) job.CallResult {
	a.t.Helper()
	st, body := a.do(key, "GET", fmt.Sprintf("/v1/sessions/%s/calls/%d?wait=60s", id, seq), nil)
	var r job.CallResult
	if st != http.StatusOK || json.Unmarshal(body, &r) != nil {
		a.t.Fatalf("call %d of %s: %d %s", seq, id, st, body)
	}
	return r
}

func wantOut(t *testing.T, r job.CallResult, want string) {
	t.Helper()
	if r.Status != job.StatusSucceeded || strings.TrimSpace(r.Stdout) != want {
		t.Fatalf("call %d: %s %q (stderr %q, error %+v); want succeeded %q", r.Seq, r.Status, r.Stdout, r.Stderr, r.Error, want)
	}
}

// Issue 24, acceptance 1 and 5 (isolation), through the API, a worker and
// the real sandbox: variables, a DataFrame and files persist from call to
// call; files are downloadable and uploadable; an Idempotency-Key runs a
// call once; another tenant finds nothing; bad input is named; a full
// queue is 429; a deleted session is 410.
func TestSessionsEndToEnd(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	e.startWorker(t, "e2e-sessions", 1, withImages(map[string]string{"python": pythonImage(t)}))

	s := a.create("k-a", map[string]any{"runtime": "python", "files": []map[string]string{{"name": "seed.txt", "content": "seeded"}}})
	if s.ID == "" || s.Status != job.SessionReady || s.Image.Digest == "" || s.Incarnation != 1 || s.Links["exec"] == "" ||
		s.ExpiresAt.Sub(s.CreatedAt) != time.Hour || s.IdleTimeoutS != 600 {
		t.Fatalf("created: %+v", s)
	}
	r := a.exec("k-a", s.ID, "x = 41\nimport pandas as pd\ndf = pd.DataFrame({'v': [1, 2, 3, 4]})\nopen('notes.txt', 'w').write('hello')\nprint(open('seed.txt').read())")
	wantOut(t, r, "seeded")
	if r.Seq != 1 || r.Incarnation != 1 || !r.StateRestored {
		t.Fatalf("call 1: seq %d incarnation %d state_restored %v", r.Seq, r.Incarnation, r.StateRestored)
	}
	r = a.exec("k-a", s.ID, "print(x + 1)\nprint(open('notes.txt').read())")
	wantOut(t, r, "42\nhello")
	r = a.exec("k-a", s.ID, "print(df['v'].rolling(2).mean().iloc[-1])")
	wantOut(t, r, "3.5")
	if r.Seq != 3 {
		t.Fatalf("call 3 has seq %d", r.Seq)
	}
	// Files: the checkpoint after the last call, and a file put in.
	if code, body := a.do("k-a", "GET", "/v1/sessions/"+s.ID+"/files/notes.txt", nil); code != 200 || string(body) != "hello" {
		t.Fatalf("download notes.txt: %d %q", code, body)
	}
	if code, body := a.do("k-a", "PUT", "/v1/sessions/"+s.ID+"/files/in/data.csv", []byte("a\n5\n")); code != http.StatusCreated { // a new file: 201 with its entry
		t.Fatalf("upload: %d %s", code, body)
	}
	wantOut(t, a.exec("k-a", s.ID, "print(open('in/data.csv').read().split()[1])"), "5")
	// A call sent twice with one Idempotency-Key runs once.
	once := "n = globals().get('n', 0) + 1\nprint(n)"
	r1 := a.exec("k-a", s.ID, once, "Idempotency-Key", "k1")
	r2 := a.exec("k-a", s.ID, once, "Idempotency-Key", "k1")
	wantOut(t, r1, "1")
	wantOut(t, r2, "1")
	if r1.Seq != r2.Seq {
		t.Fatalf("one Idempotency-Key, two calls: seq %d and %d", r1.Seq, r2.Seq)
	}
	wantOut(t, a.exec("k-a", s.ID, "print(n)"), "1")
	if code, out := a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/exec?wait=5s", map[string]any{"code": "print(2)"}, "Idempotency-Key", "k1"); code != 422 ||
		!strings.Contains(string(out), "idempotency-key-reused") {
		t.Fatalf("a key reused for another call: %d %s", code, out)
	}

	// Another tenant finds nothing: read, exec, files, delete, list.
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/sessions/" + s.ID}, {"POST", "/v1/sessions/" + s.ID + "/exec"}, {"GET", "/v1/sessions/" + s.ID + "/files/notes.txt"},
		{"PUT", "/v1/sessions/" + s.ID + "/files/x.txt"}, {"DELETE", "/v1/sessions/" + s.ID}, {"GET", "/v1/sessions/" + s.ID + "/calls/1"},
	} {
		var body any
		if c.method == "POST" {
			body = map[string]any{"code": "print(x)"}
		}
		if code, out := a.do("k-b", c.method, c.path, body); code != http.StatusNotFound {
			t.Errorf("tenant b: %s %s: %d %s", c.method, c.path, code, out)
		}
	}
	if _, out := a.do("k-b", "GET", "/v1/sessions", nil); strings.Contains(string(out), s.ID) {
		t.Errorf("tenant b lists a's session: %s", out)
	}
	if _, out := a.do("k-a", "GET", "/v1/sessions", nil); !strings.Contains(string(out), s.ID) {
		t.Errorf("tenant a's list lacks its session: %s", out)
	}
	wantOut(t, a.exec("k-a", s.ID, "print(x)"), "41") // untouched by b's attempts

	// Bad input names what to fix.
	for _, c := range []struct {
		path  string
		body  any
		code  int
		field string
	}{
		{"/v1/sessions/" + s.ID + "/exec", map[string]any{"code": "1", "limits": map[string]any{"timeout_ms": 1 << 40}}, 422, "limits.timeout_ms"},
		{"/v1/sessions/" + s.ID + "/exec", map[string]any{"code": "1", "limits": map[string]any{"memory_mb": 64}}, 422, "limits.memory_mb"},
		{"/v1/sessions", map[string]any{"idle_timeout_s": -1}, 422, "idle_timeout_s"},
		{"/v1/sessions", map[string]any{"restore": "magic"}, 422, "restore"},
		{"/v1/sessions/" + job.NewID() + "/exec", map[string]any{"code": "1"}, 404, ""},
	} {
		code, out := a.do("k-a", "POST", c.path, c.body)
		if code != c.code || !strings.Contains(string(out), `"field":"`+c.field) && c.field != "" {
			t.Errorf("POST %s %v: %d %s; want %d naming %s", c.path, c.body, code, out, c.code, c.field)
		}
	}

	// The queue is bounded: one call running and SessionQueueMax-1 more
	// waiting, the next is refused.
	code, out := a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"code": "import time\ntime.sleep(3)"})
	if code != http.StatusAccepted {
		t.Fatalf("exec without wait: %d %s", code, out)
	}
	var last job.CallResult
	for range job.SessionQueueMax - 1 {
		code, out = a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"code": "pass"})
		if code != http.StatusAccepted {
			t.Fatalf("queued call: %d %s", code, out)
		}
		_ = json.Unmarshal(out, &last)
	}
	if code, out = a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"code": "pass"}); code != http.StatusTooManyRequests {
		t.Fatalf("call past the queue's bound: %d %s", code, out)
	}
	code, out = a.do("k-a", "GET", fmt.Sprintf("/v1/sessions/%s/calls/%d?wait=60s", s.ID, last.Seq), nil)
	if code != 200 || !strings.Contains(string(out), `"status":"succeeded"`) {
		t.Fatalf("the last queued call: %d %s", code, out)
	}

	if code, out := a.do("k-a", "DELETE", "/v1/sessions/"+s.ID, nil); code != 200 || !strings.Contains(string(out), `"ended_reason":"deleted"`) {
		t.Fatalf("delete: %d %s", code, out)
	}
	if code, out := a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"code": "print(x)"}); code != http.StatusGone ||
		!strings.Contains(string(out), "deleted") {
		t.Fatalf("exec on a deleted session: %d %s", code, out)
	}
}

// Issue 24, acceptance 3: a worker holding sessions is SIGKILLed; each
// session's next call succeeds on another worker, with its files and
// without its variables (state_restored false, incarnation + 1), or with
// them rebuilt under restore "replay"; no call runs twice; the dead
// worker's session boxes are gone once it restarts.
func TestSessionsSurviveWorkerLoss(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	img := pythonImage(t)
	victim := e.workerProc(t, "e2e-sess-victim", "KILN_E2E_IMAGE_PYTHON="+img, "KILN_E2E_ID_LEASE=1s")
	files := a.create("k-a", map[string]any{})
	replay := a.create("k-a", map[string]any{"restore": "replay"})
	wantOut(t, a.exec("k-a", files.ID, "x = 41\nopen('data.txt', 'w').write('kept')\nopen('log.txt', 'a').write('1\\n')\nprint('one')"), "one")
	wantOut(t, a.exec("k-a", replay.ID, "x = 41\nprint('one')"), "one")
	wantOut(t, a.exec("k-a", replay.ID, "x += 1\nprint(x)"), "42")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client, err := containerd.New(e.containerd)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	nctx := namespaces.WithNamespace(ctx, testenv.ContainerdNamespace())
	before, err := client.Containers(nctx, fmt.Sprintf(`labels.%q==%q`, sandboxctrd.LabelWorker, "e2e-sess-victim"))
	if err != nil || len(before) < 2 {
		t.Fatalf("the victim's containers: %d %v", len(before), err)
	}

	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = victim.Process.Wait()
	testkit.Eventually(t, time.Minute, "the victim's lease to lapse", func() bool {
		inst, _ := e.store.WorkerInstance(ctx, "e2e-sess-victim")
		return inst == ""
	})
	e.startWorker(t, "e2e-sess-rescuer", 1, withImages(map[string]string{"python": img}))

	r := a.exec("k-a", files.ID, "open('log.txt', 'a').write('2\\n')\nprint(open('data.txt').read(), 'x' in globals())")
	wantOut(t, r, "kept False")
	if r.StateRestored || r.Incarnation != 2 || r.Worker != "e2e-sess-rescuer" || !strings.Contains(r.SessionNote, "worker was lost") {
		t.Fatalf("after the loss: state_restored %v incarnation %d worker %q note %q", r.StateRestored, r.Incarnation, r.Worker, r.SessionNote)
	}
	if code, body := a.do("k-a", "GET", "/v1/sessions/"+files.ID+"/files/log.txt", nil); code != 200 || string(body) != "1\n2\n" {
		t.Fatalf("log.txt (one line per call run): %d %q", code, body)
	}
	r = a.exec("k-a", replay.ID, "print(x)")
	wantOut(t, r, "42")
	if !r.StateRestored || r.Incarnation != 2 || !strings.Contains(r.SessionNote, "replay") {
		t.Fatalf("replayed: state_restored %v incarnation %d note %q", r.StateRestored, r.Incarnation, r.SessionNote)
	}

	// The victim restarts (same id): it reaps what its predecessor left.
	e.workerProc(t, "e2e-sess-victim", "KILN_E2E_IMAGE_PYTHON="+img)
	for _, c := range before {
		testkit.Eventually(t, time.Minute, "container "+c.ID()+" of the dead worker to leave containerd", func() bool {
			_, err := client.LoadContainer(nctx, c.ID())
			return err != nil
		})
	}
}

// sessionBoxes counts the containers of session id (its box).
func sessionBoxes(t *testing.T, ctx context.Context, client *containerd.Client, id string) int {
	t.Helper()
	cs, err := client.Containers(ctx, fmt.Sprintf(`labels.%q==%q`, sandboxctrd.LabelSession, id))
	if err != nil {
		t.Fatal(err)
	}
	return len(cs)
}

// waitNoBox waits until session id's box is gone from containerd.
func waitNoBox(t *testing.T, ctx context.Context, client *containerd.Client, id string) {
	t.Helper()
	testkit.Eventually(t, time.Minute, "session "+id+"'s box to leave containerd", func() bool {
		return ctx.Err() == nil && sessionBoxes(t, ctx, client, id) == 0
	})
}

// Issue 24, acceptance 4 (with issue 36's pause): the max lifetime and
// deletion remove the session's box (checked in containerd) and later calls
// are 410 naming why, and idle past its timeout a session pauses (its box
// removed) and its next call resumes it; a call past the session's memory is oom_killed and the
// next call starts the next incarnation without the old state.
func TestSessionsEndAndRestart(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	e.startWorker(t, "e2e-sessions-end", 1, withImages(map[string]string{"python": pythonImage(t)}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, err := containerd.New(e.containerd)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	nctx := namespaces.WithNamespace(ctx, testenv.ContainerdNamespace())

	// Each session's call right after its creation: the idle timeout and
	// the lifetime run from there, and a loaded host must not end a
	// session before its first call (3 s and 4 s leave room for that).
	opened := func(spec map[string]any) job.Session {
		s := a.create("k-a", spec)
		if n := sessionBoxes(t, nctx, client, s.ID); n != 1 {
			t.Fatalf("session %s has %d boxes", s.ID, n)
		}
		wantOut(t, a.exec("k-a", s.ID, "print(1)"), "1")
		return s
	}
	idle := opened(map[string]any{"idle_timeout_s": 3})
	life := opened(map[string]any{"max_lifetime_s": 4})
	gone := opened(map[string]any{})
	if code, out := a.do("k-a", "DELETE", "/v1/sessions/"+gone.ID, nil); code != 200 {
		t.Fatalf("delete: %d %s", code, out)
	}
	// Idle past its timeout, a session pauses (its box goes) and its next
	// call brings it back, files kept.
	waitNoBox(t, nctx, client, idle.ID)
	code, out := a.do("k-a", "GET", "/v1/sessions/"+idle.ID, nil)
	if code != 200 || !strings.Contains(string(out), `"status":"paused"`) {
		t.Errorf("a session idle past its timeout: %d %s; want paused", code, out)
	}
	if r := a.exec("k-a", idle.ID, "print(2)"); r.Status != job.StatusSucceeded || !strings.Contains(r.SessionNote, "paused") {
		t.Errorf("a call to the idle-paused session: %s note %q", r.Status, r.SessionNote)
	}
	for _, c := range []struct {
		s      job.Session
		reason string
	}{{gone, "deleted"}, {life, "max_lifetime"}} {
		waitNoBox(t, nctx, client, c.s.ID)
		code, out := a.do("k-a", "POST", "/v1/sessions/"+c.s.ID+"/exec", map[string]any{"code": "print(1)"})
		if code != http.StatusGone || !strings.Contains(string(out), "session-ended") {
			t.Errorf("exec on an ended session (%s): %d %s", c.reason, code, out)
		}
		code, out = a.do("k-a", "GET", "/v1/sessions/"+c.s.ID, nil)
		if code != 200 || !strings.Contains(string(out), `"ended_reason":"`+c.reason+`"`) {
			t.Errorf("session ended (%s): %d %s", c.reason, code, out)
		}
	}

	oom := a.create("k-a", map[string]any{"memory_mb": 256})
	wantOut(t, a.exec("k-a", oom.ID, "x = 41\nopen('kept.txt', 'w').write('k')"), "")
	r := a.exec("k-a", oom.ID, "b = bytearray(1 << 30)")
	if r.Status != job.StatusOOMKilled || r.Incarnation != 1 {
		t.Fatalf("a call past the session's memory: %s incarnation %d %+v", r.Status, r.Incarnation, r.Error)
	}
	r = a.exec("k-a", oom.ID, "print('x' in globals(), open('kept.txt').read())")
	wantOut(t, r, "False k")
	if r.StateRestored || r.Incarnation != 2 || !strings.Contains(r.SessionNote, "interpreter ended") {
		t.Fatalf("after the OOM: state_restored %v incarnation %d note %q", r.StateRestored, r.Incarnation, r.SessionNote)
	}
	r = a.exec("k-a", oom.ID, "print(1)")
	if !r.StateRestored || r.Incarnation != 2 {
		t.Fatalf("the call after: state_restored %v incarnation %d", r.StateRestored, r.Incarnation)
	}
	if n := sessionBoxes(t, nctx, client, oom.ID); n != 1 {
		t.Fatalf("the restarted session has %d boxes", n)
	}
}
