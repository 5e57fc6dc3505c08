package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/kilnrun/kiln/job"
)

// spillOutput moves each output stream of r longer than
// job.MaxInlineOutputBytes to the object store, under the job's tenant and
// named by its content, and leaves a reference in its place, so the Result
// the store keeps stays small whatever the job printed (readers stream it
// back: internal/resultio). It runs before the result is recorded; an error
// means the result could not be kept whole and must not be recorded.
func (w *Worker) spillOutput(ctx context.Context, m job.Message, r *job.Result) error {
	tenant := m.TenantOrDefault()
	spill := func(name string, text, b64 *string, obj **job.OutputObject) error {
		raw, err := job.RawOutput(*text, *b64)
		if err != nil {
			return fmt.Errorf("spill %s of job %s: %w", name, m.ID, err)
		}
		if len(raw) <= job.MaxInlineOutputBytes {
			return nil
		}
		if w.blobs == nil {
			return fmt.Errorf("spill %s of job %s: no object store", name, m.ID)
		}
		sum := sha256.Sum256(raw)
		ref := job.ObjectRef{Tenant: tenant, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(raw))}
		if err := w.blobs.Put(ctx, ref, bytes.NewReader(raw)); err != nil {
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

// spillRetryDelay is how long a job whose output could not be kept waits
// before it is delivered again.
const spillRetryDelay = 5 * time.Second
