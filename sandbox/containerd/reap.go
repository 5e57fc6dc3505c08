package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/snapshots"
)

// The reaping of what a worker left. Every method takes a ctx that names
// the containerd namespace (namespaces.WithNamespace).

// RemoveOrphans removes the tasks, containers and snapshots labelled
// LabelManaged=true and LabelWorker=workerID that the runtime does not own
// (Owns). It returns how many containers and stray snapshots it removed.
func (b *Backend) RemoveOrphans(ctx context.Context, workerID string) (int, error) {
	filter := WorkerFilter(workerID)
	n, err := b.RemoveUnowned(ctx, filter, "reaped orphaned sandbox")
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	// Views whose container record was never written (a crash between the two).
	sn := b.Client.SnapshotService(b.Snapshotter)
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
	return n, errors.Join(errs...)
}

// WorkerFilter selects the containers and snapshots of a worker id.
func WorkerFilter(workerID string) string {
	return fmt.Sprintf("labels.%q==true,labels.%q==%s", LabelManaged, LabelWorker, strconv.Quote(workerID))
}

// RemoveUnowned removes the containers filter selects that the runtime
// does not own (Owns), logging each with msg. It returns how many it
// removed.
func (b *Backend) RemoveUnowned(ctx context.Context, filter, msg string) (int, error) {
	cs, err := b.Client.Containers(ctx, filter)
	if err != nil {
		return 0, fmt.Errorf("sandbox: list containers: %w", err)
	}
	n := 0
	var errs []error
	for _, c := range cs {
		if b.Owns(c.ID()) {
			continue
		}
		if err := b.RemoveContainer(ctx, c); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
		b.Log.InfoContext(ctx, msg, slog.String("container_id", c.ID()))
	}
	return n, errors.Join(errs...)
}

// ReapJob removes this host's sandboxes of job jobID (task killed, container
// and its snapshot deleted) except those whose kiln.worker label keep
// approves: the worker calls it before running a redelivered job, keeping
// the sandboxes of workers that are still alive. It returns the ids of the
// containers it removed.
func (b *Backend) ReapJob(ctx context.Context, jobID string, keep func(workerID string) bool) ([]string, error) {
	if jobID == "" {
		return nil, errors.New("sandbox: reap job: no job id")
	}
	filter := fmt.Sprintf("labels.%q==true,labels.%q==%s", LabelManaged, LabelJobID, strconv.Quote(jobID))
	cs, err := b.Client.Containers(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("sandbox: list sandboxes of job %s: %w", jobID, err)
	}
	var reaped []string
	var errs []error
	for _, c := range cs {
		labels, err := c.Labels(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("labels of %s: %w", c.ID(), err))
			continue
		}
		if keep != nil && keep(labels[LabelWorker]) {
			continue
		}
		if err := b.RemoveContainer(ctx, c); err != nil {
			errs = append(errs, err)
			continue
		}
		reaped = append(reaped, c.ID())
		b.Log.WarnContext(ctx, "reaped a sandbox whose worker is gone", slog.String("container_id", c.ID()),
			slog.String("job_id", jobID), slog.String("owner", labels[LabelWorker]))
	}
	if err := errors.Join(errs...); err != nil {
		return reaped, fmt.Errorf("sandbox: reap job %s: %w", jobID, err)
	}
	return reaped, nil
}

// RemoveContainer kills and deletes c's task, then deletes c. The image's
// shared root view stays (only an older container's own view is removed).
func (b *Backend) RemoveContainer(ctx context.Context, c containerd.Container) error {
	if t, err := c.Task(ctx, nil); err == nil {
		if _, err := t.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete task %s: %w", c.ID(), err)
		}
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("load task %s: %w", c.ID(), err)
	}
	var del []containerd.DeleteOpts
	if info, err := c.Info(ctx, containerd.WithoutRefreshedMetadata); err == nil && !IsSharedRootfs(info.SnapshotKey) {
		del = append(del, containerd.WithSnapshotCleanup)
	}
	if err := c.Delete(ctx, del...); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete container %s: %w", c.ID(), err)
	}
	return nil
}

// DeadlineGrace is how long past its wall-clock limit (counted from its
// creation, so it covers a slow start) a sandbox may live before
// ReapExpired removes it: its own
// worker kills it at the limit, so only a sandbox whose worker died or hung
// gets this far.
const DeadlineGrace = 5 * time.Second

// ReapExpired removes this host's sandboxes that have outlived their
// wall-clock limit by DeadlineGrace (whoever owns them), and those whose
// worker keep does not approve (a worker whose lease lapsed). Every worker
// calls it periodically, so a sandbox never outlives its limit by much
// while any worker runs on its host, even when its own worker is gone. It
// returns the ids of the containers it removed.
func (b *Backend) ReapExpired(ctx context.Context, keep func(workerID string) bool) ([]string, error) {
	cs, err := b.Client.Containers(ctx, fmt.Sprintf("labels.%q==true", LabelManaged))
	if err != nil {
		return nil, fmt.Errorf("sandbox: list sandboxes: %w", err)
	}
	now := time.Now()
	var reaped []string
	var errs []error
	for _, c := range cs {
		labels, err := c.Labels(ctx)
		if err != nil {
			if !errdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("labels of %s: %w", c.ID(), err))
			}
			continue
		}
		if labels[LabelJobID] == "" && labels[LabelPool] == "" {
			continue // not a sandbox of a job or of a pool
		}
		why := ""
		if ms, err := strconv.ParseInt(labels[LabelDeadline], 10, 64); err == nil && now.After(time.UnixMilli(ms)) {
			why = "outlived its wall-clock limit"
		} else if keep != nil && labels[LabelLeaseScope] == b.LeaseScope && !keep(labels[LabelWorker]) {
			// Only a worker of the same store can tell from its leases that
			// the owner is gone; another store's sandboxes (another fleet, or
			// a test's) end at their deadline.
			why = "its worker is gone"
		}
		if why == "" {
			continue
		}
		if err := b.RemoveContainer(ctx, c); err != nil {
			errs = append(errs, err)
			continue
		}
		reaped = append(reaped, c.ID())
		b.Log.WarnContext(ctx, "reaped a sandbox: "+why, slog.String("container_id", c.ID()),
			slog.String("job_id", labels[LabelJobID]), slog.String("owner", labels[LabelWorker]))
	}
	if err := errors.Join(errs...); err != nil {
		return reaped, fmt.Errorf("sandbox: reap expired sandboxes: %w", err)
	}
	return reaped, nil
}
