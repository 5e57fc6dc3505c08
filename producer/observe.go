package producer

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// observe counts every answered request and its latency by route pattern,
// method and status (429 and 503 also as rejections), when metrics are on.
func (s *Server) observe(next http.Handler) http.Handler {
	if s.metrics == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		// The mux sets r.Pattern ("GET /v1/jobs/{id}"; "/" for a path of
		// no route): the label is its path, the method has its own.
		_, route, ok := strings.Cut(r.Pattern, " ")
		if !ok {
			route = r.Pattern
		}
		if route == "" || route == "/" {
			route = "unmatched"
		}
		s.metrics.HTTPRequest(r.Context(), route, r.Method, sw.status, time.Since(start))
	})
}

type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wroteHeader = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer (flushes
// and deadlines of long-polls).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// queueDepthInterval is how often the API polls the stream and consumers
// for the queue gauges, by default (Config.QueueDepthInterval).
const queueDepthInterval = 5 * time.Second

// pollQueueDepth feeds the queue gauges (messages in the stream; pending,
// ack-pending and redelivered per runtime, summed over the runtime's
// consumers) from a poll every Config.QueueDepthInterval until ctx ends, so
// a scrape never waits on NATS.
func (s *Server) pollQueueDepth(ctx context.Context) {
	if s.metrics == nil {
		return
	}
	var mu sync.Mutex
	var last ktrace.QueueDepth
	var have bool
	reg, err := s.metrics.RegisterQueueDepth(func() (ktrace.QueueDepth, bool) {
		mu.Lock()
		defer mu.Unlock()
		return last, have
	})
	if err != nil {
		s.log.WarnContext(ctx, "queue gauges", slog.Any("error", err))
		return
	}
	s.bg.Go(func() error {
		defer func() { _ = reg.Unregister() }()
		t := time.NewTicker(s.cfg.QueueDepthInterval)
		defer t.Stop()
		for {
			if d, err := s.queueDepth(ctx); err == nil {
				mu.Lock()
				last, have = d, true
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	})
}

func (s *Server) queueDepth(ctx context.Context) (ktrace.QueueDepth, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	jobs, err := s.js.Stream(ctx, job.StreamName)
	if err != nil {
		return ktrace.QueueDepth{}, err
	}
	backlog, err := queue.Backlog(ctx, jobs)
	if err != nil {
		return ktrace.QueueDepth{}, err
	}
	d := ktrace.QueueDepth{Consumers: map[string]ktrace.ConsumerDepth{}}
	for rt, n := range backlog {
		d.Consumers[rt] = ktrace.ConsumerDepth{Pending: int64(n)}
		d.Messages += int64(n)
	}
	// Jobs taken off their backlog for a free slot wait in the ready stream
	// (a few at most), then run there until acked; the workers may not
	// have made it yet.
	ready, err := s.js.Stream(ctx, job.ReadyStreamName)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return d, nil
	}
	if err != nil {
		return d, err
	}
	lister := ready.ListConsumers(ctx)
	for ci := range lister.Info() {
		rt, ok := consumerRuntime(ci)
		if !ok {
			continue
		}
		c := d.Consumers[rt]
		c.Pending += int64(ci.NumPending)
		c.AckPending += int64(ci.NumAckPending)
		c.Redelivered += int64(ci.NumRedelivered)
		d.Consumers[rt] = c
		d.Messages += int64(ci.NumPending + uint64(ci.NumAckPending))
	}
	if err := lister.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return d, err
	}
	return d, nil
}

// consumerRuntime is the runtime a consumer of the ready stream serves
// (subjects kiln.ready.<runtime>.<shard>.>): its shards count toward one
// runtime, so the gauges' runtime label is one series per runtime, whatever
// the number of tenants and shards.
func consumerRuntime(ci *jetstream.ConsumerInfo) (string, bool) {
	rest, ok := strings.CutPrefix(ci.Config.FilterSubject, job.ReadySubjectPrefix)
	if !ok {
		return "", false
	}
	rt, _, _ := strings.Cut(rest, ".")
	return rt, rt != "" && queue.IsRuntimeConsumer(ci.Name, rt)
}
