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

// Queued is the number of jobs waiting in the backlog subject (a tenant's,
// job.TenantJobSubject): queued, not yet taken for a worker's slot.
func Queued(ctx context.Context, jobs jetstream.Stream, subject string) (uint64, error) {
	info, err := jobs.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, fmt.Errorf("count the jobs queued on %s: %w", subject, err)
	}
	return info.State.Subjects[subject], nil
}

// Backlog is the number of jobs of each runtime waiting in the job stream
// (queued, not yet taken for a worker's slot), by runtime.
func Backlog(ctx context.Context, jobs jetstream.Stream) (map[string]uint64, error) {
	info, err := jobs.Info(ctx, jetstream.WithSubjectFilter(job.SubjectPrefix+">"))
	if err != nil {
		return nil, fmt.Errorf("list subjects of %s: %w", job.StreamName, err)
	}
	out := map[string]uint64{}
	for subj, n := range info.State.Subjects {
		rt, _, _ := strings.Cut(strings.TrimPrefix(subj, job.SubjectPrefix), ".")
		out[rt] += n
	}
	return out, nil
}

// bindConsumer binds the durable consumer cc names on stream, creating it
// with cc if it does not exist.
func bindConsumer(ctx context.Context, js jetstream.JetStream, stream string, cc jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	cons, err := js.Consumer(ctx, stream, cc.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cons, err = js.CreateConsumer(ctx, stream, cc)
		if errors.Is(err, jetstream.ErrConsumerExists) {
			cons, err = js.Consumer(ctx, stream, cc.Durable)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bind consumer %s: %w", cc.Durable, err)
	}
	return cons, nil
}

// IsRuntimeConsumer reports whether consumer serves runtime's jobs: one of
// the ready stream's consumers of the runtime (RunConsumerName).
func IsRuntimeConsumer(consumer, runtime string) bool {
	shard, ok := strings.CutPrefix(consumer, "kiln-run-"+runtime+"-")
	return ok && shard != "" && strings.Trim(shard, "0123456789") == ""
}

// Earlier versions read each tenant's backlog through a durable consumer
// of its own on the job stream, "kiln-worker-<runtime>-<tenant token>" (and
// "kiln-worker-<runtime>" for messages without a tenant). Their subjects
// are the backlogs this version promotes from, so their jobs run as they
// are; their consumers are deleted once no job they delivered is running
// (RetireLegacyConsumers).

// IsLegacyConsumer reports whether consumer is one of an earlier version's
// consumers of the job stream.
func IsLegacyConsumer(consumer string) bool {
	rest, ok := strings.CutPrefix(consumer, "kiln-worker-")
	if !ok || rest == "" {
		return false
	}
	if i := strings.LastIndexByte(rest, '-'); i > 0 {
		if tok := rest[i+1:]; len(tok) == tokenLen && strings.Trim(tok, "0123456789abcdef") == "" {
			return true
		}
	}
	return !strings.Contains(rest, ".")
}

// RetireLegacyConsumers deletes every earlier version's consumer of the job
// stream that holds no job being run (none delivered and unacked), and
// returns how many are left, waiting for their running jobs to end.
func RetireLegacyConsumers(ctx context.Context, js jetstream.JetStream) (left int, err error) {
	stream, err := js.Stream(ctx, job.StreamName)
	if err != nil {
		return 0, fmt.Errorf("open stream %s: %w", job.StreamName, err)
	}
	lister := stream.ListConsumers(ctx)
	var errs []error
	for ci := range lister.Info() {
		if !IsLegacyConsumer(ci.Name) {
			continue
		}
		if ci.NumAckPending > 0 {
			left++
			continue
		}
		if err := stream.DeleteConsumer(ctx, ci.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			errs = append(errs, fmt.Errorf("delete consumer %s: %w", ci.Name, err))
			left++
		}
	}
	if err := lister.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		errs = append(errs, err)
	}
	return left, errors.Join(errs...)
}
