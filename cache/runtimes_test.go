package cache

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

func TestRuntimeRegistry(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()

	if got, err := s.Runtimes(ctx); err != nil || len(got) != 0 {
		t.Fatalf("empty registry = %v, %v", got, err)
	}
	python := job.RuntimeInfo{Name: "python", Image: "kiln/python:3.13", Digest: "sha256:aaa", Limits: job.DefaultPolicy()}
	node := job.RuntimeInfo{Name: "node", Image: "kiln/node:22", Digest: "sha256:bbb", Limits: job.DefaultPolicy()}
	bash := job.RuntimeInfo{Name: "bash", Image: "kiln/bash:5", Digest: "sha256:ccc", Limits: job.DefaultPolicy()}
	for _, r := range []struct {
		info job.RuntimeInfo
		ttl  time.Duration
	}{{python, time.Hour}, {node, time.Minute}, {bash, time.Hour}} {
		if err := s.RegisterRuntime(ctx, r.info, r.ttl); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Runtimes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []job.RuntimeInfo{bash, node, python}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Runtimes = %+v\nwant (sorted by name) %+v", got, want)
	}

	// node's worker stops refreshing: once its TTL has passed, it is gone.
	if err := s.rdb.ZIncrBy(ctx, s.keys.runtimeExpiry(), -float64((2 * time.Minute).Milliseconds()), "node").Err(); err != nil {
		t.Fatal(err)
	}
	if got, err = s.Runtimes(ctx); err != nil || len(got) != 2 {
		t.Fatalf("expired runtime still listed: %+v, %v", got, err)
	}
	if got[0].Name != "bash" || got[1].Name != "python" {
		t.Fatalf("after expiry: %+v", got)
	}

	// A new image digest replaces the old entry; registering prunes the expired one.
	python.Digest = "sha256:ddd"
	if err := s.RegisterRuntime(ctx, python, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Runtimes(ctx); len(got) != 2 || got[1].Digest != "sha256:ddd" {
		t.Fatalf("after refresh: %+v", got)
	}
	if n := s.rdb.HLen(ctx, s.keys.runtimes()).Val(); n != 2 {
		t.Fatalf("registry holds %d entries, want the expired one pruned", n)
	}

	if err := s.RegisterRuntime(ctx, job.RuntimeInfo{}, time.Hour); err == nil {
		t.Fatal("registered a runtime without a name")
	}
	if err := s.RegisterRuntime(ctx, python, 0); err == nil {
		t.Fatal("registered a runtime with no TTL")
	}
}

// A registration is seen until the store loses its data, which a worker
// must notice to register again.
func TestRuntimeRegistered(t *testing.T) {
	t.Parallel()
	s, r := setup(t, Config{})
	ctx := context.Background()
	if ok, err := s.RuntimeRegistered(ctx, "python"); err != nil || ok {
		t.Fatalf("before registering: %v, %v", ok, err)
	}
	if err := s.RegisterRuntime(ctx, job.RuntimeInfo{Name: "python", Image: "kiln/python"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.RuntimeRegistered(ctx, "python"); err != nil || !ok {
		t.Fatalf("after registering: %v, %v", ok, err)
	}
	r.RestartEmpty()
	var ok bool
	var err error
	if !testkit.Poll(10*time.Second, func() bool {
		ok, err = s.RuntimeRegistered(ctx, "python")
		return err == nil && !ok
	}) {
		t.Fatalf("after Redis restarted empty: %v, %v", ok, err)
	}
}
