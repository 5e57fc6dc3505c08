package sandbox

import (
	"context"
	"log/slog"
	"sync"

	"go.opentelemetry.io/otel/trace"
)

// A spare session box per runtime: once a runtime has served a session,
// the next box for a session of it is made ahead of demand, so creating a
// session is taking a box that is ready (and labelling it), not making one.
// A spare is never a pool's box: no job ever runs in it, and it serves one
// session only. Spares go with the runtime's Close.

// sessionSpares holds the spare session boxes.
type sessionSpares struct {
	mu       sync.Mutex
	ready    map[string]*sandbox // by runtime
	creating map[string]bool
	stopped  bool
}

// takeSpare returns runtime's spare box if it is of class cls and still
// usable, else nil (a spare of another class stays: node's heap bound is
// fixed when its box is made).
func (b *boxClient) takeSpare(ctx context.Context, runtime string, cls poolClass) *sandbox {
	sp := &b.spares
	sp.mu.Lock()
	sb := sp.ready[runtime]
	if sb != nil && sb.class != cls {
		sb = nil
	}
	if sb != nil {
		delete(sp.ready, runtime)
	}
	sp.mu.Unlock()
	if sb == nil {
		return nil
	}
	if exitedIdle(sb) || b.boxCfg.Now().Sub(sb.prepared) > b.boxCfg.MaxAge {
		b.removeSessionBox(ctx, sb)
		return nil
	}
	return sb
}

// growSpare makes runtime's spare box in the background unless there is
// one (or one is being made).
func (b *boxClient) growSpare(ctx context.Context, runtime string, img *imageEntry, cls poolClass) {
	sp := &b.spares
	sp.mu.Lock()
	if sp.stopped || sp.ready[runtime] != nil || sp.creating[runtime] {
		sp.mu.Unlock()
		return
	}
	if sp.creating == nil {
		sp.creating, sp.ready = map[string]bool{}, map[string]*sandbox{}
	}
	sp.creating[runtime] = true
	sp.mu.Unlock()
	b.ct.cleaning.Add(1) // Close waits for it like for a removal
	go func() {
		defer b.ct.cleaning.Done()
		ctx := trace.ContextWithSpanContext(context.WithoutCancel(ctx), trace.SpanContext{})
		sb, err := b.prepareBox(ctx, cls, img, boxFor{})
		sp.mu.Lock()
		delete(sp.creating, runtime)
		keep := err == nil && !sp.stopped
		if keep {
			sp.ready[runtime] = sb
		}
		sp.mu.Unlock()
		if !keep {
			if err != nil {
				b.log.WarnContext(ctx, "spare session box", slog.String("runtime", runtime), slog.Any("error", err))
			}
			b.removeSessionBox(ctx, sb)
		}
	}()
}

// stopSpares removes the spare session boxes (Close).
func (b *boxClient) stopSpares(ctx context.Context) {
	sp := &b.spares
	sp.mu.Lock()
	sp.stopped = true
	ready := sp.ready
	sp.ready = nil
	sp.mu.Unlock()
	for _, sb := range ready {
		b.removeSessionBox(ctx, sb)
	}
}
