package producer

import (
	"testing"

	"github.com/kilnrun/kiln/job"
)

func TestEffectivePolicyIsTheStricterOfServerAndRuntime(t *testing.T) {
	t.Parallel()
	server := job.DefaultPolicy()
	rt := job.DefaultPolicy()
	rt.Max.MemoryMB = 128 // below the server default of 256
	rt.Max.Pids = 4096    // above the server max of 1024
	got := effectivePolicy(server, rt)
	if got.Max.MemoryMB != 128 || got.Default.MemoryMB != 128 {
		t.Errorf("memory: default %d max %d, want 128 and 128", got.Default.MemoryMB, got.Max.MemoryMB)
	}
	if got.Max.Pids != server.Max.Pids || got.Default.Pids != server.Default.Pids {
		t.Errorf("pids: default %d max %d, want the server's", got.Default.Pids, got.Max.Pids)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("effective policy invalid: %v", err)
	}
	if effectivePolicy(server, job.Policy{}) != server {
		t.Error("a runtime without a policy did not get the server's")
	}
	if server.Max.MemoryMB != job.MaxLimits.MemoryMB {
		t.Error("effectivePolicy changed its argument")
	}
}

func TestRuntimeDefaultsApplyWithinTheMaximum(t *testing.T) {
	t.Parallel()
	p := job.DefaultPolicy()
	p.Max.MemoryMB = 512
	got := withRuntimeDefaults(p, job.Limits{MemoryMB: 1024, TimeoutMS: 20_000})
	if got.Default.MemoryMB != 512 || got.Default.TimeoutMS != 20_000 || got.Default.Pids != p.Default.Pids {
		t.Fatalf("defaults %+v; want memory 512 (the max), timeout 20000, pids the server's", got.Default)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
}
