package job

import (
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"
)

// Metadata is a caller's own labels on a job or a session: a small map of
// strings (a platform's ids, a team, an experiment), returned with it and
// filterable in listings (tag=KEY=VALUE). It is the caller's input, kept
// as sent: not redacted, not part of the cache key.
type Metadata map[string]string

// Bounds of Metadata.
const (
	MaxMetadataKeys       = 16
	MaxMetadataKeyBytes   = 64
	MaxMetadataValueBytes = 256
)

// metadataKey is what a metadata key may hold: letters, digits and
// _ . : - (so a tag=KEY=VALUE filter reads unambiguously up to its first =).
var metadataKey = regexp.MustCompile(`^[A-Za-z0-9_.:-]+$`)

// ValidateMetadata checks m against the bounds; field names the map in
// the error ("metadata").
func ValidateMetadata(field string, m Metadata) error {
	if len(m) > MaxMetadataKeys {
		return invalid(field, fmt.Sprintf("%s has %d keys; the maximum is %d", field, len(m), MaxMetadataKeys))
	}
	for k, v := range m {
		f := field + "." + k
		switch {
		case k == "" || len(k) > MaxMetadataKeyBytes || !metadataKey.MatchString(k):
			return invalid(field, fmt.Sprintf("%s key %q must be 1 to %d of A-Z a-z 0-9 _ . : -", field, k, MaxMetadataKeyBytes))
		case len(v) > MaxMetadataValueBytes:
			return invalid(f, fmt.Sprintf("%s is %d bytes; the maximum is %d", f, len(v), MaxMetadataValueBytes))
		case !utf8.ValidString(v) || strings.ContainsRune(v, 0):
			return invalid(f, f+" must be UTF-8 text without NUL bytes")
		}
	}
	return nil
}

// Matches reports whether m holds every pair of tags.
func (m Metadata) Matches(tags Metadata) bool {
	for k, v := range tags {
		if got, ok := m[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// ParseTag reads a listing's tag filter, KEY=VALUE (the value may hold
// "="; it may be empty).
func ParseTag(s string) (key, value string, err error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return "", "", invalid("tag", fmt.Sprintf("tag %q must be KEY=VALUE", s))
	}
	if err := ValidateMetadata("tag", Metadata{k: v}); err != nil {
		return "", "", err
	}
	return k, v, nil
}

// Listing bounds (GET /v1/jobs without ids).
const (
	// ListPageDefault is the page size when the request names none.
	ListPageDefault = 20
	// ListPageMax bounds a page.
	ListPageMax = 100
)

// JobSummary is one job of a listing (GET /v1/jobs): what it is and how it
// ended, without its output; GET links.self for the whole job.
type JobSummary struct {
	ID         string     `json:"id"`
	Status     Status     `json:"status"`
	Runtime    string     `json:"runtime"`
	CreatedAt  time.Time  `json:"created_at"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	// Error is the failure's category, message and retryable (its
	// exception is left out: GET the job for it).
	Error    *Failure `json:"error,omitempty"`
	CacheHit bool     `json:"cache_hit"`
	Metadata Metadata `json:"metadata,omitempty"`
	ReplayOf string   `json:"replay_of,omitempty"`
	Links    JobLinks `json:"links"`
}

// JobLinks are the URLs of a job.
type JobLinks struct {
	Self string `json:"self"`
	Wait string `json:"wait"`
}

// JobPage is a page of a tenant's jobs, newest first. NextCursor, when
// set, reads the next page (?cursor=); absent, there is none.
type JobPage struct {
	Jobs       []JobSummary `json:"jobs"`
	NextCursor string       `json:"next_cursor,omitempty"`
}
