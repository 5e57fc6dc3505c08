package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// Acceptance 4 (issue 8), with the real commands: `kiln api` and `kiln
// worker` started while NATS and Redis are both down (a redis-server and a
// JetStream server that will listen on known loopback ports, not started
// yet). Both stay up, and their /readyz answers 503 naming Redis and NATS;
// once the stores start, both turn ready and a job submitted over HTTP runs
// in a real sandbox and succeeds. (worker.TestWorkerAndAPIStartWithStoresDown
// checks the same in-process, with a scripted runtime.)
func TestAPIAndWorkerStartWithStoresDown(t *testing.T) {
	bin := buildKiln(t)
	containerdAddr := testenv.Containerd(t)
	r := testenv.StartRedis(t)
	r.Stop()
	n := testenv.StartNATS(t)
	n.Stop()
	apiAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	workerAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	const workerID = "e2e-stores-down"
	t.Cleanup(func() { reapWorker(t, containerdAddr, workerID) })

	// Only what the test sets: no OTEL_* or KILN_* of the developer's shell.
	var base []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") && !strings.HasPrefix(kv, "KILN_") {
			base = append(base, kv)
		}
	}
	base = append(base, "KILN_REDIS_URL="+r.URL(), "KILN_NATS_URL="+n.URL())
	api := startKiln(t, bin, append(base, "KILN_ADDR="+apiAddr), "api")
	wk := startKiln(t, bin, append(base, "KILN_WORKER_ID="+workerID, "KILN_CONCURRENCY=1", "KILN_RUNTIMES=python",
		"KILN_METRICS_ADDR="+workerAddr, "KILN_CONTAINERD_ADDRESS="+containerdAddr,
		"KILN_CONTAINERD_NAMESPACE="+testenv.ContainerdNamespace()), "worker")

	readyz := map[string]string{"api": "http://" + apiAddr + "/readyz", "worker": "http://" + workerAddr + "/readyz"}
	get := func(url string) (int, string, error) {
		resp, err := http.Get(url)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), nil
	}
	// Both serve their probes with the stores down, and say what is missing.
	for name, url := range readyz {
		var code int
		var body string
		testkit.Eventually(t, 30*time.Second, name+" /readyz to answer with the stores down", func() bool {
			var err error
			code, body, err = get(url)
			return err == nil
		})
		if code != http.StatusServiceUnavailable || !strings.Contains(body, `"redis":"`) || strings.Contains(body, `"redis":"ok"`) ||
			!strings.Contains(body, `"nats":"unavailable`) {
			t.Fatalf("%s /readyz with the stores down: %d %s", name, code, body)
		}
		t.Logf("%s /readyz with the stores down: %d %s", name, code, strings.TrimSpace(body))
	}
	// A process that gives up on its stores exits: neither does while they
	// stay down (one that gave up later would fail the readiness below).
	anyExit := make(chan struct{})
	go func() {
		select {
		case <-api.done:
		case <-wk.done:
		}
		close(anyExit)
	}()
	testkit.Quiet(t, anyExit, 500*time.Millisecond, "a kiln process exiting with its stores down")
	for name, p := range map[string]*kilnProc{"api": api, "worker": wk} {
		if p.exited() {
			t.Fatalf("kiln %s exited with its stores down:\n%s", name, p.log())
		}
	}
	code, body, err := get(readyz["api"])
	if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "Redis and NATS are unavailable") {
		t.Fatalf("api /readyz with both stores down: %d %s %v", code, body, err)
	}

	started := time.Now()
	n.Start()
	r.Start()
	for name, url := range readyz {
		var body string
		testkit.Eventually(t, 30*time.Second, name+" to be ready once the stores started", func() bool {
			code, b, err := get(url)
			body = b
			return err == nil && code == http.StatusOK
		})
		t.Logf("%s ready %v after the stores started: %s", name, time.Since(started).Round(time.Millisecond), strings.TrimSpace(body))
	}

	// The API serves: a job submitted over HTTP runs in a sandbox.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.New("http://" + apiAddr)
	if err != nil {
		t.Fatal(err)
	}
	var sub client.Submission
	// The worker's runtime registration may trail its readiness by a
	// moment: the API answers 503 (which the client retries) meanwhile.
	testkit.Poll(15*time.Second, func() bool {
		sub, err = c.Submit(ctx, py("print('served')"))
		return !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "no runtime is registered")
	})
	if err != nil {
		t.Fatalf("submit once both are ready: %v", err)
	}
	t.Logf("submission accepted %v after the stores started", time.Since(started).Round(time.Millisecond))
	v, err := c.Wait(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != job.StatusSucceeded || v.Stdout != "served\n" || v.Worker != workerID {
		t.Fatalf("job after the stores came up: %s %q worker %q %+v", v.Status, v.Stdout, v.Worker, v.Error)
	}
	t.Logf("a job submitted over HTTP ran in a sandbox and succeeded %v after the stores started", time.Since(started).Round(time.Millisecond))
}

// kilnProc is a running kiln command whose log is kept.
type kilnProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	buf  bytes.Buffer // the process's output, read once done is closed
	err  error
}

func (p *kilnProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// log is the process's output; only once it has exited.
func (p *kilnProc) log() string {
	<-p.done
	return fmt.Sprintf("%v\n%s", p.err, p.buf.String())
}

// startKiln runs `kiln args...` with exactly env. At test end it gets
// SIGTERM (and SIGKILL after 30s); its output goes to the test's stderr.
func startKiln(t *testing.T, bin string, env []string, args ...string) *kilnProc {
	t.Helper()
	p := &kilnProc{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout = io.MultiWriter(os.Stderr, &p.buf)
	p.cmd.Stderr = p.cmd.Stdout
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}
