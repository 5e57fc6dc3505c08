package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/producer/client"
)

// fileAnswer is a files route's answer: its status and body, the body
// decoded as an entry or a problem.
type fileAnswer struct {
	code    int
	body    []byte
	entry   job.SessionFileInfo
	problem struct {
		Type, Title, Detail, Field string
		Status                     int
		Limit                      int64
	}
	header http.Header
}

func (a *sessAPI) file(key, method, path string, body any, hdr ...string) fileAnswer {
	a.t.Helper()
	code, raw := a.do(key, method, path, body, hdr...)
	ans := fileAnswer{code: code, body: raw}
	if code >= 400 {
		_ = json.Unmarshal(raw, &ans.problem)
	} else if len(raw) > 0 {
		_ = json.Unmarshal(raw, &ans.entry)
	}
	return ans
}

// wantConflict checks a refusal the session's files make: 409
// file-conflict naming the field, no Retry-After (never retryable).
func wantConflict(t *testing.T, what string, a fileAnswer, title, field string) {
	t.Helper()
	if a.code != http.StatusConflict || a.problem.Type != string(job.ProblemFileConflict) || a.problem.Title != title || a.problem.Field != field {
		t.Errorf("%s: %d %s; want 409 file-conflict %q on %s", what, a.code, a.body, title, field)
	}
}

func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Issue 36, files in a session, through the API, a worker and the real
// sandbox: /work listed (directories, links, mtimes), described, read and
// written, directories made, entries moved and removed, each answered as
// its own HTTP result; what the session's files make impossible is a 409
// naming why, never retryable; and links the session planted (to the
// host's /etc/passwd, to /etc, to /) are never gone through or written to:
// the targets, on the host and in the box, stay as they were.
func TestSessionFiles(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	e.startWorker(t, "e2e-session-files", 1, withImages(map[string]string{"python": pythonImage(t)}))
	hostPasswd, err := os.ReadFile("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	s := a.create("k-a", map[string]any{"runtime": "python"})
	base := "/v1/sessions/" + s.ID + "/files"
	r := a.exec("k-a", s.ID, `import os, hashlib
os.makedirs('data/raw', exist_ok=True)
open('data/raw/a.csv', 'w').write('x,y\n1,2\n')
os.symlink('/etc/passwd', 'passwd')
os.symlink('/etc', 'etc')
os.symlink('/', 'root')
print(hashlib.sha256(open('/etc/passwd', 'rb').read()).hexdigest())`)
	if r.Status != job.StatusSucceeded {
		t.Fatalf("the call that made the files: %+v", r.Result)
	}
	boxPasswd := strings.TrimSpace(r.Stdout)

	// Listing and stat answer from the checkpoint.
	var list job.SessionFileList
	code, body := a.do("k-a", "GET", base, nil)
	if code != 200 || json.Unmarshal(body, &list) != nil {
		t.Fatalf("list: %d %s", code, body)
	}
	kinds := map[string]string{}
	for _, f := range list.Entries {
		kinds[f.Path] = f.Type
		if f.MTime.IsZero() || f.Mode == "" || f.Name == "" {
			t.Errorf("list entry %+v lacks its mtime, mode or name", f)
		}
	}
	if kinds["data"] != "dir" || kinds["passwd"] != "symlink" || kinds["etc"] != "symlink" || kinds["data/raw"] != "" {
		t.Fatalf("list of /work: %v", kinds)
	}
	code, body = a.do("k-a", "GET", base+"?path=data&recursive=true", nil)
	if code != 200 || !strings.Contains(string(body), `"path":"data/raw/a.csv"`) {
		t.Fatalf("list data recursively: %d %s", code, body)
	}
	if st := a.file("k-a", "GET", base+"/data/raw/a.csv?stat=true", nil); st.code != 200 || st.entry.Type != "file" || st.entry.Size != 8 ||
		st.entry.SHA256 != sha([]byte("x,y\n1,2\n")) || st.entry.Mode != "0644" || st.entry.Name != "a.csv" {
		t.Fatalf("stat: %d %s", st.code, st.body)
	}
	if h := a.file("k-a", "HEAD", base+"/data/raw/a.csv", nil); h.code != 200 || len(h.body) != 0 {
		t.Fatalf("HEAD: %d %q", h.code, h.body)
	}
	if g := a.file("k-a", "GET", base+"/data", nil); g.code != 409 || g.problem.Title != "Is a directory" {
		t.Errorf("download a directory: %d %s", g.code, g.body)
	}
	if g := a.file("k-a", "GET", base+"?path=data/raw/a.csv", nil); g.code != 409 || g.problem.Title != "Not a directory" {
		t.Errorf("list a file: %d %s", g.code, g.body)
	}
	if g := a.file("k-a", "GET", base+"/nope.txt", nil); g.code != 404 || g.problem.Title != "File not found" {
		t.Errorf("download a file not there: %d %s", g.code, g.body)
	}
	if g := a.file("k-a", "GET", base+"?limit=1", nil); g.code != 200 || !strings.Contains(string(g.body), `"next_cursor"`) {
		t.Errorf("a page of one: %d %s", g.code, g.body)
	}

	// Upload: 201 new, 200 replaced; the session owns it and sees it.
	put := a.file("k-a", "PUT", base+"/in/up.txt", []byte("uploaded"), "Idempotency-Key", "put-1")
	if put.code != 201 || put.entry.Path != "in/up.txt" || put.entry.Size != 8 || put.entry.SHA256 != sha([]byte("uploaded")) {
		t.Fatalf("upload: %d %s", put.code, put.body)
	}
	if again := a.file("k-a", "PUT", base+"/in/up.txt", []byte("uploaded"), "Idempotency-Key", "put-1"); again.code != 201 || again.entry != put.entry {
		t.Fatalf("the upload retried with its key: %d %s", again.code, again.body)
	}
	if rep := a.file("k-a", "PUT", base+"/in/up.txt", []byte("replaced")); rep.code != 200 || rep.entry.Size != 8 {
		t.Fatalf("upload over a file: %d %s", rep.code, rep.body)
	}
	wantOut(t, a.exec("k-a", s.ID, "import os\nst = os.stat('in/up.txt')\nopen('in/up.txt', 'a').write('+')\nprint(open('in/up.txt').read(), st.st_uid == os.getuid(), os.stat('in').st_uid == os.getuid())"),
		"replaced+ True True")

	// mkdir, move, remove.
	if m := a.file("k-a", "POST", base, map[string]any{"op": "mkdir", "path": "out/plots/2024"}); m.code != 201 || m.entry.Type != "dir" {
		t.Fatalf("mkdir: %d %s", m.code, m.body)
	}
	if m := a.file("k-a", "POST", base, map[string]any{"op": "mkdir", "path": "out/plots/2024"}); m.code != 200 {
		t.Fatalf("mkdir of a directory there: %d %s", m.code, m.body)
	}
	wantConflict(t, "mkdir over a file", a.file("k-a", "POST", base, map[string]any{"op": "mkdir", "path": "in/up.txt"}), "File exists", "path")
	wantConflict(t, "upload under a file", a.file("k-a", "PUT", base+"/in/up.txt/x", []byte("x")), "Not a directory", "path")
	wantConflict(t, "upload over a directory", a.file("k-a", "PUT", base+"/out", []byte("x")), "Is a directory", "path")
	if mv := a.file("k-a", "POST", base, map[string]any{"op": "move", "path": "in/up.txt", "to": "final/up.txt"}); mv.code != 200 || mv.entry.Path != "final/up.txt" {
		t.Fatalf("move: %d %s", mv.code, mv.body)
	}
	if mv := a.file("k-a", "POST", base, map[string]any{"op": "move", "path": "in/up.txt", "to": "x"}); mv.code != 404 || mv.problem.Field != "path" {
		t.Errorf("move of nothing: %d %s", mv.code, mv.body)
	}
	wantConflict(t, "move onto an entry", a.file("k-a", "POST", base, map[string]any{"op": "move", "path": "data/raw/a.csv", "to": "final/up.txt"}), "File exists", "to")
	wantConflict(t, "move a directory under itself", a.file("k-a", "POST", base, map[string]any{"op": "move", "path": "data", "to": "data/raw/d"}),
		"Cannot move a directory under itself", "to")
	if d := a.file("k-a", "DELETE", base+"/nope", nil); d.code != 404 {
		t.Errorf("remove nothing: %d %s", d.code, d.body)
	}
	wantConflict(t, "remove a directory not empty", a.file("k-a", "DELETE", base+"/data", nil), "Directory not empty", "path")
	if d := a.file("k-a", "DELETE", base+"/data?recursive=true", nil); d.code != 204 || len(d.body) != 0 {
		t.Fatalf("remove -r: %d %s", d.code, d.body)
	}
	wantOut(t, a.exec("k-a", s.ID, "import os\nprint(os.path.exists('data'), open('final/up.txt').read())"), "False replaced+")

	// Links the session made are never gone through nor written to.
	for _, c := range []struct {
		method, path string
		body         any
		field        string
	}{
		{"PUT", "/passwd", []byte("owned"), "path"},
		{"PUT", "/etc/passwd", []byte("owned"), "path"},
		{"PUT", "/etc/kiln-was-here", []byte("owned"), "path"},
		{"PUT", "/root/tmp/kiln-was-here", []byte("owned"), "path"},
		{"DELETE", "/etc/passwd", nil, "path"},
		{"DELETE", "/root/etc/passwd", nil, "path"},
		{"POST", "", map[string]any{"op": "move", "path": "etc/passwd", "to": "stolen"}, "path"},
		{"POST", "", map[string]any{"op": "move", "path": "final/up.txt", "to": "etc/kiln-was-here"}, "to"},
		{"POST", "", map[string]any{"op": "mkdir", "path": "etc/kiln-dir"}, "path"},
		{"POST", "", map[string]any{"op": "mkdir", "path": "passwd"}, "path"},
	} {
		got := a.file("k-a", c.method, base+c.path, c.body)
		if got.code != http.StatusConflict || got.problem.Type != string(job.ProblemFileConflict) || got.problem.Field != c.field ||
			!strings.Contains(got.problem.Detail, "symbolic link") {
			t.Errorf("%s %s %v through a link: %d %s; want 409 naming the link", c.method, c.path, c.body, got.code, got.body)
		}
	}
	for _, p := range []string{"/etc/kiln-was-here", "/tmp/kiln-was-here", "/etc/kiln-dir"} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the host's %s: %v; a file operation went through a link", p, err)
		}
	}
	if now, _ := os.ReadFile("/etc/passwd"); string(now) != string(hostPasswd) {
		t.Error("the host's /etc/passwd changed")
	}
	// The link itself may go; its target stays.
	if d := a.file("k-a", "DELETE", base+"/passwd", nil); d.code != 204 {
		t.Fatalf("remove the link: %d %s", d.code, d.body)
	}
	wantOut(t, a.exec("k-a", s.ID, "import hashlib, os\nprint(hashlib.sha256(open('/etc/passwd', 'rb').read()).hexdigest(), os.path.lexists('passwd'), os.path.exists('/etc/kiln-was-here'))"),
		boxPasswd+" False False")

	// Paths stay under /work; bad requests name what to fix.
	for _, c := range []struct {
		method, path string
		body         any
		code         int
		field        string
	}{
		{"PUT", base + "/a/%2e%2e/%2e%2e/x", []byte("x"), 422, "path"},
		{"DELETE", base + "/" + strings.Repeat("d/", 600) + "x", nil, 422, "path"},
		{"POST", base, map[string]any{"op": "move", "path": "final/up.txt", "to": "../x"}, 422, "to"},
		{"POST", base, map[string]any{"op": "put", "path": "x"}, 422, "op"},
		{"POST", base, map[string]any{"op": "mkdir", "path": "x", "content": "y"}, 400, "content"},
		{"GET", base + "?limit=0", nil, 400, "limit"},
	} {
		if got := a.file("k-a", c.method, c.path, c.body); got.code != c.code || got.problem.Field != c.field {
			t.Errorf("%s %s %v: %d %s; want %d naming %q", c.method, c.path, c.body, got.code, got.body, c.code, c.field)
		}
	}
	// Another tenant finds nothing.
	for _, c := range []struct{ method, path string }{{"GET", base}, {"POST", base}, {"DELETE", base + "/final/up.txt"}, {"GET", base + "/final/up.txt?stat=true"}} {
		var body any
		if c.method == "POST" {
			body = map[string]any{"op": "mkdir", "path": "x"}
		}
		if got := a.file("k-b", c.method, c.path, body); got.code != 404 {
			t.Errorf("tenant b: %s %s: %d %s", c.method, c.path, got.code, got.body)
		}
	}

	// A file operation is ordered with the calls: sent while a call runs,
	// it is done after it; the call's record shows what it did.
	if code, body := a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"code": "import time\ntime.sleep(2)\nopen('late.txt', 'w').write('the call')"}); code != 202 {
		t.Fatalf("exec without wait: %d %s", code, body)
	}
	late := a.file("k-a", "PUT", base+"/late.txt", []byte("the upload"))
	if late.code != 200 {
		t.Fatalf("an upload after a running call: %d %s (201: it ran before the call)", late.code, late.body)
	}
	if g := a.file("k-a", "GET", base+"/late.txt", nil); string(g.body) != "the upload" {
		t.Fatalf("late.txt: %q", g.body)
	}
	var sess job.Session
	_, body = a.do("k-a", "GET", "/v1/sessions/"+s.ID, nil)
	_ = json.Unmarshal(body, &sess)
	var call job.CallResult
	code, body = a.do("k-a", "GET", fmt.Sprintf("/v1/sessions/%s/calls/%d", s.ID, sess.Calls), nil)
	if code != 200 || json.Unmarshal(body, &call) != nil || call.File == nil || call.File.Op != job.FileOpPut || call.File.Entry == nil {
		t.Fatalf("the upload's call record: %d %s", code, body)
	}
}

// The Go client's file operations against a live API whose longest wait
// is shorter than the call before them: each is answered once it is done
// (a 202 asked again under the same Idempotency-Key, never done twice),
// and a refusal is ErrFileConflict, not a temporary error.
func TestSessionFilesGoClient(t *testing.T) {
	e := setup(t)
	srv, err := producer.New(context.Background(), producer.Config{Store: e.store, NATS: e.nc, Queue: testQueue,
		APIKeys: map[string]string{"k-a": "acme"}, RuntimeCacheTTL: 100 * time.Millisecond, MaxWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	hs := serveAPI(t, srv.Handler())
	t.Cleanup(srv.StopLongPolls)
	t.Cleanup(srv.Close)
	e.startWorker(t, "e2e-session-files-go", 1, withImages(map[string]string{"python": pythonImage(t)}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := client.New(hs.URL, client.WithAPIKey("k-a"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.CreateSession(ctx, job.SessionSpec{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.WithoutCancel(ctx))
	// A call that outlasts the API's longest wait, then an upload behind it.
	done := make(chan error, 1)
	go func() {
		_, err := s.Run(ctx, "import time\ntime.sleep(4)\ncount = 0")
		done <- err
	}()
	// The call is accepted (seq 1) before the upload is sent.
	watch, err := c.OpenSession(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !testkit.Poll(30*time.Second, func() bool { return watch.Refresh(ctx) == nil && watch.Calls >= 1 }) {
		t.Fatal("the call was not accepted within 30s")
	}
	info, err := s.WriteFile(ctx, "a/b.txt", []byte("behind a call"))
	if err != nil || info.Path != "a/b.txt" || info.Size != 13 {
		t.Fatalf("WriteFile behind a call: %+v %v", info, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := watch.Refresh(ctx); err != nil || watch.Calls != 2 {
		t.Fatalf("calls after the upload: %d %v; want 2 (the upload done once)", watch.Calls, err)
	}
	if _, err := s.Mkdir(ctx, "a/c"); err != nil {
		t.Fatal(err)
	}
	if m, err := s.MoveFile(ctx, "a/b.txt", "a/c/b.txt", false); err != nil || m.Path != "a/c/b.txt" {
		t.Fatalf("MoveFile: %+v %v", m, err)
	}
	list, err := s.ListFiles(ctx, "a", true)
	if err != nil || len(list) != 2 || list[0].Path != "a/c" || list[1].Path != "a/c/b.txt" {
		t.Fatalf("ListFiles: %+v %v", list, err)
	}
	if st, err := s.StatFile(ctx, "a/c/b.txt"); err != nil || st.SHA256 != sha([]byte("behind a call")) {
		t.Fatalf("StatFile: %+v %v", st, err)
	}
	err = s.RemoveFile(ctx, "a", false)
	var apiErr *client.Error
	if !errors.Is(err, client.ErrFileConflict) || !errors.As(err, &apiErr) || apiErr.Temporary() {
		t.Fatalf("remove a directory not empty: %v", err)
	}
	if err := s.RemoveFile(ctx, "a", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.StatFile(ctx, "a"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("stat after remove: %v", err)
	}
}
