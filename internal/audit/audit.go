package audit

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/job"
)

// Defaults of Config.
const (
	RetentionDefault = 90 * 24 * time.Hour
	MaxReadDefault   = 1000
)

// Config configures the audit stream.
type Config struct {
	// Retention is how long records are kept. Default RetentionDefault (90 days).
	Retention time.Duration
	// Replicas of the stream. Default 1.
	Replicas int
}

func streamConfig(cfg Config) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name: job.AuditStreamName, Subjects: []string{job.AuditSubjectPrefix + ">"},
		Storage: jetstream.FileStorage, Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld,
		MaxAge: cmp.Or(cfg.Retention, RetentionDefault), Replicas: cmp.Or(cfg.Replicas, 1),
		Duplicates: 2 * time.Minute,
	}
}

// Ensure creates or updates the audit stream (the API, which owns its
// retention).
func Ensure(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	s, err := js.CreateOrUpdateStream(ctx, streamConfig(cfg))
	if err != nil {
		return nil, fmt.Errorf("audit: ensure stream %s: %w", job.AuditStreamName, err)
	}
	return s, nil
}

// EnsureExists creates the audit stream with the defaults when there is
// none, and leaves an existing one as the API configured it (the workers,
// which append results, may start first).
func EnsureExists(ctx context.Context, js jetstream.JetStream) error {
	_, err := js.CreateStream(ctx, streamConfig(Config{}))
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("audit: create stream %s: %w", job.AuditStreamName, err)
	}
	return nil
}

// Append adds rec to tenant's log and waits for the stream to store it.
// msgID, when set, makes a repeated append (a redelivered job's result) a
// no-op.
func Append(ctx context.Context, js jetstream.JetStream, tenant string, rec job.AuditRecord, msgID string) error {
	m, err := Msg(tenant, rec, msgID)
	if err != nil {
		return err
	}
	if _, err := js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("audit: append %s record: %w", rec.Kind, err)
	}
	return nil
}

// Msg is the message that appends rec alone to tenant's log (for callers
// that publish it asynchronously; Append waits). BatchMsgs puts several
// records of one kind in a message.
func Msg(tenant string, rec job.AuditRecord, msgID string) (*nats.Msg, error) {
	if rec.Time.IsZero() {
		rec.Time = time.Now().UTC()
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("audit: encode %s record: %w", rec.Kind, err)
	}
	m := nats.NewMsg(job.AuditSubject(tenant, rec.Kind))
	m.Data = b
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	return m, nil
}

// Read returns tenant's records from since on, of kind (empty: all), in
// the order they were appended, at most limit: those of one-record
// messages and of batches alike, each numbered as SeqStride says.
func Read(ctx context.Context, js jetstream.JetStream, tenant string, kind job.AuditKind, since time.Time, limit int) ([]job.AuditRecord, error) {
	subj := job.AuditSubject(tenant, cmp.Or(kind, "*"))
	s, err := js.Stream(ctx, job.AuditStreamName)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return nil, fmt.Errorf("audit: stream info: %w", err)
	}
	var total uint64
	for _, n := range info.State.Subjects {
		total += n
	}
	if total == 0 {
		return nil, nil
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if !since.IsZero() {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	c, err := s.OrderedConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("audit: read: %w", err)
	}
	var out []job.AuditRecord
	for len(out) < limit {
		batch, err := c.FetchNoWait(min(limit-len(out), 256))
		if err != nil {
			return nil, fmt.Errorf("audit: read: %w", err)
		}
		n := 0
		var derr error
		for m := range batch.Messages() {
			n++
			if derr == nil {
				out, derr = decode(m, out)
			}
		}
		// The batch is read to its end even past a record that does not
		// decode: left, the fetch's goroutine waits a second for it.
		if derr != nil {
			return nil, derr
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("audit: read: %w", err)
		}
		if n == 0 {
			break
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	if len(out) > limit { // the last message held more than was asked for
		out = out[:limit]
	}
	return out, nil
}

// KeyID identifies an API key in the log without revealing it.
func KeyID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// SHA256 is the hex SHA-256 of b.
func SHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
