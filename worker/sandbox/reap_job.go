package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

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
