package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/containerd/containerd/namespaces"

	"github.com/kilnrun/kiln/job"
)

// RuntimeInfo describes a runtime as this worker runs it: its image, and the
// contract its profile and package list give (what the worker advertises for
// GET /v1/runtimes). Limits are left to the caller.
func (r *Containerd) RuntimeInfo(ctx context.Context, runtime string) (job.RuntimeInfo, error) {
	if err := job.ValidateRuntime(runtime, r.Runtimes()); err != nil {
		return job.RuntimeInfo{}, fmt.Errorf("sandbox: %w", err)
	}
	img, err := r.images.resolve(namespaces.WithNamespace(ctx, r.cfg.Namespace), runtime)
	if err != nil {
		return job.RuntimeInfo{}, err
	}
	contract := img.profile.Contract(img.pkgs)
	_, sessions := r.box.boxCfg.boxable(runtime, img, r.cfg.Policy.Default, "", boxSession)
	contract.Sessions = &sessions
	return job.RuntimeInfo{
		Name: runtime, Image: img.ref, Digest: img.digest.String(),
		// The policy Run enforces is the one the worker advertises: the
		// API bounds jobs by it (and by its own), so no job is accepted
		// that this backend would refuse.
		Limits:          r.cfg.Policy,
		RuntimeContract: contract,
	}, nil
}

// hasModule returns the lookup a failed import's message uses: the runtimes
// other than runtime whose images have a module, from this worker's own
// images and what Config.Fleet reports. It reads nothing until called.
func (x *executor) hasModule(ctx context.Context, runtime string) func(string) []string {
	return func(mod string) []string {
		var out []string
		for _, name := range runtimeNames(x.cfg) {
			if name == runtime {
				continue
			}
			img, err := x.images.resolve(ctx, name)
			if err != nil {
				continue // a runtime this worker cannot resolve right now has nothing to say
			}
			if img.profile.Contract(img.pkgs).Provides(mod) {
				out = append(out, name)
			}
		}
		if x.cfg.Fleet != nil {
			infos, err := x.cfg.Fleet(ctx)
			if err != nil {
				x.log.WarnContext(ctx, "read the fleet's runtimes for a missing module's message", slog.Any("error", err))
			}
			for _, info := range infos {
				if info.Name != runtime && !slices.Contains(out, info.Name) && info.Provides(mod) {
					out = append(out, info.Name)
				}
			}
		}
		slices.Sort(out)
		return out
	}
}
