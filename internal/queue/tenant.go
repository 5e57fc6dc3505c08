package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/job"
)

// tokenLen is the length of job.TenantToken.
const tokenLen = 16

// TenantConsumerName is the durable pull consumer of one tenant's jobs for
// runtime, shared by every worker: "kiln-worker-<runtime>-<tenant token>".
func TenantConsumerName(runtime, token string) string { return ConsumerName(runtime) + "-" + token }

// TenantConsumerConfig is ConsumerConfig for one tenant's subject. maxRunning
// bounds the tenant's jobs running at once across the fleet (JetStream stops
// delivering the consumer's messages while that many are unacked, and a
// running job's message stays unacked until it ends); 0 means no bound.
func (c Config) TenantConsumerConfig(runtime, token string, maxRunning int) jetstream.ConsumerConfig {
	cc := c.ConsumerConfig(runtime)
	cc.Durable = TenantConsumerName(runtime, token)
	cc.Description = "Kiln workers for runtime " + runtime + ", one tenant"
	cc.FilterSubject = job.SubjectPrefix + runtime + "." + token
	if maxRunning > 0 {
		cc.MaxAckPending = maxRunning
	}
	return cc
}

// EnsureTenantConsumer creates the consumer of tenant's jobs for runtime,
// or sets the running-jobs bound (0: none) of the existing one. The API calls
// it before it first publishes a tenant's job, so the bound is in place
// before any of the tenant's jobs can be delivered. It changes nothing else
// of an existing consumer: the delivery settings (AckWait, MaxDeliver,
// BackOff) belong to the workers (see Picker).
func EnsureTenantConsumer(ctx context.Context, js jetstream.JetStream, cfg Config, runtime, tenant string, maxRunning int) (jetstream.Consumer, error) {
	cc := cfg.TenantConsumerConfig(runtime, job.TenantToken(tenant), maxRunning)
	return bindConsumer(ctx, js, cc, func(cur *jetstream.ConsumerConfig) bool {
		if cur.MaxAckPending == cc.MaxAckPending {
			return false
		}
		cur.MaxAckPending = cc.MaxAckPending
		return true
	})
}

// bindConsumer binds the durable consumer cc names, creating it with cc if
// it does not exist. For an existing one, fix adjusts a copy of its
// configuration and reports whether the consumer must be updated to it.
func bindConsumer(ctx context.Context, js jetstream.JetStream, cc jetstream.ConsumerConfig, fix func(*jetstream.ConsumerConfig) bool) (jetstream.Consumer, error) {
	cons, err := js.Consumer(ctx, job.StreamName, cc.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cons, err = js.CreateConsumer(ctx, job.StreamName, cc)
		if errors.Is(err, jetstream.ErrConsumerExists) {
			cons, err = js.Consumer(ctx, job.StreamName, cc.Durable)
		} else if err == nil {
			return cons, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bind consumer %s: %w", cc.Durable, err)
	}
	cur := cons.CachedInfo().Config
	if fix(&cur) {
		if cons, err = js.UpdateConsumer(ctx, job.StreamName, cur); err != nil {
			return nil, fmt.Errorf("update consumer %s: %w", cc.Durable, err)
		}
	}
	return cons, nil
}

// IsRuntimeConsumer reports whether consumer serves runtime's jobs: its
// runtime-wide consumer or one of its tenant consumers.
func IsRuntimeConsumer(consumer, runtime string) bool {
	base := ConsumerName(runtime)
	if consumer == base {
		return true
	}
	tok, ok := strings.CutPrefix(consumer, base+"-")
	return ok && len(tok) == tokenLen && strings.Trim(tok, "0123456789abcdef") == ""
}
