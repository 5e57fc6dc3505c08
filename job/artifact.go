package job

import (
	"fmt"
	"regexp"
)

// OutputDir is the directory inside the sandbox whose files come back as
// artifacts once the program has ended. The sandbox also names it in the
// environment as OutputDirEnv.
const (
	OutputDir    = "/work/out"
	OutputDirEnv = "KILN_OUTPUT_DIR"
)

// Artifact is a file the job left in its output directory, stored
// content-addressed and downloadable at GET /v1/jobs/{id}/artifacts/{name}.
type Artifact struct {
	// Name is the file's path relative to the output dir ("plots/a.png").
	Name string `json:"name"`
	// Size is the file's length in bytes.
	Size int64 `json:"size"`
	// SHA256 is the hex SHA-256 of the content; it is also the download's ETag.
	SHA256 string `json:"sha256" redact:"platform"`
	// ContentType is sniffed from the content (never taken from the name).
	ContentType string `json:"content_type"`
}

// SkippedArtifact is an entry of the output dir that was not kept.
type SkippedArtifact struct {
	Name   string `json:"name"`
	Size   int64  `json:"size,omitempty"`
	Reason string `json:"reason" redact:"platform"`
}

// Reasons an entry of the output dir is skipped.
const (
	SkipNotRegular = "not_regular_file" // symlink, FIFO, socket, device
	SkipTooLarge   = "file_too_large"   // over the per-file cap
	SkipTotal      = "total_too_large"  // would take the total over its cap
	SkipCount      = "too_many_files"   // over the count cap
	SkipName       = "bad_name"         // name not valid UTF-8 or too long
	SkipError      = "read_error"       // could not be read or stored
)

// MaxSkippedListed bounds Result.ArtifactsSkipped; the rest are only counted.
const MaxSkippedListed = 100

// ArtifactCaps bound what is collected from the output dir of one job.
type ArtifactCaps struct {
	// MaxFiles is how many files are kept at most. Default 64.
	MaxFiles int `json:"max_files"`
	// MaxFileBytes is the largest file kept. Default 32 MiB.
	MaxFileBytes int64 `json:"max_file_bytes"`
	// MaxTotalBytes is the most kept over all files. Default 64 MiB.
	MaxTotalBytes int64 `json:"max_total_bytes"`
}

// DefaultArtifactCaps are the caps unless the worker is configured otherwise.
var DefaultArtifactCaps = ArtifactCaps{MaxFiles: 64, MaxFileBytes: 32 << 20, MaxTotalBytes: 64 << 20}

// MaxArtifactCaps are the largest caps a worker may be configured with.
var MaxArtifactCaps = ArtifactCaps{MaxFiles: 1000, MaxFileBytes: 256 << 20, MaxTotalBytes: 1 << 30}

// Validate checks the caps are positive and within MaxArtifactCaps.
func (c ArtifactCaps) Validate() error {
	if c.MaxFiles <= 0 || c.MaxFiles > MaxArtifactCaps.MaxFiles {
		return fmt.Errorf("artifact caps: max_files %d must be between 1 and %d", c.MaxFiles, MaxArtifactCaps.MaxFiles)
	}
	if c.MaxFileBytes <= 0 || c.MaxFileBytes > MaxArtifactCaps.MaxFileBytes {
		return fmt.Errorf("artifact caps: max_file_bytes %d must be between 1 and %d", c.MaxFileBytes, MaxArtifactCaps.MaxFileBytes)
	}
	if c.MaxTotalBytes <= 0 || c.MaxTotalBytes > MaxArtifactCaps.MaxTotalBytes {
		return fmt.Errorf("artifact caps: max_total_bytes %d must be between 1 and %d", c.MaxTotalBytes, MaxArtifactCaps.MaxTotalBytes)
	}
	return nil
}

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ObjectName is the object-store name of content with hex SHA-256 sum owned
// by tenant: content is deduplicated within a tenant, never across tenants.
func ObjectName(tenant, sum string) string { return "t/" + tenant + "/sha256/" + sum }

// ObjectRef points at content in the object store (ObjectName(Tenant, SHA256)).
type ObjectRef struct {
	Tenant string `json:"tenant"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Name is the object's name in the store.
func (r ObjectRef) Name() string { return ObjectName(r.Tenant, r.SHA256) }
