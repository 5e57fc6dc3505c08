package sandbox

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/job"
)

// setupRuntimes returns a runtime serving the named runtimes (images
// kiln.local/<name>:latest, built by `make image`), failing under
// KILN_INTEGRATION=require when one is missing.
func setupRuntimes(t testing.TB, names ...string) *Containerd {
	t.Helper()
	addr := testenv.Containerd(t)
	images, err := ImagesFor(names)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := New(t.Context(), Config{
		Address:   addr,
		Namespace: testenv.ContainerdNamespace(),
		WorkerID:  testWorkerID,
		Images:    images,
		Isolation: testIsolationOverride(images),
		Logger:    slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = rt.Close() })
	for _, n := range names {
		if _, err := rt.Image(t.Context(), n); err != nil {
			testenv.Unavailable(t, "%s sandbox image: %v (run `make image RUNTIME=%s`)", n, err, n)
		}
	}
	return rt
}

// requireFailed fails unless res failed with category and a message holding want.
func requireFailed(t testing.TB, res job.Result, status job.Status, category job.Category, want string) {
	t.Helper()
	if res.Status != status || res.Error == nil || res.Error.Category != category || !strings.Contains(res.Error.Message, want) {
		t.Fatalf("want %s/%s with message containing %q; got status %s, error %+v\nstdout: %q\nstderr: %s",
			status, category, want, res.Status, res.Error, res.Stdout, res.Stderr)
	}
}
