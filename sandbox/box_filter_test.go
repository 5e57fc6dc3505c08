package sandbox

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kilnrun/kiln/sandbox/jobfilter"
)

// Runtimes sharing a state dir write the job filter at once, each whole:
// every writer succeeds, the file holds the filter, and no temporary file
// is left (CI saw one writer's rename find the other's shared temporary
// file gone).
func TestJobFilterWrittenByManyAtOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := &hostSide{cfg: Config{StateDir: dir}, jobFilterFile: filepath.Join(dir, "w-job.bpf")}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() { errs <- h.writeJobFilter() })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	want, err := jobfilter.Build()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(h.jobFilterPath())
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the job filter: %d bytes, %v; want the %d bytes jobfilter builds", len(got), err, len(want))
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("state dir holds %d files; want the filter alone", len(ents))
	}
}
