package trace

import (
	"context"
	"errors"
	"fmt"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// errExportAbandoned ends exports still running when Shutdown's deadline passes.
var errExportAbandoned = errors.New("span export abandoned: shutdown deadline passed")

// abortableExporter lets Providers.Shutdown cancel exports that the SDK runs
// on contexts of its own. Without it, a batch processor shut down while the
// collector is unreachable keeps retrying each remaining batch for the full
// export timeout after Shutdown has returned.
type abortableExporter struct {
	sdktrace.SpanExporter
	aborted context.Context
	abort   context.CancelFunc
}

func newAbortableExporter(e sdktrace.SpanExporter) *abortableExporter {
	ctx, cancel := context.WithCancel(context.Background())
	return &abortableExporter{SpanExporter: e, aborted: ctx, abort: cancel}
}

// ExportSpans exports through the wrapped exporter until ctx ends or abort is called.
func (e *abortableExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if e.aborted.Err() != nil {
		return errExportAbandoned
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(e.aborted, func() { cancel(errExportAbandoned) })
	defer stop()
	if err := e.SpanExporter.ExportSpans(ctx, spans); err != nil {
		if cause := context.Cause(ctx); errors.Is(cause, errExportAbandoned) {
			return fmt.Errorf("export %d spans: %w (%w)", len(spans), cause, err)
		}
		return fmt.Errorf("export %d spans: %w", len(spans), err)
	}
	return nil
}
