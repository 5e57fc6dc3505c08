package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/job"
)

// errStoredBound is the error of a put its tenant's stored-content bound
// refused (a *storedRefusal holds the figures).
var errStoredBound = errors.New("the tenant's stored-content bound is reached")

// storedRefusal collects the puts of one job its tenant's bound refused.
// The job then fails as its own output_limit error naming the bound, once:
// not a retried internal error, and nothing another tenant sees.
type storedRefusal struct {
	mu      sync.Mutex
	n       int       // objects refused
	quota   job.Quota // the bound that refused the first one
	limit   int64
	bytes   int64 // what the tenant had stored when the first one was refused
	objects int64
	size    int64 // the first refused object's size
	window  time.Duration
	full    int64 // the store's own bound, when it was the store that was full
	refuses error // why the store refused writes, when it did (a full disk)
}

func (s *storedRefusal) refused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n > 0
}

// message says what was refused and why.
func (s *storedRefusal) message() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refuses != nil {
		return fmt.Sprintf("the object store does not take writes (%v): %d of the job's output objects (artifacts, output past %d bytes) were not stored, the first of %d bytes; output is kept inline up to %d bytes; the operator must give the store room (a full disk), and running the job again helps only then",
			s.refuses, s.n, job.MaxInlineOutputBytes, s.size, job.MaxInlineOutputBytes)
	}
	if s.full > 0 {
		return fmt.Sprintf("the object store is full: %d of the job's output objects (artifacts, output past %d bytes) were not stored, the first of %d bytes; the store's bound (%d bytes, shared by every tenant) is the operator's setting, each tenant's is smaller",
			s.n, job.MaxInlineOutputBytes, s.size, s.full)
	}
	if s.quota == job.QuotaStoredObjects {
		return fmt.Sprintf("%s: %d of the job's output objects (artifacts, output past %d bytes) were not stored: the tenant's jobs stored %d objects within the store's %v retention, its bound is %d; store fewer files, or wait for older ones to expire",
			s.quota, s.n, job.MaxInlineOutputBytes, s.objects, s.window, s.limit)
	}
	return fmt.Sprintf("%s: %d of the job's output objects (artifacts, output past %d bytes) were not stored, the first of %d bytes: the tenant's jobs stored %d bytes within the store's %v retention, its bound is %d; write less, or wait for older output to expire",
		s.quota, s.n, job.MaxInlineOutputBytes, s.size, s.bytes, s.window, s.limit)
}

// put stores ref's content for job m within its tenant's bounds on
// stored bytes and objects: an object already stored costs nothing; a new
// one is counted first (cache.Store.ReserveStored), and refused, noted in
// refusal, when the tenant is at its bound. A put the store refuses for
// want of room is noted too: either way the job fails once as its own
// output_limit error instead of being retried.
func (o *objectStore) put(ctx context.Context, m job.Message, ref job.ObjectRef, r io.Reader, refusal *storedRefusal) error {
	q := m.Quota
	bounded := q != nil && (q.StoredBytes > 0 || q.StoredObjects > 0)
	now := o.clock.Now()
	if bounded {
		if ok, err := o.blobs.Has(ctx, ref); err != nil || ok {
			return err
		}
		usage, ok, err := o.store.ReserveStored(ctx, ref.Tenant, ref.Size, q.StoredBytes, q.StoredObjects, o.ttl(), now)
		if err != nil {
			return fmt.Errorf("count stored bytes: %w", err)
		}
		if !ok {
			refusal.mu.Lock()
			if refusal.n == 0 {
				refusal.quota, refusal.limit, refusal.size = job.QuotaStoredBytes, q.StoredBytes, ref.Size
				if q.StoredObjects > 0 && usage.Objects+1 > q.StoredObjects {
					refusal.quota, refusal.limit = job.QuotaStoredObjects, q.StoredObjects
				}
				refusal.bytes, refusal.objects, refusal.window = usage.Bytes, usage.Objects, o.ttl()
			}
			refusal.n++
			refusal.mu.Unlock()
			return fmt.Errorf("store %s: %w", ref.Name(), errStoredBound)
		}
	}
	var err error
	if strings.HasPrefix(o.ready.snapshot()[checkObjectStore], "unavailable") {
		// The store refused writes a moment ago: a put would wait out its
		// timeout to fail again. Ask the probe instead.
		if perr := o.probe(ctx); perr != nil {
			err = perr
		}
	}
	if err == nil {
		err = o.blobs.Put(ctx, ref, r)
	}
	if err != nil && bounded {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = o.store.ReleaseStored(rctx, ref.Tenant, ref.Size, now)
		cancel()
	}
	if errors.Is(err, blob.ErrFull) {
		refusal.mu.Lock()
		if refusal.n == 0 {
			refusal.size, refusal.full = ref.Size, cmp.Or(o.cfg.MaxBytes, blob.MaxBytesDefault)
		}
		refusal.n++
		refusal.mu.Unlock()
		return fmt.Errorf("%w: %w", errStoredBound, err)
	}
	if err != nil && ctx.Err() == nil {
		// Another failure: an outage passes (the job is handed back and
		// runs again), but a store that refuses writes while JetStream
		// answers (a full disk) would refuse every attempt: the job fails
		// once, as with a full bucket, and /readyz says so now.
		if perr := o.probe(ctx); perr != nil {
			refusal.mu.Lock()
			if refusal.n == 0 {
				refusal.size, refusal.refuses = ref.Size, err
			}
			refusal.n++
			refusal.mu.Unlock()
			return fmt.Errorf("%w: %w", errStoredBound, err)
		}
	}
	return err
}

// ttl is how long stored objects live: what a tenant stored counts
// against its bounds that long.
func (o *objectStore) ttl() time.Duration { return cmp.Or(o.cfg.TTL, blob.TTLDefault) }

// failStored turns res into the job's own non-retryable output_limit
// failure when its tenant's bound refused some of its output. A run that
// failed otherwise (a timeout, a memory kill) keeps its status; a platform
// fault stays one (the job runs again).
func failStored(res *job.Result, refusal *storedRefusal) {
	if !refusal.refused() {
		return
	}
	switch {
	case res.Status == job.StatusSucceeded,
		res.Status == job.StatusFailed && (res.Error == nil || res.Error.Category == job.CategoryRuntimeError || res.Error.Category == job.CategorySyntaxError):
		res.Status = job.StatusFailed
		res.Error = job.NewFailure(job.CategoryOutputLimit, refusal.message())
	}
}
