package cache

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestServerRepliesAreNotOutages(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	// A working server's refusal (wrong type) is a bug to report, not a 503.
	s.rdb.Set(ctx, s.keys.job("wrongtype"), "x", 0)
	_, err := s.GetJob(ctx, "wrongtype")
	if err == nil || errors.Is(err, ErrUnavailable) {
		t.Fatalf("WRONGTYPE reply = %v, want an error that is not ErrUnavailable", err)
	}
	// A canceled call is reported as unavailable, and still as canceled.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.GetJob(cctx, "any")
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled call = %v", err)
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err         error
		unavailable bool
	}{
		{redis.Nil, false},
		{redis.ErrClosed, true},
		{redis.ErrPoolTimeout, true},
		{context.DeadlineExceeded, true},
		{redisReply("LOADING Redis is loading the dataset in memory"), true},
		{redisReply("BUSY Redis is busy running a script"), true},
		{redisReply("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{redisReply("ERR Error running script"), false},
	} {
		if got := errors.Is(classify(tc.err), ErrUnavailable); got != tc.unavailable {
			t.Errorf("classify(%v) unavailable = %v, want %v", tc.err, got, tc.unavailable)
		}
		if !errors.Is(classify(tc.err), tc.err) {
			t.Errorf("classify(%v) lost the original error", tc.err)
		}
	}
}

// redisReply is an error reply as go-redis reports it.
type redisReply string

func (e redisReply) Error() string { return string(e) }
func (redisReply) RedisError()     {}
