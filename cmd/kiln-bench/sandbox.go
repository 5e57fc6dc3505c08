package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox"
)

// Row names, also used in ratios.
const (
	rowBare      = "bare python3 (chroot)"
	rowCtr       = "ctr run --rm (python-slim)"
	rowKilnExec  = "kiln exec"
	rowInProcess = "sandbox.Run (in-process)"
)

func init() {
	var spans *tracetest.InMemoryExporter
	register(section{
		Name:   "sandbox",
		Setup:  func(ctx context.Context, o *options) ([]row, func(), error) { return sandboxRows(ctx, o, &spans) },
		Ratios: []ratio{{rowKilnExec, rowCtr}, {rowKilnExec, rowBare}, {rowInProcess, rowCtr}},
		Report: func(ctx context.Context, o *options, _ map[string]time.Duration) { reportSpans(spans) },
	})
}

func sandboxRows(ctx context.Context, o *options, spans **tracetest.InMemoryExporter) ([]row, func(), error) {
	addr := cmp.Or(os.Getenv("KILN_CONTAINERD_ADDRESS"), sandbox.AddressDefault)
	const image = "kiln.local/python:latest"
	const ctrImage = "kiln.local/python-slim:latest"
	rootfs, err := imageRootfs()
	if err != nil {
		return nil, nil, err
	}
	tmp, err := os.MkdirTemp("", "kiln-bench-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { os.RemoveAll(tmp) }
	// The kiln binary is built first so the row measures the binary, not the compiler.
	kiln := filepath.Join(tmp, "kiln")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", kiln, "github.com/kilnrun/kiln/cmd/kiln").CombinedOutput(); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("build kiln: %w\n%s", err, out)
	}
	prog := filepath.Join(tmp, "main.py")
	if err := os.WriteFile(prog, []byte(o.Code+"\n"), 0o644); err != nil {
		cleanup()
		return nil, nil, err
	}

	var seq int
	var mu sync.Mutex
	nextID := func() string {
		mu.Lock()
		defer mu.Unlock()
		seq++
		return fmt.Sprintf("kiln-bench-%d-%d", os.Getpid(), seq)
	}
	want := []byte{} // every row must print what the program prints
	rows := []row{
		{rowBare, func(ctx context.Context) error {
			return runCmd(ctx, &want, "chroot", rootfs, "python3", "-c", o.Code)
		}},
		{rowCtr, func(ctx context.Context) error {
			// ctr copies the image's config labels onto the container, and the
			// python image's package list is over containerd's 4 KiB label
			// limit; python-slim has the same interpreter and launcher.
			return runCmd(ctx, &want, "ctr", "--address", addr, "-n", benchNamespace(), "run", "--rm", ctrImage, nextID(), "python3", "-c", o.Code)
		}},
		{rowKilnExec, func(ctx context.Context) error {
			return runCmd(ctx, &want, kiln, "exec", prog)
		}},
	}

	// The library without the CLI's process start and connection, with a
	// span recorder to show where the time goes.
	var tp *sdktrace.TracerProvider
	if o.Spans {
		*spans = tracetest.NewInMemoryExporter()
		tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(*spans))
	}
	// A worker id of this process's own, so reap at clean-up touches nothing else.
	workerID := fmt.Sprintf("kiln-bench-%d", os.Getpid())
	cfg := sandbox.Config{Address: addr, Namespace: os.Getenv("KILN_CONTAINERD_NAMESPACE"), WorkerID: workerID}
	if tp != nil {
		cfg.TracerProvider = tp
	}
	rt, err := sandbox.New(ctx, cfg)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	rows = append(rows, row{rowInProcess, func(ctx context.Context) error {
		res, err := rt.Run(ctx, sandbox.Request{ID: job.NewID(), Spec: job.Spec{Runtime: "python", Code: o.Code}})
		if err != nil {
			return err
		}
		if res.Status != job.StatusSucceeded {
			return fmt.Errorf("status %s: %s", res.Status, res.Stderr)
		}
		return nil
	}})
	return rows, func() { reap(rt, workerID); rt.Close(); removeCtrLeftovers(addr); cleanup() }, nil
}

// removeCtrLeftovers deletes containers of this process's `ctr run --rm`
// rows that are still there: an interrupt kills ctr before its --rm runs.
func removeCtrLeftovers(addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctr := func(args ...string) ([]byte, error) {
		return exec.CommandContext(ctx, "ctr", append([]string{"--address", addr, "-n", benchNamespace()}, args...)...).Output()
	}
	out, err := ctr("containers", "list", "--quiet", fmt.Sprintf("id~=^kiln-bench-%d-[0-9]+$", os.Getpid()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "kiln-bench: list leftover ctr containers:", err)
		return
	}
	for _, id := range strings.Fields(string(out)) {
		_, _ = ctr("tasks", "delete", "--force", id) // there may be no task
		if _, err := ctr("containers", "delete", id); err != nil {
			fmt.Fprintf(os.Stderr, "kiln-bench: remove leftover container %s: %v\n", id, err)
		}
	}
}

// reap removes containers still labelled with workerID: a run interrupted
// while its container was being created can leave one that its own clean-up
// never learnt the name of. The id is this process's alone, so nothing of
// another process is touched.
func reap(sb *sandbox.Containerd, workerID string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if n, err := sb.ReapOrphans(ctx, workerID); err != nil {
		fmt.Fprintf(os.Stderr, "kiln-bench: remove leftover containers of %s: %v\n", workerID, err)
	} else if n > 0 {
		fmt.Fprintf(os.Stderr, "kiln-bench: removed %d leftover container(s) of %s\n", n, workerID)
	}
}

// runCmd runs a command and checks it printed the same as the first row did.
func runCmd(ctx context.Context, want *[]byte, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, stderr.String())
	}
	if len(*want) == 0 {
		*want = out
	} else if string(out) != string(*want) {
		return fmt.Errorf("%s printed %q; the first row printed %q", name, out, *want)
	}
	return nil
}

// imageRootfs reads the unpacked root filesystem of the python image from
// the build cache (deploy/images/build.sh writes it).
func imageRootfs() (string, error) {
	cache := cmp.Or(os.Getenv("KILN_IMAGE_CACHE"), "/var/cache/kiln/images")
	b, err := os.ReadFile(filepath.Join(cache, "python.json"))
	if err != nil {
		return "", fmt.Errorf("image cache: %w (run `make image`)", err)
	}
	var meta struct {
		Rootfs string `json:"rootfs"`
	}
	if err := json.Unmarshal(b, &meta); err != nil || meta.Rootfs == "" {
		return "", fmt.Errorf("image cache %s: no rootfs field (%v)", filepath.Join(cache, "python.json"), err)
	}
	return meta.Rootfs, nil
}

// reportSpans prints the median duration of each sandbox span over the
// in-process runs.
func reportSpans(spans *tracetest.InMemoryExporter) {
	if spans == nil {
		return
	}
	by := map[string][]time.Duration{}
	var names []string
	for _, s := range spans.GetSpans() {
		if _, ok := by[s.Name]; !ok {
			names = append(names, s.Name)
		}
		by[s.Name] = append(by[s.Name], s.EndTime.Sub(s.StartTime))
	}
	order := []string{"sandbox.create", "sandbox.start", "sandbox.wait", "sandbox.collect"}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(slices.Index(order, a), slices.Index(order, b)) })
	fmt.Printf("\nin-process spans (median over %d runs, warm-up included)\n", len(by["sandbox.wait"]))
	for _, n := range names {
		fmt.Printf("  %-26s %10s\n", n, ms(quantile(by[n], 0.5)))
	}
}

// benchNamespace is the containerd namespace holding the images:
// KILN_CONTAINERD_NAMESPACE, as for the worker, else Kiln's default.
func benchNamespace() string {
	return cmp.Or(os.Getenv("KILN_CONTAINERD_NAMESPACE"), sandbox.NamespaceDefault)
}
