package sandbox

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

func setupCaps(t *testing.T, caps job.ArtifactCaps) (*Containerd, string) {
	t.Helper()
	state := t.TempDir()
	rt, err := New(t.Context(), Config{
		Address: testenv.Containerd(t), Namespace: testenv.ContainerdNamespace(), WorkerID: testWorkerID,
		StateDir: state, ArtifactCaps: caps,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = rt.Close() })
	if _, err := rt.Image(t.Context(), "python"); err != nil {
		testenv.Unavailable(t, "python sandbox image: %v (run `make image`)", err)
	}
	return rt, state
}

// A job's files in the output dir come back with size, hash and a sniffed
// content type, from nested dirs too, in name order.
func TestArtifactsCollected(t *testing.T) {
	rt, state := setupCaps(t, job.ArtifactCaps{})
	st := &testkit.MemStore{}
	base := Request{Store: st.Put}
	ctx := t.Context()
	res, err := rt.Run(ctx, asRun(base, job.NewID(), py(`
import os
out = os.environ["KILN_OUTPUT_DIR"]
os.makedirs(out + "/sub")
open(out + "/b.txt", "w").write("hello\n")
open(out + "/sub/a.png", "wb").write(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
print(out)
`)))
	if err != nil || res.Status != job.StatusSucceeded {
		t.Fatalf("run: %v %s %s", err, res.Status, res.Stderr)
	}
	if strings.TrimSpace(res.Stdout) != job.OutputDir {
		t.Errorf("KILN_OUTPUT_DIR = %q; want %s", res.Stdout, job.OutputDir)
	}
	if len(res.Artifacts) != 2 {
		t.Fatalf("artifacts %+v; want 2", res.Artifacts)
	}
	want := []struct{ name, ctype string }{{"b.txt", "text/plain; charset=utf-8"}, {"sub/a.png", "image/png"}}
	for i, w := range want {
		a := res.Artifacts[i]
		if a.Name != w.name || a.ContentType != w.ctype {
			t.Errorf("artifact %d: %+v; want %s %s", i, a, w.name, w.ctype)
		}
		if b := st.Get(a.SHA256); int64(len(b)) != a.Size {
			t.Errorf("artifact %s: stored %d bytes; listed %d", a.Name, len(b), a.Size)
		}
	}
	settle(t, rt)
	if ents := leftoverWorkDirs(rt, filepath.Join(state, testWorkerID)); len(ents) != 0 {
		t.Errorf("work dirs left behind: %v", ents)
	}
}

// Links and special files the job plants in the output dir yield nothing of
// the host and do not block collection; the caps on count and size are
// applied and reported.
func TestArtifactsHostileOutputDir(t *testing.T) {
	rt, state := setupCaps(t, job.ArtifactCaps{MaxFiles: 20, MaxFileBytes: 1 << 20, MaxTotalBytes: 4 << 20})
	canary := filepath.Join(t.TempDir(), "canary")
	secret := "host-canary-" + job.NewID()
	if err := os.WriteFile(canary, []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	st := &testkit.MemStore{}
	base := Request{Store: st.Put}
	ctx := t.Context()
	start := time.Now()
	res, err := rt.Run(ctx, asRun(base, job.NewID(), py(fmt.Sprintf(`
import os
out = os.environ["KILN_OUTPUT_DIR"]
os.symlink(%q, out + "/canary")
os.symlink("/proc/self/environ", out + "/environ")
os.symlink("/etc/hostname", out + "/hostname")
os.symlink("/", out + "/dir-link")
os.mkfifo(out + "/fifo")
os.link("/work/main.py", out + "/hardlink")
try:
    os.link("/tmp/x", out + "/crossdev")
except OSError as e:
    print("cross-device link refused:", e.errno)
open(out + "/big", "wb").write(b"x" * ((1 << 20) + 1))
os.makedirs(out + "/many")
for i in range(10000):
    open(out + "/many/%%05d" %% i, "w").write(str(i))
print("planted")
`, canary))))
	if err != nil || res.Status != job.StatusSucceeded {
		t.Fatalf("run: %v %s %s", err, res.Status, res.Stderr)
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("run with a hostile output dir took %v", d)
	}
	for _, b := range st.Objects() {
		for _, leak := range []string{secret, "PATH=", host} {
			if leak != "" && bytes.Contains(b, []byte(leak)) {
				t.Errorf("a stored artifact holds %q: %q", leak, b)
			}
		}
	}
	reasons := map[string]string{}
	for _, s := range res.ArtifactsSkipped {
		reasons[s.Name] = s.Reason
	}
	for _, name := range []string{"canary", "environ", "hostname", "dir-link", "fifo"} {
		if reasons[name] != job.SkipNotRegular {
			t.Errorf("%s: skipped as %q; want %s", name, reasons[name], job.SkipNotRegular)
		}
	}
	if reasons["big"] != job.SkipTooLarge {
		t.Errorf("big: skipped as %q; want %s", reasons["big"], job.SkipTooLarge)
	}
	if len(res.Artifacts) != 20 {
		t.Errorf("%d artifacts kept; want the cap, 20", len(res.Artifacts))
	}
	if res.ArtifactsSkippedCount < 10000-20 || len(res.ArtifactsSkipped) != job.MaxSkippedListed {
		t.Errorf("skipped count %d, listed %d; want ≥ %d and %d", res.ArtifactsSkippedCount, len(res.ArtifactsSkipped), 10000-20, job.MaxSkippedListed)
	}
	for _, a := range res.Artifacts {
		if a.Name == "hardlink" && !bytes.Contains(st.Get(a.SHA256), []byte("planted")) {
			t.Errorf("hard link content is not the job's own main.py: %q", st.Get(a.SHA256))
		}
	}
	settle(t, rt)
	if ents := leftoverWorkDirs(rt, filepath.Join(state, testWorkerID)); len(ents) != 0 {
		t.Errorf("work dirs left behind: %v", ents)
	}
}

// leftoverWorkDirs lists what is left in a worker's work dirs: the dirs of
// sandboxes the runtime no longer owns, and, in a box it keeps, any job's
// work dir (each is removed when its job ends).
func leftoverWorkDirs(rt *Containerd, dir string) []string {
	ents, _ := os.ReadDir(dir)
	var left []string
	for _, e := range ents {
		if !rt.live.owns(e.Name()) {
			left = append(left, e.Name())
			continue
		}
		jobs, _ := os.ReadDir(filepath.Join(dir, e.Name(), "work"))
		for _, j := range jobs {
			if j.Name() == filepath.Base(job.OutputDir) {
				continue // made with the tmpfs; a box's jobs each have their own
			}
			left = append(left, filepath.Join(e.Name(), "work", j.Name()))
		}
	}
	return left
}
