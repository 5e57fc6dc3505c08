package trace

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestExportedSpansAreRedacted(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(NewRedactingExporter(mem)))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	key := "ghp_" + strings.Repeat("Ab1", 12)
	_, span := tp.Tracer("t").Start(context.Background(), "collect")
	span.SetAttributes(attribute.String("kiln.file", "/work/out/"+key), attribute.Int("n", 1))
	err := fmt.Errorf("open %s: %w", key, errors.ErrUnsupported)
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	span.End()
	_, plain := tp.Tracer("t").Start(context.Background(), "plain")
	plain.End()
	spans := mem.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	got := fmt.Sprintf("%+v", spans[0])
	if strings.Contains(got, key) || !strings.Contains(got, "[REDACTED:github_token]") || !strings.Contains(got, `{"n":1}`) {
		t.Fatalf("exported span: %s", got)
	}
}
