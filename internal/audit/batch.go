package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/job"
)

// An audit message's body is one record as JSON (Msg, Append: no
// FormatHeader), or several records of one tenant and kind as JSON lines
// (BatchMsgs: FormatHeader FormatLines). Read reads both.
const (
	// FormatHeader names the format of a message's body; absent, the body
	// is one record.
	FormatHeader = "Kiln-Audit-Format"
	// FormatLines is a body of records as JSON lines, in the order they
	// were made.
	FormatLines = "jsonl"
)

const (
	// SeqStride numbers records: a record's Seq is its message's stream
	// sequence × SeqStride + its index in the message, so every record has
	// its own Seq, in the log's order, whatever its message's format.
	SeqStride = 1000
	// MaxBatch is the most records one message holds (< SeqStride).
	MaxBatch = 512
	// maxBatchBytes bounds a message's body, well under NATS's default
	// maximum payload (1 MiB); a record larger than it goes alone.
	maxBatchBytes = 256 << 10
)

// BatchMsgs are the messages that append recs, all of kind, to tenant's
// log: as few as MaxBatch and the size bound allow, each holding records
// in recs' order. They carry no message id: a record that must be kept
// once however often it is appended (a redelivered job's result) goes
// alone through Append.
func BatchMsgs(tenant string, kind job.AuditKind, recs []job.AuditRecord) ([]*nats.Msg, error) {
	subj := job.AuditSubject(tenant, kind)
	var msgs []*nats.Msg
	var body []byte // the message being filled; handed to it, not copied
	n := 0
	flush := func() {
		if n == 0 {
			return
		}
		m := nats.NewMsg(subj)
		m.Header.Set(FormatHeader, FormatLines)
		m.Data = body
		msgs = append(msgs, m)
		body = nil
		n = 0
	}
	var line []byte
	for i, rec := range recs {
		if rec.Kind != kind {
			return nil, fmt.Errorf("audit: a %s record in a batch of %s records", rec.Kind, kind)
		}
		if rec.Time.IsZero() {
			rec.Time = time.Now().UTC()
		}
		var err error
		if line, err = appendRecord(line[:0], rec); err != nil {
			return nil, err
		}
		line = append(line, '\n')
		if n > 0 && len(body)+len(line) > maxBatchBytes {
			flush()
		}
		if body == nil {
			// Room for the records left if they are about this one's size.
			body = make([]byte, 0, min(maxBatchBytes, (len(line)+len(line)/4)*min(len(recs)-i, MaxBatch)))
		}
		body = append(body, line...)
		n++
		if n == MaxBatch {
			flush()
		}
	}
	flush()
	return msgs, nil
}

// decode appends the records m holds to out, numbered by m's stream
// sequence. A body that does not decode is skipped, as is a line of a
// batch that does not; a format this build does not know is an error.
func decode(m jetstream.Msg, out []job.AuditRecord) ([]job.AuditRecord, error) {
	var seq uint64
	if md, err := m.Metadata(); err == nil {
		seq = md.Sequence.Stream * SeqStride
	}
	var format string
	if h := m.Headers(); h != nil {
		format = h.Get(FormatHeader)
	}
	switch format {
	case "":
		var rec job.AuditRecord
		if json.Unmarshal(m.Data(), &rec) == nil {
			rec.Seq = seq
			out = append(out, rec)
		}
	case FormatLines:
		data := m.Data()
		for i := uint64(0); len(data) > 0; i++ {
			line, rest, _ := bytes.Cut(data, []byte{'\n'})
			data = rest
			var rec job.AuditRecord
			if json.Unmarshal(line, &rec) == nil {
				rec.Seq = seq + i
				out = append(out, rec)
			}
		}
	default:
		return out, fmt.Errorf("audit: message %s: unknown format %q", m.Subject(), format)
	}
	return out, nil
}
