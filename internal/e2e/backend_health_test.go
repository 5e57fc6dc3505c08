package e2e

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/sandbox"
)

// The worker's backend check (sandbox.Containerd.Healthy) against the real
// containerd: it answers, cheaply; once the client's connection is gone it
// fails within its timeout instead of hanging the worker's probe.
func TestContainerdHealthCheck(t *testing.T) {
	addr := testenv.Containerd(t)
	ctx := context.Background()
	rt, err := sandbox.New(ctx, sandbox.Config{Address: addr, Namespace: testenv.ContainerdNamespace(), WorkerID: "health-e2e",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := rt.Healthy(ctx); err != nil {
		t.Fatalf("containerd up: %v", err)
	}
	took := time.Since(start)
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := rt.Healthy(ctx); err == nil {
		t.Fatal("Healthy answered nil over a closed connection")
	} else if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Healthy took %v to fail; want its 2s bound", d)
	} else {
		t.Logf("healthy in %v; unreachable reported in %v: %v", took, d, err)
	}
}
