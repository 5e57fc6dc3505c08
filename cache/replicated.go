package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/job"
)

// Redis replicates asynchronously: the primary answers a write before any
// replica has it, and a failover promotes a replica that may lack the last
// writes. Most of Kiln's state survives that: a job record still queued is
// restored from its queue message (RestoreJob). A job's terminal state does
// not: once a worker acks the job's message nothing is left to redo the job
// from, and the new primary would keep the record queued or running forever.
// So with Config.MinReplicas set, every call after which a worker acks
// (Finish, Abandon, ConfirmTerminal) ends with WAIT on the connection that
// made its write, and fails with ErrNotReplicated when too few replicas
// acknowledged it.

// replicas is the Store's side of replication: Config.MinReplicas and
// ReplicaWait, and the WAIT after a write that needs them.
type replicas struct {
	*conn
	min  int
	wait time.Duration
}

// session is what one replicated call runs on. WAIT counts only the writes
// of its own connection, so the write and the WAIT must share one.
type session interface {
	redis.Scripter
	Wait(ctx context.Context, numReplicas int, timeout time.Duration) *redis.IntCmd
}

// session returns a single connection when MinReplicas asks for a WAIT, and
// the pool otherwise; done releases it.
func (r replicas) session() (sess session, done func()) {
	if r.min == 0 {
		return r.rdb, func() {}
	}
	cn := r.rdb.Conn()
	return cn, func() { _ = cn.Close() }
}

// confirmFlag tells a script to make a write even where it changes nothing,
// so that the WAIT after it has this server's state of the record to wait
// for: the replication stream is ordered, so a replica that acknowledged the
// write holds everything the primary had applied before it.
func (r replicas) confirmFlag() string {
	if r.min > 0 {
		return "1"
	}
	return "0"
}

// await sends WAIT on sess, after its write, when MinReplicas is set.
func (r replicas) await(ctx context.Context, sess session, op string) error {
	if r.min == 0 {
		return nil
	}
	n, err := sess.Wait(ctx, r.min, r.wait).Result()
	if err != nil {
		return fail(op+": wait for replicas", err)
	}
	if int(n) < r.min {
		return fmt.Errorf("%s: %d of %d replicas acknowledged it within %v: %w", op, n, r.min, r.wait, ErrNotReplicated)
	}
	return nil
}

// ConfirmTerminal returns the job's status and, when it is terminal and
// Config.MinReplicas is set, first makes sure that many replicas hold it. A
// worker that finds a job already terminal calls it before acking the job's
// message: that state may still be on the primary alone (the attempt that
// wrote it was stopped before a replica confirmed it). The error wraps
// ErrNotReplicated when too few replicas acknowledged within
// Config.ReplicaWait (repeat the call), and ErrNotFound when there is no
// record. A status that is not terminal (a failover reverted the record) is
// returned without waiting.
func (s *Jobs) ConfirmTerminal(ctx context.Context, id string) (job.Status, error) {
	op := "confirm job " + id + " terminal"
	sess, done := s.repl.session()
	defer done()
	st, err := confirmScript.Run(ctx, sess, []string{s.keys.job(id)}, s.repl.confirmFlag()).Text()
	if errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	if err != nil {
		return "", fail(op, err)
	}
	status := job.Status(st)
	if !status.Terminal() {
		return status, nil
	}
	return status, s.repl.await(ctx, sess, op)
}

// warnFew logs when the primary has fewer replicas connected than
// MinReplicas: every job's result would wait for them (a worker configured
// for replicas against a single server would hold every job).
func (r replicas) warnFew(ctx context.Context) {
	if r.min == 0 {
		return
	}
	info, err := r.rdb.Info(ctx, "replication").Result()
	if err != nil {
		return
	}
	for _, line := range strings.Split(info, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:")
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(v); err == nil && n < r.min {
			r.log.WarnContext(ctx, "redis primary has fewer replicas than MinReplicas; job results wait for them before their messages are acked",
				slog.Int("connected_replicas", n), slog.Int("min_replicas", r.min))
		}
		return
	}
}
