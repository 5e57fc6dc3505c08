package job

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// DefaultTenant is the one tenant of a server without API keys (dev mode).
const DefaultTenant = "default"

// WorkSubjectPrefix + runtime carries the wake-up that producers send after
// queueing a job, so idle workers look at the queue at once instead of at
// their next poll; its payload is the TenantJobSubject the job is on (empty
// from producers of earlier versions). Losing one only delays a job to
// that poll.
const WorkSubjectPrefix = "kiln.work."

// WorkSubject returns the wake-up subject of runtime.
func WorkSubject(runtime string) string { return WorkSubjectPrefix + runtime }

// TenantToken is the subject token of a tenant: 16 hex digits of the
// SHA-256 of its name, so any name makes a valid, fixed-length token and the
// queue's subjects do not show tenant names.
func TenantToken(tenant string) string {
	sum := sha256.Sum256([]byte(tenant))
	return hex.EncodeToString(sum[:8])
}

// TenantJobSubject is where a tenant's jobs for runtime are published:
// "kiln.jobs.<runtime>.<tenant token>". Workers serve these subjects in
// turn (fair share); JobSubject(runtime), without a tenant, is still served
// for messages published before tenants existed.
func TenantJobSubject(runtime, tenant string) string {
	return SubjectPrefix + runtime + "." + TenantToken(tenant)
}

// IsTenantJobSubject reports whether subject is a TenantJobSubject of
// runtime: the runtime's prefix and 16 lower-case hex digits.
func IsTenantJobSubject(runtime, subject string) bool {
	tok, ok := strings.CutPrefix(subject, SubjectPrefix+runtime+".")
	if !ok || len(tok) != 16 {
		return false
	}
	for _, c := range []byte(tok) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ScopedKey is Key computed within a result-cache scope (a tenant, or a
// group of tenants sharing a cache): jobs in different scopes never share a
// key, so they never share a cached result or an in-flight run. The empty
// scope is Key itself.
func ScopedKey(scope string, s Spec, imageDigest string) string {
	if scope == "" {
		return Key(s, imageDigest)
	}
	return keyWithScope(scope, s, imageDigest)
}

// CacheKey is the job's result-cache key for the image digest that ran it.
func (m Message) CacheKey(imageDigest string) string {
	return ScopedKey(m.CacheScope, m.Spec, imageDigest)
}

// TenantOrDefault is the tenant the job belongs to: messages written before
// tenants existed name none and belong to DefaultTenant. Everything scoped
// to a tenant (records, quotas, subjects, artifacts, output) uses this one
// answer.
func (m Message) TenantOrDefault() string { return TenantOr(m.Tenant) }

// TenantOr is the one rule for a tenant a payload leaves empty (written
// before tenants existed, or by a server without API keys): it is
// DefaultTenant.
func TenantOr(tenant string) string {
	if tenant == "" {
		return DefaultTenant
	}
	return tenant
}
