package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/mcpserver"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/producer/client"
)

// Issue 24, acceptance 5 (surfaces): the Go client's session, tool calls
// with a session id in and out, and the MCP server with one Kiln session
// per MCP session, all against a live API, worker and sandbox.
func TestSessionsSurfaces(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	e.startWorker(t, "e2e-sessions-surfaces", 1, withImages(map[string]string{"python": pythonImage(t)}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	t.Run("go client", func(t *testing.T) {
		c, err := client.New(a.base, client.WithAPIKey("k-a"))
		if err != nil {
			t.Fatal(err)
		}
		s, err := c.CreateSession(ctx, job.SessionSpec{})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := s.Run(ctx, "x = 41\nopen('f.txt', 'w').write('kept')"); err != nil || r.Status != job.StatusSucceeded {
			t.Fatalf("run 1: %+v %v", r, err)
		}
		if r, err := s.Run(ctx, "print(x + 1)"); err != nil || r.Stdout != "42\n" || r.Seq != 2 {
			t.Fatalf("run 2: %+v %v", r, err)
		}
		if b, err := s.ReadFile(ctx, "f.txt"); err != nil || string(b) != "kept" {
			t.Fatalf("read file: %q %v", b, err)
		}
		if _, err := s.WriteFile(ctx, "in/g.txt", []byte("put")); err != nil {
			t.Fatal(err)
		}
		if r, err := s.Run(ctx, "print(open('in/g.txt').read())"); err != nil || r.Stdout != "put\n" {
			t.Fatalf("run 3: %+v %v", r, err)
		}
		list, err := c.Sessions(ctx)
		if err != nil || len(list) == 0 {
			t.Fatalf("sessions: %v %v", list, err)
		}
		if err := s.Close(ctx); err != nil || s.Status != job.SessionEnded {
			t.Fatalf("close: %v %s", err, s.Status)
		}
		if _, err := s.Run(ctx, "print(x)"); err == nil {
			t.Fatal("a call to a closed session ran")
		}
	})

	t.Run("tool calls", func(t *testing.T) {
		call := func(sid, code string) (string, string) {
			t.Helper()
			code2, body := a.do("k-a", "POST", "/v1/tool-calls", map[string]any{"type": "tool_use", "id": "toolu_1", "name": "run_python",
				"input": map[string]any{"code": code}}, "Kiln-Session-Id", sid)
			if code2 != http.StatusOK {
				t.Fatalf("tool call: %d %s", code2, body)
			}
			var block struct {
				Content []struct {
					Text string `json:"text"`
				} `json:"content"`
			}
			if err := json.Unmarshal(body, &block); err != nil || len(block.Content) == 0 {
				t.Fatalf("tool result: %s", body)
			}
			text := block.Content[0].Text
			i := strings.Index(text, "session_id: ")
			if i < 0 {
				t.Fatalf("the tool result names no session: %s", text)
			}
			return strings.Fields(text[i+len("session_id: "):])[0], text
		}
		sid, _ := call("new", "x = 41")
		got, text := call(sid, "print(x + 1)")
		if got != sid || !strings.Contains(text, "42") || !strings.Contains(text, "seq: 2") {
			t.Fatalf("the second tool call: session %s (want %s): %s", got, sid, text)
		}
		// Another tenant cannot use the session through a tool call either.
		if code, body := a.do("k-b", "POST", "/v1/tool-calls", map[string]any{"type": "tool_use", "id": "toolu_2", "name": "run_python",
			"input": map[string]any{"code": "print(x)"}}, "Kiln-Session-Id", sid); code != http.StatusNotFound {
			t.Fatalf("tenant b's tool call in a's session: %d %s", code, body)
		}
	})

	t.Run("mcp", func(t *testing.T) {
		srv, err := mcpserver.New(ctx, mcpserver.Config{BaseURL: a.base, APIKey: "k-a", Sessions: true})
		if err != nil {
			t.Fatal(err)
		}
		connect := func() *mcp.ClientSession {
			st, ct := mcp.NewInMemoryTransports()
			if _, err := srv.MCP().Connect(ctx, st, nil); err != nil {
				t.Fatal(err)
			}
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx, ct, nil)
			if err != nil {
				t.Fatal(err)
			}
			return cs
		}
		text := func(cs *mcp.ClientSession, code string) string {
			t.Helper()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": code}})
			if err != nil {
				t.Fatal(err)
			}
			return res.Content[0].(*mcp.TextContent).Text
		}
		one, two := connect(), connect()
		text(one, "x = 41")
		if out := text(one, "print(x + 1)"); !strings.Contains(out, "42") {
			t.Fatalf("the MCP session's second call: %s", out)
		}
		if out := text(two, "print('x' in globals())"); !strings.Contains(out, "False") {
			t.Fatalf("another MCP session shares the first's state: %s", out)
		}
		out := text(one, "print(1)")
		sid := strings.Fields(out[strings.Index(out, "session_id: ")+len("session_id: "):])[0]
		one.Close()
		var code int
		var body []byte
		if !testkit.Poll(time.Minute, func() bool {
			code, body = a.do("k-a", "GET", "/v1/sessions/"+sid, nil)
			return code == 200 && strings.Contains(string(body), `"status":"ended"`)
		}) {
			t.Fatalf("the Kiln session of a closed MCP session: %d %s", code, body)
		}
		two.Close()
	})
}

// A session's CPU counts toward its tenant's cpu_seconds_per_day: once a
// call has used the quota, the next call is refused (429) and not run.
func TestSessionsCPUQuota(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := e.tenantsAPI(t, ctx, map[string]string{"k-frugal": "frugal"},
		map[string]producer.Tenant{"frugal": {Quota: producer.Quota{CPUSecondsPerDay: 1}}})["k-frugal"]
	e.startWorker(t, "e2e-sessions-cpu", 1, withImages(map[string]string{"python": pythonImage(t)}))
	s, err := c.CreateSession(ctx, job.SessionSpec{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Exec(ctx, job.SessionCall{Code: "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.2: pass\nprint('burnt')",
		Limits: job.Limits{CPUMS: 3000}})
	if err != nil || r.Stdout != "burnt\n" || r.CPUMS < 1000 {
		t.Fatalf("the burning call: %+v %v", r, err)
	}
	_, err = s.Run(ctx, "print('after')")
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusTooManyRequests || !strings.Contains(ae.Type, "cpu_seconds_per_day") {
		t.Fatalf("a call past the CPU quota: %v", err)
	}
}
