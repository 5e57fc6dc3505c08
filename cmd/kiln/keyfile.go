package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kilnrun/kiln/producer"
)

// tenantSettings are the names parseTenantOptions knows.
var tenantSettings = []string{"max_queued", "max_running", "submissions_per_second", "burst", "cpu_seconds_per_day",
	"cache_group", "max_event_streams", "max_event_streams_per_job", "callback_concurrency",
	"max_stored_bytes", "max_stored_objects"}

// parseTenantOptions reads the settings after NAME:KEY on a key-file line,
// space-separated NAME=VALUE pairs:
//
//	max_queued=N              jobs waiting in the queue (429 beyond)
//	max_running=N             jobs running at once across the fleet (more wait)
//	submissions_per_second=R  token-bucket rate (429 beyond); burst=N its size
//	cpu_seconds_per_day=N     CPU time per UTC day (429 once used)
//	cache_group=G             share the result cache with tenants of group G
//	max_event_streams=N       event streams open at once on one API process (default 16; 429 beyond)
//	max_event_streams_per_job=N  event streams open at once on one job (default 4; 429 beyond)
//	callback_concurrency=N    callbacks sent at once (default 4; more wait their turn)
//	max_stored_bytes=N        bytes of artifacts and long output kept in the object store over its retention (default 1 GiB)
//	max_stored_objects=N      objects, likewise (default 10000); a job over either fails as output_limit
func parseTenantOptions(fields []string) (producer.Tenant, error) {
	var t producer.Tenant
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok || v == "" {
			return t, fmt.Errorf("setting %q is not NAME=VALUE", f)
		}
		var err error
		num := func(dst *int64) {
			*dst, err = strconv.ParseInt(v, 10, 64)
			if err == nil && *dst < 0 {
				err = fmt.Errorf("negative")
			}
		}
		switch k {
		case "max_queued":
			num(&t.Quota.MaxQueued)
		case "max_running":
			num(&t.Quota.MaxRunning)
		case "submissions_per_second":
			t.Quota.SubmissionsPerSecond, err = strconv.ParseFloat(v, 64)
		case "burst":
			num(&t.Quota.Burst)
		case "cpu_seconds_per_day":
			num(&t.Quota.CPUSecondsPerDay)
		case "cache_group":
			t.CacheGroup = v
		case "recycle":
			err = errors.New("recycled sandboxes were replaced by boxes, where every job of every tenant runs in a fresh inner sandbox (README: boxes): remove the setting")
		case "max_event_streams":
			num(&t.Bounds.EventStreams)
		case "max_event_streams_per_job":
			num(&t.Bounds.EventStreamsPerJob)
		case "callback_concurrency":
			num(&t.Bounds.CallbackConcurrency)
		case "max_stored_bytes":
			num(&t.Bounds.StoredBytes)
		case "max_stored_objects":
			num(&t.Bounds.StoredObjects)
		default:
			return t, fmt.Errorf("unknown setting %q (known: %s)", k, strings.Join(tenantSettings, ", "))
		}
		if err != nil {
			return t, fmt.Errorf("setting %s=%s: %v", k, v, err)
		}
	}
	return t, t.Validate()
}
