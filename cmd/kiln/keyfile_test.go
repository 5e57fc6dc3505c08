package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/producer"
)

func TestKeyFileTenantSettings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "keys")
	content := `# tenants
alice:k-alice-1 max_queued=100 max_running=4 submissions_per_second=2.5 burst=10 cpu_seconds_per_day=3600 cache_group=team max_event_streams=3 max_event_streams_per_job=2 callback_concurrency=2 max_stored_bytes=1048576 max_stored_objects=50
alice:k-alice-2 max_queued=100 max_running=4 submissions_per_second=2.5 burst=10 cpu_seconds_per_day=3600 cache_group=team max_event_streams=3 max_event_streams_per_job=2 callback_concurrency=2 max_stored_bytes=1048576 max_stored_objects=50
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
	want := producer.Tenant{CacheGroup: "team", Quota: producer.Quota{MaxQueued: 100, MaxRunning: 4, SubmissionsPerSecond: 2.5, Burst: 10, CPUSecondsPerDay: 3600},
		Bounds: producer.Bounds{EventStreams: 3, EventStreamsPerJob: 2, CallbackConcurrency: 2, StoredBytes: 1 << 20, StoredObjects: 50}}
	if tenants["alice"] != want || tenants["bob"] != (producer.Tenant{}) {
		t.Fatalf("tenants %+v", tenants)
	}
	for _, bad := range []string{
		"alice:k1 max_queued=-1",
		"alice:k1 max_queud=5",
		"alice:k1 max_queued",
		"alice:k1 max_event_streams=-2",
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
