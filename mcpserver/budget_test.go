package mcpserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kilnrun/kiln/job"
)

// Every call's job names the server's budget; the model's input cannot.
func TestCallsNameTheConfiguredBudget(t *testing.T) {
	const budget = "bud_0123456789abcdef0123456789abcdef"
	got := make(chan string, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/runtimes", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"runtimes": []job.RuntimeInfo{{Name: "python", Limits: job.DefaultPolicy()}}})
	})
	mux.HandleFunc("POST /v1/jobs", func(w http.ResponseWriter, r *http.Request) {
		var spec job.Spec
		_ = json.NewDecoder(r.Body).Decode(&spec)
		got <- spec.Budget
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(job.Result{ID: testJobID, Status: job.StatusSucceeded, ExitCode: job.IntPtr(0)})
	})
	api := httptest.NewServer(mux)
	defer api.Close()
	ctx := context.Background()
	s, err := New(ctx, Config{BaseURL: api.URL, Budget: budget})
	if err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.MCP().Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "print(1)"}}); err != nil {
		t.Fatal(err)
	}
	if b := <-got; b != budget {
		t.Fatalf("submitted budget %q, want %q", b, budget)
	}
}
