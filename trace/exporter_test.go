package trace

import (
	"context"
	"errors"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// hangingExporter stands in for an exporter retrying an unreachable collector.
type hangingExporter struct{ calls chan struct{} }

func (e hangingExporter) ExportSpans(ctx context.Context, _ []sdktrace.ReadOnlySpan) error {
	e.calls <- struct{}{}
	<-ctx.Done()
	return ctx.Err()
}

func (hangingExporter) Shutdown(context.Context) error { return nil }

// TestAbortEndsExportInFlight proves that after Shutdown's deadline no export
// keeps running on the SDK's own background context.
func TestAbortEndsExportInFlight(t *testing.T) {
	t.Parallel()
	inner := hangingExporter{calls: make(chan struct{}, 2)}
	exp := newAbortableExporter(inner)

	done := make(chan error, 1)
	go func() { done <- exp.ExportSpans(context.Background(), nil) }()
	<-inner.calls
	exp.abort()
	select {
	case err := <-done:
		if !errors.Is(err, errExportAbandoned) {
			t.Errorf("aborted export returned %v; want errExportAbandoned", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("export still running 5s after abort")
	}

	if err := exp.ExportSpans(context.Background(), nil); !errors.Is(err, errExportAbandoned) {
		t.Errorf("export after abort returned %v; want errExportAbandoned", err)
	}
	if len(inner.calls) != 0 {
		t.Error("export after abort reached the wrapped exporter")
	}
}
