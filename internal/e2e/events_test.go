package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// sseEvent is one Server-Sent Event as a client saw it.
type sseEvent struct {
	id, typ, data string
	at            time.Time
}

// followEvents reads GET /v1/jobs/{id}/events into a channel, closed when
// the stream ends.
func followEvents(t *testing.T, ctx context.Context, base, id, lastEventID string) <-chan sseEvent {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/jobs/"+id+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	ch := make(chan sseEvent, 1000)
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 4<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.typ != "" {
					ev.at = time.Now()
					ch <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				ev.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.typ = line[7:]
			case strings.HasPrefix(line, "data: "):
				ev.data = line[6:]
			}
		}
	}()
	return ch
}

func outputText(t *testing.T, ev sseEvent) string {
	var o job.OutputEvent
	if err := json.Unmarshal([]byte(ev.data), &o); err != nil {
		t.Fatalf("%s event data %q: %v", ev.typ, ev.data, err)
	}
	b, _ := o.Bytes()
	return string(b)
}

// collect drains ch, failing the test if it does not end within d.
func collect(t *testing.T, ch <-chan sseEvent, d time.Duration) []sseEvent {
	t.Helper()
	var evs []sseEvent
	timeout := time.After(d)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return evs
			}
			evs = append(evs, ev)
		case <-timeout:
			t.Fatalf("event stream did not end within %v; got %+v", d, evs)
		}
	}
}

// Live output over SSE, with the worker in its own process (its own NATS
// connection): the first line arrives while the job still sleeps; a client
// joining late gets the retained output, then follows; Last-Event-ID
// resumes after the event named; a finished job's stream is its Result.
func TestEventsLiveOutput(t *testing.T) {
	e := setup(t)
	e.workerProc(t, "w-events")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sub, err := e.api.Submit(ctx, py(`
import os, sys, time
print("first line", flush=True)
time.sleep(2)
print("second line", flush=True)
open(os.environ["KILN_OUTPUT_DIR"] + "/note.txt", "w").write("done")
`))
	if err != nil {
		t.Fatal(err)
	}
	a := followEvents(t, ctx, e.apiURL, sub.ID, "")
	var evs []sseEvent
	var first sseEvent
	for first.typ == "" {
		select {
		case ev, ok := <-a:
			if !ok {
				t.Fatalf("stream ended before the first line: %+v", evs)
			}
			evs = append(evs, ev)
			if ev.typ == job.EventStdout && strings.Contains(outputText(t, ev), "first line") {
				first = ev
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("no first line within 60s: %+v", evs)
		}
	}
	// Late clients, while the job sleeps: one from the start, one resuming.
	late := followEvents(t, ctx, e.apiURL, sub.ID, "")
	resumed := followEvents(t, ctx, e.apiURL, sub.ID, first.id)
	evs = append(evs, collect(t, a, 60*time.Second)...)
	end := evs[len(evs)-1]
	if end.typ != job.EventResult {
		t.Fatalf("last event %+v; want result", end)
	}
	if gap := end.at.Sub(first.at); gap < 1500*time.Millisecond {
		t.Errorf("first line came %v before the result; want > 1.5s (live, not at the end)", gap)
	}
	var res job.Result
	if err := json.Unmarshal([]byte(end.data), &res); err != nil || res.Status != job.StatusSucceeded || res.Stdout != "first line\nsecond line\n" {
		t.Errorf("result event %q (%v)", end.data, err)
	}
	types := map[string]int{}
	var stdout strings.Builder
	for _, ev := range evs {
		types[ev.typ]++
		if ev.typ == job.EventStdout {
			stdout.WriteString(outputText(t, ev))
		}
		if ev.typ == job.EventArtifacts && !strings.Contains(ev.data, `"note.txt"`) {
			t.Errorf("artifacts event %q lacks note.txt", ev.data)
		}
	}
	if stdout.String() != "first line\nsecond line\n" || types[job.EventStatus] < 2 || types[job.EventArtifacts] != 1 {
		t.Errorf("events: %v, stdout %q", types, stdout.String())
	}

	lateEvs := collect(t, late, 30*time.Second)
	var lateOut strings.Builder
	for _, ev := range lateEvs {
		if ev.typ == job.EventStdout {
			lateOut.WriteString(outputText(t, ev))
		}
	}
	if lateOut.String() != "first line\nsecond line\n" || lateEvs[len(lateEvs)-1].typ != job.EventResult {
		t.Errorf("late client: stdout %q, events %+v", lateOut.String(), lateEvs)
	}
	resEvs := collect(t, resumed, 30*time.Second)
	var resOut strings.Builder
	for _, ev := range resEvs {
		if ev.typ == job.EventStdout {
			resOut.WriteString(outputText(t, ev))
		}
	}
	if resOut.String() != "second line\n" || resEvs[len(resEvs)-1].typ != job.EventResult {
		t.Errorf("resumed after %s: stdout %q; want only the second line", first.id, resOut.String())
	}

	// Finished: the Result at once.
	start := time.Now()
	done := collect(t, followEvents(t, ctx, e.apiURL, sub.ID, ""), 5*time.Second)
	if len(done) != 1 || done[0].typ != job.EventResult || time.Since(start) > time.Second {
		t.Errorf("finished job's stream: %+v after %v; want the result at once", done, time.Since(start))
	}
}
