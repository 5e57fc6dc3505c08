package producer

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// A job that has not finished, or that ran on an image digest the workers
// no longer serve, cannot be replayed as it ran: 409 saying why.
func TestReplayRefusedWhenItCannotRunAsItRan(t *testing.T) {
	t.Parallel()
	b := setup(t, budgetTenants)
	queued := accepted(t, b.submit(t, `{"code": "print(1)", "cache": false}`, asAlice...))
	p := b.do(t, http.MethodPost, "/v1/jobs/"+queued.ID+"/replay", "", asAlice...).problem(t, http.StatusConflict)
	if p.Type != string(job.ProblemReplayUnavailable) || !strings.Contains(p.Detail, "has not finished") {
		t.Fatalf("replay of a queued job: %+v", p)
	}
	if _, err := b.worker(t, context.Background(), func(job.Message) job.Result {
		r := succeeded("1\n")(job.Message{})
		r.Image = job.Image{Name: "kiln.local/python:old", Digest: "sha256:" + strings.Repeat("0", 64)}
		return r
	}); err != nil {
		t.Fatal(err)
	}
	p = b.do(t, http.MethodPost, "/v1/jobs/"+queued.ID+"/replay", "", asAlice...).problem(t, http.StatusConflict)
	if p.Type != string(job.ProblemReplayUnavailable) || !strings.Contains(p.Detail, "same digest") || !strings.Contains(p.Detail, testDigest) {
		t.Fatalf("replay on a changed digest: %+v", p)
	}
	b.do(t, http.MethodPost, "/v1/jobs/"+queued.ID+"/replay", "", asBob...).problem(t, http.StatusNotFound)
}
