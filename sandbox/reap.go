package sandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/containerd/namespaces"
)

// ReapOrphans removes the tasks, containers and snapshots labelled
// kiln.managed=true and kiln.worker=workerID, left by a worker with that id
// that died mid-job (package containerd's RemoveOrphans), then the work dir
// mounts of its sandboxes and the root views of images that are gone. Call
// it at start-up, before running jobs: it removes everything of that
// worker, running or not. It returns how many containers and stray
// snapshots it removed.
func (r *Containerd) ReapOrphans(ctx context.Context, workerID string) (int, error) {
	if workerID == "" {
		return 0, errNoWorker
	}
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	n, err := r.ct.be.RemoveOrphans(ctx, workerID)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	// Work dir mounts of this worker's sandboxes (their containers are gone now).
	if _, err := r.hostSide.reapWorkDirs(); err != nil {
		errs = append(errs, err)
	}
	// Root views of images that are gone (rebuilt while no worker ran).
	if _, err := r.ct.be.PruneRootfs(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return n, fmt.Errorf("sandbox: reap orphans: %w", err)
	}
	return n, nil
}

// ReapJob removes this host's sandboxes of job jobID (task killed, container
// and its snapshot deleted) except those whose kiln.worker label keep
// approves: the worker calls it before running a redelivered job, keeping
// the sandboxes of workers that are still alive. It returns the ids of the
// containers it removed.
func (r *Containerd) ReapJob(ctx context.Context, jobID string, keep func(workerID string) bool) ([]string, error) {
	return r.ct.be.ReapJob(namespaces.WithNamespace(ctx, r.cfg.Namespace), jobID, keep)
}

// ReapExpired removes this host's sandboxes that have outlived their
// wall-clock limit by containerd.DeadlineGrace (whoever owns them), and
// those whose worker keep does not approve (a worker whose lease lapsed).
// Every worker calls it periodically. It returns the ids of the containers
// it removed.
func (r *Containerd) ReapExpired(ctx context.Context, keep func(workerID string) bool) ([]string, error) {
	return r.ct.be.ReapExpired(namespaces.WithNamespace(ctx, r.cfg.Namespace), keep)
}
