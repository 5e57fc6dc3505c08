package main

import (
	"cmp"
	"context"
	"fmt"
	"os"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox"
)

// runtimeBenchPrograms is the "print one line" program of each runtime: its
// cold start through the whole sandbox, beside the default python image's.
var runtimeBenchPrograms = []struct{ runtime, code string }{
	{"python", "print(1)"},
	{"python-slim", "print(1)"},
	{"node", "console.log(1)"},
}

func init() {
	register(section{
		Name:  "runtimes",
		Order: 15,
		Setup: runtimeRows,
		Ratios: []ratio{
			{runtimeRowName("python-slim", "print(1)"), runtimeRowName("python", "print(1)")},
			{runtimeRowName("node", "console.log(1)"), runtimeRowName("python", "print(1)")},
		},
	})
}

func runtimeRowName(runtime, code string) string {
	return fmt.Sprintf("sandbox.Run %s: %s", runtime, code)
}

// runtimeRows measures a cold sandbox per job for each runtime; a runtime
// whose image is not built is an error naming the make target.
func runtimeRows(ctx context.Context, _ *options) ([]row, func(), error) {
	addr := cmp.Or(os.Getenv("KILN_CONTAINERD_ADDRESS"), sandbox.AddressDefault)
	names := make([]string, 0, len(runtimeBenchPrograms))
	for _, p := range runtimeBenchPrograms {
		names = append(names, p.runtime)
	}
	images, err := sandbox.ImagesFor(names)
	if err != nil {
		return nil, nil, err
	}
	workerID := fmt.Sprintf("kiln-bench-rt-%d", os.Getpid())
	rt, err := sandbox.New(ctx, sandbox.Config{
		Address: addr, Namespace: os.Getenv("KILN_CONTAINERD_NAMESPACE"), WorkerID: workerID, Images: images,
	})
	if err != nil {
		return nil, nil, err
	}
	var rows []row
	for _, p := range runtimeBenchPrograms {
		if _, err := rt.Image(ctx, p.runtime); err != nil {
			rt.Close()
			return nil, nil, fmt.Errorf("runtime %s: %w (build it with `make image RUNTIME=%s`)", p.runtime, err, p.runtime)
		}
		rows = append(rows, coldRunRow(rt, runtimeRowName(p.runtime, p.code), p.runtime, p.runtime, p.code))
	}
	return rows, func() { reap(rt, workerID); rt.Close() }, nil
}

// coldRunRow is a row that runs code in a fresh sandbox of runtime and checks
// it printed 1; label names the row in an error.
func coldRunRow(rt *sandbox.Containerd, name, label, runtime, code string) row {
	return row{name, func(ctx context.Context) error {
		res, err := rt.Run(ctx, sandbox.Request{ID: job.NewID(), Spec: job.Spec{Runtime: runtime, Code: code}})
		if err != nil {
			return err
		}
		if res.Status != job.StatusSucceeded || res.Stdout != "1\n" {
			return fmt.Errorf("%s: status %s stdout %q: %s", label, res.Status, res.Stdout, res.Stderr)
		}
		return nil
	}}
}
