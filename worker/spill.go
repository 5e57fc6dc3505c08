package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/kilnrun/kiln/job"
)

// spill moves each output stream of r longer than
// job.MaxInlineOutputBytes to the object store, under the job's tenant and
// named by its content, and leaves a reference in its place, so the Result
// the store keeps stays small whatever the job printed (readers stream it
// back: internal/resultio). It runs before the result is recorded; an error
// means the result could not be kept whole and must not be recorded.
//
// Output its tenant's stored-content bound refuses is kept inline up to
// job.MaxInlineOutputBytes, flagged truncated, and the job fails as its own
// output_limit error naming the bound: recorded once, not retried.
func (o *objectStore) spill(ctx context.Context, m job.Message, r *job.Result) error {
	tenant := m.TenantOrDefault()
	spill := func(name string, text, b64 *string, obj **job.OutputObject) error {
		raw, err := job.RawOutput(*text, *b64)
		if err != nil {
			return fmt.Errorf("spill %s of job %s: %w", name, m.ID, err)
		}
		if len(raw) <= job.MaxInlineOutputBytes {
			return nil
		}
		if o.blobs == nil {
			return fmt.Errorf("spill %s of job %s: no object store", name, m.ID)
		}
		sum := sha256.Sum256(raw)
		ref := job.ObjectRef{Tenant: tenant, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(raw))}
		var refusal storedRefusal
		if err := o.put(ctx, m, ref, bytes.NewReader(raw), &refusal); errors.Is(err, errStoredBound) {
			keepInline(r, name, raw)
			failStored(r, &refusal)
			return nil
		} else if err != nil {
			return fmt.Errorf("spill %s of job %s: %w", name, m.ID, err)
		}
		*obj = job.NewOutputObject(ref, raw)
		*text, *b64 = "", ""
		return nil
	}
	if err := spill("stdout", &r.Stdout, &r.StdoutBase64, &r.StdoutObject); err != nil {
		return err
	}
	return spill("stderr", &r.Stderr, &r.StderrBase64, &r.StderrObject)
}

// keepInline keeps a stream the store refused inline, cut to
// job.MaxInlineOutputBytes and flagged truncated.
func keepInline(r *job.Result, name string, raw []byte) {
	var kept job.Result
	kept.SetOutput(cutUTF8(raw, job.MaxInlineOutputBytes), nil)
	if name == "stderr" {
		r.Stderr, r.StderrBase64, r.StderrTruncated = kept.Stdout, kept.StdoutBase64, true
		return
	}
	r.Stdout, r.StdoutBase64, r.StdoutTruncated = kept.Stdout, kept.StdoutBase64, true
}

// cutUTF8 is b's first n bytes at most, not splitting a UTF-8 character
// of text output.
func cutUTF8(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	if !utf8.Valid(b) {
		return b[:n]
	}
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	return b[:n]
}

// spillRetryDelay is how long a job whose output could not be kept waits
// before it is delivered again.
const spillRetryDelay = 5 * time.Second
