package producer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/kilnrun/kiln/job"
)

// messageHeadroom is left in a NATS message for the headers and the
// message's own fields around the spec.
const messageHeadroom = 64 << 10

// byReference returns msg unchanged when it fits in one NATS message, else
// with its spec stored in the object store under the caller's tenant and
// only a reference (plus runtime, limits, cache flag and network: what
// Spec.CacheEnabled and a worker's set-up read before the spec is fetched)
// left in it.
func (q *jobQueue) byReference(ctx context.Context, msg job.Message) (job.Message, error) {
	raw, err := json.Marshal(msg.Spec)
	if err != nil {
		return msg, fmt.Errorf("encode job spec: %w", err)
	}
	if int64(len(raw)) <= q.nc.MaxPayload()-messageHeadroom {
		return msg, nil
	}
	sum := sha256.Sum256(raw)
	ref := job.ObjectRef{Tenant: msg.Tenant, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(raw))}
	if err := q.blobs.Put(ctx, ref, bytes.NewReader(raw)); err != nil {
		return msg, fmt.Errorf("store spec of job %s: %w", msg.ID, err)
	}
	msg.SpecRef = &ref
	msg.Spec = job.Spec{Runtime: msg.Spec.Runtime, Limits: msg.Spec.Limits, Cache: msg.Spec.Cache, Budget: msg.Spec.Budget, Network: msg.Spec.Network,
		Metadata: msg.Spec.Metadata}
	return msg, nil
}
