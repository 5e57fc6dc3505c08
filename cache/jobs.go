package cache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/redis/go-redis/v9"
)

// CreateJob records a new job as queued with TTL Config.JobTTL. It fails with
// ErrExists if a record with msg.ID already exists. Creating the very same
// message twice succeeds (so a retried call is harmless).
func (s *Jobs) CreateJob(ctx context.Context, msg job.Message) error {
	return s.createJob(ctx, msg, false)
}

// CreateUnpublishedJob is CreateJob for a job about to be published: in the
// same step it adds the job to the unpublished index (publish.go) at its
// creation time, so the reconciler republishes it if its publish is never
// confirmed. The index entry stays even when the record exists already.
func (s *Jobs) CreateUnpublishedJob(ctx context.Context, msg job.Message) error {
	return s.createJob(ctx, msg, true)
}

func (s *Jobs) createJob(ctx context.Context, msg job.Message, unpublished bool) error {
	op := "create job " + msg.ID
	if msg.ID == "" {
		return fmt.Errorf("%s: message has no id", op)
	}
	raw, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("%s: encode message: %w", op, err)
	}
	n, err := s.runCreateJob(ctx, msg, raw, s.jobTTL, unpublished)
	if err != nil {
		return fail(op, err)
	}
	if n == 0 {
		return fmt.Errorf("%s: %w", op, ErrExists)
	}
	return nil
}

// runCreateJob runs createJobScript for msg (raw: its JSON) with the
// record's TTL ttl (ms), in its tenant's job index.
func (s *Jobs) runCreateJob(ctx context.Context, msg job.Message, raw []byte, ttl int64, unpublished bool) (int, error) {
	inflight := ""
	if msg.Key != "" {
		inflight = s.keys.inflight(msg.Key)
	}
	flag := "0"
	if unpublished {
		flag = "1"
	}
	keys := append([]string{s.keys.job(msg.ID), s.keys.unpublished()}, s.index.sets(msg, job.StatusQueued)...)
	return createJobScript.Run(ctx, s.rdb, keys, raw, ttl, inflight, flag, msg.CreatedAt.UnixMilli(), msg.ID,
		s.index.bound(), s.keys.jobIndex(msg.TenantOrDefault()), s.jobTTL).Int()
}

// GetJob returns the job's record, or ErrNotFound.
func (s *Jobs) GetJob(ctx context.Context, id string) (Record, error) {
	h, err := s.rdb.HGetAll(ctx, s.keys.job(id)).Result()
	if err != nil {
		return Record{}, fail("get job "+id, err)
	}
	if err := s.readCopies(ctx, h); err != nil {
		return Record{}, fmt.Errorf("get job %s: %w", id, err)
	}
	r, err := decodeRecord(id, h)
	if err != nil {
		return Record{}, fmt.Errorf("get job %s: %w", id, err)
	}
	return *r, nil
}

// GetJobs returns the records of ids in one round trip (a pipeline), in the
// order of ids, with a nil entry for each id that has no record.
func (s *Jobs) GetJobs(ctx context.Context, ids []string) ([]*Record, error) {
	out := make([]*Record, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	cmds := make([]*redis.MapStringStringCmd, len(ids))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.HGetAll(ctx, s.keys.job(id))
		}
		return nil
	})
	if err != nil {
		return nil, fail(fmt.Sprintf("get %d jobs", len(ids)), err)
	}
	hs := make([]map[string]string, len(cmds))
	for i, c := range cmds {
		hs[i] = c.Val()
	}
	if err := s.readCopies(ctx, hs...); err != nil {
		return nil, fmt.Errorf("get %d jobs: %w", len(ids), err)
	}
	for i, h := range hs {
		r, err := decodeRecord(ids[i], h)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return nil, fmt.Errorf("get %d jobs: %w", len(ids), err)
		default:
			out[i] = r
		}
	}
	return out, nil
}

// DeleteJob removes a job that is still queued, with its in-flight claim if
// that names the job: the producer's rollback when publishing failed. A job
// that has left queued (a worker got it after all) is left untouched and nil
// is returned. ErrNotFound if there is no record.
func (s *Jobs) DeleteJob(ctx context.Context, id string) error {
	op := "delete job " + id
	n, err := deleteJobScript.Run(ctx, s.rdb, []string{s.keys.job(id)}, id).Int()
	if err != nil {
		return fail(op, err)
	}
	if n < 0 {
		return fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	if n == 0 {
		s.log.DebugContext(ctx, "cache: job not deleted: no longer queued", "job_id", id)
	}
	return nil
}

// Lease is an attempt's claim on a running job: Token names the attempt (the
// same token for every call about the same attempt, unique across attempts)
// and TTL is how long the lease lasts unless renewed.
type Lease struct {
	Token string
	TTL   time.Duration
}

// MarkRunningLeased records that worker started attempt of the job at at (now
// if zero), atomically and only if the job is not terminal, and gives the
// attempt lease (none when lease.TTL is 0), which RenewLease extends. It returns the status after the call: StatusRunning, or the
// terminal status the job already had (for example StatusCanceled), in which
// case the worker must not run it.
//
// A running job whose lease is held by another attempt and has not lapsed is
// being run right now by a live worker (this delivery is a duplicate, for
// example after the queue lost that worker's heartbeats): nothing changes and
// the error wraps ErrLeased. The caller should hold the delivery and ask
// again; once the holder finishes, the answer is its terminal status, and if
// the holder dies, its lease lapses and the next call takes the job over.
//
// A job still running whose cancellation was requested (its worker died and
// this is a redelivery) is finished as canceled instead, and StatusCanceled
// returned: a cancellation outlives the worker that should have carried it out.
// ErrNotFound if there is no record.
func (s *Jobs) MarkRunningLeased(ctx context.Context, id, worker string, attempt int, at time.Time, lease Lease) (job.Status, error) {
	op := "mark job " + id + " running"
	if at.IsZero() {
		at = time.Now()
	}
	now := time.Now()
	canceled, err := canceledResult(id, "job was canceled while running; its redelivery was not run", now)
	if err != nil {
		return "", fmt.Errorf("%s: %w", op, err)
	}
	reply, err := markRunningScript.Run(ctx, s.rdb, []string{s.keys.job(id)},
		worker, attempt, formatTime(at), id, canceled, formatTime(now),
		lease.Token, max(lease.TTL.Milliseconds(), 0), s.index.bound(), s.jobTTL).StringSlice()
	if errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	if err != nil {
		return "", fail(op, err)
	}
	if len(reply) == 3 && reply[0] == "leased" {
		return job.StatusRunning, fmt.Errorf("%s: %w (%s, lapses in %s ms unless renewed)", op, ErrLeased, reply[1], reply[2])
	}
	if len(reply) != 1 {
		return "", fmt.Errorf("%s: unexpected reply %q", op, reply)
	}
	return job.Status(reply[0]), nil
}

// RenewLease extends the lease that MarkRunningLeased gave (same token) to
// lease.TTL from now. held is false when the attempt no longer holds it: the
// job is terminal, or the lease lapsed and another attempt took the job
// over. ErrNotFound if there is no record.
func (s *Jobs) RenewLease(ctx context.Context, id string, lease Lease) (held bool, err error) {
	return s.renewLease(ctx, "renew lease of job "+id, id, lease.Token, max(lease.TTL, time.Millisecond))
}

func (s *Jobs) renewLease(ctx context.Context, op, id, token string, ttl time.Duration) (bool, error) {
	n, err := renewLeaseScript.Run(ctx, s.rdb, []string{s.keys.job(id)}, token, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fail(op, err)
	}
	if n < 0 {
		return false, fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	return n == 1, nil
}

// ReleaseLease ends the lease with token now, so that a redelivery of a job
// handed back need not wait for it to lapse. held is as for RenewLease.
func (s *Jobs) ReleaseLease(ctx context.Context, id, token string) (held bool, err error) {
	return s.renewLease(ctx, "release lease of job "+id, id, token, 0)
}

// Finish stores the job's terminal result; the first terminal result wins,
// atomically. It sets finished_at (res.FinishedAt, or now when nil), the
// result and status = res.Status, and deletes the in-flight claim for the
// job's cache key if it names this job. won is false, and the record untouched,
// if the job was already terminal (a late duplicate). res.Status must be
// terminal; res.ID defaults to id. ErrNotFound if there is no record.
//
// Repeating a call with the same res (FinishedAt set) is safe and reports
// won again. With Config.MinReplicas set, the job's terminal state must then
// reach that many replicas: otherwise the error wraps ErrNotReplicated, won
// says whether res is the recorded result, and the caller repeats the call
// (against whichever server is primary by then) until it succeeds.
func (s *Jobs) Finish(ctx context.Context, id string, res job.Result) (won bool, err error) {
	return s.finish(ctx, "finish job "+id, id, res, false)
}

// Abandon is Finish for a job given up on by someone other than the attempt
// running it (its deliveries ran out): it refuses, with an error wrapping
// ErrLeased, while an attempt holds a live lease on the job, because that
// attempt is still running and will write the result itself.
func (s *Jobs) Abandon(ctx context.Context, id string, res job.Result) (won bool, err error) {
	return s.finish(ctx, "abandon job "+id, id, res, true)
}

func (s *Jobs) finish(ctx context.Context, op, id string, res job.Result, respectLease bool) (won bool, err error) {
	if !res.Status.Terminal() {
		return false, fmt.Errorf("%s: status %q is not terminal", op, res.Status)
	}
	if res.ID == "" {
		res.ID = id
	}
	if res.FinishedAt == nil {
		now := time.Now().UTC()
		res.FinishedAt = &now
	}
	raw, err := encodeResult(res)
	if err != nil {
		return false, fmt.Errorf("%s: %w", op, err)
	}
	respect := "0"
	if respectLease {
		respect = "1"
	}
	// The token lets a repeated call, whose first run won but whose reply
	// was lost or whose write was not replicated yet, learn that it won
	// instead of reading its own result as a rival's. It is derived from the
	// result, so the same result gives the same token.
	sum := sha256.Sum256(raw)
	token := hex.EncodeToString(sum[:16])
	sess, done := s.repl.session()
	defer done()
	n, err := finishScript.Run(ctx, sess, []string{s.keys.job(id)},
		string(res.Status), raw, formatTime(*res.FinishedAt), token, id, respect, s.repl.confirmFlag(), s.index.bound(), s.jobTTL).Int()
	if err != nil {
		return false, fail(op, err)
	}
	switch n {
	case -1:
		return false, fmt.Errorf("%s: %w", op, ErrNotFound)
	case 2:
		return false, fmt.Errorf("%s: %w", op, ErrLeased)
	}
	return n == 1, s.repl.await(ctx, sess, op)
}

// Cancel cancels a job. A queued job becomes canceled at once (terminal, with
// a Result of status canceled and error category canceled) and its in-flight
// claim is released. A running job gets CancelRequested and stays running:
// its worker must stop it and Finish it; Cancel returns StatusRunning. A
// terminal job is left unchanged and its status returned. ErrNotFound if
// there is no record.
func (s *Jobs) Cancel(ctx context.Context, id string) (job.Status, error) {
	st, _, err := s.CancelReport(ctx, id)
	return st, err
}

// CancelReport is Cancel that also says whether this very call turned a
// queued job canceled (false for a running job, a repeated cancel, or a job
// already terminal), so that a canceled job is counted once.
func (s *Jobs) CancelReport(ctx context.Context, id string) (st job.Status, canceledNow bool, err error) {
	op := "cancel job " + id
	now := time.Now()
	canceled, err := canceledResult(id, "job was canceled before it started", now)
	if err != nil {
		return "", false, fmt.Errorf("%s: %w", op, err)
	}
	reply, err := cancelScript.Run(ctx, s.rdb, []string{s.keys.job(id)}, canceled, formatTime(now), id, s.index.bound(), s.jobTTL).StringSlice()
	if errors.Is(err, redis.Nil) {
		return "", false, fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	if err != nil {
		return "", false, fail(op, err)
	}
	if len(reply) != 2 {
		return "", false, fmt.Errorf("%s: unexpected reply %q", op, reply)
	}
	return job.Status(reply[0]), reply[1] == "1", nil
}

// canceledResult is the Result of a job canceled without a worker finishing it.
func canceledResult(id, msg string, at time.Time) ([]byte, error) {
	at = at.UTC()
	raw, err := encodeResult(job.Result{
		ID:         id,
		Status:     job.StatusCanceled,
		Error:      job.NewFailure(job.CategoryCanceled, msg),
		FinishedAt: &at,
	})
	if err != nil {
		return nil, fmt.Errorf("canceled result: %w", err)
	}
	return raw, nil
}
