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

	"github.com/nats-io/nats.go"
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
	// eventsPullBytes bounds the events a stream holds in the API, whatever
	// its reader's speed: the next batch is fetched only once the last one
	// is written, so a reader that does not keep up leaves the events in
	// JetStream. At least the stream's largest message (1 MiB).
	eventsPullBytes = 1<<20 + 64<<10
	// eventsFetchWait is how long one fetch waits for events to come.
	eventsFetchWait = 10 * time.Second
	// eventsConsumerInactive is when JetStream removes a stream's consumer
	// that nobody fetches from, should the API die before removing it.
	eventsConsumerInactive = 30 * time.Second
)

// eventsResultID is the SSE id of the final result event.
const eventsResultID = "result"

// lastEventID reads the Last-Event-ID a reconnecting client sends: how many
// of the stream's events it has seen.
func lastEventID(r *http.Request) (uint64, *problem) {
	last := r.Header.Get("Last-Event-ID")
	if last == "" || last == eventsResultID {
		return 0, nil
	}
	n, err := strconv.ParseUint(last, 10, 64)
	if err != nil {
		p := newProblem(http.StatusBadRequest, job.ProblemInvalidParameter, "Invalid Last-Event-ID",
			fmt.Sprintf("Last-Event-ID %q is not an event id of this stream (a decimal number)", last))
		p.Field = "Last-Event-ID"
		return 0, p
	}
	return n, nil
}

// writeSSE writes one event and flushes it.
func writeSSE(w http.ResponseWriter, rc *http.ResponseController, evID, typ string, data []byte) error {
	if evID != "" {
		fmt.Fprintf(w, "id: %s\n", evID)
	}
	fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, data)
	return rc.Flush()
}

// eventReader is one reader of a run's events (followRun).
type eventReader struct {
	// event takes the run's seen-th event (1, 2, 3...); an error ends the
	// reading.
	event func(seen uint64, typ string, data []byte) error
	// idle is called each eventsKeepAlive; an error ends the reading. Nil:
	// the reader keeps itself alive.
	idle func() error
	// result is called once done has reported the run ended, after every
	// event of the run that reached the stream.
	result func(ctx context.Context)
}

// stallWriter gives each write to an event stream's client stall to get
// through: a client that stops reading is cut off then, so its stream does
// not hold a bound's slot (or a handler) for as long as its job runs.
type stallWriter struct {
	http.ResponseWriter
	stall time.Duration
}

func (w *stallWriter) Write(b []byte) (int, error) {
	_ = http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Now().Add(w.stall))
	return w.ResponseWriter.Write(b)
}

func (w *stallWriter) Flush() {
	rc := http.NewResponseController(w.ResponseWriter)
	_ = rc.SetWriteDeadline(time.Now().Add(w.stall))
	_ = rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// eventStreams are the live event streams (SSE) of jobs and session
// calls, read from the KILN_EVENTS stream; they own the gate that bounds
// the streams a tenant, and a job, hold open (streamgate.go).
type eventStreams struct {
	cfg      *Config // Tenants' bounds, EventStallTimeout
	store    Store
	js       jetstream.JetStream
	nc       *nats.Conn
	streams  *streamGate
	results  *resultWriter // a finished job's Result, last
	waits    *waits        // a shutdown ends the streams as it ends long-polls
	problems *problems
	tmetrics *tenantMetrics
	log      *slog.Logger
}

// handleEvents answers GET /v1/jobs/{id}/events as Server-Sent Events: the
// job's retained events (status, stdout, stderr, artifacts) from the start,
// or after Last-Event-ID, then the live ones, and last its Result (event
// "result"), after which the stream ends. A finished job gets its Result at once.
//
// Event ids count the job's own events (1, 2, 3...), so they say nothing
// of other jobs. The streams a tenant, and a job, hold open are bounded
// (Bounds); a reader that takes nothing for EventStallTimeout is cut off.
func (e *eventStreams) handleEvents(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	id := r.PathValue("id")
	if !job.ValidID(id) {
		writeProblem(w, invalidID(id))
		return
	}
	skip, p := lastEventID(r)
	if p != nil {
		writeProblem(w, p)
		return
	}
	rec, err := e.store.GetJob(ctx, id)
	if errors.Is(err, cache.ErrNotFound) || (err == nil && rec.Message.TenantOrDefault() != caller) {
		writeProblem(w, notFound(id))
		return
	}
	if err != nil {
		writeProblem(w, e.problems.storeProblem(ctx, "get job", err))
		return
	}
	done := func(ctx context.Context) bool {
		rec, err = e.store.GetJob(ctx, id)
		return err == nil && rec.Status.Terminal()
	}
	e.streamEvents(w, r, caller, id, skip, rec.Status.Terminal(), done, func(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController) {
		body, _ := recordView(&rec)
		rv, ok := body.(*resultView)
		if !ok || !rv.Spilled() {
			b, _ := json.Marshal(body)
			_ = writeSSE(w, rc, eventsResultID, job.EventResult, b)
			return
		}
		// A Result with its output in the object store is streamed into
		// the event's one data line (its JSON has no newline).
		fmt.Fprintf(w, "id: %s\nevent: %s\ndata: ", eventsResultID, job.EventResult)
		if err := resultio.Write(ctx, w, &rv.Result, func() ([]byte, error) { return json.Marshal(rv) }, e.results.openObject); err != nil {
			e.log.WarnContext(ctx, "stream result event: cut short", slog.String("job_id", id), slog.Any("error", err))
			panic(http.ErrAbortHandler)
		}
		_, _ = io.WriteString(w, "\n\n")
		_ = rc.Flush()
	})
}

// streamEvents answers a client with the live events published under id
// (a job's, or a session call's) as server-sent events, skipping the first
// skip, then the run's result: once done reports the run ended (it reads
// the record), sendResult writes the result event from what done read.
// ended: the run had ended before the stream began.
func (e *eventStreams) streamEvents(w http.ResponseWriter, r *http.Request, caller, id string, skip uint64, ended bool,
	done func(ctx context.Context) bool, sendResult func(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController)) {
	w = &stallWriter{ResponseWriter: w, stall: e.cfg.EventStallTimeout}
	rc := http.NewResponseController(w)
	begin := func() {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Accel-Buffering", "no")
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
	}
	p := e.followRun(r.Context(), caller, id, skip, ended, done, begin, eventReader{
		event: func(seen uint64, typ string, data []byte) error {
			return writeSSE(w, rc, strconv.FormatUint(seen, 10), typ, data)
		},
		idle: func() error {
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return err
			}
			return rc.Flush()
		},
		result: func(ctx context.Context) { sendResult(ctx, w, rc) },
	})
	if p != nil {
		writeProblem(w, p)
	}
}

// followRun reads the live events published under id (a job's, or a session
// call's), skipping the first skip, with rd, until the run ends, ctx ends,
// the server shuts down or rd refuses an event: once done reports the run
// ended (it reads the record), rd.result is called. ended: the run had
// ended before the reading began (rd.result at once). The tenant's and the
// run's bounds on event streams hold every reading; one over them is the
// problem returned, before begin. begin is called once the reading holds
// its consumer, before any event.
func (e *eventStreams) followRun(ctx context.Context, caller, id string, skip uint64, ended bool,
	done func(ctx context.Context) bool, begin func(), rd eventReader) *problem {
	release, over, limit := e.streams.acquire(caller, id, e.cfg.Tenants[caller].Bounds.withDefaults())
	if release == nil {
		return e.streamRefused(ctx, caller, over, limit)
	}
	defer release()
	var cons jetstream.Consumer
	if !ended {
		var err error
		if cons, err = e.js.CreateConsumer(ctx, job.EventsStreamName, jetstream.ConsumerConfig{
			FilterSubject: job.EventsSubject(id), DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckNonePolicy,
			InactiveThreshold: eventsConsumerInactive, MemoryStorage: true,
		}); err != nil {
			return e.problems.storeProblem(ctx, "follow events", fmt.Errorf("%w: %w", cache.ErrUnavailable, err))
		}
	}
	if begin != nil {
		begin()
	}
	if cons == nil {
		rd.result(ctx)
		return nil
	}
	fctx, stopFollow := context.WithCancel(ctx)
	defer e.removeConsumer(ctx, cons, stopFollow)
	msgs := e.followEvents(fctx, id, cons)
	var seen uint64 // the events read so far: the next one's id is seen+1
	var keepC <-chan time.Time
	if rd.idle != nil {
		keep := time.NewTicker(eventsKeepAlive)
		defer keep.Stop()
		keepC = keep.C
	}
	poll := time.NewTicker(eventsRecordPoll)
	defer poll.Stop()
	var endBy <-chan time.Time // set once the run has ended
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-e.waits.done.Done():
			return nil // shutting down: the client reconnects with Last-Event-ID
		case <-keepC:
			if rd.idle() != nil {
				return nil
			}
		case <-poll.C:
			if endBy == nil && done(ctx) {
				// Give the end events a moment to arrive in order.
				endBy = time.After(time.Second)
			}
		case <-endBy:
			if done(ctx) {
				rd.result(ctx)
			}
			return nil
		case m, ok := <-msgs:
			if !ok {
				return nil // the consumer failed: the client reconnects with Last-Event-ID
			}
			// One event, or a batch of them (a job's end), each counted.
			for _, ev := range events.Split(m.Headers().Get(job.HeaderEvent), m.Data()) {
				typ := ev.Event
				if typ == job.EventResult {
					// The record is written before the end events are published.
					if done(ctx) {
						rd.result(ctx)
						return nil
					}
					endBy = time.After(time.Second)
					continue
				}
				if seen++; seen <= skip || strings.ContainsAny(typ, "\r\n") || typ == "" {
					continue
				}
				if rd.event(seen, typ, ev.Data) != nil {
					return nil
				}
			}
		}
	}
}

// publishQueued announces a job accepted to the queue on its event stream.
func (e *eventStreams) publishQueued(ctx context.Context, id string) {
	if err := events.Status(e.nc, id, job.StatusQueued, ""); err != nil {
		e.log.DebugContext(ctx, "publish queued event", slog.String("job_id", id), slog.Any("error", err))
	}
}
