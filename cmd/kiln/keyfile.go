package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/job/egressrule"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/redact"
)

// tenantSettings are the names parseTenantOptions knows.
var tenantSettings = []string{"max_queued", "max_running", "submissions_per_second", "burst", "cpu_seconds_per_day",
	"cache_group", "max_event_streams", "max_event_streams_per_job", "callback_concurrency",
	"max_stored_bytes", "max_stored_objects", "audit_records_per_day", "audit_bytes_per_day", "redact", "redact_secret", "redact_pattern", "egress", "dedicated_boxes"}

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
//	redact=off|on|strict      redaction of key-like strings in output (default on)
//	redact_secret=S           also redact the literal S (8 to 1024 bytes; repeatable); only a fingerprint leaves the API
//	redact_pattern=NAME:RE    also redact matches of the RE2 expression RE, counted as pattern:NAME (repeatable)
//	egress=RULES              hosts the tenant's jobs may ask to reach ("network": {"allow": [...]}), comma-separated:
//	                          api.example.org, *.data.gov (names under it), an optional :PORT (default 80 and 443); default none
//	dedicated_boxes=true      run the tenant's jobs only in boxes no other tenant uses (default false: a box serves
//	                          any tenant, each job in a fresh inner sandbox)
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
		case "audit_records_per_day":
			num(&t.Bounds.AuditRecordsPerDay)
		case "audit_bytes_per_day":
			num(&t.Bounds.AuditBytesPerDay)
		case "redact", "redact_secret", "redact_pattern":
			err = parseRedactOption(&t, k, v)
		case "dedicated_boxes":
			t.DedicatedBoxes, err = strconv.ParseBool(v)
		case "egress":
			if t.Egress != nil {
				err = errors.New("given twice: list every host in one egress=, comma-separated")
			} else {
				t.Egress, err = parseEgressAllowance(v)
			}
		default:
			return t, fmt.Errorf("unknown setting %q (known: %s)", k, strings.Join(tenantSettings, ", "))
		}
		if err != nil {
			return t, fmt.Errorf("setting %s=%s: %v", k, v, err)
		}
	}
	return t, t.Validate()
}

// parseEgressAllowance reads a tenant's egress allowance, at least one
// rule.
func parseEgressAllowance(v string) (egressrule.Rules, error) {
	rules, err := egressrule.ParseRules(v)
	if err != nil {
		return nil, err
	}
	if len(rules) == 0 {
		return nil, errors.New("no host given: name at least one, such as egress=api.example.org,*.data.gov:443")
	}
	return rules, nil
}

// parseRedactOption adds one redaction setting to t's policy.
func parseRedactOption(t *producer.Tenant, k, v string) error {
	if t.Redact == nil {
		t.Redact = &job.RedactPolicy{}
	}
	p := t.Redact
	switch k {
	case "redact":
		p.Mode = job.RedactMode(v)
		if !p.Mode.Valid() {
			return errors.New("the mode is off, on or strict")
		}
	case "redact_secret":
		if len(p.Secrets) == redact.MaxSecrets {
			return fmt.Errorf("at most %d secrets per tenant", redact.MaxSecrets)
		}
		fp, err := redact.Fingerprint(v)
		if err != nil {
			return err
		}
		p.Secrets = append(p.Secrets, fp)
	case "redact_pattern":
		name, expr, ok := strings.Cut(v, ":")
		if !ok || name == "" || expr == "" {
			return errors.New("the value is NAME:REGEXP")
		}
		if len(p.Patterns) == redact.MaxPatterns {
			return fmt.Errorf("at most %d patterns per tenant", redact.MaxPatterns)
		}
		if _, err := redact.CompilePattern(expr); err != nil {
			return err
		}
		p.Patterns = append(p.Patterns, job.RedactPattern{Name: name, Regexp: expr})
	}
	return nil
}
