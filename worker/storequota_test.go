package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// Issue 23, acceptance 2 (at the worker, with a small bound): a tenant
// over its stored-bytes bound gets its own clear failure, once, whether
// the refused content is an artifact or output too long to keep inline;
// another tenant's job with artifacts and big output in the same minute
// succeeds with everything stored.
func TestStoredBytesBoundFailsOnlyItsTenant(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: 2 * time.Second})
	const bound = 300 << 10
	var mu sync.Mutex
	calls := map[string]int{}
	// Each job writes the artifact and the stdout its code names, in KiB.
	rt := &requestRuntime{Runtime: &testkit.Runtime{}, run: func(ctx context.Context, req sandboxapi.Request) (job.Result, error) {
		id, spec := req.ID, req.Spec
		mu.Lock()
		calls[id]++
		mu.Unlock()
		var artKiB, outKiB int
		fmt.Sscanf(spec.Code, "art=%d out=%d", &artKiB, &outKiB)
		res, _ := testkit.Succeed(ctx, id, spec)
		if artKiB > 0 {
			content := bytes.Repeat([]byte(id[len(id)-6:]), artKiB<<10/6)
			sum := sha256.Sum256(content)
			ref := job.ObjectRef{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(content))}
			if err := req.Store(ctx, ref, bytes.NewReader(content)); err != nil {
				res.ArtifactsSkipped = append(res.ArtifactsSkipped, job.SkippedArtifact{Name: "a.bin", Size: ref.Size, Reason: job.SkipError})
			} else {
				res.Artifacts = append(res.Artifacts, job.Artifact{Name: "a.bin", Size: ref.Size, SHA256: ref.SHA256})
			}
		}
		out := []byte(strings.Repeat(id[len(id)-4:]+"\n", outKiB<<10/5))
		res.SetOutput(out, nil)
		res.StdoutBytes = int64(len(out))
		return res, nil
	}}
	b.start(t, rt, nil)
	bounded := func(m *job.Message) { m.Quota = &job.TenantQuota{StoredBytes: bound, StoredObjects: 100} }

	// The hog fills its bound: 250 KiB stored, then a job whose 200 KiB of
	// output no longer fits, then one whose artifact does not.
	fill := b.submitAs(t, "hog", "art=250 out=0", bounded)
	if rec := b.waitTerminal(t, fill, 10*time.Second); rec.Status != job.StatusSucceeded || len(rec.Result.Artifacts) != 1 {
		t.Fatalf("the hog's first job: %s %+v", rec.Status, rec.Result)
	}
	bigOut := b.submitAs(t, "hog", "art=0 out=200", bounded)
	bigArt := b.submitAs(t, "hog", "art=100 out=0", bounded)
	// The other tenant, in the same minute: artifacts and big output.
	calm := b.submitAs(t, "calm", "art=250 out=200", func(m *job.Message) { m.Quota = &job.TenantQuota{StoredBytes: 1 << 30, StoredObjects: 100} })

	for _, id := range []string{bigOut, bigArt} {
		rec := b.waitTerminal(t, id, 10*time.Second)
		r := rec.Result
		if rec.Status != job.StatusFailed || r.Error == nil || r.Error.Category != job.CategoryOutputLimit || r.Error.Retryable ||
			!strings.Contains(r.Error.Message, string(job.QuotaStoredBytes)) {
			t.Fatalf("the hog's job over its bound: %s %+v; want failed, output_limit naming %s", rec.Status, r.Error, job.QuotaStoredBytes)
		}
		mu.Lock()
		n := calls[id]
		mu.Unlock()
		if n != 1 || r.Attempt != 1 {
			t.Errorf("job %s ran %d times (attempt %d); want once", id, n, r.Attempt)
		}
		t.Logf("%s", r.Error.Message)
	}
	if r := b.waitTerminal(t, bigOut, time.Second).Result; !r.StdoutTruncated || len(r.Stdout) > job.MaxInlineOutputBytes || r.StdoutObject != nil || r.StdoutBytes != 200<<10/5*5 {
		t.Errorf("the refused output: truncated %v, %d bytes inline of %d, object %v", r.StdoutTruncated, len(r.Stdout), r.StdoutBytes, r.StdoutObject)
	}

	rec := b.waitTerminal(t, calm, 10*time.Second)
	r := rec.Result
	if rec.Status != job.StatusSucceeded || len(r.Artifacts) != 1 || r.StdoutObject == nil || r.StdoutTruncated {
		t.Fatalf("the other tenant's job: %s %+v; want succeeded with its artifact and output stored", rec.Status, r)
	}
	for _, ref := range []job.ObjectRef{r.StdoutObject.ObjectRef, {Tenant: "calm", SHA256: r.Artifacts[0].SHA256, Size: r.Artifacts[0].Size}} {
		if ok, err := b.blobStore().Has(context.Background(), ref); err != nil || !ok {
			t.Errorf("the other tenant's object %s is not stored: %v", ref.Name(), err)
		}
	}
}

// blobStore is the worker's object store bucket, as a reader opens it.
func (b *bundle) blobStore() *blob.Store { return blob.New(b.js, blob.Config{}) }

// A job whose output the object store itself has no room for (the bucket's
// MaxBytes, the operator's setting) fails once as output_limit saying so,
// its output kept inline up to the cap: not handed back and retried into
// an internal_error with its output lost.
func TestFullObjectStoreFailsTheJobOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: 2 * time.Second})
	rt := &requestRuntime{Runtime: &testkit.Runtime{}, run: func(ctx context.Context, req sandboxapi.Request) (job.Result, error) {
		id, spec := req.ID, req.Spec
		res, _ := testkit.Succeed(ctx, id, spec)
		out := []byte(strings.Repeat("y", 300<<10))
		res.SetOutput(out, nil)
		res.StdoutBytes = int64(len(out))
		return res, nil
	}}
	b.start(t, rt, func(c *Config) { c.Blob = blob.Config{Bucket: "KILN_BLOBS_SMALL", MaxBytes: 200 << 10} })
	id := b.submit(t, "print('y' * 300 * 1024)")
	rec := b.waitTerminal(t, id, 10*time.Second)
	r := rec.Result
	if rec.Status != job.StatusFailed || r.Error == nil || r.Error.Category != job.CategoryOutputLimit || r.Error.Retryable ||
		!strings.Contains(r.Error.Message, "object store is full") {
		t.Fatalf("%s %+v; want failed, output_limit, saying the store is full", rec.Status, r.Error)
	}
	if rt.Calls.Load() != 1 || r.Attempt != 1 || !r.StdoutTruncated || len(r.Stdout) != job.MaxInlineOutputBytes {
		t.Errorf("ran %d times (attempt %d); stdout truncated %v, %d bytes kept", rt.Calls.Load(), r.Attempt, r.StdoutTruncated, len(r.Stdout))
	}
}
