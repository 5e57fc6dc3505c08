package cache

import (
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	// ErrNotFound is returned when a job record does not exist (never created,
	// deleted, or expired after Config.JobTTL).
	ErrNotFound = errors.New("not found")

	// ErrExists is returned by CreateJob when a record with the same id exists.
	ErrExists = errors.New("already exists")

	// ErrLeased is returned by MarkRunningLeased and Abandon when another attempt
	// of the job holds a live lease: it is running somewhere right now (a
	// redelivery after lost heartbeats, not after a crash). The caller should
	// wait and ask again; the lease lapses when its holder stops renewing it.
	ErrLeased = errors.New("job is running under another attempt's lease")

	// ErrUnavailable wraps every failure to reach Redis: refused or dropped
	// connections, timeouts, a closed Store, the caller's context ending before
	// Redis answered, and replies meaning "not serving right now" (LOADING,
	// BUSY, MASTERDOWN, ...). The original error stays in the chain, so
	// errors.Is(err, context.DeadlineExceeded) still works.
	ErrUnavailable = errors.New("cache unavailable")

	// ErrNotReplicated is returned, wrapped, by Finish, Abandon and
	// ConfirmTerminal when fewer than Config.MinReplicas replicas
	// acknowledged the job's terminal state within Config.ReplicaWait: the
	// state is on the primary (readers see it) but a failover now could lose
	// it. The call is safe to repeat, against the same primary or a new
	// one; the job's queue message should be kept until one succeeds.
	ErrNotReplicated = errors.New("not acknowledged by enough replicas")
)

// notServing are reply prefixes with which a reachable server says it cannot
// serve now; to a caller they mean the same as a refused connection.
var notServing = []string{"LOADING ", "BUSY ", "MASTERDOWN ", "CLUSTERDOWN ", "TRYAGAIN ", "READONLY ", "NOREPLICAS ", "ERR max number of clients",
	"ERR WAIT cannot be used with replica instances"} // a primary demoted by a failover, before the client follows

// classify wraps err with ErrUnavailable unless it is a reply from a working
// server (redis.Nil, WRONGTYPE, a script error, ...). It is the single place
// where Redis failures are mapped to what callers should do about them.
func classify(err error) error {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, ErrUnavailable) {
		return err
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		msg := reply.Error()
		for _, p := range notServing {
			if strings.HasPrefix(msg, p) {
				return fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
		}
		return err
	}
	// Anything that is not a server reply happened on the way to or from
	// the server: dial, read/write, pool timeout, closed client, context.
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// fail prefixes err with the operation and maps it with classify.
func fail(op string, err error) error {
	return fmt.Errorf("%s: %w", op, classify(err))
}
