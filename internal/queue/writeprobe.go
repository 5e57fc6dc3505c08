package queue

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// The write probe: one small message written to a stream of its own, with
// the job stream's storage and replicas, keeping only the last. A store that
// cannot write (a full disk, which NATS latches until restarted) fails the
// probe; the API and the workers fail /readyz while it does.
const (
	ProbeStream  = "KILN_STORE_PROBE"
	ProbeSubject = "kiln.probe.store"
)

// ProbeWrite creates the probe stream if it is missing (it never changes an
// existing one's settings) and writes one message to it.
func (c Config) ProbeWrite(ctx context.Context, js jetstream.JetStream) error {
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: ProbeStream, Description: "Kiln's check that JetStream's store takes writes",
		Subjects: []string{ProbeSubject}, Storage: jetstream.FileStorage, Replicas: c.StreamConfig().Replicas,
		MaxMsgs: 1, Discard: jetstream.DiscardOld,
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return err
	}
	_, err = js.Publish(ctx, ProbeSubject, nil)
	return err
}
