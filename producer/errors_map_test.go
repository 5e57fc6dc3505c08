package producer

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// Every domain error is answered by toProblem alone, with its status, type
// and Retry-After, however deep the context it is wrapped in.
func TestEveryDomainErrorMapsToItsProblem(t *testing.T) {
	t.Parallel()
	s := &Server{problems: &problems{retryAfter: 2 * time.Second, queueFullRetryAfter: 5 * time.Second, log: slog.New(slog.DiscardHandler)}}
	cause := errors.New("nats: timeout")
	cases := []struct {
		name   string
		err    error
		status int
		typ    string
		retry  string // the Retry-After header; "" for none
		field  string
		jobID  string
		detail string // a part of the detail
	}{
		{"idempotency key reused", &refusal{kind: errIdempotencyKeyReused, field: "Idempotency-Key", detail: "used for job x"},
			422, string(job.ProblemIdempotencyKeyReused), "", "Idempotency-Key", "", "used for job x"},
		{"queue full", &refusal{kind: errQueueFull, cause: cause}, 429, string(job.ProblemQueueFull), "5", "", "", "nothing was queued"},
		{"queue unavailable", &refusal{kind: errQueueUnavailable, cause: cause}, 503, string(job.ProblemUnavailable), "2", "", "", "nothing was queued"},
		{"queue unavailable, job recorded", &refusal{kind: errQueueUnavailable, recorded: "j1", cause: cause},
			503, string(job.ProblemUnavailable), "2", "", "j1", "the job j1 is recorded and will be queued"},
		{"publish unconfirmed", &refusal{kind: errPublishUnconfirmed, recorded: "j2", cause: cause},
			503, string(job.ProblemUnavailable), "2", "", "j2", "did not confirm job j2"},
		{"quota", &refusal{kind: errQuotaExceeded, quota: job.QuotaRate, limit: 3, retryAfter: 1500 * time.Millisecond, detail: "too fast"},
			429, job.QuotaProblemType(job.QuotaRate), "2", "", "", "too fast"},
		{"budget invalid", &refusal{kind: errBudgetInvalid, field: "budget", detail: "no such budget"},
			422, string(job.ProblemInvalidField), "", "budget", "", "no such budget"},
		{"budget exhausted", &refusal{kind: errBudgetExhausted, field: "budget", detail: "all runs used"},
			409, string(job.ProblemBudgetExhausted), "", "budget", "", "all runs used"},
		{"egress", &refusal{kind: errEgressNotAllowed, field: "network.allow[0]", detail: "host x"},
			422, string(job.ProblemEgressNotAllowed), "", "network.allow[0]", "", "host x"},
		{"no runtimes", fmt.Errorf("runtime %q: %w", "python", errNoRuntimes), 503, string(job.ProblemUnavailable), "2", "runtime", "", "no runtime is registered"},
		{"invalid spec", &job.InvalidError{Field: "code", Message: "code is empty"}, 422, string(job.ProblemInvalidField), "", "code", "", "code is empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := fmt.Errorf("submit job: %w", tc.err) // context wrapped around it
			p := s.problems.toProblem(context.Background(), "submit job", err)
			w := &capWriter{header: http.Header{}, limit: 1 << 20}
			writeProblem(w, p)
			if w.status != tc.status || string(p.Type) != tc.typ || p.Field != tc.field || p.JobID != tc.jobID || !strings.Contains(p.Detail, tc.detail) {
				t.Fatalf("answer %d %+v; want %d %s field %q job %q detail with %q", w.status, p, tc.status, tc.typ, tc.field, tc.jobID, tc.detail)
			}
			if got := w.header.Get("Retry-After"); got != tc.retry {
				t.Fatalf("Retry-After %q, want %q", got, tc.retry)
			}
			if r, ok := tc.err.(*refusal); ok && !errors.Is(p, r.kind) {
				t.Fatalf("the problem does not wrap the domain error %v", tc.err)
			}
		})
	}
	if p := s.problems.toProblem(context.Background(), "submit job", &refusal{kind: errQuotaExceeded, quota: job.QuotaQueued, limit: 7}); p.Limit != 7 ||
		p.Title != "Quota exceeded: "+string(job.QuotaQueued) || p.Status != http.StatusTooManyRequests {
		t.Fatalf("quota problem %+v", p)
	}
}

// The domain side of a submission builds no HTTP answer: those files know
// neither net/http nor the problem type, and toProblem answers for them.
func TestSubmissionDomainBuildsNoHTTPAnswer(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"submission.go", "errors.go", "publish.go", "quota.go", "network.go"} {
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if imp.Path.Value == `"net/http"` {
				t.Errorf("%s imports net/http", name)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && (id.Name == "newProblem" || id.Name == "problem") {
				t.Errorf("%s uses %s: domain code returns the errors of errors.go, and toProblem answers them", name, id.Name)
			}
			return true
		})
	}
}
