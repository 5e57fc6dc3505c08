package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kilnrun/kiln/internal/localnet"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
)

// buildKiln builds the kiln command into a temporary directory.
// Acceptance 2: `kiln mcp`, driven by the MCP Go SDK's client over stdio and
// over streamable HTTP, lists the run tools and runs run_python (with an
// input file) on the real pipeline; a job's artifacts come back as resource
// links (the PNG also inline) whose kiln:// resources read their bytes.
func TestMCPServerCommand(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "e2e-mcp", 1)
	bin := buildKiln(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env := append(os.Environ(), "KILN_SERVER="+e.apiURL)

	t.Run("stdio", func(t *testing.T) {
		cmd := exec.Command(bin, "mcp")
		var stderr testkit.SyncBuffer
		cmd.Env, cmd.Stderr = env, io.MultiWriter(os.Stderr, &stderr)
		exerciseMCP(ctx, t, &mcp.CommandTransport{Command: cmd})
		// The client closed the connection (its stdin): a normal end, exit 0,
		// and no error line (the SDK's Run logged "server run cancelled").
		if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
			t.Errorf("kiln mcp did not exit 0 once its client disconnected: %v", cmd.ProcessState)
		}
		if out := stderr.String(); strings.Contains(out, "ERROR") || strings.Contains(out, "cancelled") {
			t.Errorf("kiln mcp logged at its normal end:\n%s", out)
		}
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
		started := ready
		go func() { // the command says where it listens once it does
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				if strings.Contains(sc.Text(), "streamable HTTP at") && ready != nil {
					close(ready)
					ready = nil
				}
				fmt.Fprintln(os.Stderr, sc.Text())
			}
		}()
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("kiln mcp --http did not start listening within 30s")
		}
		exerciseMCP(ctx, t, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp"})
	})
}

func exerciseMCP(ctx context.Context, t *testing.T, transport mcp.Transport) {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "kiln-e2e", Version: "1"}, nil)
	cs, err := c.Connect(ctx, transport, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer cs.Close()

	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tools.Tools) != 1 || tools.Tools[0].Name != "run_python" {
		t.Fatalf("tools: %+v, want run_python only (one runtime registered)", tools.Tools)
	}
	schema, _ := tools.Tools[0].InputSchema.(map[string]any)
	if props, _ := schema["properties"].(map[string]any); props["code"] == nil || props["files"] == nil {
		t.Fatalf("run_python input schema: %v", schema)
	}

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{
		"code":  "print(open('data/n.txt').read().strip() * 2)",
		"files": []map[string]any{{"name": "data/n.txt", "content": "ab\n"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	text := mcpText(res)
	if res.IsError || !strings.Contains(text, "status: succeeded") || !strings.Contains(text, "stdout:\nabab\n") {
		t.Fatalf("run_python: is_error %v:\n%s", res.IsError, text)
	}

	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "1/0"}})
	if err != nil {
		t.Fatal(err)
	}
	if text := mcpText(res); !res.IsError || !strings.Contains(text, "error_category: runtime_error") || !strings.Contains(text, "ZeroDivisionError") {
		t.Fatalf("failing run_python: is_error %v:\n%s", res.IsError, text)
	}
	mcpArtifacts(ctx, t, cs)
}

// mcpArtifacts runs a job that writes a PNG and a text file to its output
// dir: the result links both as kiln:// resources, shows the PNG inline, and
// reading each resource returns its bytes.
func mcpArtifacts(ctx context.Context, t *testing.T, cs *mcp.ClientSession) {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{
		"code":      plotCode + "open(out + '/notes.txt', 'w').write('three points\\n')\n",
		"timeout_s": 60,
	}})
	if err != nil {
		t.Fatal(err)
	}
	if text := mcpText(res); res.IsError || !strings.Contains(text, "stdout:\nsaved\n") {
		t.Fatalf("run_python with artifacts: is_error %v:\n%s", res.IsError, text)
	}
	links := map[string]*mcp.ResourceLink{}
	var images []*mcp.ImageContent
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.ResourceLink:
			links[c.Name] = c
		case *mcp.ImageContent:
			images = append(images, c)
		}
	}
	plot, notes := links["plot.png"], links["notes.txt"]
	if len(links) != 3 || plot == nil || notes == nil || links["squares.csv"] == nil {
		t.Fatalf("resource links %v; want plot.png, squares.csv and notes.txt", links)
	}
	if !strings.HasPrefix(plot.URI, "kiln://jobs/") || !strings.HasSuffix(plot.URI, "/artifacts/plot.png") || plot.MIMEType != "image/png" ||
		notes.MIMEType != "text/plain" {
		t.Errorf("links: plot.png %+v, notes.txt %+v", plot, notes)
	}
	if len(images) != 1 || images[0].MIMEType != "image/png" {
		t.Fatalf("inline images %v; want the PNG only", images)
	}
	if _, err := png.Decode(bytes.NewReader(images[0].Data)); err != nil {
		t.Fatalf("inline image is not a PNG: %v", err)
	}

	rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: plot.URI})
	if err != nil {
		t.Fatalf("read %s: %v", plot.URI, err)
	}
	if len(rr.Contents) != 1 || rr.Contents[0].MIMEType != "image/png" || !bytes.Equal(rr.Contents[0].Blob, images[0].Data) {
		t.Errorf("read %s: %d contents; want the inlined PNG's bytes", plot.URI, len(rr.Contents))
	}
	rr, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: notes.URI})
	if err != nil {
		t.Fatalf("read %s: %v", notes.URI, err)
	}
	if len(rr.Contents) != 1 || rr.Contents[0].Text != "three points\n" || rr.Contents[0].MIMEType != "text/plain" {
		t.Errorf("read %s: %+v", notes.URI, rr.Contents)
	}
	missing := strings.TrimSuffix(plot.URI, "plot.png") + "nope.png"
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: missing}); err == nil {
		t.Errorf("read %s: no error for an artifact the job did not leave", missing)
	}
}

func mcpText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// Acceptance 3 and 4 of the rich-results issue, with the official MCP
// TypeScript SDK's client (sdk/typescript's devDependency; `npm ci` there
// first): a chart through `kiln mcp` comes back with an image block, a 90 s
// job succeeds with resetTimeoutOnProgress although the SDK's request
// timeout is 60 s, and a call given up over streamable HTTP (aborted, the
// session closed at once) leaves its job's record canceled.
func TestMCPTypeScriptClient(t *testing.T) {
	node := lookTool(t, "node")
	if _, err := os.Stat(filepath.Join(repoRoot(t), "sdk", "typescript", "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		testenv.Unavailable(t, "the MCP TypeScript SDK is not installed: run `npm ci` in sdk/typescript (%v)", err)
	}
	e := setup(t)
	e.startWorker(t, "e2e-mcp-ts", 2, withImages(map[string]string{"python": pythonImage(t), "node": recipeImage(t, "node")}))
	bin := buildKiln(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", "sdk/typescript/test/mcp.test.js")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "KILN_SERVER="+e.apiURL, "KILN_BIN="+bin)
	out := &testLogWriter{t: t}
	cmd.Stdout, cmd.Stderr = out, out
	err := cmd.Run()
	out.flush()
	if err != nil {
		t.Fatalf("node --test sdk/typescript/test/mcp.test.js: %v", err)
	}
}
