package producer

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// The cache-hit path for an entry the API has read before (knownHit): one
// Redis round trip, which checks that the entry is still the one in Redis
// and records the hit, and an answer from the entry's template.
//
// The answer to a cache hit is the cached Result under the hit's id, trace
// id and time (cache.HitOf), with its links. Everything else in it is the
// entry's, so for an entry the API knows (cache.KnownResult) the answer's
// JSON is made once, as encoding/json writes it, and each hit of the entry
// fills in its own id, times, trace id and links. The answer is byte for
// byte what writeJSON would send (cachehit_test.go compares them); an
// entry whose encoding does not have the expected shape gets no template,
// and its hits are encoded as any answer.

// hitTemplate is the part of a hit's answer that is the entry's: the JSON
// between `{"id":"<id>",` and `"cache_hit":true,`.
type hitTemplate struct{ middle []byte }

// hitTemplateTime is the placeholder time the template is made with.
var hitTemplateTime = time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)

// newHitTemplate returns res's template, or nil when its answer does not
// have the shape render writes.
func newHitTemplate(res job.Result) *hitTemplate {
	v := &resultView{Result: cache.HitOf(res, "", "", hitTemplateTime)}
	b, err := marshal(v)
	if err != nil {
		return nil
	}
	at, _ := json.Marshal(hitTemplateTime)
	prefix := []byte(`{"id":"",`)
	suffix := []byte(`"cache_hit":true,"created_at":` + string(at) + `,"finished_at":` + string(at) + "}\n")
	if !bytes.HasPrefix(b, prefix) || !bytes.HasSuffix(b, suffix) || len(b) < len(prefix)+len(suffix) {
		return nil
	}
	return &hitTemplate{middle: bytes.Clone(b[len(prefix) : len(b)-len(suffix)])}
}

// render appends the answer to a hit (id, traceID, at) to buf; ok is false,
// and nothing is appended, when id or traceID would need escaping in JSON.
func (t *hitTemplate) render(buf []byte, id, traceID string, at time.Time) ([]byte, bool) {
	if !job.VerbatimInJSON(id) || !job.VerbatimInJSON(traceID) || at.Year() < 0 || at.Year() > 9999 {
		return buf, false
	}
	buf = append(buf, `{"id":"`...)
	buf = append(buf, id...)
	buf = append(buf, `",`...)
	buf = append(buf, t.middle...)
	buf = append(buf, `"cache_hit":true,"created_at":"`...)
	buf = at.AppendFormat(buf, time.RFC3339Nano)
	buf = append(buf, `","finished_at":"`...)
	buf = at.AppendFormat(buf, time.RFC3339Nano)
	buf = append(buf, '"')
	if traceID != "" {
		buf = append(buf, `,"trace_id":"`...)
		buf = append(buf, traceID...)
		buf = append(buf, '"')
	}
	buf = append(buf, `,"links":{"self":"/v1/jobs/`...)
	buf = append(buf, id...)
	buf = append(buf, `","wait":"/v1/jobs/`...)
	buf = append(buf, id...)
	buf = append(buf, "?wait=30s\"}}\n"...)
	return buf, true
}

// maxHitTemplates bounds the templates kept; one more starts afresh.
const maxHitTemplates = 4096

// hitTemplates holds the templates of known entries. An entry's
// cache.KnownResult never changes, so its pointer names its template.
type hitTemplates struct {
	mu sync.RWMutex
	m  map[*cache.KnownResult]*hitTemplate
}

// of returns known's template, making it on first use (nil when it has none).
func (h *hitTemplates) of(known *cache.KnownResult) *hitTemplate {
	h.mu.RLock()
	t, ok := h.m[known]
	h.mu.RUnlock()
	if ok {
		return t
	}
	t = newHitTemplate(known.Result)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil || len(h.m) >= maxHitTemplates {
		h.m = map[*cache.KnownResult]*hitTemplate{}
	}
	h.m[known] = t
	return t
}

// knownHit answers c from the result-cache entry of its key this process
// read before, when that entry is fresh enough, has no artifacts or spilled
// output to check, and is still the entry in Redis: the hit is checked and
// recorded in one round trip (cache.Store.CreateHitOfKnown, or
// CreateAliasOfKnown for an id an Idempotency-Key names). Otherwise, or
// when Redis fails, ok is false and the caller reads the entry as usual
// (lookupResult), which also reports the failure; c then has a new id if
// the check spent its own.
func (sub *submissions) knownHit(ctx context.Context, span trace.Span, c *candidate, maxAge time.Duration) (out answer, ok bool) {
	known, ok := sub.store.KnownResult(c.key)
	if !ok {
		return answer{}, false
	}
	res := &known.Result
	if res.FinishedAt == nil || time.Since(*res.FinishedAt) > maxAge || len(res.Artifacts) > 0 || res.Spilled() {
		return answer{}, false
	}
	ctx, lookup := sub.tracer.Start(ctx, ktrace.SpanCacheLookup, trace.WithAttributes(ktrace.CacheKeyKey.String(c.key)))
	defer lookup.End()
	view := cacheHitView(*res, c.id, c.traceID, sub.cfg.Now().UTC(), c.spec.Metadata)
	msg := job.Message{ID: c.id, Spec: c.spec, Key: c.key, CreatedAt: *view.CreatedAt, TraceID: c.traceID,
		Tenant: c.tenant, CacheScope: c.scope}
	var created bool
	var err error
	if c.claimed {
		created, err = sub.store.CreateAliasOfKnown(ctx, known, msg)
	} else {
		created, err = sub.store.CreateHitOfKnown(ctx, known, msg)
	}
	if err != nil || !created {
		lookup.SetAttributes(attribute.Bool("kiln.cache.known_changed", true))
		if !c.claimed {
			c.id = job.NewID()
			span.SetAttributes(ktrace.JobIDKey.String(c.id))
		}
		return answer{}, false
	}
	lookup.SetAttributes(ktrace.CacheHitKey.Bool(true))
	span.SetAttributes(ktrace.CacheHitKey.Bool(true))
	sub.countCacheHit(ctx, msg)
	view.Links = jobLinks(msg.ID)
	if len(view.Metadata) == 0 {
		// The template holds no metadata: a labelled hit is encoded as any answer.
		view.tmpl = sub.hitTemplates.of(known)
	}
	return answer{id: msg.ID, done: true, body: view}, true
}

// countCacheHit counts a submission answered from the result cache.
func (sub *submissions) countCacheHit(ctx context.Context, msg job.Message) {
	sub.metrics.CacheHit(ctx, msg.Spec.Runtime)
	sub.tmetrics.submission(ctx, msg.Tenant, "cache_hit")
}
