package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"
)

// ReapOrphans removes the tasks, containers and snapshots labelled
// kiln.managed=true and kiln.worker=workerID, left by a worker with that id
// that died mid-job. Call it at start-up, before running jobs: it removes
// everything of that worker, running or not. It returns how many containers
// and stray snapshots it removed.
func (r *Containerd) ReapOrphans(ctx context.Context, workerID string) (int, error) {
	if workerID == "" {
		return 0, errNoWorker
	}
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	filter := workerFilter(workerID)
	n, err := r.removeUnowned(ctx, filter, "reaped orphaned sandbox")
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	// Views whose container record was never written (a crash between the two).
	sn := r.client.SnapshotService(r.cfg.Snapshotter)
	var keys []string
	if err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		keys = append(keys, info.Name)
		return nil
	}, filter); err != nil {
		errs = append(errs, fmt.Errorf("list orphaned snapshots: %w", err))
	}
	for _, k := range keys {
		if err := sn.Remove(ctx, k); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove snapshot %s: %w", k, err))
			continue
		}
		n++
	}
	// Work dir mounts of this worker's sandboxes (their containers are gone now).
	if _, err := r.reapWorkDirs(); err != nil {
		errs = append(errs, err)
	}
	// Root views of images that are gone (rebuilt while no worker ran).
	if _, err := r.pruneRootfs(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return n, fmt.Errorf("sandbox: reap orphans: %w", err)
	}
	return n, nil
}

// workerFilter selects the containers and snapshots of a worker id.
func workerFilter(workerID string) string {
	return fmt.Sprintf("labels.%q==true,labels.%q==%s", LabelManaged, LabelWorker, strconv.Quote(workerID))
}

// removeUnowned removes the containers filter selects that this runtime
// does not own (neither idle in its pool, nor running a job, nor being
// removed: track), logging each with msg. It returns how many it removed.
func (r *Containerd) removeUnowned(ctx context.Context, filter, msg string) (int, error) {
	cs, err := r.client.Containers(ctx, filter)
	if err != nil {
		return 0, fmt.Errorf("sandbox: list containers: %w", err)
	}
	n := 0
	var errs []error
	for _, c := range cs {
		if r.owns(c.ID()) {
			continue
		}
		if err := r.removeContainer(ctx, c); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
		r.log.InfoContext(ctx, msg, slog.String("container_id", c.ID()))
	}
	return n, errors.Join(errs...)
}

// isSharedRootfs reports whether a container's snapshot key is its image's
// shared read-only root view (which must stay) rather than a view of its own.
func isSharedRootfs(key string) bool { return strings.HasPrefix(key, rootfsKey("")) }
