package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// Issue 40, acceptance 8 (last part): a job that writes 4 MiB at once
// gives a reader of its live events what the live view carries, then an
// output_skipped event with the bytes it left out: shown and skipped add
// up to the 4 MiB the stored result has.
func TestLiveViewSaysWhatItSkipped(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "w-skip", 1)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const total = 4 << 20
	spec := py("import sys, time\ntime.sleep(1)\nsys.stdout.write('a' * %d)\nsys.stdout.flush()\n", total)
	spec.Limits.OutputBytes = 8 << 20
	spec.Cache = job.CacheOff()
	sub, err := e.api.Submit(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	evs := followEvents(t, ctx, e.apiURL, sub.ID, "")
	var shown, skipped int64
	var order []string
	for _, ev := range collect(t, evs, 90*time.Second) {
		switch ev.typ {
		case job.EventStdout:
			shown += int64(len(outputText(t, ev)))
			if len(order) == 0 || order[len(order)-1] != ev.typ {
				order = append(order, ev.typ)
			}
		case job.EventOutputSkipped:
			var sk job.SkippedEvent
			if err := json.Unmarshal([]byte(ev.data), &sk); err != nil || sk.Stream != job.EventStdout || sk.Bytes <= 0 {
				t.Fatalf("skip event %s: %v", ev.data, err)
			}
			skipped += sk.Bytes
			order = append(order, ev.typ)
		}
	}
	t.Logf("live view: %d bytes shown, %d skipped, events %v", shown, skipped, order)
	if skipped == 0 || shown+skipped != total {
		t.Errorf("shown %d + skipped %d bytes; want a skip, adding up to %d", shown, skipped, total)
	}
	if len(order) == 0 || order[0] != job.EventStdout || !strings.Contains(strings.Join(order, ","), job.EventOutputSkipped) {
		t.Errorf("events in order %v; want output, then the skip", order)
	}
	v, err := e.api.Wait(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != job.StatusSucceeded || v.StdoutBytes != total || len(v.Stdout) != total {
		t.Fatalf("the stored result: %s, %d bytes counted, %d kept", v.Status, v.StdoutBytes, len(v.Stdout))
	}
}
