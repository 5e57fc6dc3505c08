package queue

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/job"
)

// The ready stream is the hand-off between a tenant's backlog and the
// workers. A worker with a free slot picks the next tenant in turn (Picker),
// moves that tenant's oldest job from its backlog subject in KILN_JOBS to a
// subject of KILN_READY (promote), and fetches one job from the ready
// stream's consumer of its runtime and shard. Every worker of a runtime
// shares that consumer, so the queue's JetStream footprint is one stream of
// backlogs, one ready stream and runtimes × shards consumers, whatever the
// number of tenants; ack, in-progress heartbeats, redelivery after a lost
// worker and the bounded deliveries are the ready consumer's, as they were a
// tenant consumer's.
//
// Fair turns: a job reaches the ready stream only when a worker has a slot
// for it and the tenant's turn has come, so the ready stream holds about one
// job per free slot, and a tenant with 10,000 queued jobs is served one job
// a turn like a tenant with one.
//
// A tenant's running-jobs bound: each ready subject of a bounded tenant is a
// lane (kiln.ready.<runtime>.<shard>.<tenant token>.b<n>, n below the
// bound), and the stream holds at most one message per subject, rejecting
// the next (DiscardNewPerSubject). A job holds its lane from promotion until
// its message is acked, the end of its run: the stream itself keeps the
// tenant to its bound across the fleet, through worker losses (a redelivered
// job keeps its lane) and with no counter to drift. A tenant without a bound
// gets a subject per job (kiln.ready.<...>.<token>.q<backlog sequence>).

// ReadyStreamConfig is the KILN_READY stream: work-queue retention, file
// storage, one message per subject (the lanes), bounded like the job
// stream, de-duplicating promotions (a job moved twice is stored once).
func (c Config) ReadyStreamConfig() jetstream.StreamConfig {
	c = c.withDefaults()
	return jetstream.StreamConfig{
		Name:                 job.ReadyStreamName,
		Description:          "Kiln jobs taken off their tenant's backlog for a free worker slot",
		Subjects:             []string{job.ReadySubjectPrefix + ">"},
		Retention:            jetstream.WorkQueuePolicy,
		Storage:              jetstream.FileStorage,
		Replicas:             c.Replicas,
		MaxMsgs:              c.MaxMsgs,
		MaxBytes:             c.MaxBytes,
		MaxMsgsPerSubject:    1,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		Duplicates:           c.DuplicateWindow,
		AllowDirect:          true,
	}
}

// EnsureReadyStream creates the ready stream, or updates it to this
// configuration.
func EnsureReadyStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	sc := cfg.ReadyStreamConfig()
	s, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("ensure stream %s: %w", sc.Name, err)
	}
	return s, nil
}

// ShardOf is the shard of a tenant's ready jobs (token: job.TenantToken)
// among shards.
func ShardOf(token string, shards int) int {
	if shards <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(token))
	return int(h.Sum32() % uint32(shards))
}

// readyShardFilter is the subjects of one shard of a runtime's ready jobs.
func readyShardFilter(runtime string, shard int) string {
	return job.ReadySubjectPrefix + runtime + "." + strconv.Itoa(shard) + ".>"
}

// readySubject is a lane of a tenant's ready jobs.
func readySubject(runtime string, shard int, token, lane string) string {
	return job.ReadySubjectPrefix + runtime + "." + strconv.Itoa(shard) + "." + token + "." + lane
}

// BacklogSubjectOf is the backlog subject (job.TenantJobSubject) of the
// tenant a ready job's subject belongs to; false for any other subject.
func BacklogSubjectOf(readySubj string) (string, bool) {
	rest, ok := strings.CutPrefix(readySubj, job.ReadySubjectPrefix)
	if !ok {
		return "", false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 4 {
		return "", false
	}
	return job.SubjectPrefix + parts[0] + "." + parts[2], true
}

// tokenOf is the tenant token of a backlog subject of runtime: its last
// token, or the default tenant's for the runtime-wide subject of messages
// published before tenants had subjects.
func tokenOf(runtime, subject string) string {
	if subject == job.JobSubject(runtime) {
		return job.TenantToken(job.DefaultTenant)
	}
	return subject[strings.LastIndexByte(subject, '.')+1:]
}

// isSubjectFull reports whether err is the stream refusing a message
// because its subject holds its one message: a lane in use.
func isSubjectFull(apiErr *jetstream.APIError) bool {
	return strings.Contains(apiErr.Description, "per subject")
}

func subjectFull(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && isSubjectFull(apiErr)
}

// The headers the server sets on a stored message, which a copy must not
// carry (direct get answers with them).
var serverHeaders = []string{"Nats-Sequence", "Nats-Stream", "Nats-Subject", "Nats-Time-Stamp", "Nats-Last-Sequence", "Nats-Num-Pending"}

// MaxRunningOf is the running-jobs bound a job's message carries
// (job.HeaderMaxRunning); 0: none.
func MaxRunningOf(h nats.Header) int {
	n, err := strconv.Atoi(h.Get(job.HeaderMaxRunning))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// promotion is what promote did with a tenant's backlog.
type promotion int

const (
	promoted    promotion = iota // its oldest job is in the ready stream
	backlogGone                  // nothing queued on the subject
	atBound                      // every lane of the tenant is taken
	raced                        // another worker moved the job first
)

// promote moves the oldest job of a tenant's backlog subject to the ready
// stream, on the subjects of shard. The move is a copy, then the
// original's deletion: a worker lost between the two leaves the job in
// both, and the copy's message id (the job's) makes the next promotion of
// it a duplicate the stream ignores; the delivery's claim on the job's
// record keeps a copy made past the duplicate window from running it twice.
func promote(ctx context.Context, jobs jetstream.Stream, js jetstream.JetStream, runtime, subject string, shard int) (promotion, error) {
	raw, err := jobs.GetMsg(ctx, 0, jetstream.WithGetMsgSubject(subject))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return backlogGone, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the oldest job of %s: %w", subject, err)
	}
	token := tokenOf(runtime, subject)
	m := nats.NewMsg("")
	m.Data = raw.Data
	for k, v := range raw.Header {
		m.Header[k] = v
	}
	for _, k := range serverHeaders {
		m.Header.Del(k)
	}
	id := raw.Header.Get(job.HeaderJobID)
	if id == "" {
		id = strconv.FormatUint(raw.Sequence, 10)
	}
	m.Header.Set(job.HeaderMsgID, "ready:"+id)
	if m.Header.Get(job.HeaderQueuedAt) == "" {
		m.Header.Set(job.HeaderQueuedAt, raw.Time.UTC().Format(time.RFC3339Nano))
	}
	lanes := []string{"q" + strconv.FormatUint(raw.Sequence, 10)}
	if bound := MaxRunningOf(raw.Header); bound > 0 {
		lanes = make([]string, bound)
		for i := range lanes {
			lanes[i] = "b" + strconv.Itoa(i)
		}
	}
	stored, duplicate := false, false
	for _, lane := range lanes {
		m.Subject = readySubject(runtime, shard, token, lane)
		ack, err := js.PublishMsg(ctx, m, jetstream.WithExpectStream(job.ReadyStreamName))
		if err == nil {
			stored, duplicate = true, ack.Duplicate
			break
		}
		if !subjectFull(err) {
			return 0, fmt.Errorf("move the oldest job of %s to %s: %w", subject, job.ReadyStreamName, err)
		}
	}
	if !stored {
		return atBound, nil
	}
	if err := jobs.DeleteMsg(ctx, raw.Sequence); err != nil && !isMsgGone(err) {
		// The job is in the ready stream; its original goes with the next
		// promotion of the subject (a duplicate, then deleted).
		return promoted, fmt.Errorf("remove the job moved from %s: %w", subject, err)
	}
	if duplicate {
		// Another worker moved the job first (two read the same oldest
		// job): its copy is in the ready stream, or already taken, so
		// there is nothing of this move to wait for.
		return raced, nil
	}
	return promoted, nil
}

// isMsgGone reports whether a deletion failed because the message was
// already gone (another worker moved it first).
func isMsgGone(err error) bool {
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true
	}
	// The server answers a deletion of a missing message 10057, "no
	// message found"; the client reports it as ErrMsgDeleteUnsuccessful
	// with the server's answer as text, not as an APIError to unwrap.
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeMessageNotFound || strings.Contains(apiErr.Description, "no message found")) {
		return true
	}
	return errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) &&
		(strings.Contains(err.Error(), "err_code=10057") || strings.Contains(err.Error(), "no message found"))
}
