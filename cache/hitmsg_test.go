package cache

import (
	"bytes"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// A hit's light message made from its entry's template is byte for byte
// the one encoding/json writes, whatever the message holds; a message the
// template was not made for is not made from it.
func TestHitMsgTemplateEncodesAsJSON(t *testing.T) {
	t.Parallel()
	base := job.Message{ID: job.NewID(), Spec: job.Spec{Runtime: "python", Code: "print(1)", Stdin: "x", Limits: job.DefaultLimits},
		Key: job.CodeSHA256("k"), CreatedAt: time.Date(2026, 11, 27, 3, 4, 5, 600, time.UTC),
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Tenant: "alice", CacheScope: "tenant:alice"}
	odd := base
	odd.Tenant, odd.CacheScope = `a "quoted" \ tenant <&> é,"created_at":"x"`, `group:"g"`
	odd.Spec.Runtime = `py"thon`
	bare := base
	bare.TraceID, bare.Tenant, bare.CacheScope = "", "", ""
	bare.Spec.Limits = job.Limits{MemoryMB: 128}
	for name, msg := range map[string]job.Message{"plain": base, "escaped": odd, "bare": bare} {
		tmpl := newHitMsgTemplate(msg)
		if tmpl == nil {
			t.Fatalf("%s: no template", name)
		}
		for _, trace := range []string{"", "0af7651916cd43dd8448eb211c80319c"} {
			for _, at := range []time.Time{msg.CreatedAt, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
				time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.FixedZone("x", 5*3600+1800))} {
				m := msg
				m.ID, m.TraceID, m.CreatedAt = job.NewID(), trace, at
				if !tmpl.fits(&m) {
					t.Fatalf("%s: the template does not fit a hit of its entry", name)
				}
				want, err := lightMessage(m)
				if err != nil {
					t.Fatal(err)
				}
				if got := tmpl.append(nil, &m); !bytes.Equal(got, want) {
					t.Fatalf("%s:\n got %s\nwant %s", name, got, want)
				}
			}
		}
	}

	tmpl := newHitMsgTemplate(base)
	for name, change := range map[string]func(*job.Message){
		"tenant":     func(m *job.Message) { m.Tenant = "bob" },
		"scope":      func(m *job.Message) { m.CacheScope = "group:g" },
		"key":        func(m *job.Message) { m.Key = job.CodeSHA256("other") },
		"runtime":    func(m *job.Message) { m.Spec.Runtime = "node" },
		"limits":     func(m *job.Message) { m.Spec.Limits.Pids++ },
		"quota":      func(m *job.Message) { m.Quota = &job.TenantQuota{CPUSecondsPerDay: 1} },
		"redact":     func(m *job.Message) { m.Redact = &job.RedactPolicy{} },
		"replay":     func(m *job.Message) { m.ReplayOf = job.NewID() },
		"spec ref":   func(m *job.Message) { m.SpecRef = &job.ObjectRef{} },
		"id escaped": func(m *job.Message) { m.ID = `a"b` },
		"trace":      func(m *job.Message) { m.TraceID = "a\nb" },
		"year":       func(m *job.Message) { m.CreatedAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) },
	} {
		m := base
		change(&m)
		if tmpl.fits(&m) {
			t.Errorf("%s changed: the template still fits", name)
		}
	}
}
