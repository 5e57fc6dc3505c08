package events

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/redact"
)

// A key written in two halves, the first published chunk ending inside it,
// never reaches live viewers: the redacting stream holds the half back.
func TestRedactedOutputCatchesAKeySplitAcrossChunks(t *testing.T) {
	n := testenv.StartNATS(t)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	id := job.NewID()
	got := make(chan string, 100)
	sub, err := nc.Subscribe(job.EventsSubject(id), func(m *nats.Msg) {
		var ev job.OutputEvent
		if m.Header.Get(job.HeaderEvent) == job.EventStdout && json.Unmarshal(m.Data, &ev) == nil {
			b, _ := ev.Bytes()
			got <- string(b)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	d, err := redact.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	key := "ghp_" + strings.Repeat("aB3", 12)
	o := NewRedactedOutput(nc, id, 1<<20, d, func(err error) { t.Error(err) })
	lead := strings.Repeat("progress line\n", 100) // past the held tail, so a chunk goes out
	o.Write("stdout", []byte(lead+"token="+key[:10]))
	first := <-got
	if strings.Contains(first, "ghp_") {
		t.Fatalf("first chunk carries the key's first half: %q", first[len(first)-40:])
	}
	o.Write("stdout", []byte(key[10:]+"\ndone\n"))
	o.Close()
	all := first
	for len(got) > 0 {
		all += <-got
	}
	// Close published everything before returning; the subscription may
	// still be delivering the last events.
	for !strings.HasSuffix(all, "done\n") {
		all += testkit.Receive(t, got, 5*time.Second, fmt.Sprintf("the rest of the output after %q", all[max(0, len(all)-80):]))
	}
	if strings.Contains(all, key[4:14]) || !strings.Contains(all, "token="+redact.Replacement(redact.KindGitHubToken)+"\ndone\n") {
		t.Fatalf("live output: %q", all[len(lead)-20:])
	}
	if all[:len(lead)] != lead {
		t.Fatal("text before the key changed")
	}
}
