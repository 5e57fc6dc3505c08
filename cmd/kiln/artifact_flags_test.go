package main

import (
	"flag"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox"
)

// The artifact caps are worker settings: flags (or their env variables)
// reach the sandbox config, and a cap beyond the server maximum is refused
// when the runtime's config is checked, naming the cap.
func TestArtifactCapFlags(t *testing.T) {
	var cfg workerConfig
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	workerFlags(fs, &cfg, false)
	if cfg.Artifacts != job.DefaultArtifactCaps {
		t.Fatalf("defaults %+v; want %+v", cfg.Artifacts, job.DefaultArtifactCaps)
	}
	if err := fs.Parse([]string{"--artifact-max-files", "5", "--artifact-max-file-bytes", "1024", "--artifact-max-bytes", "4096"}); err != nil {
		t.Fatal(err)
	}
	if want := (job.ArtifactCaps{MaxFiles: 5, MaxFileBytes: 1024, MaxTotalBytes: 4096}); cfg.Artifacts != want {
		t.Fatalf("parsed %+v; want %+v", cfg.Artifacts, want)
	}
	over := sandbox.Config{ArtifactCaps: job.ArtifactCaps{MaxFiles: job.MaxArtifactCaps.MaxFiles + 1, MaxFileBytes: 1, MaxTotalBytes: 1}}
	if err := over.Validate(); err == nil || !strings.Contains(err.Error(), "max_files") {
		t.Fatalf("a cap over the maximum: %v; want an error naming max_files", err)
	}
}
