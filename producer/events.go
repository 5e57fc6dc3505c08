package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/events"
	"github.com/kilnrun/kiln/internal/resultio"
	"github.com/kilnrun/kiln/job"
)

// Timing of an event stream.
const (
	// eventsKeepAlive is how often an idle stream gets an SSE comment, so
	// proxies keep it open.
	eventsKeepAlive = 15 * time.Second
	// eventsRecordPoll is how often the job's record is read while
	// streaming: a job that ended without its end events reaching the
	// stream (canceled while queued, a lost publish) still gets its Result.
	eventsRecordPoll = 2 * time.Second
)

// eventsResultID is the SSE id of the final result event.
const eventsResultID = "result"

// handleEvents answers GET /v1/jobs/{id}/events as Server-Sent Events: the
// job's retained events (status, stdout, stderr, artifacts) from the start,
// or after Last-Event-ID, then the live ones, and last its Result (event
// "result"), after which the stream ends. A finished job gets its Result at once.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	id := r.PathValue("id")
	if !job.ValidID(id) {
		writeProblem(w, invalidID(id))
		return
	}
	var startSeq uint64
	if last := r.Header.Get("Last-Event-ID"); last != "" && last != eventsResultID {
		n, err := strconv.ParseUint(last, 10, 64)
		if err != nil {
			p := newProblem(http.StatusBadRequest, typeInvalidParameter, "Invalid Last-Event-ID",
				fmt.Sprintf("Last-Event-ID %q is not an event id of this stream (a decimal number)", last))
			p.Field = "Last-Event-ID"
			writeProblem(w, p)
			return
		}
		startSeq = n + 1
	}
	rec, err := s.store.GetJob(ctx, id)
	if errors.Is(err, cache.ErrNotFound) || (err == nil && tenantOf(&rec) != caller) {
		writeProblem(w, notFound(id))
		return
	}
	if err != nil {
		writeProblem(w, s.storeProblem(ctx, "get job", err))
		return
	}
	rc := http.NewResponseController(w)
	sse := func(evID, typ string, data []byte) error {
		if evID != "" {
			fmt.Fprintf(w, "id: %s\n", evID)
		}
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, data)
		return rc.Flush()
	}
	sendResult := func(rec cache.Record) {
		body, _ := recordView(&rec)
		rv, ok := body.(*resultView)
		if !ok || !rv.Spilled() {
			b, _ := json.Marshal(body)
			_ = sse(eventsResultID, job.EventResult, b)
			return
		}
		// A Result with its output in the object store is streamed into
		// the event's one data line (its JSON has no newline).
		fmt.Fprintf(w, "id: %s\nevent: %s\ndata: ", eventsResultID, job.EventResult)
		if err := resultio.Write(ctx, w, &rv.Result, func() ([]byte, error) { return json.Marshal(rv) }, s.openObject); err != nil {
			s.log.WarnContext(ctx, "stream result event: cut short", slog.String("job_id", id), slog.Any("error", err))
			panic(http.ErrAbortHandler)
		}
		_, _ = io.WriteString(w, "\n\n")
		_ = rc.Flush()
	}
	var cons jetstream.Consumer
	if !rec.Status.Terminal() {
		cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{job.EventsSubject(id)}, DeliverPolicy: jetstream.DeliverAllPolicy}
		if startSeq > 0 {
			cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, startSeq
		}
		if cons, err = s.js.OrderedConsumer(ctx, job.EventsStreamName, cfg); err != nil {
			writeProblem(w, s.storeProblem(ctx, "follow job events", fmt.Errorf("%w: %w", cache.ErrUnavailable, err)))
			return
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if cons == nil {
		sendResult(rec)
		return
	}
	msgs := make(chan jetstream.Msg, 64)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-ctx.Done():
		}
	})
	if err != nil {
		s.log.WarnContext(ctx, "follow job events", slog.String("job_id", id), slog.Any("error", err))
		return
	}
	defer cc.Stop()
	_ = rc.Flush()
	keep := time.NewTicker(eventsKeepAlive)
	defer keep.Stop()
	poll := time.NewTicker(eventsRecordPoll)
	defer poll.Stop()
	var endBy <-chan time.Time // set once the record is terminal
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.waitsDone.Done():
			return // shutting down: the client reconnects with Last-Event-ID
		case <-keep.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
				return
			}
		case <-poll.C:
			if endBy != nil {
				continue
			}
			if rec, err = s.store.GetJob(ctx, id); err == nil && rec.Status.Terminal() {
				// Give the end events a moment to arrive in order.
				endBy = time.After(time.Second)
			}
		case <-endBy:
			if rec, err = s.store.GetJob(ctx, id); err == nil {
				sendResult(rec)
			}
			return
		case m := <-msgs:
			typ := m.Headers().Get(job.HeaderEvent)
			if typ == job.EventResult {
				// The record is written before the end events are published.
				if rec, err = s.store.GetJob(ctx, id); err == nil && rec.Status.Terminal() {
					sendResult(rec)
					return
				}
				endBy = time.After(time.Second)
				continue
			}
			md, err := m.Metadata()
			if err != nil || strings.ContainsAny(typ, "\r\n") || typ == "" {
				continue
			}
			if err := sse(strconv.FormatUint(md.Sequence.Stream, 10), typ, m.Data()); err != nil {
				return
			}
		}
	}
}

// publishQueued announces a job accepted to the queue on its event stream.
func (s *Server) publishQueued(ctx context.Context, id string) {
	if err := events.Status(s.nc, id, job.StatusQueued, ""); err != nil {
		s.log.DebugContext(ctx, "publish queued event", slog.String("job_id", id), slog.Any("error", err))
	}
}
