package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/job"
)

// objectStore is the object store as the worker's runs use it: specs sent
// by reference, output past the inline bound, artifacts and sessions'
// files, each within its tenant's stored bounds (storequota.go), and the
// store's own write probe, whose answer /readyz shows (writeprobe.go).
type objectStore struct {
	blobs *blob.Store // nil until open
	cfg   blob.Config
	store Store // counts what each tenant stored
	clock Clock
	ready *readiness
	log   *slog.Logger
	nc    *nats.Conn
	js    jetstream.JetStream
	// probeFor bounds one write probe: min(WriteProbe, 2 s).
	probeFor time.Duration
}

func newObjectStore(cfg *Config, log *slog.Logger, js jetstream.JetStream, ready *readiness) *objectStore {
	return &objectStore{cfg: cfg.Blob, store: cfg.Store, clock: cfg.Clock, ready: ready, log: log,
		nc: cfg.NATS, js: js, probeFor: min(cfg.WriteProbe, 2*time.Second)}
}

// open creates (or updates) the bucket; Run calls it before any job runs.
func (o *objectStore) open(ctx context.Context) error {
	b, err := blob.Ensure(ctx, o.js, o.cfg)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	o.blobs = b
	return nil
}

// maxSpecObject bounds a spec read back from the object store: the largest
// request body the API takes.
const maxSpecObject = job.MaxSpecJSONSize

// loadSpec returns m with its whole spec: a spec sent by reference is read
// from the object store and checked against its hash.
func (o *objectStore) loadSpec(ctx context.Context, m job.Message) (job.Message, error) {
	if m.SpecRef == nil {
		return m, nil
	}
	b, err := o.blobs.GetBytes(ctx, *m.SpecRef, maxSpecObject)
	if err != nil {
		return m, fmt.Errorf("load spec of job %s: %w", m.ID, err)
	}
	var spec job.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return m, fmt.Errorf("decode spec of job %s: %w", m.ID, err)
	}
	// The reference's hash covers the bytes; the limits resolved by the
	// producer ride in the message.
	spec.Limits = m.Spec.Limits
	m.Spec = spec
	return m, nil
}
