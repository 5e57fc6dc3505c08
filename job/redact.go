package job

// RedactMode is how much of a job's output a tenant has redacted before it
// leaves the worker (key file: redact=off|on|strict).
type RedactMode string

const (
	// RedactOn (the default, also the empty mode) replaces key-like strings
	// of the built-in kinds and the tenant's registered secrets and patterns.
	RedactOn RedactMode = "on"
	// RedactOff keeps output as the program wrote it.
	RedactOff RedactMode = "off"
	// RedactStrict adds generic assignments of secret-named settings
	// (password=..., api_key: ..., token = ...): more false positives, fewer
	// misses.
	RedactStrict RedactMode = "strict"
)

// Valid reports whether m is a known mode ("" is RedactOn).
func (m RedactMode) Valid() bool {
	switch m {
	case "", RedactOn, RedactOff, RedactStrict:
		return true
	}
	return false
}

// RedactPolicy is the part of a tenant's settings a worker needs to redact
// its jobs' output; the API puts it on each job's Message as it queues the
// job. Registered secrets travel as fingerprints, never as their text.
type RedactPolicy struct {
	Mode RedactMode `json:"mode,omitempty"`
	// Secrets are fingerprints of literal strings the tenant registered.
	Secrets []SecretPrint `json:"secrets,omitempty"`
	// Patterns are RE2 expressions the tenant registered, by name.
	Patterns []RedactPattern `json:"patterns,omitempty"`
}

// SecretPrint identifies a registered secret without carrying it: its
// length, a rolling hash the worker scans output with, and its SHA-256 that
// confirms a candidate.
type SecretPrint struct {
	Len    int    `json:"len"`
	Roll   uint64 `json:"roll"`
	SHA256 string `json:"sha256"`
}

// RedactPattern is a tenant's named RE2 pattern; its matches are counted as
// "pattern:" + Name.
type RedactPattern struct {
	Name   string `json:"name"`
	Regexp string `json:"regexp"`
}
