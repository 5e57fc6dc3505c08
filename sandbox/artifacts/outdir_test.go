package artifacts

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// setupWork returns a work dir with an empty output dir, and that dir.
func setupWork(t *testing.T) (work, out string) {
	t.Helper()
	work = t.TempDir()
	out = filepath.Join(work, filepath.Base(job.OutputDir))
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	return work, out
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func skipped(res job.Result) map[string]string {
	m := map[string]string{}
	for _, s := range res.ArtifactsSkipped {
		m[s.Name] = s.Reason
	}
	return m
}

// Files come back in name order, from nested dirs too, with size, hash and
// a sniffed content type, each stored once.
func TestCollectOutputDir(t *testing.T) {
	t.Parallel()
	work, out := setupWork(t)
	writeFile(t, filepath.Join(out, "b.txt"), []byte("hello\n"))
	writeFile(t, filepath.Join(out, "sub", "a.png"), append([]byte("\x89PNG\r\n\x1a\n"), make([]byte, 100)...))
	st := &testkit.MemStore{}
	var res job.Result
	if err := CollectOutputDir(t.Context(), work, job.DefaultArtifactCaps, st.Put, &res); err != nil {
		t.Fatal(err)
	}
	want := []struct{ name, ctype string }{{"b.txt", "text/plain; charset=utf-8"}, {"sub/a.png", "image/png"}}
	if len(res.Artifacts) != len(want) || res.ArtifactsSkippedCount != 0 {
		t.Fatalf("artifacts %+v, skipped %+v", res.Artifacts, res.ArtifactsSkipped)
	}
	for i, w := range want {
		a := res.Artifacts[i]
		if a.Name != w.name || a.ContentType != w.ctype || int64(len(st.Get(a.SHA256))) != a.Size {
			t.Errorf("artifact %d: %+v (stored %d bytes); want %s %s", i, a, len(st.Get(a.SHA256)), w.name, w.ctype)
		}
	}
}

// Links and special files yield nothing of what they point at and do not
// block the walk; a hard link (to a file of the same work dir) is a file.
// An output dir that is itself a link is not followed.
func TestCollectRefusesLinks(t *testing.T) {
	t.Parallel()
	work, out := setupWork(t)
	secret := "host-canary-" + job.NewID()
	canary := filepath.Join(t.TempDir(), "canary")
	writeFile(t, canary, []byte(secret))
	writeFile(t, filepath.Join(work, "main.py"), []byte("print('planted')"))
	for name, target := range map[string]string{"canary": canary, "dir-link": "/", "rel": "../main.py"} {
		if err := os.Symlink(target, filepath.Join(out, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(out, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(work, "main.py"), filepath.Join(out, "hardlink")); err != nil {
		t.Fatal(err)
	}
	st := &testkit.MemStore{}
	var res job.Result
	if err := CollectOutputDir(t.Context(), work, job.DefaultArtifactCaps, st.Put, &res); err != nil {
		t.Fatal(err)
	}
	reasons := skipped(res)
	for _, name := range []string{"canary", "dir-link", "rel", "fifo"} {
		if reasons[name] != job.SkipNotRegular {
			t.Errorf("%s: skipped as %q; want %s", name, reasons[name], job.SkipNotRegular)
		}
	}
	if len(res.Artifacts) != 1 || res.Artifacts[0].Name != "hardlink" || !bytes.Contains(st.Get(res.Artifacts[0].SHA256), []byte("planted")) {
		t.Errorf("artifacts %+v; want the hard link to main.py only", res.Artifacts)
	}
	for _, b := range st.Objects() {
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("a stored artifact holds the canary")
		}
	}

	// The output dir itself replaced by a link to a dir outside.
	work2 := t.TempDir()
	if err := os.Symlink(filepath.Dir(canary), filepath.Join(work2, filepath.Base(job.OutputDir))); err != nil {
		t.Fatal(err)
	}
	res = job.Result{}
	if err := CollectOutputDir(t.Context(), work2, job.DefaultArtifactCaps, st.Put, &res); err != nil || len(res.Artifacts) != 0 || res.ArtifactsSkippedCount != 0 {
		t.Errorf("output dir as a link: %v, %+v", err, res)
	}
}

// The caps on count, file size and total are applied in name order and
// reported; a file the store refuses is skipped, not fatal.
func TestCollectCaps(t *testing.T) {
	t.Parallel()
	work, out := setupWork(t)
	for name, size := range map[string]int{"a": 5, "b": 11, "c": 5, "d": 5, "e": 1, "f": 1, "g": 0} {
		writeFile(t, filepath.Join(out, name), bytes.Repeat([]byte(name), size))
	}
	st := &testkit.MemStore{}
	var res job.Result
	caps := job.ArtifactCaps{MaxFiles: 3, MaxFileBytes: 10, MaxTotalBytes: 12}
	if err := CollectOutputDir(t.Context(), work, caps, st.Put, &res); err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, a := range res.Artifacts {
		kept = append(kept, a.Name)
	}
	if strings.Join(kept, ",") != "a,c,e" {
		t.Errorf("kept %v; want a,c,e", kept)
	}
	want := map[string]string{"b": job.SkipTooLarge, "d": job.SkipTotal, "f": job.SkipCount, "g": job.SkipCount}
	if got := skipped(res); len(got) != len(want) || res.ArtifactsSkippedCount != len(want) {
		t.Errorf("skipped %v (count %d); want %v", got, res.ArtifactsSkippedCount, want)
	} else {
		for name, reason := range want {
			if got[name] != reason {
				t.Errorf("%s: skipped as %q; want %s", name, got[name], reason)
			}
		}
	}

	refuse := func(context.Context, job.ObjectRef, io.Reader) error { return errors.New("store down") }
	res = job.Result{}
	if err := CollectOutputDir(t.Context(), work, caps, refuse, &res); err != nil || len(res.Artifacts) != 0 || skipped(res)["a"] != job.SkipError {
		t.Errorf("store refusing: %v, %+v", err, res)
	}
}

// A tree deeper than the walk's bound is cut there and reported; a
// cancelled walk ends with ctx's error.
func TestCollectDepthAndCancel(t *testing.T) {
	t.Parallel()
	work, out := setupWork(t)
	deep := out
	for range maxOutputDepth + 4 {
		deep = filepath.Join(deep, "d")
	}
	writeFile(t, filepath.Join(deep, "bottom"), []byte("x"))
	writeFile(t, filepath.Join(out, "d", "top"), []byte("y"))
	st := &testkit.MemStore{}
	var res job.Result
	if err := CollectOutputDir(t.Context(), work, job.DefaultArtifactCaps, st.Put, &res); err != nil {
		t.Fatal(err)
	}
	cut := strings.Repeat("d/", maxOutputDepth)
	if len(res.Artifacts) != 1 || res.Artifacts[0].Name != "d/top" || skipped(res)[cut] != job.SkipName {
		t.Errorf("artifacts %+v, skipped %+v; want d/top kept and %s cut", res.Artifacts, res.ArtifactsSkipped, cut)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := CollectOutputDir(ctx, work, job.DefaultArtifactCaps, st.Put, &job.Result{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled walk: %v", err)
	}
}
