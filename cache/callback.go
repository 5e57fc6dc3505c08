package cache

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/job"
)

// fieldCallback is the job record's callback delivery state (job.CallbackState JSON).
const fieldCallback = "callback"

// setCallbackScript: KEYS[1] job; ARGV state JSON. Writes the callback field
// of an existing record (never resurrects an expired one). Returns 1, or 0
// when there is no record.
var setCallbackScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'callback', ARGV[1])
return 1
`)

// SetCallback records where the job's callback delivery stands.
// ErrNotFound if there is no record.
func (s *Jobs) SetCallback(ctx context.Context, id string, st job.CallbackState) error {
	op := "set callback state of job " + id
	raw, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("%s: encode: %w", op, err)
	}
	n, err := setCallbackScript.Run(ctx, s.rdb, []string{s.keys.job(id)}, raw).Int()
	if err != nil {
		return fail(op, err)
	}
	if n == 0 {
		return fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	return nil
}

// decodeCallback reads the record's callback field; nil when absent.
func decodeCallback(h map[string]string) (*job.CallbackState, error) {
	v := h[fieldCallback]
	if v == "" {
		return nil, nil
	}
	st := new(job.CallbackState)
	if err := json.Unmarshal([]byte(v), st); err != nil {
		return nil, fmt.Errorf("decode callback state: %w", err)
	}
	return st, nil
}
