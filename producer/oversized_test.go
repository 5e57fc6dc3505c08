package producer

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/job"
)

// oversizedClients are programs that POST the file $BODY to $URL as JSON
// with each client as people use it, and print the answer's status, a
// newline and its body. Python's urllib and requests send the whole body
// before they read anything: a server that stops reading at the limit and
// closes resets them before they see its answer.
var oversizedClients = []struct {
	name string
	tool string // the interpreter or command; absent: the test is unavailable
	args []string
}{
	{"python urllib", "python3", []string{"-c", `import os, urllib.request, urllib.error
req = urllib.request.Request(os.environ["URL"], data=open(os.environ["BODY"], "rb").read(),
                             headers={"Content-Type": "application/json"}, method="POST")
try:
    r = urllib.request.urlopen(req, timeout=60)
    print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())`}},
	{"python requests", "python3", []string{"-c", `import os, requests
r = requests.post(os.environ["URL"], data=open(os.environ["BODY"], "rb").read(),
                  headers={"Content-Type": "application/json"}, timeout=60)
print(r.status_code); print(r.text)`}},
	{"node fetch", "node", []string{"-e", `const fs = require("fs");
(async () => {
  const r = await fetch(process.env.URL, { method: "POST", body: fs.readFileSync(process.env.BODY),
    headers: { "Content-Type": "application/json" } });
  console.log(r.status); console.log(await r.text());
})().catch((e) => { console.error(e); process.exit(1); });`}},
	{"curl", "curl", []string{"-sS", "--max-time", "60", "-X", "POST", "-H", "Content-Type: application/json",
		"--data-binary", "@BODY", "-w", "\n%{http_code}", "URL"}},
	{"curl without Expect", "curl", []string{"-sS", "--max-time", "60", "-X", "POST", "-H", "Content-Type: application/json",
		"-H", "Expect:", "--data-binary", "@BODY", "-w", "\n%{http_code}", "URL"}},
}

// Issue 40, acceptance 7: a 40 MB submission (the limit is 32 MiB) is
// answered 413 with the problem body, and every common client reads it:
// Python's urllib and requests, Node's fetch, Go's net/http and curl (with
// and without Expect: 100-continue), each against the API on a real
// socket. Twice each, the second on a fresh connection after the first.
func TestOversizedBodyIsAnsweredToEveryClient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url := b.http.URL + "/v1/jobs"
	body := append(append([]byte(`{"runtime": "python", "code": "`), bytes.Repeat([]byte("x"), 40_000_000)...), `"}`...)
	path := filepath.Join(t.TempDir(), "body.json")
	if err := os.WriteFile(path, body, 0o600); err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, status int, answer string) {
		t.Helper()
		if status != http.StatusRequestEntityTooLarge || !strings.Contains(answer, string(job.ProblemBodyTooLarge)) {
			t.Errorf("status %d, body %.300q; want 413 and the %s problem", status, answer, job.ProblemBodyTooLarge)
		}
	}
	t.Run("go net/http", func(t *testing.T) {
		for range 2 {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				cancel()
				t.Fatalf("Go net/http: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			cancel()
			check(t, resp.StatusCode, string(b))
		}
	})
	for _, c := range oversizedClients {
		t.Run(c.name, func(t *testing.T) {
			tool, err := exec.LookPath(c.tool)
			if err != nil {
				testenv.Unavailable(t, "%s: %v", c.tool, err)
			}
			if c.name == "python requests" {
				if err := exec.Command(tool, "-c", "import requests").Run(); err != nil {
					testenv.Unavailable(t, "python requests is not installed: %v", err)
				}
			}
			args := make([]string, len(c.args))
			for i, a := range c.args {
				switch a { // curl's: the others read $URL and $BODY
				case "@BODY":
					a = "@" + path
				case "URL":
					a = url
				}
				args[i] = a
			}
			for range 2 {
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
				cmd := exec.CommandContext(ctx, tool, args...)
				cmd.Env = append(os.Environ(), "URL="+url, "BODY="+path)
				out, err := cmd.CombinedOutput()
				cancel()
				if err != nil {
					t.Fatalf("%s: %v\n%.2000s", c.name, err, out)
				}
				text := strings.TrimSpace(string(out))
				var status int
				var answer string
				if c.tool == "curl" { // body, then the status on the last line
					i := strings.LastIndexByte(text, '\n')
					answer, text = text[:max(i, 0)], text[i+1:]
					status = atoiOr(text)
				} else { // the status, then the body
					first, rest, _ := strings.Cut(text, "\n")
					status, answer = atoiOr(first), rest
				}
				check(t, status, answer)
			}
		})
	}
}

func atoiOr(s string) int {
	n := 0
	for _, c := range strings.TrimSpace(s) {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}
