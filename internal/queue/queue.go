package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/job"
)

// Config sizes the job streams. Zero fields take the documented default.
type Config struct {
	Replicas        int           // stream replicas; default 1
	MaxMsgs         int64         // queued jobs at most before publishes fail (backpressure); default 100,000
	MaxBytes        int64         // queued bytes at most; default 1 GiB
	DuplicateWindow time.Duration // Nats-Msg-Id de-duplication window; default 10m
	AckWait         time.Duration // redelivery after this long without ack or heartbeat; default 30s
	MaxDeliver      int           // deliveries per job before it is recorded as internal_error; default 3
	// Shards is the number of consumers of each runtime's ready jobs (and
	// so, in a cluster, of Raft groups serving them); default 1, at most
	// MaxShards. Fixed for the life of the streams: change it only with
	// the ready stream empty.
	Shards int
}

// MaxShards bounds Config.Shards.
const MaxShards = 64

// Defaults for Config.
const (
	DefaultMaxMsgs         = 100_000
	DefaultMaxBytes        = 1 << 30
	DefaultDuplicateWindow = 10 * time.Minute
	DefaultAckWait         = 30 * time.Second
	DefaultMaxDeliver      = 3
)

// Validate reports settings out of range (zero fields take their default).
func (c Config) Validate() error {
	if c.Shards < 0 || c.Shards > MaxShards {
		return fmt.Errorf("queue: %d shards: set 1 to %d (0: the default, 1)", c.Shards, MaxShards)
	}
	return nil
}

func (c Config) withDefaults() Config {
	c.Replicas = cmp.Or(c.Replicas, 1)
	c.MaxMsgs = cmp.Or(c.MaxMsgs, DefaultMaxMsgs)
	c.MaxBytes = cmp.Or(c.MaxBytes, DefaultMaxBytes)
	c.DuplicateWindow = cmp.Or(c.DuplicateWindow, DefaultDuplicateWindow)
	c.AckWait = cmp.Or(c.AckWait, DefaultAckWait)
	c.MaxDeliver = cmp.Or(c.MaxDeliver, DefaultMaxDeliver)
	c.Shards = cmp.Or(c.Shards, 1)
	return c
}

// StreamConfig is the KILN_JOBS stream: every tenant's backlog, each on a
// subject of its own (job.TenantJobSubject), with no consumer: workers take
// a tenant's oldest job by subject (direct get, so AllowDirect) and move it
// to the ready stream (ready.go). Work-queue retention, file storage,
// bounded, rejecting new messages when full (so producers can answer 429).
func (c Config) StreamConfig() jetstream.StreamConfig {
	c = c.withDefaults()
	return jetstream.StreamConfig{
		Name:        job.StreamName,
		Description: "Kiln jobs waiting for a worker, a subject per tenant and runtime",
		Subjects:    []string{job.SubjectPrefix + ">"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    c.Replicas,
		MaxMsgs:     c.MaxMsgs,
		MaxBytes:    c.MaxBytes,
		Discard:     jetstream.DiscardNew,
		Duplicates:  c.DuplicateWindow,
		AllowDirect: true,
	}
}

// RunConsumerName is the durable pull consumer of one shard of a runtime's
// ready jobs, shared by every worker of the runtime.
func RunConsumerName(runtime string, shard int) string {
	return "kiln-run-" + runtime + "-" + strconv.Itoa(shard)
}

// RunConsumerConfig is the durable pull consumer of one shard of a
// runtime's ready jobs: explicit ack, short AckWait kept alive by InProgress
// heartbeats, bounded deliveries with back-off. Every worker of the runtime
// shares it, whatever the number of tenants.
func (c Config) RunConsumerConfig(runtime string, shard int) jetstream.ConsumerConfig {
	c = c.withDefaults()
	// One back-off per redelivery: MaxDeliver-1 of them. Servers before 2.10
	// reject a consumer with as many back-offs as deliveries.
	backoff := make([]time.Duration, 0, c.MaxDeliver)
	for i := 0; i < c.MaxDeliver-1; i++ {
		// First redelivery after AckWait, later ones further apart.
		backoff = append(backoff, c.AckWait*time.Duration(1<<i))
	}
	return jetstream.ConsumerConfig{
		Durable:       RunConsumerName(runtime, shard),
		Description:   "Kiln workers for runtime " + runtime + ", shard " + strconv.Itoa(shard),
		FilterSubject: readyShardFilter(runtime, shard),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    c.MaxDeliver,
		BackOff:       nilIfEmpty(backoff),
		MaxAckPending: -1,
	}
}

// EnsureStream creates the stream, or updates it to this configuration.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	sc := cfg.StreamConfig()
	s, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("ensure stream %s: %w", sc.Name, err)
	}
	return s, nil
}

// IsStreamFull reports whether a publish failed because the stream hit its bounds.
func IsStreamFull(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	// 10077 is the server's "stream store failed" wrapper around "maximum
	// messages/bytes exceeded"; 10047 is "insufficient resources". A subject
	// at its own bound (the ready stream's lanes) is not the stream full.
	if isSubjectFull(apiErr) {
		return false
	}
	return apiErr.ErrorCode == 10077 || apiErr.ErrorCode == 10047 ||
		strings.Contains(apiErr.Description, "maximum messages") || strings.Contains(apiErr.Description, "maximum bytes")
}

// PublishMayHaveStored reports whether a failed publish may nonetheless have
// been stored by the server: the request went out and no answer came back
// (a timeout, the connection lost while waiting). An API error is the server's
// definite no, and no responders means no server took the request.
func PublishMayHaveStored(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case err == nil, errors.As(err, &apiErr), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrConnectionClosed):
		return false
	}
	return true
}

func nilIfEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}
