package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/job"
)

// VerifyStream checks the stream against cfg without changing it: it is
// created when missing (so a worker can start before any API), and when it
// exists with other settings, every difference is logged at ERROR and the
// server's settings stay. The API owns the stream (EnsureStream).
func VerifyStream(ctx context.Context, js jetstream.JetStream, cfg Config, log *slog.Logger) (jetstream.Stream, error) {
	want := cfg.StreamConfig()
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if s, err = js.CreateStream(ctx, want); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, fmt.Errorf("create stream %s: %w", want.Name, err)
		}
		if err == nil {
			log.InfoContext(ctx, "created the job stream (none existed; the API owns its settings)", slog.String("stream", want.Name))
			return s, nil
		}
		s, err = js.Stream(ctx, want.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", want.Name, err)
	}
	if diff := StreamDiff(s.CachedInfo().Config, want); len(diff) > 0 {
		log.ErrorContext(ctx, "JOB STREAM SETTINGS DIFFER FROM THIS PROCESS'S; keeping the server's (the API owns the stream: change them there)",
			slog.String("stream", want.Name), slog.String("differences", strings.Join(diff, "; ")))
	}
	return s, nil
}

// EnsureStreamOwned is the stream owner's (the API's) set-up: it creates
// the stream when missing, and when the server's settings differ from cfg it
// logs every difference at WARN and applies cfg.
func EnsureStreamOwned(ctx context.Context, js jetstream.JetStream, cfg Config, log *slog.Logger) (jetstream.Stream, error) {
	want := cfg.StreamConfig()
	if s, err := js.Stream(ctx, want.Name); err == nil {
		if diff := StreamDiff(s.CachedInfo().Config, want); len(diff) > 0 {
			log.WarnContext(ctx, "updating the job stream's settings (the API owns them)",
				slog.String("stream", want.Name), slog.String("differences", strings.Join(diff, "; ")))
		}
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("look up stream %s: %w", want.Name, err)
	}
	return EnsureStream(ctx, js, cfg)
}

// EnsureReadyOwned sets up the ready stream and the runtime's consumers of
// it (one per shard), which the worker fleet owns: each is created when
// missing; when one exists with other settings, an owner (the worker started
// with --queue-owner) updates it, logging the change, and anyone else logs
// every difference at ERROR and keeps the server's.
func EnsureReadyOwned(ctx context.Context, js jetstream.JetStream, cfg Config, runtime string, owner bool, log *slog.Logger) ([]jetstream.Consumer, error) {
	if err := ensureReadyStreamOwned(ctx, js, cfg, owner, log); err != nil {
		return nil, err
	}
	var out []jetstream.Consumer
	for shard := range cfg.withDefaults().Shards {
		cons, err := ensureRunConsumerOwned(ctx, js, cfg.RunConsumerConfig(runtime, shard), owner, log)
		if err != nil {
			return nil, err
		}
		out = append(out, cons)
	}
	return out, nil
}

func ensureReadyStreamOwned(ctx context.Context, js jetstream.JetStream, cfg Config, owner bool, log *slog.Logger) error {
	want := cfg.ReadyStreamConfig()
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if _, err = js.CreateStream(ctx, want); err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("set up stream %s: %w", want.Name, err)
	}
	diff := StreamDiff(s.CachedInfo().Config, want)
	if len(diff) == 0 {
		return nil
	}
	if owner {
		log.WarnContext(ctx, "updating the ready stream's settings (this worker is the queue owner)",
			slog.String("stream", want.Name), slog.String("differences", strings.Join(diff, "; ")))
		if _, err := js.UpdateStream(ctx, want); err != nil {
			return fmt.Errorf("update stream %s: %w", want.Name, err)
		}
		return nil
	}
	log.ErrorContext(ctx, "READY STREAM SETTINGS DIFFER FROM THIS WORKER'S; keeping the server's (start one worker with --queue-owner to change them)",
		slog.String("stream", want.Name), slog.String("differences", strings.Join(diff, "; ")))
	return nil
}

func ensureRunConsumerOwned(ctx context.Context, js jetstream.JetStream, want jetstream.ConsumerConfig, owner bool, log *slog.Logger) (jetstream.Consumer, error) {
	cons, err := js.Consumer(ctx, job.ReadyStreamName, want.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		if cons, err = js.CreateConsumer(ctx, job.ReadyStreamName, want); err != nil {
			return nil, fmt.Errorf("create consumer %s: %w", want.Durable, err)
		}
		return cons, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up consumer %s: %w", want.Durable, err)
	}
	diff := ConsumerDiff(cons.CachedInfo().Config, want)
	if len(diff) == 0 {
		return cons, nil
	}
	if owner {
		log.WarnContext(ctx, "updating the job consumer's settings (this worker is the queue owner)",
			slog.String("consumer", want.Durable), slog.String("differences", strings.Join(diff, "; ")))
		if cons, err = js.UpdateConsumer(ctx, job.ReadyStreamName, want); err != nil {
			return nil, fmt.Errorf("update consumer %s: %w", want.Durable, err)
		}
		return cons, nil
	}
	log.ErrorContext(ctx, "JOB CONSUMER SETTINGS DIFFER FROM THIS WORKER'S; keeping the server's (start one worker with --queue-owner to change them)",
		slog.String("consumer", want.Durable), slog.String("differences", strings.Join(diff, "; ")))
	return cons, nil
}

// StreamDiff lists the settings of have that differ from want, as
// "field: server=X this process=Y".
func StreamDiff(have, want jetstream.StreamConfig) []string {
	var d differ
	d.add("subjects", strings.Join(have.Subjects, ","), strings.Join(want.Subjects, ","))
	d.add("retention", have.Retention, want.Retention)
	d.add("storage", have.Storage, want.Storage)
	d.add("replicas", max(have.Replicas, 1), max(want.Replicas, 1))
	d.add("max_msgs", have.MaxMsgs, want.MaxMsgs)
	d.add("max_bytes", have.MaxBytes, want.MaxBytes)
	d.add("discard", have.Discard, want.Discard)
	d.add("duplicate_window", have.Duplicates, want.Duplicates)
	d.add("max_msgs_per_subject", unlimited(have.MaxMsgsPerSubject), unlimited(want.MaxMsgsPerSubject))
	d.add("discard_new_per_subject", have.DiscardNewPerSubject, want.DiscardNewPerSubject)
	d.add("allow_direct", have.AllowDirect, want.AllowDirect)
	return d
}

// ConsumerDiff lists the settings of have that differ from want.
func ConsumerDiff(have, want jetstream.ConsumerConfig) []string {
	var d differ
	d.add("filter_subject", have.FilterSubject, want.FilterSubject)
	d.add("ack_policy", have.AckPolicy, want.AckPolicy)
	d.add("ack_wait", have.AckWait, want.AckWait)
	d.add("max_deliver", have.MaxDeliver, want.MaxDeliver)
	if !slices.Equal(have.BackOff, want.BackOff) {
		d.add("backoff", fmt.Sprint(have.BackOff), fmt.Sprint(want.BackOff))
	}
	d.add("max_ack_pending", have.MaxAckPending, want.MaxAckPending)
	return d
}

// unlimited is a stream bound as the server reports it: -1 for none (a
// configuration's 0).
func unlimited(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

type differ []string

func (d *differ) add(field string, have, want any) {
	if fmt.Sprint(have) != fmt.Sprint(want) {
		*d = append(*d, fmt.Sprintf("%s: server=%v this process=%v", field, have, want))
	}
}
