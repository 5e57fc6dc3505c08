package producer

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/kilnrun/kiln/job"
)

// listChunk is how many records a list reads from Redis at a time, so a
// list holds at most this many records beyond its size bound.
const listChunk = 10

// listViews renders the jobs ids name, in order, reading the records
// listChunk at a time. Once the rendered jobs reach MaxListBytes, the
// remaining ids are answered with a response-too-large error without being
// read (the first job is always rendered, whatever its size).
func (jr *jobRoutes) listViews(ctx context.Context, tenant string, ids []string) ([]any, error) {
	out := make([]any, 0, len(ids))
	size := int64(0)
	for start := 0; start < len(ids); start += listChunk {
		chunk := ids[start:min(start+listChunk, len(ids))]
		if size >= jr.cfg.MaxListBytes {
			for _, id := range chunk {
				out = append(out, listItem{ID: id, Error: jr.listTooLarge(id)})
			}
			continue
		}
		recs, err := jr.store.GetJobs(ctx, chunk)
		if err != nil {
			return nil, err
		}
		for i, rec := range recs {
			id := chunk[i]
			switch {
			case rec == nil || rec.Message.TenantOrDefault() != tenant:
				out = append(out, listItem{ID: id, Error: notFound(id)})
			case size >= jr.cfg.MaxListBytes:
				out = append(out, listItem{ID: id, Error: jr.listTooLarge(id)})
			default:
				view, _ := recordView(rec)
				if rv, ok := view.(*resultView); ok {
					budget := jr.cfg.MaxListBytes - size
					if p := jr.results.inlineOutput(ctx, rv, &budget); p != nil {
						out = append(out, listItem{ID: id, Error: p})
						continue
					}
				}
				b, err := marshal(view)
				if err != nil {
					return nil, fmt.Errorf("encode job %s: %w", id, err)
				}
				size += int64(len(b))
				out = append(out, json.RawMessage(b))
			}
		}
	}
	return out, nil
}

func (jr *jobRoutes) listTooLarge(id string) *problem {
	p := newProblem(http.StatusRequestEntityTooLarge, job.ProblemResponseTooLarge, "Response too large",
		fmt.Sprintf("job %s was not included: the jobs before it filled the list's bound of %d bytes; ask for it again, or GET /v1/jobs/%s", id, jr.cfg.MaxListBytes, id))
	p.Limit = jr.cfg.MaxListBytes
	return p
}
