package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/job/egressrule"
	"github.com/kilnrun/kiln/producer"
)

func TestKeyFileTenantSettings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "keys")
	content := `# tenants
alice:k-alice-1 max_queued=100 max_running=4 submissions_per_second=2.5 burst=10 cpu_seconds_per_day=3600 cache_group=team max_event_streams=3 max_event_streams_per_job=2 callback_concurrency=2 max_stored_bytes=1048576 max_stored_objects=50 dedicated_boxes=true
alice:k-alice-2 max_queued=100 max_running=4 submissions_per_second=2.5 burst=10 cpu_seconds_per_day=3600 cache_group=team max_event_streams=3 max_event_streams_per_job=2 callback_concurrency=2 max_stored_bytes=1048576 max_stored_objects=50 dedicated_boxes=true
bob:k-bob
k-bare
`
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, tenants, err := loadAPIKeys(file, "")
	if err != nil {
		t.Fatal(err)
	}
	if keys["k-alice-1"] != "alice" || keys["k-alice-2"] != "alice" || keys["k-bob"] != "bob" || len(keys) != 4 {
		t.Fatalf("keys %v", keys)
	}
	want := producer.Tenant{CacheGroup: "team", DedicatedBoxes: true, Quota: producer.Quota{MaxQueued: 100, MaxRunning: 4, SubmissionsPerSecond: 2.5, Burst: 10, CPUSecondsPerDay: 3600},
		Bounds: producer.Bounds{EventStreams: 3, EventStreamsPerJob: 2, CallbackConcurrency: 2, StoredBytes: 1 << 20, StoredObjects: 50}}
	if !reflect.DeepEqual(tenants["alice"], want) || !reflect.DeepEqual(tenants["bob"], producer.Tenant{}) {
		t.Fatalf("tenants %+v", tenants)
	}
	for _, bad := range []string{
		"alice:k1 max_queued=-1",
		"alice:k1 max_queud=5",
		"alice:k1 max_queued",
		"alice:k1 max_event_streams=-2",
		"alice:k1 dedicated_boxes=maybe",
		"alice:k1 max_running=4\nalice:k2 max_running=5",
		"alice:k1 max_running=4\nalice:k2",
	} {
		if err := os.WriteFile(file, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := loadAPIKeys(file, ""); err == nil || !strings.Contains(err.Error(), "alice") {
			t.Fatalf("%q: err %v, want one naming the tenant", bad, err)
		}
	}
}

func TestKeyFileEgressAllowance(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "keys")
	content := `alice:k-alice-1 egress=API.example.org,*.data.gov:443
alice:k-alice-2 egress=API.example.org,*.data.gov:443
bob:k-bob max_queued=3
`
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	_, tenants, err := loadAPIKeys(file, "")
	if err != nil {
		t.Fatal(err)
	}
	want := egressrule.Rules{{Host: "api.example.org"}, {Host: "*.data.gov", Port: 443}}
	if got := tenants["alice"].Egress; !reflect.DeepEqual(got, want) {
		t.Fatalf("alice's allowance %v, want %v", got, want)
	}
	if got := tenants["bob"].Egress; got != nil {
		t.Fatalf("bob's allowance %v, want none (the default)", got)
	}

	for _, tc := range []struct{ content, want string }{
		{"alice:k1\nbob:k2 egress=10.0.0.1", "name a host, not an address"},
		{"bob:k2 egress=api.example.org:99999", "port"},
		{"bob:k2 egress=*", "DNS name"},
		{"bob:k2 egress=a.example.org egress=b.example.org", "given twice"},
		{"bob:k2 egress=,", "no host given"},
		{"bob:k1 egress=a.example.org\nbob:k2 egress=b.example.org", "other settings on an earlier line"},
	} {
		content := strings.ReplaceAll(tc.content, "\\n", "\n")
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err := loadAPIKeys(file, "")
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "bob") || !strings.Contains(err.Error(), "line") {
			t.Errorf("%q: err %v, want one naming the line, the tenant and %q", tc.content, err, tc.want)
		}
	}
}

func TestDevEgressAllowance(t *testing.T) {
	t.Parallel()
	tenants := map[string]producer.Tenant{}
	if err := devEgress("api.example.org,*.data.gov:443", nil, tenants); err != nil {
		t.Fatal(err)
	}
	want := egressrule.Rules{{Host: "api.example.org"}, {Host: "*.data.gov", Port: 443}}
	if got := tenants[job.DefaultTenant].Egress; !reflect.DeepEqual(got, want) {
		t.Fatalf("the dev tenant's allowance %v, want %v", got, want)
	}
	if err := devEgress("", nil, map[string]producer.Tenant{}); err != nil {
		t.Fatalf("no --egress-allow: %v", err)
	}
	if err := devEgress("api.example.org", map[string]string{"k": "alice"}, map[string]producer.Tenant{}); err == nil || !strings.Contains(err.Error(), "egress= on their lines") {
		t.Fatalf("--egress-allow with API keys: err %v, want one pointing at the key file", err)
	}
	if err := devEgress("127.0.0.1", nil, map[string]producer.Tenant{}); err == nil || !strings.Contains(err.Error(), "--egress-allow") {
		t.Fatalf("--egress-allow 127.0.0.1: err %v, want one naming the flag", err)
	}
}
