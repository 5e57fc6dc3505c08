package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kilnrun/kiln/internal/localnet"
	"github.com/kilnrun/kiln/internal/testkit"
)

// Issue 36, acceptance 7 (second half): `kiln mcp --sessions on` over
// streamable HTTP and over stdio leaves 0 Kiln sessions after 20 clients
// connect, call and disconnect. The tenant may hold 10 live sessions, so a
// server that leaked them would refuse the clients past the tenth. Over HTTP
// half the clients close (the Go SDK sends DELETE) and half go away without a
// word (their connections cut, none opened again: a client process that
// died, or the TypeScript SDK's close(), which sends no DELETE); over stdio
// each client closes the server's stdin (the server process exits).
func TestSessionMCPDisconnectLeavesNoKilnSessions(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	e.startWorker(t, "e2e-mcp-sessions", 4, withImages(map[string]string{"python": pythonImage(t)}))
	bin := buildKiln(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	env := append(os.Environ(), "KILN_SERVER="+a.base, "KILN_API_KEY=k-a", "KILN_MCP_SESSIONS=on")

	live := func() []string { return liveSessions(t, a, "k-a") }
	// call runs one stateful call and checks it ran in a Kiln session.
	call := func(cs *mcp.ClientSession, i int) error {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{
			"code": fmt.Sprintf("x = %d\nprint(x * 2)", i)}})
		if err != nil {
			return fmt.Errorf("client %d: call: %w", i, err)
		}
		if text := mcpText(res); res.IsError || !strings.Contains(text, fmt.Sprintf("stdout:\n%d\n", i*2)) ||
			!strings.Contains(text, "session_id: ") {
			return fmt.Errorf("client %d: is_error %v:\n%s", i, res.IsError, text)
		}
		return nil
	}
	// waves runs 20 clients, 4 at a time; each wave's clients are gone
	// before the next starts, and the tenant's live sessions stay under its
	// cap only if the server closed theirs.
	waves := func(t *testing.T, client func(i int) error) {
		t.Helper()
		for w := 0; w < 5; w++ {
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for j := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[j] = client(w*4 + j)
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("wave %d: %v", w, err)
			}
			var ids []string
			if !testkit.Poll(time.Minute, func() bool { ids = live(); return len(ids) == 0 }) {
				t.Fatalf("after wave %d (%d clients gone): live Kiln sessions %v", w, (w+1)*4, ids)
			}
		}
	}

	t.Run("stdio", func(t *testing.T) {
		waves(t, func(i int) error {
			cmd := exec.Command(bin, "mcp")
			cmd.Env = env
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
			if err != nil {
				return fmt.Errorf("client %d: connect: %w", i, err)
			}
			err = call(cs, i)
			_ = cs.Close() // closes the server's stdin and waits for it to exit
			if err == nil && (cmd.ProcessState == nil || !cmd.ProcessState.Success()) {
				err = fmt.Errorf("client %d: kiln mcp did not exit 0: %v", i, cmd.ProcessState)
			}
			return err
		})
	})

	t.Run("streamable HTTP", func(t *testing.T) {
		port, err := localnet.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		cmd := exec.Command(bin, "mcp", "--http", addr)
		cmd.Env = env
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		ready := make(chan struct{})
		go func() {
			sc := bufio.NewScanner(stderr)
			once := sync.Once{}
			for sc.Scan() {
				if strings.Contains(sc.Text(), "streamable HTTP at") {
					once.Do(func() { close(ready) })
				}
				fmt.Fprintln(os.Stderr, sc.Text())
			}
		}()
		select {
		case <-ready:
		case <-time.After(30 * time.Second):
			t.Fatal("kiln mcp --http did not start listening within 30s")
		}
		waves(t, func(i int) error {
			d := &cutDialer{}
			hc := &http.Client{Transport: &http.Transport{DialContext: d.dial}}
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx,
				&mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", HTTPClient: hc, MaxRetries: -1}, nil)
			if err != nil {
				return fmt.Errorf("client %d: connect: %w", i, err)
			}
			err = call(cs, i)
			if i%2 == 1 {
				d.cut() // gone without a word: the DELETE of Close below never leaves
			}
			_ = cs.Close()
			return err
		})
		// The server that stops closes what its sessions hold: a client
		// still connected when it gets SIGTERM leaves nothing either.
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := call(cs, 99); err != nil {
			t.Fatal(err)
		}
		if ids := live(); len(ids) != 1 {
			t.Fatalf("live Kiln sessions with one client connected: %v", ids)
		}
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		if !testkit.Poll(time.Minute, func() bool { return len(live()) == 0 }) {
			t.Fatalf("a stopped kiln mcp left Kiln sessions: %v", live())
		}
		_ = cs.Close()
	})
}

// liveSessions lists the ids of key's live sessions.
func liveSessions(t *testing.T, a *sessAPI, key string) []string {
	t.Helper()
	code, body := a.do(key, "GET", "/v1/sessions", nil)
	var out struct {
		Sessions []struct {
			ID string `json:"id"`
		} `json:"sessions"`
	}
	if code != http.StatusOK || json.Unmarshal(body, &out) != nil {
		t.Fatalf("list sessions: %d %s", code, body)
	}
	ids := make([]string, 0, len(out.Sessions))
	for _, s := range out.Sessions {
		ids = append(ids, s.ID)
	}
	return ids
}

// cutDialer records an HTTP client's connections so a test can cut them
// all at once and refuse new ones, as when the client's process dies.
type cutDialer struct {
	mu    sync.Mutex
	conns []net.Conn
	dead  bool
}

func (d *cutDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return nil, errors.New("the client is gone")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *cutDialer) cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dead = true
	for _, c := range d.conns {
		_ = c.Close()
	}
}

// Issue 36: a tool call its MCP client cancels (notifications/cancelled)
// cancels the Kiln session's call as well: the running program stops at
// once, not at its timeout, and the interpreter keeps its variables for the
// conversation's next call.
func TestSessionMCPCancelStopsKilnCall(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	e.startWorker(t, "e2e-mcp-cancel", 2, withImages(map[string]string{"python": pythonImage(t)}))
	bin := buildKiln(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.Command(bin, "mcp")
	cmd.Env = append(os.Environ(), "KILN_SERVER="+a.base, "KILN_API_KEY=k-a", "KILN_MCP_SESSIONS=on")
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	// Each call may run a minute: on a loaded host the cancel below must
	// reach the call before its own timeout would end it.
	run := func(ctx context.Context, code string) (*mcp.CallToolResult, error) {
		return cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": code, "timeout_s": 60}})
	}
	if res, err := run(ctx, "x = 41"); err != nil || res.IsError {
		t.Fatalf("first call: %v %s", err, mcpText(res))
	}
	ids := liveSessions(t, a, "k-a")
	if len(ids) != 1 {
		t.Fatalf("live sessions %v; want the conversation's one", ids)
	}
	calls := "/v1/sessions/" + ids[0] + "/calls/2"

	callCtx, cancelCall := context.WithCancel(ctx)
	defer cancelCall()
	errc := make(chan error, 1)
	go func() {
		_, err := run(callCtx, "import time\ntime.sleep(120)")
		errc <- err
	}()
	if !testkit.Poll(time.Minute, func() bool {
		code, body := a.do("k-a", "GET", calls, nil)
		return code == http.StatusAccepted && strings.Contains(string(body), `"status":"running"`)
	}) {
		t.Fatal("the second call did not start running")
	}
	cancelCall()
	if err := <-errc; err == nil {
		t.Fatal("the canceled tool call answered no error")
	}
	start := time.Now()
	code, body := a.do("k-a", "GET", calls+"?wait=30s", nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"status":"canceled"`) {
		t.Fatalf("the Kiln call after its tool call was canceled: %d %s", code, body)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the Kiln call ended %s after its tool call was canceled", took)
	}
	res, err := run(ctx, "print(x + 1)")
	if err != nil || res.IsError || !strings.Contains(mcpText(res), "stdout:\n42\n") {
		t.Fatalf("the call after the canceled one: %v %s", err, mcpText(res))
	}
}
