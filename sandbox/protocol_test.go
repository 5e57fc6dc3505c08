package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/namespaces"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/initproto"
)

// An image whose launcher speaks the previous major version of the
// launcher protocol is refused by its launcher, on the box path (its zygote
// refuses the job's header) and in a container of its own (its launcher
// refuses the frame): the job ends internal_error, the platform's fault,
// with the launcher's own words naming both versions; never a program's
// failure.
func TestPreviousProtocolImageIsRefused(t *testing.T) {
	t.Parallel()
	ref := previousProtocolImage(t)
	want := fmt.Sprintf("kiln-launcher: the worker speaks launcher protocol %s, this launcher %d.%d", initproto.Protocol, initproto.ProtocolMajor-1, initproto.ProtocolMinor)
	paths := []string{"box", "container"}
	if underGVisor() {
		paths = paths[1:] // boxes run under runc only
	}
	for _, path := range paths {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			cfg := setupConfig(t)
			cfg.WorkerID = testWorkerID + "-proto-" + randomHex(3)
			if path == "box" {
				cfg = boxConfig(cfg)
			}
			cfg.Images = map[string]string{"python": ref}
			rt := startRuntime(t, cfg)
			res, err := rt.Run(t.Context(), Request{ID: job.NewID(), Tenant: "acme", Spec: py("print(1)")})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.Status != job.StatusInternalError || res.Error == nil || res.Error.Category != job.CategoryInternal ||
				!strings.Contains(res.Error.Message, want) || res.Stdout != "" {
				t.Fatalf("got %s %+v (stdout %q); want internal_error saying %q", res.Status, res.Error, res.Stdout, want)
			}
			t.Logf("%s: %s", path, res.Error.Message)
			if path == "box" {
				if st := rt.BoxStats(); st.Claims+st.Hits == 0 {
					t.Errorf("the job did not run in a box (%+v)", st)
				}
			}
		})
	}
}

// previousProtocolImage tags, for this test only, the python image with one
// more layer: its kilnproto.py speaking the protocol major before this
// worker's (the same launcher otherwise). It returns the reference and
// removes the image, and its root view, at the end.
func previousProtocolImage(t *testing.T) string {
	t.Helper()
	addr := testenv.Containerd(t)
	src, err := os.ReadFile(filepath.Join("..", "deploy", "images", "python", "kilnproto.py"))
	if err != nil {
		t.Fatal(err)
	}
	cur := fmt.Sprintf("PROTOCOL_MAJOR = %d\n", initproto.ProtocolMajor)
	if !bytes.Contains(src, []byte(cur)) {
		t.Fatalf("kilnproto.py does not say %q", cur)
	}
	prev := bytes.Replace(src, []byte(cur), fmt.Appendf(nil, "PROTOCOL_MAJOR = %d\n", initproto.ProtocolMajor-1), 1)
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: "usr/lib/kiln/kilnproto.py", Mode: 0o644, Size: int64(len(prev)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(prev); err != nil || tw.Close() != nil {
		t.Fatalf("layer: %v", err)
	}

	ctx := namespaces.WithNamespace(context.Background(), testenv.ContainerdNamespace())
	c, err := containerd.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, done, err := c.WithLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer done(ctx)
	base, err := c.ImageService().Get(ctx, ImagesDefault()["python"])
	if err != nil {
		testenv.Unavailable(t, "python sandbox image: %v (run `make image`)", err)
	}
	if base.Target.MediaType != ocispec.MediaTypeImageManifest {
		t.Fatalf("the python image's target is %s; this test adds a layer to a single manifest", base.Target.MediaType)
	}
	cs := c.ContentStore()
	var m ocispec.Manifest
	var cfg ocispec.Image
	raw, err := content.ReadBlob(ctx, cs, base.Target)
	if err == nil {
		err = json.Unmarshal(raw, &m)
	}
	if err == nil {
		raw, err = content.ReadBlob(ctx, cs, m.Config)
	}
	if err == nil {
		err = json.Unmarshal(raw, &cfg)
	}
	if err != nil {
		t.Fatalf("the python image's manifest and config: %v", err)
	}
	id := randomHex(6)
	write := func(mediaType string, b []byte, labels map[string]string) ocispec.Descriptor {
		desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
		if err := content.WriteBlob(ctx, cs, "protocol-test-"+id+"-"+desc.Digest.Encoded()[:12], bytes.NewReader(b), desc, content.WithLabels(labels)); err != nil {
			t.Fatal(err)
		}
		return desc
	}
	layerDesc := write(ocispec.MediaTypeImageLayer, layer.Bytes(), nil)
	cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, layerDesc.Digest)
	cfgBytes, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.Config = write(m.Config.MediaType, cfgBytes, nil)
	m.Layers = append(m.Layers, layerDesc)
	mBytes, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	// The labels keep the config and layers referenced for containerd's GC.
	labels := map[string]string{"containerd.io/gc.ref.content.config": m.Config.Digest.String()}
	for i, l := range m.Layers {
		labels[fmt.Sprintf("containerd.io/gc.ref.content.l.%d", i)] = l.Digest.String()
	}
	mDesc := write(ocispec.MediaTypeImageManifest, mBytes, labels)
	ref := "kiln.local/python:protocol-" + id
	if _, err := c.ImageService().Create(ctx, images.Image{Name: ref, Target: mDesc}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// After the runtimes that used it (cleanups run last first).
		dctx := namespaces.WithNamespace(context.Background(), testenv.ContainerdNamespace())
		if err := c.ImageService().Delete(dctx, ref); err != nil {
			t.Logf("remove test image %s: %v", ref, err)
		}
		key := ctrd.RootfsKey(identity.ChainID(cfg.RootFS.DiffIDs).String())
		if err := c.SnapshotService(SnapshotterDefault).Remove(dctx, key); err != nil {
			t.Logf("remove the test image's root view %s: %v", key, err)
		}
	})
	return ref
}
