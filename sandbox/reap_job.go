package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
)

// ReapJob removes this host's sandboxes of job jobID (task killed, container
// and its snapshot deleted) except those whose kiln.worker label keep
// approves: the worker calls it before running a redelivered job, keeping
// the sandboxes of workers that are still alive. It returns the ids of the
// containers it removed.
func (r *Containerd) ReapJob(ctx context.Context, jobID string, keep func(workerID string) bool) ([]string, error) {
	if jobID == "" {
		return nil, errors.New("sandbox: reap job: no job id")
	}
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	filter := fmt.Sprintf("labels.%q==true,labels.%q==%s", LabelManaged, LabelJobID, strconv.Quote(jobID))
	cs, err := r.client.Containers(ctx, filter)
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
		if err := r.removeContainer(ctx, c); err != nil {
			errs = append(errs, err)
			continue
		}
		reaped = append(reaped, c.ID())
		r.log.WarnContext(ctx, "reaped a sandbox whose worker is gone", slog.String("container_id", c.ID()),
			slog.String("job_id", jobID), slog.String("owner", labels[LabelWorker]))
	}
	if err := errors.Join(errs...); err != nil {
		return reaped, fmt.Errorf("sandbox: reap job %s: %w", jobID, err)
	}
	return reaped, nil
}

// removeContainer kills and deletes c's task, then deletes c. The image's
// shared root view stays (only an older container's own view is removed).
func (r *Containerd) removeContainer(ctx context.Context, c containerd.Container) error {
	if t, err := c.Task(ctx, nil); err == nil {
		if _, err := t.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete task %s: %w", c.ID(), err)
		}
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("load task %s: %w", c.ID(), err)
	}
	var del []containerd.DeleteOpts
	if info, err := c.Info(ctx, containerd.WithoutRefreshedMetadata); err == nil && !isSharedRootfs(info.SnapshotKey) {
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
func (r *Containerd) ReapExpired(ctx context.Context, keep func(workerID string) bool) ([]string, error) {
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	cs, err := r.client.Containers(ctx, fmt.Sprintf("labels.%q==true", LabelManaged))
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
		} else if keep != nil && labels[LabelLeaseScope] == r.cfg.LeaseScope && !keep(labels[LabelWorker]) {
			// Only a worker of the same store can tell from its leases that
			// the owner is gone; another store's sandboxes (another fleet, or
			// a test's) end at their deadline.
			why = "its worker is gone"
		}
		if why == "" {
			continue
		}
		if err := r.removeContainer(ctx, c); err != nil {
			errs = append(errs, err)
			continue
		}
		reaped = append(reaped, c.ID())
		r.log.WarnContext(ctx, "reaped a sandbox: "+why, slog.String("container_id", c.ID()),
			slog.String("job_id", labels[LabelJobID]), slog.String("owner", labels[LabelWorker]))
	}
	if err := errors.Join(errs...); err != nil {
		return reaped, fmt.Errorf("sandbox: reap expired sandboxes: %w", err)
	}
	return reaped, nil
}
