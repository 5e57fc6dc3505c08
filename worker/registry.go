package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/kilnrun/kiln/job"
)

// registrar keeps this worker's runtimes in the store's runtime registry,
// which the API reads to accept a job (its image digest is part of the
// cache key) and to answer GET /v1/runtimes.
type registrar struct {
	rt       Sandboxes
	store    Store
	clock    Clock
	every    time.Duration // RegistryInterval; an entry lives 3 of them
	probe    time.Duration // StoreProbe: how often a lost entry is looked for
	log      *slog.Logger
	hooks    Hooks
	sessions func() bool // whether this worker takes sessions
}

// run keeps this worker's runtime entry in the registry fresh.
func (r *registrar) run(ctx context.Context, rt string) {
	refresh := r.clock.After(r.every)
	for {
		info, err := r.info(ctx, rt)
		if err == nil {
			err = r.store.RegisterRuntime(ctx, info, 3*r.every)
		}
		if err != nil && ctx.Err() == nil {
			r.log.WarnContext(ctx, "register runtime", slog.String("runtime", rt), slog.Any("error", err))
		}
		if ctx.Err() == nil {
			fire(r.hooks.Registered, Event{Runtime: rt, Err: err})
		}
		again, due := r.untilReregister(ctx, refresh, rt, err == nil)
		if !again {
			return
		}
		if due {
			refresh = r.clock.After(r.every)
		}
	}
}

// info is what the worker advertises of a runtime: its image, and,
// when the backend knows them, its contract (main file, reserved names,
// packages) and the limits policy the backend enforces. The worker adds
// nothing of its own: a backend that reports no policy leaves the API's.
func (r *registrar) info(ctx context.Context, rt string) (job.RuntimeInfo, error) {
	if info, err := r.rt.RuntimeInfo(ctx, rt); !unsupported(err) {
		if info.Sessions != nil && *info.Sessions && !r.sessions() {
			off := false // the backend could host them, this worker takes none
			info.Sessions = &off
		}
		return info, err
	}
	img, err := r.rt.Image(ctx, rt)
	if err != nil {
		return job.RuntimeInfo{}, err
	}
	return job.RuntimeInfo{Name: rt, Image: img.Name, Digest: img.Digest}, nil
}
