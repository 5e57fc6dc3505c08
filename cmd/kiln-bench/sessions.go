package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	sandboxctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox"
	"github.com/kilnrun/kiln/worker"
)

// The sessions section (issue 24): a warm call on an idle session through
// the API, session creation, and what an idle session holds in memory,
// against the chrooted interpreter the sandbox section also measures.
const (
	rowSessionBare = "bare python3 (chroot) [s]"
	rowSessionCall = "session warm call (exec ?wait)"
	// rowE2BCall is the same warm call through E2B's surface (package
	// e2bapi): POST /execute on a sandbox, read to its end of execution.
	rowE2BCall = "session warm call (E2B /execute)"
	// createRuns is how many session creations the report times, each
	// with a box ready for it.
	createRuns = 10
	// benchSessionsMax bounds the pipeline's sessions (its API's per-tenant
	// quota and its worker's room), above what the section keeps at once.
	benchSessionsMax = 64
	// idleSessions is how many idle sessions the memory report holds: the
	// capacity the sessions issue asks of one host's default budget.
	idleSessions = 50
	// benchSessionsMemory is what the pipeline's worker lets its sessions
	// declare together (idleSessions at the default memory_mb, and more).
	benchSessionsMemory = 64 << 30
	// pauseRuns is how many pause and resume pairs the report times.
	pauseRuns = 10
)

func init() {
	s := &sessionBench{}
	register(section{
		Name:   "sessions",
		Order:  2,
		Setup:  s.setup,
		Ratios: []ratio{{rowSessionCall, rowSessionBare}, {rowE2BCall, rowSessionCall}},
		Report: s.report,
	})
}

type sessionBench struct {
	p    *pipeline
	warm string // the idle session the warm-call row calls
	wg   sync.WaitGroup
}

func (b *sessionBench) setup(ctx context.Context, o *options) ([]row, func(), error) {
	rootfs, err := imageRootfs()
	if err != nil {
		return nil, nil, err
	}
	b.p = &pipeline{name: "sessions pipeline"}
	_, cleanup, err := b.p.setup(ctx, &options{Pipeline: true, Code: o.Code})
	if err != nil {
		return nil, nil, err
	}
	done := func() { b.wg.Wait(); cleanup() }
	if b.warm, err = b.create(ctx); err != nil {
		done()
		return nil, nil, err
	}
	call, err := json.Marshal(job.SessionCall{Code: o.Code})
	if err != nil {
		done()
		return nil, nil, err
	}
	sbx, err := b.e2bCreate(ctx)
	if err != nil {
		done()
		return nil, nil, err
	}
	e2bCall, err := json.Marshal(map[string]string{"code": o.Code})
	if err != nil {
		done()
		return nil, nil, err
	}
	want := []byte{}
	rows := []row{
		{rowSessionBare, func(ctx context.Context) error {
			return runCmd(ctx, &want, "chroot", rootfs, "python3", "-c", o.Code)
		}},
		{rowSessionCall, func(ctx context.Context) error {
			st, body, err := b.p.do(ctx, "POST", "/v1/sessions/"+b.warm+"/exec?wait=30s", call)
			if err != nil {
				return err
			}
			var r job.CallResult
			if st != 200 || json.Unmarshal(body, &r) != nil || r.Status != job.StatusSucceeded {
				return fmt.Errorf("session call: %d %s", st, body)
			}
			return nil
		}},
		{rowE2BCall, func(ctx context.Context) error {
			body, err := b.e2bDo(ctx, "POST", "/execute", e2bCall, map[string]string{"E2b-Sandbox-Id": sbx.SandboxID,
				"E2b-Sandbox-Port": "49999", "X-Access-Token": sbx.EnvdAccessToken})
			if err != nil {
				return err
			}
			if !bytes.HasSuffix(body, []byte(`{"type":"end_of_execution"}`+"\n")) || bytes.Contains(body, []byte(`"type":"error"`)) {
				return fmt.Errorf("E2B execute: %s", body)
			}
			return nil
		}},
	}
	return rows, done, nil
}

// e2bSandbox is what E2B's create answers, of what the E2B row needs.
type e2bSandbox struct{ SandboxID, EnvdAccessToken string }

// e2bCreate makes an E2B sandbox (a session) through E2B's surface.
func (b *sessionBench) e2bCreate(ctx context.Context) (e2bSandbox, error) {
	var s e2bSandbox
	body, err := b.e2bDo(ctx, "POST", "/sandboxes", []byte(`{"templateID":"code-interpreter-v1"}`), map[string]string{"X-API-Key": b.p.key})
	if err == nil && (json.Unmarshal(body, &s) != nil || s.SandboxID == "") {
		err = fmt.Errorf("create an E2B sandbox: %s", body)
	}
	return s, err
}

// e2bDo sends an E2B request with hdr and returns its answer's body, or
// an error for a status other than 200 and 201.
func (b *sessionBench) e2bDo(ctx context.Context, method, path string, body []byte, hdr map[string]string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, b.p.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := b.p.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, out)
	}
	return out, nil
}

// create makes a session and returns its id.
func (b *sessionBench) create(ctx context.Context) (string, error) {
	st, body, err := b.p.do(ctx, "POST", "/v1/sessions", []byte(`{"runtime":"python"}`))
	if err != nil {
		return "", err
	}
	var s job.Session
	if st != 201 || json.Unmarshal(body, &s) != nil {
		return "", fmt.Errorf("create session: %d %s", st, body)
	}
	return s.ID, nil
}

// delete ends a session off the measured path.
func (b *sessionBench) delete(ctx context.Context, id string) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		_, _, _ = b.p.do(context.WithoutCancel(ctx), "DELETE", "/v1/sessions/"+id, nil)
	}()
}

// reportCreate times session creation when a box is ready for it: before
// each creation, every removal and the spare box the last creation started
// are waited for (Settle).
func (b *sessionBench) reportCreate(ctx context.Context, bare time.Duration) {
	var took []time.Duration
	for range createRuns {
		if err := b.p.sb.Settle(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "kiln-bench: sessions: create:", err)
			return
		}
		start := time.Now()
		id, err := b.create(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kiln-bench: sessions: create:", err)
			return
		}
		took = append(took, time.Since(start))
		b.delete(ctx, id)
		b.wg.Wait()
	}
	med := quantile(took, 0.5)
	fmt.Printf("\nsession create with a box ready (POST /v1/sessions, %d runs): median %s, p99 %s", len(took), ms(med), ms(quantile(took, 0.99)))
	if bare > 0 {
		fmt.Printf(" (%.2f× the chrooted interpreter)", float64(med)/float64(bare))
	}
	fmt.Println()
}

// reportPause times pausing a session that imported pandas and holds a
// DataFrame and a file (the pause pickles its variables), and resuming it
// (its files and variables back, restored "files+variables"), then the
// first call after the resume, which reads both.
func (b *sessionBench) reportPause(ctx context.Context) {
	id, err := b.create(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kiln-bench: sessions: pause:", err)
		return
	}
	defer func() { b.delete(ctx, id); b.wg.Wait() }()
	call, _ := json.Marshal(job.SessionCall{Code: "import pandas as pd\ndf = pd.DataFrame({'a': range(1000)})\ndf.to_csv('df.csv')\nprint(len(df))"})
	if st, body, err := b.p.do(ctx, "POST", "/v1/sessions/"+id+"/exec?wait=60s", call); err != nil || st != 200 {
		fmt.Fprintln(os.Stderr, "kiln-bench: sessions: pause:", st, string(body), err)
		return
	}
	after, _ := json.Marshal(job.SessionCall{Code: "print(open('df.csv').read().count('\\n'), len(df))"})
	var pause, resume, first []time.Duration
	for range pauseRuns {
		if err := b.p.sb.Settle(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "kiln-bench: sessions: pause:", err)
			return
		}
		steps := []struct {
			path string
			body []byte
			took *[]time.Duration
			want func([]byte) bool
		}{
			{"/pause?wait=60s", nil, &pause, func(b []byte) bool { return bytes.Contains(b, []byte(`"status":"paused"`)) }},
			{"/resume", nil, &resume, func(b []byte) bool { return bytes.Contains(b, []byte(`"restored":"files+variables"`)) }},
			{"/exec?wait=60s", after, &first, func(b []byte) bool { return bytes.Contains(b, []byte(`"stdout":"1001 1000\n"`)) }},
		}
		for _, s := range steps {
			start := time.Now()
			st, body, err := b.p.do(ctx, "POST", "/v1/sessions/"+id+s.path, s.body)
			if err != nil || st != 200 || !s.want(body) {
				fmt.Fprintln(os.Stderr, "kiln-bench: sessions: pause:", s.path, st, string(body), err)
				return
			}
			*s.took = append(*s.took, time.Since(start))
		}
	}
	fmt.Printf("session pause / resume (pandas imported, a DataFrame held, a file in /work; %d runs): pause median %s (the variables pickled), resume median %s (restored: files+variables), first call after it %s\n",
		pauseRuns, ms(quantile(pause, 0.5)), ms(quantile(resume, 0.5)), ms(quantile(first, 0.5)))
}

// report prints what idle sessions hold: idleSessions sessions, each with
// one call that imported pandas and made a small DataFrame, then idle; the
// memory charged to each session's box (its cgroup: zygote, interpreter,
// kiln-init, page cache of its files).
func (b *sessionBench) report(ctx context.Context, _ *options, medians map[string]time.Duration) {
	b.wg.Wait()
	b.reportCreate(ctx, medians[rowSessionBare])
	b.reportPause(ctx)
	call, _ := json.Marshal(job.SessionCall{Code: "import pandas as pd\ndf = pd.DataFrame({'a': range(1000)})\nprint(len(df))"})
	var ids []string
	for range idleSessions {
		id, err := b.create(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kiln-bench: sessions: idle memory:", err)
			return
		}
		ids = append(ids, id)
		if st, body, err := b.p.do(ctx, "POST", "/v1/sessions/"+id+"/exec?wait=60s", call); err != nil || st != 200 {
			fmt.Fprintln(os.Stderr, "kiln-bench: sessions: idle memory:", st, string(body), err)
			return
		}
	}
	defer func() {
		for _, id := range ids {
			b.delete(ctx, id)
		}
		b.wg.Wait()
	}()
	var total, most int64
	for _, id := range ids {
		n, err := sessionMemory(ctx, id)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kiln-bench: sessions: idle memory:", err)
			return
		}
		total += n
		most = max(most, n)
	}
	declared := sessionDeclaredMB(ctx, b, ids[0])
	fmt.Printf("\nidle python session (pandas imported, a DataFrame held): %.1f MiB each on average, %.1f MiB at most; %d sessions hold %.0f MiB together.\n",
		float64(total)/float64(len(ids))/(1<<20), float64(most)/(1<<20), len(ids), float64(total)/(1<<20))
	if declared > 0 {
		fmt.Printf("  admission counts each at its memory_mb (%d MiB by default): a worker's default budget (--sessions-memory-mb %d) admits %d of them, %d of one tenant's\n",
			declared, worker.SessionsMemoryDefault>>20, (worker.SessionsMemoryDefault>>20)/declared, (worker.SessionsMemoryDefault>>20)/2/declared)
	}
}

// sessionDeclaredMB is session id's memory_mb as the API shows it (0 when
// it cannot be read).
func sessionDeclaredMB(ctx context.Context, b *sessionBench, id string) int64 {
	st, body, err := b.p.do(ctx, "GET", "/v1/sessions/"+id, nil)
	var s job.Session
	if err != nil || st != 200 || json.Unmarshal(body, &s) != nil {
		return 0
	}
	return s.MemoryMB
}

// sessionMemory reads the memory charged to session id's box from its
// cgroup.
func sessionMemory(ctx context.Context, id string) (int64, error) {
	c, err := containerd.New(os.Getenv("KILN_CONTAINERD_ADDRESS"))
	if os.Getenv("KILN_CONTAINERD_ADDRESS") == "" {
		c, err = containerd.New(sandbox.AddressDefault)
	}
	if err != nil {
		return 0, err
	}
	defer c.Close()
	ctx = namespaces.WithNamespace(ctx, benchNamespace())
	cs, err := c.Containers(ctx, fmt.Sprintf(`labels.%q==%q`, sandboxctrd.LabelSession, id))
	if err != nil || len(cs) != 1 {
		return 0, fmt.Errorf("session %s's box: %d containers, %v", id, len(cs), err)
	}
	spec, err := cs[0].Spec(ctx)
	if err != nil || spec.Linux == nil {
		return 0, fmt.Errorf("session %s's box: spec: %v", id, err)
	}
	path := spec.Linux.CgroupsPath
	if strings.Contains(path, ":") { // systemd form: slice:prefix:name
		parts := strings.SplitN(path, ":", 3)
		path = filepath.Join(parts[0], parts[1]+"-"+parts[2]+".scope")
	}
	for _, f := range []string{filepath.Join("/sys/fs/cgroup", path, "memory.current"),
		filepath.Join("/sys/fs/cgroup/memory", path, "memory.usage_in_bytes")} {
		if raw, err := os.ReadFile(f); err == nil {
			return strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
		}
	}
	return 0, errors.New("session " + id + "'s box: no memory figure in its cgroup")
}
