package queue

import (
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

// TenantCallbacksConsumerName is the durable consumer every deliverer
// shares for the callbacks published on their tenants' subjects
// (job.TenantCallbackSubject), whatever the number of tenants.
const TenantCallbacksConsumerName = CallbackConsumerName + "-tenants"

// TenantCallbacksMaxAckPending bounds the callbacks of every tenant
// delivered and not yet settled at once: those being sent, and those
// waiting for their next attempt after a failed one. A callback that waits
// for its tenant's or its destination's turn is parked (ParkCallback) and
// holds none of it.
const TenantCallbacksMaxAckPending = 16384

// TenantCallbacksConsumerConfig is the deliverers' one consumer of the
// tenants' callback subjects, like CallbackConsumerConfig otherwise.
func TenantCallbacksConsumerConfig() jetstream.ConsumerConfig {
	cc := CallbackConsumerConfig()
	cc.Durable = TenantCallbacksConsumerName
	cc.Description = "Kiln callback deliverers, every tenant"
	cc.FilterSubject = job.CallbackTenantPrefix + "*"
	cc.MaxAckPending = TenantCallbacksMaxAckPending
	return cc
}

// CallbackParkedPrefix + tenant token + "." + destination key is where a
// tenant's callbacks to one receiver wait while the tenant's (or the
// receiver's) share of the deliverers is busy: a subject no consumer
// reads, so a tenant with any number of them waiting holds nothing of the
// consumer the others' callbacks come through, and callbacks waiting on a
// receiver that hangs are not ahead of the same tenant's callbacks to
// another. (CallbackParkedPrefix + tenant token alone is the subject of an
// earlier layout, still moved back.)
const CallbackParkedPrefix = job.CallbackSubjectPrefix + "w."

// Parked names the parked callbacks of one tenant to one destination.
type Parked struct {
	Token string // the tenant's token (job.TenantToken)
	Dest  string // the destination's key; "" for the earlier layout
}

// Subject is where p's callbacks wait.
func (p Parked) Subject() string {
	if p.Dest == "" {
		return CallbackParkedPrefix + p.Token
	}
	return CallbackParkedPrefix + p.Token + "." + p.Dest
}

// ParkCallback copies msg, a tenant's callback delivered by the tenants'
// consumer, to p's subject; the caller acks msg once it returns nil. A
// deliverer lost between the two leaves the callback in both: the copy's
// message id (the original's stream sequence) makes the second parking of
// the redelivered original a duplicate the stream ignores, within its
// duplicate window.
func ParkCallback(ctx context.Context, js jetstream.JetStream, msg jetstream.Msg, p Parked) error {
	meta, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("park a callback: %w", err)
	}
	m := nats.NewMsg(p.Subject())
	m.Data = msg.Data()
	m.Header.Set(job.HeaderMsgID, "park:"+strconv.FormatUint(meta.Sequence.Stream, 10))
	if _, err := js.PublishMsg(ctx, m, jetstream.WithExpectStream(job.CallbackStreamName)); err != nil {
		return fmt.Errorf("park a callback of tenant %s: %w", p.Token, err)
	}
	return nil
}

// UnparkCallback moves the oldest of p's parked callbacks back to its
// tenant's subject, where the tenants' consumer delivers it: a copy
// (message id: the parked one's sequence), then the parked one's deletion.
// It reports whether there was one to move.
func UnparkCallback(ctx context.Context, s jetstream.Stream, js jetstream.JetStream, p Parked) (bool, error) {
	raw, err := s.GetMsg(ctx, 0, jetstream.WithGetMsgSubject(p.Subject()))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read tenant %s's oldest parked callback: %w", p.Token, err)
	}
	m := nats.NewMsg(job.CallbackTenantPrefix + p.Token)
	m.Data = raw.Data
	m.Header.Set(job.HeaderMsgID, "unpark:"+strconv.FormatUint(raw.Sequence, 10))
	if _, err := js.PublishMsg(ctx, m, jetstream.WithExpectStream(job.CallbackStreamName)); err != nil {
		return false, fmt.Errorf("move tenant %s's parked callback: %w", p.Token, err)
	}
	if err := s.DeleteMsg(ctx, raw.Sequence); err != nil && !isMsgGone(err) {
		return true, fmt.Errorf("remove tenant %s's moved callback: %w", p.Token, err)
	}
	return true, nil
}

// ParkedCallbacks lists the tenants and destinations with parked
// callbacks, with how many each has.
func ParkedCallbacks(ctx context.Context, s jetstream.Stream) (map[Parked]uint64, error) {
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(CallbackParkedPrefix+">"))
	if err != nil {
		return nil, fmt.Errorf("list subjects of %s: %w", job.CallbackStreamName, err)
	}
	out := make(map[Parked]uint64, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		token, dest, _ := strings.Cut(strings.TrimPrefix(subj, CallbackParkedPrefix), ".")
		out[Parked{Token: token, Dest: dest}] = n
	}
	return out, nil
}

// RetireTenantCallbackConsumers deletes the consumers of one tenant's
// callbacks each that an earlier version made (kiln-callbacks-<token>):
// their subjects overlap the tenants' consumer's, which a work-queue
// stream refuses. The callbacks they held stay in the stream and come
// through the tenants' consumer; one being sent by an earlier deliverer
// as its consumer goes may be sent twice (delivery is at least once).
func RetireTenantCallbackConsumers(ctx context.Context, s jetstream.Stream) (int, error) {
	lister := s.ListConsumers(ctx)
	var errs []error
	n := 0
	for ci := range lister.Info() {
		if !strings.HasPrefix(ci.Name, CallbackConsumerName+"-") || ci.Name == TenantCallbacksConsumerName {
			continue
		}
		if err := s.DeleteConsumer(ctx, ci.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			errs = append(errs, fmt.Errorf("delete consumer %s: %w", ci.Name, err))
			continue
		}
		n++
	}
	if err := lister.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		errs = append(errs, err)
	}
	return n, errors.Join(errs...)
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

// EnsureTenantCallbacksConsumer creates the deliverers' consumer of the
// tenants' callback subjects, or updates it.
func EnsureTenantCallbacksConsumer(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	return ensureCallbackConsumer(ctx, js, TenantCallbacksConsumerConfig())
}

func ensureCallbackConsumer(ctx context.Context, js jetstream.JetStream, cc jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, job.CallbackStreamName, cc)
	if err != nil {
		return nil, fmt.Errorf("ensure consumer %s: %w", cc.Durable, err)
	}
	return cons, nil
}
