package queue

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/job"
)

// CallbackConsumerName is the durable consumer every callback deliverer shares.
const CallbackConsumerName = "kiln-callbacks"

// CallbackAckWait is how long a deliverer holds a callback without acking
// before JetStream hands it to another deliverer; it outlasts the longest
// HTTP attempt (callback.TimeoutDefault) with room to spare.
const CallbackAckWait = 60 * time.Second

// CallbackStreamConfig is the KILN_CALLBACKS stream: one message per ended
// job that named a callback_url, kept until a deliverer acks it (delivered
// or given up). Same replicas as the job stream.
func (c Config) CallbackStreamConfig() jetstream.StreamConfig {
	c = c.withDefaults()
	return jetstream.StreamConfig{
		Name:        job.CallbackStreamName,
		Description: "Kiln job callbacks waiting to be delivered",
		Subjects:    []string{job.CallbackSubjectPrefix + ">"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    c.Replicas,
		MaxMsgs:     c.MaxMsgs,
		MaxBytes:    c.MaxBytes,
		Discard:     jetstream.DiscardNew,
		Duplicates:  c.DuplicateWindow,
	}
}

// CallbackConsumerConfig is the deliverers' durable pull consumer of
// callbacks published before they had a subject per tenant (one token after
// the prefix: the job id). Deliveries are unbounded: the deliverer decides
// when a callback is given up (its MaxAge) and spaces attempts with
// NakWithDelay.
func CallbackConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       CallbackConsumerName,
		Description:   "Kiln callback deliverers",
		FilterSubject: job.CallbackSubjectPrefix + "*",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       CallbackAckWait,
		MaxDeliver:    -1,
		MaxAckPending: 1024,
	}
}

// TenantCallbackConsumerConfig is the deliverers' durable consumer of one
// tenant's callbacks (token: job.TenantToken), like CallbackConsumerConfig:
// a callback waiting its turn, or its next attempt, counts against its own
// tenant's MaxAckPending only.
func TenantCallbackConsumerConfig(token string) jetstream.ConsumerConfig {
	cc := CallbackConsumerConfig()
	cc.Durable = CallbackConsumerName + "-" + token
	cc.Description = "Kiln callback deliverers, one tenant"
	cc.FilterSubject = job.CallbackTenantPrefix + token
	return cc
}

// CallbackTenants lists the tokens of the tenants with callbacks in the
// stream (waiting, or being sent).
func CallbackTenants(ctx context.Context, s jetstream.Stream) ([]string, error) {
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(job.CallbackTenantPrefix+"*"))
	if err != nil {
		return nil, fmt.Errorf("list subjects of %s: %w", job.CallbackStreamName, err)
	}
	out := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		out = append(out, strings.TrimPrefix(subj, job.CallbackTenantPrefix))
	}
	return out, nil
}

// EnsureCallbackStream creates the callback stream, or updates it to this configuration.
func EnsureCallbackStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	sc := cfg.CallbackStreamConfig()
	s, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("ensure stream %s: %w", sc.Name, err)
	}
	return s, nil
}

// EnsureCallbackConsumer creates the deliverers' consumer of callbacks
// published without a tenant subject, or updates it.
func EnsureCallbackConsumer(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	return ensureCallbackConsumer(ctx, js, CallbackConsumerConfig())
}

// EnsureTenantCallbackConsumer creates the deliverers' consumer of one
// tenant's callbacks, or updates it.
func EnsureTenantCallbackConsumer(ctx context.Context, js jetstream.JetStream, token string) (jetstream.Consumer, error) {
	return ensureCallbackConsumer(ctx, js, TenantCallbackConsumerConfig(token))
}

func ensureCallbackConsumer(ctx context.Context, js jetstream.JetStream, cc jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, job.CallbackStreamName, cc)
	if err != nil {
		return nil, fmt.Errorf("ensure consumer %s: %w", cc.Durable, err)
	}
	return cons, nil
}
