package events

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// A job's end is one message, a batch of its terminal status, artifact
// list and end marker in that order, after its display outputs; Split gives
// back the events. A batch too large for one message goes as its events.
func TestEndIsOneBatchAfterTheOutputs(t *testing.T) {
	nc, err := nats.Connect(testenv.StartNATS(t).URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	end := func(res job.Result) []*nats.Msg {
		t.Helper()
		id := job.NewID()
		got := make(chan *nats.Msg, 64)
		sub, err := nc.ChanSubscribe(job.EventsSubject(id), got)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		res.ID = id
		if err := End(nc, id, res); err != nil {
			t.Fatal(err)
		}
		var msgs []*nats.Msg
		for {
			m := testkit.Receive(t, got, 10*time.Second, "an end event")
			msgs = append(msgs, m)
			evs := Split(m.Header.Get(job.HeaderEvent), m.Data)
			if len(evs) > 0 && evs[len(evs)-1].Event == job.EventResult {
				return msgs
			}
		}
	}
	types := func(msgs []*nats.Msg) (wire, served []string) {
		for _, m := range msgs {
			wire = append(wire, m.Header.Get(job.HeaderEvent))
			for _, ev := range Split(m.Header.Get(job.HeaderEvent), m.Data) {
				served = append(served, ev.Event)
			}
		}
		return wire, served
	}

	res := job.Result{Status: job.StatusSucceeded, Worker: "w1",
		Outputs:   []job.Output{{Type: "display_data", Data: map[string]json.RawMessage{job.MIMEText: json.RawMessage(`"hi"`)}}},
		Artifacts: []job.Artifact{{Name: "out.txt", Size: 2}}}
	msgs := end(res)
	wire, served := types(msgs)
	if !slices.Equal(wire, []string{job.EventOutput, job.EventBatch}) ||
		!slices.Equal(served, []string{job.EventOutput, job.EventStatus, job.EventArtifacts, job.EventResult}) {
		t.Fatalf("wire %v, served %v", wire, served)
	}
	batch := Split(job.EventBatch, msgs[1].Data)
	var st job.StatusEvent
	var arts []job.Artifact
	if json.Unmarshal(batch[0].Data, &st) != nil || st.Status != job.StatusSucceeded || st.Worker != "w1" ||
		json.Unmarshal(batch[1].Data, &arts) != nil || len(arts) != 1 || arts[0].Name != "out.txt" {
		t.Fatalf("batch %s", msgs[1].Data)
	}

	// An artifact list that alone fits a message, but not with the rest of
	// the batch: three messages.
	item := job.Artifact{Name: strings.Repeat("a", 40), Size: 1 << 20, SHA256: strings.Repeat("0", 64), ContentType: "text/plain"}
	one, _ := json.Marshal(item)
	many := make([]job.Artifact, (maxBatchBytes-64)/(len(one)+1)+1)
	for i := range many {
		many[i] = item
	}
	if b, _ := json.Marshal(many); len(b) > maxBatchBytes || len(b)+200 < maxBatchBytes {
		t.Fatalf("artifact list of %d bytes; want just under %d", len(b), maxBatchBytes)
	}
	wire, served = types(end(job.Result{Status: job.StatusFailed, Artifacts: many}))
	if !slices.Equal(wire, []string{job.EventStatus, job.EventArtifacts, job.EventResult}) || !slices.Equal(wire, served) {
		t.Fatalf("large end: wire %v, served %v", wire, served)
	}
	if Split(job.EventBatch, []byte("not json")) != nil {
		t.Fatal("an undecodable batch carries events")
	}
}
