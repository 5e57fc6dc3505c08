package sandbox

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

// rootfsKey names the shared read-only view of a layer chain.
func rootfsKey(chainID string) string {
	return "kiln-rootfs-" + strings.TrimPrefix(chainID, "sha256:")
}

// ensureRootfs returns the key of the chain's shared read-only view,
// unpacking the image and creating the view when missing. Every job's
// container mounts this one view (its root is read-only, so nothing is
// written to it), which spares each job a snapshot of its own to create and
// remove. The view is a GC root, so containerd keeps it (and the image layers
// under it) while no container uses it; pruneRootfs removes it once no image
// has the chain any more.
func (r *Containerd) ensureRootfs(ctx context.Context, img containerd.Image, chainID string) (string, error) {
	key := rootfsKey(chainID)
	sn := r.client.SnapshotService(r.cfg.Snapshotter)
	// The view's existence implies the layers under it are unpacked.
	_, err := sn.Stat(ctx, key)
	if err == nil {
		return key, nil
	}
	if !errdefs.IsNotFound(err) {
		return "", fmt.Errorf("look up root view %s: %w", key, err)
	}
	if _, err := sn.Stat(ctx, chainID); errdefs.IsNotFound(err) {
		if err := img.Unpack(ctx, r.cfg.Snapshotter); err != nil {
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

// pruneRootfs removes the shared root views whose chain no image in the
// namespace has any more (the image was rebuilt or removed) and that no
// container mounts. It returns how many it removed.
func (r *Containerd) pruneRootfs(ctx context.Context) (int, error) {
	keep := map[string]bool{}
	imgs, err := r.client.ListImages(ctx)
	if err != nil {
		return 0, fmt.Errorf("list images: %w", err)
	}
	for _, img := range imgs {
		diffs, err := img.RootFS(ctx)
		if err != nil {
			// An image we cannot read might be the one a view belongs to.
			return 0, fmt.Errorf("read layers of image %s: %w", img.Name(), err)
		}
		keep[rootfsKey(identity.ChainID(diffs).String())] = true
	}
	cs, err := r.client.ContainerService().List(ctx)
	if err != nil {
		return 0, fmt.Errorf("list containers: %w", err)
	}
	for _, c := range cs {
		keep[c.SnapshotKey] = true
	}
	sn := r.client.SnapshotService(r.cfg.Snapshotter)
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
		r.log.InfoContext(ctx, "removed the root view of an image no longer present", slog.String("snapshot", key))
	}
	return n, errors.Join(errs...)
}

// withRootfs makes the image's shared read-only view the container's root
// file system (ensureRootfs). The container does not own the snapshot:
// deleting the container must leave it.
func withRootfs(snapshotter, key, imageName string) containerd.NewContainerOpts {
	return func(_ context.Context, _ *containerd.Client, c *containers.Container) error {
		c.Snapshotter, c.SnapshotKey, c.Image = snapshotter, key, imageName
		return nil
	}
}
