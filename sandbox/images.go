package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/runtimes"
)

// imageEntry is what a run needs from an image, resolved once per digest so
// that a job does not re-read the manifest and config from the content store.
type imageEntry struct {
	ref     string
	digest  digest.Digest
	chainID string   // the image's unpacked layer chain
	rootfs  string   // the key of the chain's shared read-only view, every job's root
	args    []string // entrypoint + cmd: the launcher
	profile runtimes.Profile
	pkgs    runtimes.Packages
	// isolation is what the runtime's sandboxes run under (Config.isolationOf).
	isolation Isolation
}

// Image returns the runtime's image name and manifest digest as containerd has it now.
func (r *Containerd) Image(ctx context.Context, runtime string) (job.Image, error) {
	if err := job.ValidateRuntime(runtime, r.Runtimes()); err != nil {
		return job.Image{}, fmt.Errorf("sandbox: %w", err)
	}
	img, err := r.images.resolve(namespaces.WithNamespace(ctx, r.cfg.Namespace), runtime)
	if err != nil {
		return job.Image{}, err
	}
	return job.Image{Name: img.ref, Digest: img.digest.String()}, nil
}

// imageCache is the images of the configured runtimes as last resolved
// (by runtime and reference, imageKey): read from containerd, their
// shared root views made (package containerd's rootfs.go). While
// containerd does not answer, a run takes the entry last resolved
// (outage.go).
type imageCache struct {
	cfg    Config
	client *containerd.Client
	be     *ctrd.Backend
	log    *slog.Logger
	now    func() time.Time // the clock of imageRecheck

	mu      sync.Mutex
	entries map[string]*imageEntry // by runtime and reference (imageKey)
	checked map[string]time.Time   // when each entry's reference was last looked up
}

// imageRecheck is how long a resolved image stands before the next job
// looks its reference up again: a rebuilt image is picked up within this
// long. At saturation a lookup a job (a containerd metadata read and its
// gRPC round trip) cost about 1 ms of the host's CPU, 6% of a print(1)
// job's on the box path.
const imageRecheck = time.Second

// resolve looks the runtime's image up (one cheap metadata call, at most
// once per imageRecheck, so a rebuilt image is picked up within a second)
// and reuses the parsed entry while the digest is unchanged. While
// containerd does not answer, the entry it last found stands (outage.go):
// a box needs no containerd to run a job.
func (c *imageCache) resolve(ctx context.Context, runtime string) (*imageEntry, error) {
	ref := c.cfg.Images[runtime]
	key := imageKey(runtime, ref)
	now := c.now()
	c.mu.Lock()
	e, at := c.entries[key], c.checked[key]
	c.mu.Unlock()
	if e != nil && !now.Before(at) && now.Sub(at) < imageRecheck {
		return e, nil
	}
	rec, err := c.client.ImageService().Get(ctx, ref)
	if err != nil {
		if e := c.cachedImage(runtime, ref); e != nil && ctrd.Unreachable(err) {
			return e, nil
		}
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("sandbox: image %s for runtime %s is not in containerd namespace %s (build it with `make image`): %w", ref, runtime, c.cfg.Namespace, err)
		}
		return nil, fmt.Errorf("sandbox: get image %s: %w", ref, err)
	}
	// Keyed by runtime too: two runtimes may share an image and differ in isolation.
	if e != nil && e.digest == rec.Target.Digest {
		c.mu.Lock()
		c.checked[key] = now
		c.mu.Unlock()
		return e, nil
	}
	// One read of the manifest and config gives the launcher command and the
	// layer chain. (IsUnpacked, Spec and RootFS would read both blobs three times.)
	img := containerd.NewImage(c.client, rec)
	ic, err := img.Spec(ctx)
	if err != nil {
		return nil, fmt.Errorf("sandbox: read image config of %s: %w", ref, err)
	}
	args := append(slices.Clone(ic.Config.Entrypoint), ic.Config.Cmd...)
	if len(args) == 0 {
		return nil, fmt.Errorf("sandbox: image %s has no entrypoint; it must start the kiln launcher", ref)
	}
	profile, err := parseProfile(ic.Config.Labels[runtimes.LabelProfile])
	if err != nil {
		return nil, fmt.Errorf("sandbox: image %s (label %s; rebuild it with `make image RUNTIME=%s`): %w", ref, runtimes.LabelProfile, runtime, err)
	}
	pkgs, err := runtimes.ParsePackages(ic.Config.Labels[runtimes.LabelPackages])
	if err != nil {
		return nil, fmt.Errorf("sandbox: image %s (label %s): %w", ref, runtimes.LabelPackages, err)
	}
	iso, err := c.cfg.isolationOf(runtime, profile)
	if err != nil {
		return nil, fmt.Errorf("sandbox: runtime %s: %w", runtime, err)
	}
	if iso == IsolationGVisor {
		if st, err := os.Stat(c.cfg.Runsc); err != nil || st.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("sandbox: runtime %s runs under gvisor but %s is missing or not executable (install it with deploy/local/runsc.sh or `make deps`): %v", runtime, c.cfg.Runsc, err)
		}
	}
	chainID := identity.ChainID(ic.RootFS.DiffIDs).String()
	rootfs, err := c.be.EnsureRootfs(ctx, img, chainID)
	if err != nil {
		return nil, fmt.Errorf("sandbox: image %s: %w", ref, err)
	}
	old := e
	e = &imageEntry{ref: ref, digest: rec.Target.Digest, chainID: chainID, rootfs: rootfs, args: args, profile: profile, pkgs: pkgs, isolation: iso}
	c.mu.Lock()
	c.entries[key] = e
	c.checked[key] = now
	c.mu.Unlock()
	if old != nil && old.rootfs != rootfs {
		// The image was rebuilt: its old root view may now be unused.
		if _, err := c.be.PruneRootfs(ctx); err != nil {
			c.log.WarnContext(ctx, "prune root views of replaced images", slog.Any("error", err))
		}
	}
	return e, nil
}

// cachedImage is the image entry runtime's last resolve found for ref, or
// nil: what a run uses while containerd does not answer (no image can have
// changed that it would see).
func (c *imageCache) cachedImage(runtime, ref string) *imageEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries[imageKey(runtime, ref)]
}

// parseProfile reads an image's runtimes.LabelProfile value under the rules
// every sandbox fixes: its environment (ctrd.BaseEnv) and the isolations this
// package runs.
func parseProfile(raw string) (runtimes.Profile, error) {
	return runtimes.Parse(raw, runtimes.Rules{BaseEnv: ctrd.BaseEnv, Isolation: func(s string) error {
		_, err := parseIsolation(s)
		return err
	}})
}

// imageKey is imageCache's key of a runtime's image entry.
func imageKey(runtime, ref string) string { return runtime + " " + ref }
