package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/snapshots"
	"github.com/opencontainers/image-spec/identity"
)

// RootfsKey names the shared read-only view of a layer chain.
func RootfsKey(chainID string) string {
	return "kiln-rootfs-" + strings.TrimPrefix(chainID, "sha256:")
}

// EnsureRootfs returns the key of the chain's shared read-only view,
// unpacking the image and creating the view when missing. Every job's
// container mounts this one view (its root is read-only, so nothing is
// written to it), which spares each job a snapshot of its own to create and
// remove. The view is a GC root, so containerd keeps it (and the image layers
// under it) while no container uses it; PruneRootfs removes it once no image
// has the chain any more.
func (b *Backend) EnsureRootfs(ctx context.Context, img containerd.Image, chainID string) (string, error) {
	key := RootfsKey(chainID)
	sn := b.Client.SnapshotService(b.Snapshotter)
	// The view's existence implies the layers under it are unpacked.
	_, err := sn.Stat(ctx, key)
	if err == nil {
		return key, nil
	}
	if !errdefs.IsNotFound(err) {
		return "", fmt.Errorf("look up root view %s: %w", key, err)
	}
	if _, err := sn.Stat(ctx, chainID); errdefs.IsNotFound(err) {
		if err := img.Unpack(ctx, b.Snapshotter); err != nil {
			return "", fmt.Errorf("unpack: %w", err)
		}
	} else if err != nil {
		return "", fmt.Errorf("check it is unpacked: %w", err)
	}
	labels := map[string]string{
		LabelManaged: "true", LabelRootfs: chainID,
		"containerd.io/gc.root": time.Now().UTC().Format(time.RFC3339),
	}
	// Another worker on the host may create it at the same moment: fine.
	if _, err := sn.View(ctx, key, chainID, snapshots.WithLabels(labels)); err != nil && !errdefs.IsAlreadyExists(err) {
		return "", fmt.Errorf("create root view %s: %w", key, err)
	}
	return key, nil
}

// PruneRootfs removes the shared root views whose chain no image in the
// namespace has any more (the image was rebuilt or removed) and that no
// container mounts. It returns how many it removed.
func (b *Backend) PruneRootfs(ctx context.Context) (int, error) {
	keep := map[string]bool{}
	imgs, err := b.Client.ListImages(ctx)
	if err != nil {
		return 0, fmt.Errorf("list images: %w", err)
	}
	for _, img := range imgs {
		diffs, err := img.RootFS(ctx)
		if err != nil {
			// An image we cannot read might be the one a view belongs to.
			return 0, fmt.Errorf("read layers of image %s: %w", img.Name(), err)
		}
		keep[RootfsKey(identity.ChainID(diffs).String())] = true
	}
	cs, err := b.Client.ContainerService().List(ctx)
	if err != nil {
		return 0, fmt.Errorf("list containers: %w", err)
	}
	for _, c := range cs {
		keep[c.SnapshotKey] = true
	}
	sn := b.Client.SnapshotService(b.Snapshotter)
	var stale []string
	err = sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if info.Labels[LabelRootfs] != "" && !keep[info.Name] {
			stale = append(stale, info.Name)
		}
		return nil
	}, fmt.Sprintf("labels.%q==true", LabelManaged))
	if err != nil {
		return 0, fmt.Errorf("list root views: %w", err)
	}
	n := 0
	var errs []error
	for _, key := range stale {
		// A job that resolved the old image a moment ago and mounts the view
		// now fails to start and is retried on the current image.
		if err := sn.Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove root view %s: %w", key, err))
			continue
		}
		n++
		b.Log.InfoContext(ctx, "removed the root view of an image no longer present", slog.String("snapshot", key))
	}
	return n, errors.Join(errs...)
}

// WithRootfs makes the image's shared read-only view the container's root
// file system (EnsureRootfs). The container does not own the snapshot:
// deleting the container must leave it.
func WithRootfs(snapshotter, key, imageName string) containerd.NewContainerOpts {
	return func(_ context.Context, _ *containerd.Client, c *containers.Container) error {
		c.Snapshotter, c.SnapshotKey, c.Image = snapshotter, key, imageName
		return nil
	}
}

// IsSharedRootfs reports whether a container's snapshot key is its image's
// shared read-only root view (which must stay) rather than a view of its own.
func IsSharedRootfs(key string) bool { return strings.HasPrefix(key, RootfsKey("")) }
