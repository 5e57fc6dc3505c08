package cache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// idempotencyClaim is the stored value of an Idempotency-Key claim.
type idempotencyClaim struct {
	JobID    string `json:"job_id"`
	BodyHash string `json:"body_hash"`
}

// ClaimIdempotency records that, within scope (for example an API key id),
// Idempotency-Key key belongs to job jobID created from a body whose hash is
// bodyHash; it is kept for Config.JobTTL. One round trip (SET NX GET).
//
// claimed is true when this call made the claim (or an identical one already
// existed). Otherwise existingJobID and existingHash describe the earlier
// claim: the same hash means a retry that should get the earlier job; a
// different hash means the key was reused for another request (HTTP 422).
func (s *Claims) ClaimIdempotency(ctx context.Context, scope, key, bodyHash, jobID string) (existingJobID, existingHash string, claimed bool, err error) {
	op := fmt.Sprintf("claim idempotency key in scope %s", scope)
	raw, err := json.Marshal(idempotencyClaim{JobID: jobID, BodyHash: bodyHash})
	if err != nil {
		return "", "", false, fmt.Errorf("%s: %w", op, err)
	}
	prev, err := s.rdb.SetArgs(ctx, s.keys.idempotency(scope, key), raw, redis.SetArgs{Mode: "NX", Get: true, TTL: s.cfg.JobTTL}).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return jobID, bodyHash, true, nil
	case err != nil:
		return "", "", false, fail(op, err)
	}
	var c idempotencyClaim
	if err := json.Unmarshal([]byte(prev), &c); err != nil {
		return "", "", false, fmt.Errorf("%s: decode earlier claim: %w", op, err)
	}
	return c.JobID, c.BodyHash, c.JobID == jobID && c.BodyHash == bodyHash, nil
}
