package events

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// cut never splits a UTF-8 character unless the chunk is final, and never
// returns more than MaxChunk bytes.
func TestCutKeepsCharactersWhole(t *testing.T) {
	text := bytes.Repeat([]byte("é"), MaxChunk) // 2 bytes each
	c := cut(text, false)
	if len(c) > MaxChunk || !utf8.Valid(c) || len(c) == 0 {
		t.Fatalf("cut of %d bytes of text: %d bytes, valid %v", len(text), len(c), utf8.Valid(c))
	}
	partial := []byte("ab\xe2\x82") // "ab" + the first two bytes of "€"
	if c := cut(partial, false); string(c) != "ab" {
		t.Errorf("non-final cut %q; want the incomplete character held back", c)
	}
	if c := cut(partial, true); !bytes.Equal(c, partial) {
		t.Errorf("final cut %q; want everything", c)
	}
	bin := bytes.Repeat([]byte{0xff}, MaxChunk+10)
	if c := cut(bin, false); len(c) != MaxChunk {
		t.Errorf("cut of binary: %d bytes; want %d", len(c), MaxChunk)
	}
}

// Output written faster than the live view carries is left out of it with
// an output_skipped event at the point of the gap, counting the bytes:
// what a reader sees plus what it is told it skipped is the whole stream
// up to the job's cap; bytes past the cap are not "skipped" (the stored
// output stops there too).
func TestOutputSaysWhatTheLiveViewSkipped(t *testing.T) {
	n := testenv.StartNATS(t)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	id := job.NewID()
	type ev struct {
		typ  string
		data []byte
	}
	got := make(chan ev, 1000)
	sub, err := nc.Subscribe(job.EventsSubject(id), func(m *nats.Msg) {
		got <- ev{m.Header.Get(job.HeaderEvent), m.Data}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const capBytes = 5 << 20
	o := NewOutput(nc, id, capBytes, func(err error) { t.Error(err) })
	o.Write("stdout", bytes.Repeat([]byte("a"), 4<<20)) // at once: 1 MiB is held, 3 MiB skipped
	o.Write("stdout", []byte("tail\n"))                 // pending is still full: skipped too, the same gap
	o.Close()
	var shown, skipped int64
	var order []string
	deadline := time.After(10 * time.Second)
	for shown+skipped < 4<<20+5 {
		select {
		case e := <-got:
			switch e.typ {
			case job.EventStdout:
				var oe job.OutputEvent
				if err := json.Unmarshal(e.data, &oe); err != nil {
					t.Fatal(err)
				}
				shown += int64(len(oe.Data))
				if len(order) == 0 || order[len(order)-1] != "stdout" {
					order = append(order, "stdout")
				}
			case job.EventOutputSkipped:
				var se job.SkippedEvent
				if err := json.Unmarshal(e.data, &se); err != nil || se.Stream != "stdout" {
					t.Fatalf("skip event %s: %v", e.data, err)
				}
				skipped += se.Bytes
				order = append(order, "skipped")
			}
		case <-deadline:
			t.Fatalf("shown %d + skipped %d bytes; want %d", shown, skipped, 4<<20+5)
		}
	}
	if shown != maxPending || skipped != 3<<20+5 || strings.Join(order, ",") != "stdout,skipped" {
		t.Fatalf("shown %d, skipped %d, order %v; want 1 MiB shown, then 3 MiB + 5 skipped", shown, skipped, order)
	}

	// Past the cap, nothing is counted as skipped.
	id2 := job.NewID()
	got2 := make(chan string, 100)
	sub2, err := nc.Subscribe(job.EventsSubject(id2), func(m *nats.Msg) { got2 <- m.Header.Get(job.HeaderEvent) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub2.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	o3 := NewOutput(nc, id2, 10, nil)
	o3.Write("stderr", bytes.Repeat([]byte("b"), 100))
	o3.Close()
	// A status event after Close marks the end of what the output sent.
	if err := Status(nc, id2, job.StatusSucceeded, "w"); err != nil {
		t.Fatal(err)
	}
	if typ := testkit.Receive(t, got2, 5*time.Second, "the capped chunk"); typ != job.EventStderr {
		t.Fatalf("event %s", typ)
	}
	if typ := testkit.Receive(t, got2, 5*time.Second, "the end marker"); typ != job.EventStatus {
		t.Fatalf("an event past the cap: %s", typ)
	}
}
