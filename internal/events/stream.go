package events

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/job"
)

// Config sizes the events stream. Zero fields take the default beside them.
type Config struct {
	// MaxAge is how long events are retained for clients that connect late.
	// Default: 1h.
	MaxAge time.Duration
	// MaxBytes bounds the whole stream; the oldest events go first. Default: 1 GiB.
	MaxBytes int64
	// MaxMsgsPerJob bounds the events retained per job (the oldest go
	// first). Default: 10,000 (a job of 5 minutes publishes at most ~6,000
	// output chunks at 10 a second per stream).
	MaxMsgsPerJob int64
	// Replicas of the stream. Default: 1.
	Replicas int
}

// Defaults of Config.
const (
	MaxAgeDefault        = time.Hour
	MaxBytesDefault      = 1 << 30
	MaxMsgsPerJobDefault = 10_000
)

func (c Config) withDefaults() Config {
	c.MaxAge = cmp.Or(c.MaxAge, MaxAgeDefault)
	c.MaxBytes = cmp.Or(c.MaxBytes, MaxBytesDefault)
	c.MaxMsgsPerJob = cmp.Or(c.MaxMsgsPerJob, MaxMsgsPerJobDefault)
	c.Replicas = cmp.Or(c.Replicas, 1)
	return c
}

// StreamConfig is the KILN_EVENTS stream: limits retention, oldest discarded.
func (c Config) StreamConfig() jetstream.StreamConfig {
	c = c.withDefaults()
	return jetstream.StreamConfig{
		Name:              job.EventsStreamName,
		Description:       "Kiln jobs' live events, retained for late clients",
		Subjects:          []string{job.EventsSubjectPrefix + ">"},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Replicas:          c.Replicas,
		MaxAge:            c.MaxAge,
		MaxBytes:          c.MaxBytes,
		MaxMsgsPerSubject: c.MaxMsgsPerJob,
		Discard:           jetstream.DiscardOld,
		MaxMsgSize:        1 << 20,
	}
}

// Ensure creates the stream, or updates it to cfg.
func Ensure(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	sc := cfg.StreamConfig()
	s, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("events: ensure stream %s: %w", sc.Name, err)
	}
	return s, nil
}

// Publish sends one event of a job. It does not wait for the stream's
// acknowledgement: live events are best effort, the job's record is the truth.
func Publish(nc *nats.Conn, id, typ string, data any) error {
	b, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("events: encode %s event: %w", typ, err)
	}
	return publishRaw(nc, id, typ, b)
}

// publishRaw sends one message of type typ whose data is b.
func publishRaw(nc *nats.Conn, id, typ string, b []byte) error {
	m := nats.NewMsg(job.EventsSubject(id))
	m.Header.Set(job.HeaderEvent, typ)
	m.Data = b
	if err := nc.PublishMsg(m); err != nil {
		return fmt.Errorf("events: publish %s event of %s: %w", typ, id, err)
	}
	return nil
}

// Status publishes a status event.
func Status(nc *nats.Conn, id string, st job.Status, worker string) error {
	return Publish(nc, id, job.EventStatus, job.StatusEvent{Status: st, Worker: worker})
}

// End publishes the display outputs, then one batch (job.EventBatch) of
// the terminal status, the artifact list and the end marker (a result event
// whose data the API replaces with the stored Result). A batch too large for
// one message goes as its events, one message each.
func End(nc *nats.Conn, id string, res job.Result) error {
	for i, o := range res.Outputs {
		if err := Publish(nc, id, job.EventOutput, displayEvent(i, o)); err != nil {
			return err
		}
	}
	arts := res.Artifacts
	if arts == nil {
		arts = []job.Artifact{}
	}
	var batch []job.BatchedEvent
	for _, ev := range []struct {
		typ  string
		data any
	}{
		{job.EventStatus, job.StatusEvent{Status: res.Status, Worker: res.Worker}},
		{job.EventArtifacts, arts},
		{job.EventResult, job.StatusEvent{Status: res.Status}},
	} {
		b, err := json.Marshal(ev.data)
		if err != nil {
			return fmt.Errorf("events: encode %s event: %w", ev.typ, err)
		}
		batch = append(batch, job.BatchedEvent{Event: ev.typ, Data: b})
	}
	b, err := json.Marshal(batch)
	if err != nil {
		return fmt.Errorf("events: encode end of %s: %w", id, err)
	}
	if len(b) <= maxBatchBytes {
		return publishRaw(nc, id, job.EventBatch, b)
	}
	for _, ev := range batch {
		if err := publishRaw(nc, id, ev.Event, ev.Data); err != nil {
			return err
		}
	}
	return nil
}

// maxBatchBytes bounds a batch's data: the stream's largest message (1 MiB)
// less room for the subject and headers.
const maxBatchBytes = 1<<20 - 4<<10

// Split returns the events a message of type typ with data carries: itself,
// or a batch's events in order. A batch that does not decode carries none.
func Split(typ string, data []byte) []job.BatchedEvent {
	if typ != job.EventBatch {
		return []job.BatchedEvent{{Event: typ, Data: data}}
	}
	var batch []job.BatchedEvent
	if err := json.Unmarshal(data, &batch); err != nil {
		return nil
	}
	return batch
}

// displayEvent is output i as an event, its values other than text/plain
// left out when they would make the message too large.
func displayEvent(i int, o job.Output) job.DisplayEvent {
	size := 0
	for _, v := range o.Data {
		size += len(v)
	}
	if size <= job.MaxDisplayEventBytes {
		return job.DisplayEvent{Index: i, Output: o}
	}
	short := job.Output{Type: o.Type, Data: map[string]json.RawMessage{job.MIMEText: o.Data[job.MIMEText]}, Artifacts: o.Artifacts}
	return job.DisplayEvent{Index: i, Output: short, Partial: true}
}
