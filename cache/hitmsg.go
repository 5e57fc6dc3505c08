package cache

import (
	"bytes"
	"time"

	"github.com/kilnrun/kiln/job"
)

// A cache hit's record holds its light message (lightMessage: the job's
// runtime, limits, key, time, trace id, tenant and cache scope). For hits
// of a known entry everything in it but the id, the time and the trace id
// is the same from hit to hit, so its JSON is made once per entry and
// tenant, as encoding/json writes it, and each hit fills in its own three
// (hitmsg_test.go compares the two byte for byte). A message the template
// does not fit is encoded as any other.

// hitMsgTemplate is the light message of hits of one entry by one tenant,
// cut where the id and the time go: head + id + mid + created_at + tail,
// with `,"trace_id":"…"` after the time's closing quote when there is one.
type hitMsgTemplate struct {
	// what the template was made for: the fields it holds
	runtime, key, tenant, scope string
	limits                      job.Limits

	mid, tail []byte
}

// hitMsgTemplateTime is the placeholder time the template is made with.
var hitMsgTemplateTime = time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)

const hitMsgTemplateID = "00000000-0000-0000-0000-000000000000"

// fits reports whether msg's light message is the template's with msg's
// id, time and trace id filled in.
func (t *hitMsgTemplate) fits(msg *job.Message) bool {
	return t.runtime == msg.Spec.Runtime && t.limits == msg.Spec.Limits && t.key == msg.Key &&
		t.tenant == msg.Tenant && t.scope == msg.CacheScope &&
		msg.Quota == nil && msg.Redact == nil && msg.ReplayOf == "" && msg.SpecRef == nil && len(msg.Spec.Metadata) == 0 &&
		job.VerbatimInJSON(msg.ID) && job.VerbatimInJSON(msg.TraceID) && msg.CreatedAt.Year() >= 0 && msg.CreatedAt.Year() <= 9999
}

// newHitMsgTemplate returns the template of msg's light message, or nil
// when its encoding does not have the expected shape.
func newHitMsgTemplate(msg job.Message) *hitMsgTemplate {
	t := &hitMsgTemplate{runtime: msg.Spec.Runtime, limits: msg.Spec.Limits, key: msg.Key,
		tenant: msg.Tenant, scope: msg.CacheScope}
	probe := job.Message{ID: hitMsgTemplateID, Spec: msg.Spec, Key: msg.Key, CreatedAt: hitMsgTemplateTime,
		Tenant: msg.Tenant, CacheScope: msg.CacheScope}
	b, err := lightMessage(probe)
	if err != nil {
		return nil
	}
	head := []byte(`{"id":"` + hitMsgTemplateID + `"`)
	at, _ := hitMsgTemplateTime.MarshalJSON()
	stamp := append([]byte(`,"created_at":`), at...)
	if !bytes.HasPrefix(b, head) {
		return nil
	}
	// A string value holds no bare quote, so the time's field is found
	// where the encoder wrote it, not inside a value.
	i := bytes.Index(b, stamp)
	if i < 0 || bytes.Contains(b[i+len(stamp):], stamp) {
		return nil
	}
	t.mid = bytes.Clone(b[len(head) : i+len(`,"created_at":"`)])
	t.tail = bytes.Clone(b[i+len(stamp):])
	return t
}

// append appends msg's light message (fits(msg) must hold) to buf.
func (t *hitMsgTemplate) append(buf []byte, msg *job.Message) []byte {
	buf = append(buf, `{"id":"`...)
	buf = append(buf, msg.ID...)
	buf = append(buf, '"')
	buf = append(buf, t.mid...)
	buf = msg.CreatedAt.AppendFormat(buf, time.RFC3339Nano)
	buf = append(buf, '"')
	if msg.TraceID != "" {
		buf = append(buf, `,"trace_id":"`...)
		buf = append(buf, msg.TraceID...)
		buf = append(buf, '"')
	}
	return append(buf, t.tail...)
}
