package cache

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/job"
)

// CreateAlias records a job answered from the result cache, so that its id
// can be read back like any other job's: a record born terminal holding res
// (already marked as a cache hit), with TTL Config.JobTTL, in its tenant's
// job index. It is light: the message keeps the runtime, limits, metadata,
// key and times but not the code, stdin, args or files, which the cached
// result does not need. A record already
// holding the id is left alone (a retried submission) and nil is returned.
func (s *Results) CreateAlias(ctx context.Context, msg job.Message, res job.Result) error {
	op := "create cache-hit record " + msg.ID
	args, err := s.aliasArgs(op, msg, res)
	if err != nil {
		return err
	}
	keys := append([]string{s.keys.job(msg.ID)}, s.index.sets(msg, res.Status)...)
	args = append(args, msg.ID, s.index.bound(), s.keys.jobIndex(msg.TenantOrDefault()))
	if err := createAliasScript.Run(ctx, s.rdb, keys, args...).Err(); err != nil && err != redis.Nil {
		return fail(op, err)
	}
	return nil
}

// aliasArgs are createAliasScript's arguments: msg light, res's status,
// res's stored form, finished_at and the TTL.
func (s *Results) aliasArgs(op string, msg job.Message, res job.Result) ([]any, error) {
	if msg.ID == "" || !res.Status.Terminal() {
		return nil, fmt.Errorf("%s: needs an id and a terminal result (status %q)", op, res.Status)
	}
	rawMsg, err := lightMessage(msg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	rawRes, err := encodeResult(res)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	finished := ""
	if res.FinishedAt != nil {
		finished = formatTime(*res.FinishedAt)
	}
	return []any{rawMsg, string(res.Status), rawRes, finished, s.jobTTL}, nil
}

// lightMessage is a cache-hit record's message: msg without the code,
// stdin, args or files, which the cached result does not need (its
// metadata stays: it is the caller's label on this job).
func lightMessage(msg job.Message) ([]byte, error) {
	light := msg
	light.Spec = job.Spec{Runtime: msg.Spec.Runtime, Limits: msg.Spec.Limits, Metadata: msg.Spec.Metadata}
	b, err := json.Marshal(light)
	if err != nil {
		return nil, fmt.Errorf("encode message: %w", err)
	}
	return b, nil
}

// createAliasScript: KEYS[1] job, KEYS[2..] the job index sets the job
// enters (jobindex.go); ARGV msg JSON, status, result JSON, finished_at, TTL
// ms, id, index trim bound, the job index. Returns 1 when created, 0 when a
// record exists.
var createAliasScript = redis.NewScript(indexLua + `
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'msg', ARGV[1], 'status', ARGV[2], 'result', ARGV[3], 'finished_at', ARGV[4], 'attempt', '0', 'cache_hit', '1', 'index', ARGV[8])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
for i = 2, #KEYS do
  index_add(KEYS[i], ARGV[6], ARGV[7], ARGV[5])
end
return 1
`)
