package job

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// MaxCacheAgeS bounds CachePolicy.MaxAgeS (30 days). The server's result TTL
// bounds it further: an entry gone from Redis cannot answer whatever the age.
const MaxCacheAgeS = 30 * 24 * 3600

// CachePolicy is a spec's "cache" member: JSON false (never answer from the
// cache, never store, never coalesce), true (answer with a result no older
// than the server's default max age), or {"max_age_s": N} (answer with a
// result no older than N seconds).
type CachePolicy struct {
	// Off is set by JSON false.
	Off bool
	// MaxAgeS is the oldest cached result, in seconds, the client accepts; 0
	// means the server's default.
	MaxAgeS int64
}

// CacheOff is the policy of JSON false.
func CacheOff() *CachePolicy { return &CachePolicy{Off: true} }

// MarshalJSON writes false, true or {"max_age_s": N}.
func (c CachePolicy) MarshalJSON() ([]byte, error) {
	switch {
	case c.Off:
		return []byte("false"), nil
	case c.MaxAgeS == 0:
		return []byte("true"), nil
	}
	return []byte(`{"max_age_s":` + strconv.FormatInt(c.MaxAgeS, 10) + `}`), nil
}

// UnmarshalJSON reads false, true or {"max_age_s": N} with 1 <= N <=
// MaxCacheAgeS. Anything else is an *InvalidError naming the field.
func (c *CachePolicy) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch string(b) {
	case "true":
		*c = CachePolicy{}
		return nil
	case "false":
		*c = CachePolicy{Off: true}
		return nil
	}
	if len(b) == 0 || b[0] != '{' {
		return invalid("cache", `cache must be false, true or {"max_age_s": N}`)
	}
	var obj struct {
		MaxAgeS *int64 `json:"max_age_s"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&obj); err != nil {
		return invalid("cache", fmt.Sprintf(`cache must be false, true or {"max_age_s": N} with N a whole number of seconds: %v`, err))
	}
	if obj.MaxAgeS == nil {
		return invalid("cache.max_age_s", `cache object needs "max_age_s": the oldest cached result you accept, in seconds`)
	}
	if *obj.MaxAgeS < 1 || *obj.MaxAgeS > MaxCacheAgeS {
		return invalid("cache.max_age_s", fmt.Sprintf("max_age_s is %d; it must be between 1 and %d seconds (send \"cache\": false to never use the cache)", *obj.MaxAgeS, MaxCacheAgeS))
	}
	*c = CachePolicy{MaxAgeS: *obj.MaxAgeS}
	return nil
}
