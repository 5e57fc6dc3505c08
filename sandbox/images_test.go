package sandbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/namespaces"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// testImageRef names img's target by a new reference, prefix and a random
// suffix, removed when the test ends: a runtime's image the test may
// "rebuild" (point at another image).
func testImageRef(t *testing.T, ctx context.Context, is images.Store, prefix string, img images.Image) string {
	t.Helper()
	ref := prefix + randomHex(6)
	if _, err := is.Create(ctx, images.Image{Name: ref, Target: img.Target}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dctx := namespaces.WithNamespace(context.Background(), testenv.ContainerdNamespace())
		if err := is.Delete(dctx, ref); err != nil {
			t.Logf("remove test image %s: %v", ref, err)
		}
	})
	return ref
}

// A runtime's image stands for imageRecheck after it was looked up, and the
// next job after that sees the image its reference names now: a rebuilt
// image is picked up within imageRecheck, and a job in between costs no
// lookup.
func TestImageLookedUpAgainAfterRecheck(t *testing.T) {
	rt := startRuntime(t, setupConfig(t))
	ctx := namespacesCtx(t, rt)
	is := rt.client.ImageService()
	slim, err := is.Get(ctx, "kiln.local/python-slim:latest")
	if err != nil {
		testenv.Unavailable(t, "the python-slim image (make image): %v", err)
	}
	full, err := is.Get(ctx, ImagesDefault()["python"])
	if err != nil {
		testenv.Unavailable(t, "the python image (make image): %v", err)
	}
	if slim.Target.Digest == full.Target.Digest {
		t.Fatalf("python and python-slim share the digest %s", slim.Target.Digest)
	}
	ref := testImageRef(t, ctx, is, "kiln.local/python-slim:recheck-", slim)
	cfg := rt.cfg
	cfg.Images = map[string]string{"python-slim": ref}
	now := time.Unix(1_800_000_000, 0)
	c := &imageCache{cfg: cfg, client: rt.client, be: rt.images.be, log: rt.log, now: func() time.Time { return now },
		entries: map[string]*imageEntry{}, checked: map[string]time.Time{}}
	resolve := func(when string) string {
		t.Helper()
		e, err := c.resolve(ctx, "python-slim")
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		return e.digest.String()
	}
	if got := resolve("first"); got != slim.Target.Digest.String() {
		t.Fatalf("first resolve: digest %s, want %s", got, slim.Target.Digest)
	}
	// "Rebuild": the reference now names another image.
	img := slim
	img.Name, img.Target = ref, full.Target
	if _, err := is.Update(ctx, img, "target"); err != nil {
		t.Fatal(err)
	}
	now = now.Add(imageRecheck - time.Millisecond)
	if got := resolve("within imageRecheck"); got != slim.Target.Digest.String() {
		t.Errorf("within imageRecheck of the lookup: digest %s, want the one looked up, %s", got, slim.Target.Digest)
	}
	now = now.Add(time.Millisecond)
	if got := resolve("after imageRecheck"); got != full.Target.Digest.String() {
		t.Errorf("imageRecheck after the lookup: digest %s, want the rebuilt image's, %s", got, full.Target.Digest)
	}
	// A clock that went back looks up again rather than trusting the entry.
	img.Target = slim.Target
	if _, err := is.Update(ctx, img, "target"); err != nil {
		t.Fatal(err)
	}
	now = now.Add(-time.Hour)
	if got := resolve("clock went back"); got != slim.Target.Digest.String() {
		t.Errorf("after the clock went back: digest %s, want the image the reference names, %s", got, slim.Target.Digest)
	}
}

// A box made from an image its runtime's reference no longer names serves
// no job: once the rebuilt image is looked up (within imageRecheck), each
// job runs in a box of the image its result names, and an idle box of the
// old one is retired.
func TestBoxOfAReplacedImageServesNoJob(t *testing.T) {
	if underGVisor() {
		t.Skip("gVisor runtimes run a container per job")
	}
	cfg := boxConfig(setupConfig(t))
	rt0 := startRuntime(t, setupConfig(t))
	cctx := namespacesCtx(t, rt0)
	is := rt0.client.ImageService()
	full, err := is.Get(cctx, ImagesDefault()["python"])
	if err != nil {
		testenv.Unavailable(t, "the python image (make image): %v", err)
	}
	slim, err := is.Get(cctx, "kiln.local/python-slim:latest")
	if err != nil {
		testenv.Unavailable(t, "the python-slim image (make image): %v", err)
	}
	ref := testImageRef(t, cctx, is, "kiln.local/python:replaced-", full)
	cfg.Images = map[string]string{"python": ref}
	rt := startRuntime(t, cfg)
	// What the job's own root holds: pandas is in python's image, not in
	// python-slim's.
	probe := py("import os\nprint(os.path.isdir('/usr/lib/python3/dist-packages/pandas'))")
	first := runAs(t, rt, "acme", probe)
	if first.Status != job.StatusSucceeded || first.Image.Digest != full.Target.Digest.String() {
		t.Fatalf("before the rebuild: %s, image %s (want %s)\n%s", first.Status, first.Image.Digest, full.Target.Digest, first.Stderr)
	}
	img := full
	img.Name, img.Target = ref, slim.Target
	if _, err := is.Update(cctx, img, "target"); err != nil {
		t.Fatal(err)
	}
	// Every job, until and after the lookup, runs on the image its result
	// names.
	var last job.Result
	picked := testkit.Poll(30*time.Second, func() bool {
		last = runAs(t, rt, "acme", probe)
		if last.Status != job.StatusSucceeded {
			t.Fatalf("probe: %s %+v\n%s", last.Status, last.Error, last.Stderr)
		}
		hasPandas := strings.TrimSpace(last.Stdout) == "True"
		switch last.Image.Digest {
		case full.Target.Digest.String():
			if !hasPandas {
				t.Fatalf("a result naming python's image (%s) ran on another: %q", last.Image.Digest, last.Stdout)
			}
			return false
		case slim.Target.Digest.String():
			if hasPandas {
				t.Fatalf("a result naming the rebuilt image (%s) ran in a box of the old one", last.Image.Digest)
			}
			return true
		}
		t.Fatalf("a result naming neither image: %s", last.Image.Digest)
		return false
	})
	if !picked {
		t.Fatalf("the rebuilt image was not picked up within 30 s (imageRecheck %s); last result's image %s", imageRecheck, last.Image.Digest)
	}
}
