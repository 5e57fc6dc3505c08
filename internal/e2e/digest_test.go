package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/namespaces"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
	"github.com/kilnrun/kiln/sandbox"
)

// Acceptance 2 (the image digest): once the runtime's image has another
// digest, the same job is a cache miss and runs on the new image; its result
// is then cached under the new digest.
func TestNewImageDigestMissesCache(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ref, newDigest := restampedImage(t, e.containerd)
	run := func(spec job.Spec) client.Submission {
		t.Helper()
		sub, err := e.api.Submit(ctx, spec, client.WithWait(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if !sub.Terminal() || sub.Status != job.StatusSucceeded {
			t.Fatalf("job: %+v", sub.Result)
		}
		return sub
	}
	spec := py("print('which image?')")

	stopA := e.startWorker(t, "e2e-digest-a", 1)
	first := run(spec)
	if first.CacheHit || first.Image.Digest == newDigest {
		t.Fatalf("first run: cache_hit=%v digest %s", first.CacheHit, first.Image.Digest)
	}
	if again := run(spec); !again.CacheHit {
		t.Fatal("the same job on the same image was not a cache hit")
	}
	stopA()

	// A worker on the restamped image takes over; the API learns its digest
	// from the runtime registry.
	e.startWorker(t, "e2e-digest-b", 1, withImages(map[string]string{"python": ref}))
	testkit.Eventually(t, 30*time.Second, "the API to advertise digest "+newDigest, func() bool {
		rts, err := e.api.Runtimes(ctx)
		return err == nil && len(rts) == 1 && rts[0].Digest == newDigest
	})
	before := e.runs.total.Load()
	second := run(spec)
	if second.CacheHit || e.runs.total.Load() != before+1 {
		t.Fatalf("after the image changed: cache_hit=%v, runs %d → %d; want a miss that runs", second.CacheHit, before, e.runs.total.Load())
	}
	if second.Image.Digest != newDigest || second.Image.Name != ref {
		t.Fatalf("ran image %+v; want %s at %s", second.Image, ref, newDigest)
	}
	if third := run(spec); !third.CacheHit || third.Image.Digest != newDigest {
		t.Fatalf("resubmission on the new image: cache_hit=%v digest %s", third.CacheHit, third.Image.Digest)
	}
}

// restampedImage tags, for this test only, an image with the same config and
// layers as the default python image under a manifest that differs by one
// annotation: another digest, nothing to build. It returns the reference and
// the new manifest digest, and removes the tag at the end.
func restampedImage(t *testing.T, address string) (ref string, dgst string) {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), testenv.ContainerdNamespace())
	c, err := containerd.New(address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, done, err := c.WithLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer done(ctx)
	base, err := c.ImageService().Get(ctx, sandbox.ImagesDefault()["python"])
	if err != nil {
		t.Fatal(err)
	}
	if base.Target.MediaType != ocispec.MediaTypeImageManifest {
		t.Fatalf("base image target is %s; this test restamps a single manifest", base.Target.MediaType)
	}
	cs := c.ContentStore()
	raw, err := content.ReadBlob(ctx, cs, base.Target)
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	id := job.NewID()
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations["run.kiln.e2e"] = id
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(b), Size: int64(len(b))}
	// The labels keep the config and layers referenced for containerd's GC.
	labels := map[string]string{"containerd.io/gc.ref.content.config": m.Config.Digest.String()}
	for i, l := range m.Layers {
		labels[fmt.Sprintf("containerd.io/gc.ref.content.l.%d", i)] = l.Digest.String()
	}
	if err := content.WriteBlob(ctx, cs, "e2e-restamp-"+id, bytes.NewReader(b), desc, content.WithLabels(labels)); err != nil {
		t.Fatal(err)
	}
	ref = "kiln.local/python:e2e-" + id
	if _, err := c.ImageService().Create(ctx, images.Image{Name: ref, Target: desc}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dctx := namespaces.WithNamespace(context.Background(), testenv.ContainerdNamespace())
		if err := c.ImageService().Delete(dctx, ref); err != nil {
			t.Logf("remove test image %s: %v", ref, err)
		}
	})
	return ref, desc.Digest.String()
}
