package audit

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/kilnrun/kiln/job"
)

// appendRecord appends rec as one JSON object, the way encoding/json
// would decode it back, without reflection: the API's drain encodes every
// record it appends, one per cache hit at full rate. Seq is left out (it
// is set when read). TestAppendRecordKeepsEveryField fails when a field of
// job.AuditRecord is missing here.
func appendRecord(b []byte, rec job.AuditRecord) ([]byte, error) {
	if y := rec.Time.Year(); y < 0 || y > 9999 {
		return nil, fmt.Errorf("audit: encode %s record: year %d outside [0,9999]", rec.Kind, y)
	}
	b = append(b, `{"time":"`...)
	b = rec.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","kind":`...)
	b = appendString(b, string(rec.Kind))
	str := func(name, v string) {
		if v != "" {
			b = append(b, `,"`...)
			b = append(b, name...)
			b = append(b, `":`...)
			b = appendString(b, v)
		}
	}
	sums := func(name string, m map[string]string) {
		if len(m) == 0 {
			return
		}
		b = append(b, `,"`...)
		b = append(b, name...)
		b = append(b, `":{`...)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendString(b, m[k])
		}
		b = append(b, '}')
	}
	str("key", rec.Key)
	str("job_id", rec.JobID)
	str("session_id", rec.SessionID)
	if rec.Call != 0 {
		b = append(b, `,"call":`...)
		b = strconv.AppendInt(b, rec.Call, 10)
	}
	str("runtime", rec.Runtime)
	str("digest", rec.Digest)
	str("code_sha256", rec.CodeSHA256)
	sums("inputs", rec.Inputs)
	if rec.CacheHit {
		b = append(b, `,"cache_hit":true`...)
	}
	str("replay_of", rec.ReplayOf)
	str("budget", rec.Budget)
	str("status", string(rec.Status))
	if rec.ExitCode != nil {
		b = append(b, `,"exit_code":`...)
		b = strconv.AppendInt(b, int64(*rec.ExitCode), 10)
	}
	sums("outputs", rec.Outputs)
	str("detail", rec.Detail)
	if rec.Egress != nil {
		e, err := json.Marshal(rec.Egress)
		if err != nil {
			return nil, fmt.Errorf("audit: encode %s record's egress: %w", rec.Kind, err)
		}
		b = append(b, `,"egress":`...)
		b = append(b, e...)
	}
	if rec.Count != 0 {
		b = append(b, `,"count":`...)
		b = strconv.AppendInt(b, rec.Count, 10)
	}
	return append(b, '}'), nil
}

// appendString appends s as a JSON string: quotes, backslashes and control
// characters escaped, invalid UTF-8 as U+FFFD, as encoding/json writes it
// (without its HTML escaping, which a log read as JSON does not need).
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' { // as encoding/json: JSONP-safe
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
