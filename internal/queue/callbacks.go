package queue

import (
	"context"
	"fmt"
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

// CallbackConsumerConfig is the deliverers' durable pull consumer. Deliveries
// are unbounded: the deliverer decides when a callback is given up (its
// MaxAge) and spaces attempts with NakWithDelay.
func CallbackConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       CallbackConsumerName,
		Description:   "Kiln callback deliverers",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       CallbackAckWait,
		MaxDeliver:    -1,
		MaxAckPending: 1024,
	}
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

// EnsureCallbackConsumer creates the deliverers' consumer, or updates it.
func EnsureCallbackConsumer(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	cc := CallbackConsumerConfig()
	cons, err := js.CreateOrUpdateConsumer(ctx, job.CallbackStreamName, cc)
	if err != nil {
		return nil, fmt.Errorf("ensure consumer %s: %w", cc.Durable, err)
	}
	return cons, nil
}
