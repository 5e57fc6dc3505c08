package trace_test

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	ktrace "github.com/kilnrun/kiln/trace"
)

// A producer starts the submit span and sends its context with the job; the
// worker continues the same trace from the message headers.
func Example() {
	ctx := context.Background()
	p, err := ktrace.Setup(ctx, ktrace.Config{ServiceName: "kiln-api"})
	if err != nil {
		panic(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	}()
	logger := ktrace.NewLogger(os.Stderr, slog.LevelInfo)

	ctx, span := p.TracerProvider().Tracer("github.com/kilnrun/kiln/producer").Start(ctx, ktrace.SpanSubmit)
	defer span.End()
	msg := nats.NewMsg("kiln.jobs.python")
	ktrace.Inject(ctx, p.Propagator(), msg.Header)
	logger.InfoContext(ctx, "job queued") // carries trace_id and span_id

	// In the worker, after receiving msg:
	workerCtx := ktrace.Extract(context.Background(), p.Propagator(), msg.Header)
	_, execute := p.TracerProvider().Tracer("github.com/kilnrun/kiln/worker").Start(workerCtx, ktrace.SpanExecute)
	execute.End()
}
