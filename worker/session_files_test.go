package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// fileOp accepts a file operation of the session, as the API does, and
// waits for its result.
func (b *bundle) fileOp(t *testing.T, tenant, id string, op job.SessionFileOp) job.CallResult {
	t.Helper()
	ctx := context.Background()
	seq, _, err := b.store.EnqueueCall(ctx, tenant, id, job.SessionCall{File: &op, EventsID: job.NewID()}, "", 16, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rec, err := b.store.Session(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.nc.Publish(job.SessionWorkerPrefix+rec.Worker, []byte(id)); err != nil {
		t.Fatal(err)
	}
	r := b.callDone(t, id, seq, 10*time.Second)
	if r.File == nil {
		t.Fatalf("%s: the result has no file outcome: %+v", op.Describe(), r.Result)
	}
	return r
}

// upload stores content in the object store under tenant, as the API does
// for a PUT, and returns the put operation that names it.
func (b *bundle) upload(t *testing.T, tenant, name, content string) job.SessionFileOp {
	t.Helper()
	ctx := context.Background()
	bs, err := blob.Ensure(ctx, b.js, blob.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(content))
	ref := job.ObjectRef{Tenant: tenant, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(content))}
	if err := bs.Put(ctx, ref, bytes.NewReader([]byte(content))); err != nil {
		t.Fatal(err)
	}
	return job.SessionFileOp{Op: job.FileOpPut, Path: name, Content: &ref}
}

func wantRefused(t *testing.T, r job.CallResult, code, field string) {
	t.Helper()
	if r.File.Error == nil || r.File.Error.Code != code || r.File.Error.Field != field || r.Status != job.StatusFailed ||
		r.Error == nil || r.Error.Category != job.CategoryInvalidRequest || r.Error.Retryable {
		t.Fatalf("%s %s: %+v (error %+v); want refused %s on %s, not retryable", r.File.Op, r.File.Path, r.File.Error, r.Error, code, field)
	}
}

// File operations are calls of the session done by its worker on the box's
// files, between calls: an upload makes its parents and is seen by the
// next call and in the checkpoint (directories and mtimes included, so the
// API lists without asking the worker); mkdir, move and remove answer
// entries or name what stood in the way, never a retryable failure; a path
// through a link the session made is refused and the link's target is left
// alone.
func TestSessionFileOperations(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	rt := &testkit.Sessions{}
	rt.Exec = func(ctx context.Context, s *testkit.ScriptedSession, req sandboxapi.Request) (job.Result, sandboxapi.CallInfo, error) {
		out := ""
		switch {
		case strings.HasPrefix(req.Spec.Code, "read "):
			data, ok := s.File(strings.TrimPrefix(req.Spec.Code, "read "))
			if !ok {
				return job.Result{ID: req.ID, Status: job.StatusFailed, ExitCode: job.IntPtr(1)}, sandboxapi.CallInfo{}, nil
			}
			out = string(data)
		case req.Spec.Code == "link":
			s.Symlink("/etc", "etc") // a link out of /work, as `os.symlink('/etc', 'etc')` makes
			s.Symlink("/etc/passwd", "passwd")
		}
		return job.Result{ID: req.ID, Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: out}, sandboxapi.CallInfo{}, nil
	}
	b.start(t, rt, nil)
	id := b.openTestSession(t, "acme")

	put := b.fileOp(t, "acme", id, b.upload(t, "acme", "data/raw/a.csv", "x,y\n1,2\n"))
	if put.Status != job.StatusSucceeded || !put.File.Created || put.File.Entry == nil || put.File.Entry.Type != job.FileTypeFile ||
		put.File.Entry.Size != 8 || put.File.Entry.Mode != "0644" || put.File.Entry.SHA256 == "" || put.Seq != 1 {
		t.Fatalf("put: %+v entry %+v", put.Result, put.File.Entry)
	}
	if r := b.callDone(t, id, b.call(t, "acme", id, "read data/raw/a.csv"), 10*time.Second); r.Stdout != "x,y\n1,2\n" {
		t.Fatalf("the call after the upload read %q", r.Stdout)
	}
	again := b.fileOp(t, "acme", id, b.upload(t, "acme", "data/raw/a.csv", "x,y\n3,4\n"))
	if again.Status != job.StatusSucceeded || again.File.Created {
		t.Fatalf("a put over a file: %+v created %v", again.Result, again.File.Created)
	}
	// The checkpoint lists directories, with mtimes.
	rec, err := b.store.Session(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, f := range rec.Files {
		kinds[f.Name] = f.Info().Type
		if f.MTime.IsZero() {
			t.Errorf("checkpoint entry %s has no mtime", f.Name)
		}
	}
	if kinds["data"] != job.FileTypeDir || kinds["data/raw"] != job.FileTypeDir || kinds["data/raw/a.csv"] != job.FileTypeFile {
		t.Fatalf("checkpoint after the upload: %v", kinds)
	}

	if r := b.fileOp(t, "acme", id, job.SessionFileOp{Op: job.FileOpMkdir, Path: "out/plots"}); !r.File.Created || r.File.Entry.Type != job.FileTypeDir {
		t.Fatalf("mkdir: %+v %+v", r.Result, r.File)
	}
	if r := b.fileOp(t, "acme", id, job.SessionFileOp{Op: job.FileOpMkdir, Path: "out/plots"}); r.Status != job.StatusSucceeded || r.File.Created {
		t.Fatalf("mkdir of a directory there: %+v %+v", r.Result, r.File)
	}
	wantRefused(t, b.fileOp(t, "acme", id, job.SessionFileOp{Op: job.FileOpMkdir, Path: "data/raw/a.csv"}), job.FileErrExists, "path")
	wantRefused(t, b.fileOp(t, "acme", id, b.upload(t, "acme", "data/raw/a.csv/b", "no")), job.FileErrNotDir, "path")
	wantRefused(t, b.fileOp(t, "acme", id, job.SessionFileOp{Op: job.FileOpRemove, Path: "nope.txt"}), job.FileErrNotFound, "path")
	wantRefused(t, b.fileOp(t, "acme", id, job.SessionFileOp{Op: job.FileOpRemove, Path: "data"}), job.FileErrNotEmpty, "path")
	wantRefused(t, b.fileOp(t, "acme", id, job.SessionFileOp{Op: job.FileOpMove, Path: "nope", To: "x"}), job.FileErrNotFound, "path")
	wantRefused(t, b.fileOp(t, "acme", id, job.SessionFileOp{Op: job.FileOpMove, Path: "data", To: "data/raw/deeper"}), job.FileErrMoveIntoSelf, "to")

	mv := b.fileOp(t, "acme", id, job.SessionFileOp{Op: job.FileOpMove, Path: "data/raw/a.csv", To: "final/a.csv"})
	if mv.Status != job.StatusSucceeded || mv.File.Entry == nil || mv.File.Entry.Path != "final/a.csv" || mv.File.Entry.Size != 8 {
		t.Fatalf("move: %+v %+v", mv.Result, mv.File.Entry)
	}
	wantRefused(t, b.fileOp(t, "acme", id, job.SessionFileOp{Op: job.FileOpMove, Path: "out", To: "final"}), job.FileErrExists, "to")
	if r := b.fileOp(t, "acme", id, job.SessionFileOp{Op: job.FileOpRemove, Path: "data", Recursive: true}); r.Status != job.StatusSucceeded || r.File.Entry != nil {
		t.Fatalf("remove -r: %+v %+v", r.Result, r.File)
	}

	// Links the session made are never gone through, nor written to.
	b.callDone(t, id, b.call(t, "acme", id, "link"), 10*time.Second)
	box := rt.Opened()[0]
	for _, op := range []job.SessionFileOp{
		b.upload(t, "acme", "etc/passwd", "owned"), b.upload(t, "acme", "passwd", "owned"),
		{Op: job.FileOpRemove, Path: "etc/passwd"}, {Op: job.FileOpMkdir, Path: "etc/sub"},
		{Op: job.FileOpMove, Path: "etc/passwd", To: "stolen"}, {Op: job.FileOpMove, Path: "final/a.csv", To: "etc/a.csv"},
	} {
		field := "path"
		if op.Op == job.FileOpMove && strings.HasPrefix(op.To, "etc/") {
			field = "to"
		}
		wantRefused(t, b.fileOp(t, "acme", id, op), job.FileErrSymlink, field)
	}
	if data, _ := box.File("final/a.csv"); string(data) != "x,y\n3,4\n" {
		t.Fatalf("the file a refused move named: %q", data)
	}
	// The link itself may be removed (its target is not touched).
	if r := b.fileOp(t, "acme", id, job.SessionFileOp{Op: job.FileOpRemove, Path: "passwd"}); r.Status != job.StatusSucceeded {
		t.Fatalf("remove a link: %+v", r.Result)
	}
	// Nothing above was a code call: the interpreter saw only its own.
	if n := box.Calls(); n != 2 {
		t.Fatalf("the interpreter ran %d calls; want 2 (file operations run no code)", n)
	}
}
